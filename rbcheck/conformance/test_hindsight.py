"""Hindsight experience replay (``spec.her = (strategy, ratio)``,
reference/her.py; the oracle is harness/her_oracle.py).

The declared rules: a sampled row either keeps its goal and stored reward,
or is *relabelled*: its ``desired_goal`` is the goal achieved after a held
step of its own, finished episode, at a step the strategy allows
(``"future"``: the row's own step or a later one; ``"final"``: the
episode's last; ``"episode"``: any held step), and its reward is
``reference.her.goal_reward(next_achieved_goal, new goal)``. No relabelled
goal comes from another episode (across the ring's wrap), an overwritten
step, or an episode that has not ended. The share of relabelled rows
follows ``ratio`` under the declared count rule
(``Conventions.hindsight["her_count"]``, harness/her_laws.py), and all of
this holds after a save and a load into a fresh buffer, with the stream
carried on there.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_binomial, assert_same, fail
from rbcheck.harness.her_laws import exact_count, hindsight
from rbcheck.harness.her_oracle import LAYOUT, HindsightOracle, goal_rows, write
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.transition_streams import TERMINATED, Stream, streams

pytestmark = [pytest.mark.requires("her"), pytest.mark.conventions("hindsight")]
#: probability that one distributional check fails on a correct implementation
FALSE_ALARM = 1e-4
RATIOS = (0.5, 0.75, 0.8)  # k / (k + 1) for k = 1, 3, 4: each library's own argument can say it exactly


def her_setup(impl, data, finish: bool):
    """``(spec, rows)``: a drawn strategy among the declared ones, ratio, capacity and stream
    (``finish``: its last step ends every episode)."""
    strategy = data.draw(st.sampled_from(hindsight(impl.conventions, "strategies")), label="strategy")
    capacity = data.draw(st.integers(2, 24), label="capacity")
    stream = data.draw(streams(1, capacity), label="stream")
    if finish:
        stream = Stream(1, stream.ends[:-1] + ((TERMINATED,),))
    spec = BufferSpec(capacity=capacity, seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT,
                      her=(strategy, data.draw(st.sampled_from(RATIOS), label="ratio")))
    return spec, goal_rows(stream)


def her_written(impl, data, finish: bool):
    """``(spec, trace, buf, oracle)``: a drawn stream (``her_setup``) written whole into a fresh
    recorded buffer, and the oracle of it."""
    spec, rows = her_setup(impl, data, finish=finish)
    trace = her_trace(impl, spec, rows)
    buf = trace.wrap(impl.make(spec))
    write(buf, rows, 0, len(rows))
    return spec, trace, buf, her_oracle(impl, spec, rows)


def check_share(impl, spec: BufferSpec, trace: Trace, relabelled: int, finished: int, where: str) -> None:
    """Under ``her_count="per_draw"``: ``relabelled`` of ``finished`` sampled rows is Binomial(finished,
    ratio) (the exact counts are checked per batch by ``sample_and_check``)."""
    if hindsight(impl.conventions, "her_count") == "per_draw":
        assert_binomial(f"relabelled rows of {finished} sampled rows of finished episodes {where}",
                        relabelled, finished, spec.her[1], trace, false_alarm=FALSE_ALARM)


def sample_and_check(buf, oracle: HindsightOracle, spec: BufferSpec, impl, trace: Trace, batches, where: str):
    """Sample each batch size of ``batches``, check every row against the oracle
    and each batch's relabelled count under an exact count rule; return the
    relabelled and finished counts over all batches."""
    rule, ratio = hindsight(impl.conventions, "her_count"), spec.her[1]
    relabelled = finished = 0
    for b, size in enumerate(batches):
        rows, _ = buf.sample(size)
        what = f"batch {b} of {size} {where}"
        got, done = oracle.check(rows, trace, what)
        relabelled, finished = relabelled + int(got.sum()), finished + int(done.sum())
        if rule in ("floor", "ceil"):
            assert_same(f"relabelled rows of {what} (her_count={rule!r}: {rule}({ratio} * {size}))",
                        int(got.sum()), exact_count(rule, ratio, size), trace)
        elif rule == "floor_episodes":
            episodes = rows["episode"].cpu().reshape(-1)
            whole = [bool(got[episodes == e].all()) for e in episodes.unique().tolist()]
            mixed = [e for e in episodes.unique().tolist() if got[episodes == e].any() and not got[episodes == e].all()]
            if mixed:
                fail(f"episodes of {what} with some rows relabelled and some not", mixed,
                     "none (her_count='floor_episodes': an episode's sampled rows are relabelled together)", trace)
            assert_same(f"relabelled episodes of {what} (her_count='floor_episodes': int({ratio} * {len(whole)}))",
                        sum(whole), exact_count(rule, ratio, len(whole)), trace)
    return relabelled, finished


@given(data=st.data())
def test_relabelled_goals_come_from_the_strategys_steps_of_the_same_episode(impl, data):
    """exact: over drawn streams of goal episodes (ending terminated or
    truncated, or still running; before, at and long after the ring's first
    wrap) and each declared strategy, every sampled row is held and either
    keeps its goal and stored reward, or has a goal reached after a held step
    of its own finished episode that the strategy allows, and the reward
    recomputed for that goal."""
    spec, trace, buf, oracle = her_written(impl, data, finish=False)
    if not can_sample(impl, oracle):
        return
    sizes = [data.draw(st.integers(1, 64), label=f"batch {b}") for b in range(3)]
    sample_and_check(buf, oracle, spec, impl, trace, sizes, "after the stream")


@given(data=st.data())
def test_relabelled_share_follows_the_declared_ratio(impl, data):
    """distributional (binomial, false-alarm rate 1e-4) or exact: with every
    episode finished, 2000 sampled rows in batches of 1..8 and 32..256 hold a
    share ``ratio`` of relabelled rows: Binomial(2000, ratio) under the spec's
    ``her_count="per_draw"``; exactly ``int(ratio * B)`` rows of each batch
    under ``"floor"`` (``ceil`` under ``"ceil"``), or ``int(ratio * E)`` of
    its E episodes under ``"floor_episodes"``."""
    spec, trace, buf, oracle = her_written(impl, data, finish=True)
    if not can_sample(impl, oracle):
        return
    small = data.draw(st.booleans(), label="batches of 1..8 (else 32..256)")
    batches = schedule(1000, 1, 8) if small else schedule(2000, 32, 256)
    relabelled, finished = sample_and_check(buf, oracle, spec, impl, trace, batches, "after the stream")
    check_share(impl, spec, trace, relabelled, finished, f"(ratio {spec.her[1]})")


@pytest.mark.requires("save_load")
@given(data=st.data())
def test_episode_bookkeeping_survives_save_and_load(impl, data):
    """exact and distributional: a stream is written up to a drawn step
    (often mid-episode), saved, loaded into a fresh buffer built with another
    seed, and carried on there to its end (every episode finished); then the
    samples hold as before: every relabelled goal from the strategy's steps
    of the row's own episode, reward recomputed, and the relabelled share
    as declared (1000 rows in batches of 32..256)."""
    spec, rows = her_setup(impl, data, finish=True)
    cut = data.draw(st.integers(1, len(rows)), label="rows written before the save")
    trace = her_trace(impl, spec, rows)
    buf = trace.wrap(impl.make(spec))
    write(buf, rows, 0, cut)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = trace.directory(Path(tmp))
        buf.save(tmp)
        fresh = trace.make(spec.but(seed=spec.seed + 1), "fresh")
        fresh.load(tmp)
    write(fresh, rows, cut, len(rows))
    oracle = her_oracle(impl, spec, rows)
    if not can_sample(impl, oracle):
        return
    where = f"after a save at row {cut} of {len(rows)}, a load into a fresh buffer and the rest of the stream"
    relabelled, finished = sample_and_check(fresh, oracle, spec, impl, trace, schedule(1000, 32, 256), where)
    check_share(impl, spec, trace, relabelled, finished, where)


def her_oracle(impl, spec: BufferSpec, rows) -> HindsightOracle:
    """The oracle of the whole stream written, under the declared reward and unfinished-episode rules."""
    return HindsightOracle(rows, len(rows), spec.capacity, spec.her[0], hindsight(impl.conventions, "reward"),
                           hindsight(impl.conventions, "unfinished"))


def can_sample(impl, oracle: HindsightOracle) -> bool:
    """Whether the buffer must sample: a finished episode is held (held whole, under the declared
    episodes="whole_only"); else nothing may be relabelled, and a buffer may refuse to sample."""
    return oracle.held_finished(whole=hindsight(impl.conventions, "episodes") == "whole_only")


def schedule(total: int, low: int, high: int) -> list[int]:
    from rbcheck.harness.scale import batch_schedule

    return list(batch_schedule(total, low, high))


def her_trace(impl, spec: BufferSpec, rows) -> Trace:
    """A trace whose snippet rebuilds ``rows`` (the stream's ends, one env)."""
    trace = Trace(impl, spec)
    trace.need("from rbcheck.harness.her_oracle import goal_rows")
    trace.need("from rbcheck.harness.transition_streams import Stream")
    ends = tuple((1 if t else (2 if u else 0),) for t, u in zip(rows["terminated"].tolist(),
                                                                rows["truncated"].tolist(), strict=True))
    trace.let("rows", rows, f"goal_rows(Stream(1, {ends!r}))")
    return trace


__all__: list[str] = []
