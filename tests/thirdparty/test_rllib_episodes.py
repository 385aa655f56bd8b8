"""The adapter of RLlib's episode buffers (ray 2.60.0, columns
``rllib-episodes`` and ``rllib-episodes-per``): its own checks, passing.
With n = 1 no window is shortened (RLlib's bugs RE1-RE5 of docs/findings.md need n > 1), so
every sampled row must equal the oracle's: what the adapter feeds and reads
back is RLlib's own data. Skipped where RLlib is not installed: ``nox -s
thirdparty``."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.rllib", reason="RLlib is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402

from rbcheck.harness.adapters.rllib_episodes import (  # noqa: E402
    DrawLimit,
    rllib_episodes_adapter,
    rllib_episodes_per_adapter,
)
from rbcheck.harness.protocol import BufferSpec  # noqa: E402
from rbcheck.harness.transition_streams import LAYOUT, NONE, TERMINATED, TRUNCATED, Stream  # noqa: E402
from rbcheck.reference.transitions import Transitions  # noqa: E402

# two envs: env 0 terminates at step 2 and truncates at step 5, env 1 runs on
STREAM = Stream(2, ((NONE, NONE), (NONE, NONE), (TERMINATED, NONE), (NONE, NONE), (NONE, NONE), (TRUNCATED, NONE),
                    (NONE, NONE)))


@pytest.mark.parametrize("factory", [rllib_episodes_adapter, rllib_episodes_per_adapter])
def test_one_step_samples_are_the_rows_written(factory):
    spec = BufferSpec(capacity=100, seed=3, layout=LAYOUT, num_envs=2, nstep=1, gamma=0.5)
    buf = factory().make(spec)
    STREAM.write(buf)
    rows = STREAM.rows()
    assert len(buf) == len(rows) and sorted(buf.contents()["id"].tolist()) == list(range(len(rows)))
    assert len(buf.rb.episodes) == 4  # env 0: three episodes, env 1: one (each step's chunk concatenated)
    out, info = buf.sample(64)
    tr = Transitions(rows)
    for b, i in enumerate(out["id"].tolist()):
        want = tr.nstep(i, 1, 0.5)
        assert torch.equal(out["obs"][b], rows["obs"][i]) and torch.equal(out["nstep_obs"][b], want.obs)
        assert float(out["nstep_return"][b]) == want.ret and float(out["nstep_discount"][b]) == want.discount
    assert set(out["id"].tolist()) == set(range(len(rows)))  # 64 draws of 14 rows reach every one


def test_a_sample_that_would_loop_forever_raises():
    spec = BufferSpec(capacity=100, seed=0, layout=LAYOUT, num_envs=1, nstep=3, gamma=0.5)
    buf = rllib_episodes_per_adapter().make(spec)
    Stream(1, ((NONE,), (NONE,))).write(buf)  # two steps: no row has 3 steps left
    with pytest.raises(DrawLimit, match="prioritized_episode_buffer.py:495-497"):
        buf.sample(4)


def test_capacity_evicts_whole_episodes_through_the_adapter():
    spec = BufferSpec(capacity=4, seed=0, layout=LAYOUT, num_envs=1, nstep=1, gamma=0.5)
    buf = rllib_episodes_adapter().make(spec)
    Stream(1, ((NONE,), (NONE,), (TERMINATED,), (NONE,), (NONE,), (TERMINATED,))).write(buf)
    assert buf.contents()["id"].tolist() == [3, 4, 5]  # the first episode dropped whole, not its oldest step


def test_prioritized_n_step_values_are_right_where_it_samples():
    """n = 2: the rows the prioritized buffer does sample (those with two steps left in their episode,
    RE4) carry the oracle's return, discount and bootstrap observation, terminated and truncated ends
    included."""
    ends = [NONE] * 5 + [TERMINATED] + [NONE] * 3 + [TRUNCATED] + [NONE] * 3
    stream = Stream(1, tuple((e,) for e in ends))
    spec = BufferSpec(capacity=100, seed=1, layout=LAYOUT, num_envs=1, nstep=2, gamma=0.5)
    buf = rllib_episodes_per_adapter().make(spec)
    stream.write(buf)
    rows = stream.rows()
    tr = Transitions(rows)
    out, info = buf.sample(200)
    sampled = set(out["id"].tolist())
    assert sampled == {i for i in range(len(rows)) if tr.complete(i, 2) and len(tr.window(i, 2)) == 2}
    for b, i in enumerate(out["id"].tolist()):
        want = tr.nstep(i, 2, 0.5)
        assert float(out["nstep_return"][b]) == want.ret and float(out["nstep_discount"][b]) == want.discount
        assert torch.equal(out["nstep_obs"][b], want.obs)
    assert torch.all(info["weight"] == 1.0)  # every row at the default priority
