"""stable-baselines3 2.9.2 transitions (invariant 10, docs/findings.md S3,
S4): strict xfails stating the spec's behaviour for the bugs still there,
and executed checks that the historic ones (#934, #1853, #1503) are fixed.
Skipped where SB3 is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (nox -s thirdparty installs it)")
from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402

VERSION = "stable-baselines3 2.9.2"
OBS = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = spaces.Box(-1.0, 1.0, (1,), np.float32)
ZERO = np.zeros((1, 1), np.float32)


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def step(rb, obs, next_obs, done=False, truncated=False):
    o = np.full((1, 3), obs, np.float32)
    n = np.full((1, 3), next_obs, np.float32)
    rb.add(o, n, ZERO, np.zeros(1), np.array([float(done)]), [{"TimeLimit.truncated": truncated}])


def next_obs_of(rb, obs: float, draws: int = 256) -> set[float]:
    """The next observations SB3 samples for the row whose obs is ``obs``."""
    np.random.seed(0)
    s = rb.sample(draws)
    rows = s.observations[:, 0].numpy() == obs
    assert rows.any(), f"row with obs {obs} sampled 0 times in {draws}, but should be sampled"
    return set(s.next_observations[rows, 0].numpy().tolist())


@bug("optimize_memory_usage: the final observation of an episode is overwritten by the next episode's "
     "first one (observations[pos + 1] = next_obs, common/buffers.py:269, read back at :312)")
def test_memopt_keeps_the_final_observation():
    rb = ReplayBuffer(8, OBS, ACT, device="cpu", optimize_memory_usage=True, handle_timeout_termination=False)
    step(rb, 1.0, 99.0, done=True, truncated=True)  # the episode ends: final observation 99
    step(rb, 2.0, 3.0)  # the next episode starts at 2
    assert next_obs_of(rb, 1.0) == {99.0}


@bug("optimize_memory_usage with buffer_size=1 is accepted, then sample() fails with numpy's "
     "'ValueError: low >= high' (np.random.randint(1, buffer_size), common/buffers.py:302); "
     "the one slot holds obs and next_obs at once (:269)")
def test_memopt_buffer_of_one_slot_is_refused():
    try:
        ReplayBuffer(1, OBS, ACT, device="cpu", optimize_memory_usage=True, handle_timeout_termination=False)
    except ValueError as err:
        assert "buffer_size" in str(err)
        return
    raise AssertionError("ReplayBuffer(1, optimize_memory_usage=True) was accepted, but should be refused")


def test_934_memopt_with_timeouts_is_refused():
    """#934 (bootstrapping from the next episode's first obs): fixed by refusing
    the combination (common/buffers.py:206-210)."""
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        ReplayBuffer(8, OBS, ACT, device="cpu", optimize_memory_usage=True, handle_timeout_termination=True)


def test_1853_full_memopt_buffer_newest_row_has_its_own_next_obs():
    """#1853: once full, the newest row's next obs is its own (the oldest slot is never sampled, :302)."""
    rb = ReplayBuffer(4, OBS, ACT, device="cpu", optimize_memory_usage=True, handle_timeout_termination=False)
    for k in range(6):
        step(rb, float(k), float(k + 1))
    for k in (3.0, 4.0, 5.0):
        assert next_obs_of(rb, k) == {k + 1}
    np.random.seed(0)
    assert 2.0 not in set(rb.sample(256).observations[:, 0].numpy().tolist())  # its slot holds 6 now


def test_1503_buffer_not_full_never_samples_an_unwritten_slot():
    """#1503 / PR #1504: before the first wrap only written slots are sampled (upper bound pos, :113)."""
    for memopt in (False, True):
        rb = ReplayBuffer(8, OBS, ACT, device="cpu", optimize_memory_usage=memopt, handle_timeout_termination=False)
        for k in range(3):
            step(rb, float(k + 1), float(k + 2))
        np.random.seed(0)
        assert set(rb.sample(256).observations[:, 0].numpy().tolist()) <= {1.0, 2.0, 3.0}
