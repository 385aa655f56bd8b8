"""Slice samplers of the field (issue 40): slices without replacement
(reference/slice_without_replacement_sampler.py) and prioritized slices
(reference/prioritized_slice_sampler.py).

* Slices without replacement: an epoch draws every valid slice start exactly
  once (a start whose slice lies in one trajectory, read in write order from
  the oldest row, so never across the write cursor); a write ends the epoch in
  progress. Declared otherwise (``Conventions.sampler_rules["slice_epoch"] =
  "trajectories"``): every eligible trajectory once per epoch, one slice each.
* Prioritized slices: a slice start ``s`` is drawn with probability
  ``(p_s + eps) ** alpha / sum over valid starts``: the start step's own
  priority; ``update_priority`` moves exactly the slots it names; weights
  ``(leaf_s / leaf_min) ** -beta`` over the held slots.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_chi_square, assert_same, assert_td_equal, fail
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.sampler_laws import sampler_rule
from rbcheck.harness.strategies import EpisodeLayout, episode_layouts

#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4


def held_runs(layout: EpisodeLayout, written: int, capacity: int) -> list[list[int]]:
    """Row ids (write order) of each trajectory held after the first ``written`` rows."""
    episode = [k for k, n in enumerate(layout.lengths) for _ in range(n)][:written]
    runs: list[list[int]] = []
    for j in range(max(written - capacity, 0), written):
        if runs and episode[runs[-1][-1]] == episode[j]:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs


def valid_starts(runs: list[list[int]], slice_len: int, strict: bool) -> dict[int, int]:
    """start id -> its trajectory's rank: where a slice of ``slice_len`` lies in one trajectory
    (a shorter trajectory's first row too, without ``strict_length``)."""
    starts = {}
    for t, run in enumerate(runs):
        if len(run) >= slice_len:
            starts.update({j: t for j in run[:len(run) - slice_len + 1]})
        elif not strict:
            starts[run[0]] = t
    return starts


def split_slices(rows, info, runs, capacity: int, slice_len: int, trace: Trace, when: str) -> list[tuple[int, int]]:
    """``(start id, rows)`` of each slice of a sample, each slice checked: consecutive ids of one held
    trajectory from its start (``slice_len`` rows, fewer only at a trajectory's end), the
    physical slots ``id % capacity``, the rows the stored ones."""
    where = {j: (t, k) for t, run in enumerate(runs) for k, j in enumerate(run)}
    ids, index = rows["id"].cpu().reshape(-1).tolist(), torch.as_tensor(info["index"]).cpu().reshape(-1).tolist()
    if len(ids) != len(index):
        fail(f"len(info['index']) {when}", len(index), f"{len(ids)} (one per row)", trace)
    starts, p = [], 0
    while p < len(ids):
        if ids[p] not in where:
            fail(f"id of sample row {p} {when}", ids[p], "an id held in the ring", trace)
        t, k = where[ids[p]]
        want = runs[t][k:k + slice_len]
        got = ids[p:p + len(want)]
        if got != want or [i % capacity for i in want] != index[p:p + len(want)]:
            fail(f"ids (slots) of slice {len(starts)} {when}", f"{got} ({index[p:p + len(want)]})",
                 f"{want} (slots {[i % capacity for i in want]}): consecutive in write order inside one "
                 f"trajectory of ids {runs[t][0]}..{runs[t][-1]}, never across the write cursor", trace)
        starts.append((ids[p], len(want)))
        p += len(want)
    return starts


def slice_spec(sampler: str, capacity: int, slice_len: int, strict: bool, seed: int, **fields) -> BufferSpec:
    return BufferSpec(capacity=capacity, sampler=sampler, slice_len=slice_len, strict_length=strict, seed=seed,
                      **fields)


@pytest.mark.requires("slice_without_replacement")
@given(layout=episode_layouts(max_episodes=6, max_len=8), data=st.data())
def test_slice_epochs_draw_every_valid_start_once(impl, layout, data):
    """exact: over drawn interleavings of writes (the ring wrapping) and
    samples, each batch holds ``min(num_slices, left)`` valid slices (a short
    tail dropped with ``drop_last``) whose starts were not drawn before in the
    epoch; an epoch draws every valid start exactly once (declared
    ``slice_epoch="trajectories"``: every eligible trajectory once); a write
    ends the epoch in progress; no valid start (or too few with
    ``drop_last``) raises."""
    capacity = data.draw(st.integers(2, layout.total + 2), label="capacity")
    slice_len, num_slices = data.draw(st.integers(1, 4), label="slice_len"), data.draw(st.integers(1, 4), label="num_slices")
    spec = slice_spec("slice_without_replacement", capacity, slice_len, data.draw(st.booleans(), label="strict_length"),
                      data.draw(st.integers(0, 2**16), label="seed"), drop_last=data.draw(st.booleans(), label="drop_last"),
                      shuffle=data.draw(st.booleans(), label="shuffle"), batch_size=num_slices * slice_len)
    by_trajectory = sampler_rule(impl.conventions, "slice_epoch") == "trajectories"
    trace = Trace(impl, spec)
    episodes = trace.source("episodes", layout)
    buf = trace.wrap(impl.make(spec))
    rows_all, written, batch = episodes.batch(), 0, num_slices * slice_len
    units: set = set()  # what the epoch in progress has left to draw (starts, or trajectories)
    fresh = True  # no epoch in progress
    for step in range(data.draw(st.integers(1, 14), label="steps")):
        if written < layout.total and (written == 0 or data.draw(st.booleans(), label=f"write at step {step}")):
            n = data.draw(st.integers(1, layout.total - written), label=f"rows written at step {step}")
            buf.extend(rows_all[written:written + n])
            written, fresh = written + n, True
            continue
        runs = held_runs(layout, written, capacity)
        starts = valid_starts(runs, slice_len, spec.strict_length)
        if fresh or not units or (spec.drop_last and len(units) < num_slices):  # a new epoch begins
            units = set(starts.values()) if by_trajectory else set(starts)
            if not units or (spec.drop_last and len(units) < num_slices):
                try:
                    buf.sample(batch)
                except Exception:  # noqa: BLE001 - the refusal asked for
                    continue
                fail(f"buf.sample({batch}) with {len(units)} valid {'trajectories' if by_trajectory else 'starts'} "
                     f"(slice_len={slice_len}, drop_last={spec.drop_last})", "<a batch>", "an error", trace)
            fresh = False
        when = f"at step {step} ({len(units)} of the epoch left, {num_slices} slices a batch)"
        rows, info = buf.sample(batch)
        assert_td_equal(f"sample rows {when}", rows, buf.contents()[torch.as_tensor(info["index"]).cpu()], trace,
                        check_device=False)
        drawn = [s for s, _ in split_slices(rows, info, runs, capacity, slice_len, trace, when)]
        assert_same(f"slices in the batch {when}", len(drawn), min(num_slices, len(units)), trace)
        for s in drawn:
            if s not in starts:
                fail(f"slice start id {s} {when}", s, f"a valid start among {sorted(starts)[:12]}", trace)
            unit = starts[s] if by_trajectory else s
            if unit not in units:
                fail(f"{'trajectory' if by_trajectory else 'slice start'} drawn {when}", unit,
                     f"one not drawn before in this epoch (left: {sorted(units)[:12]})", trace)
            units.discard(unit)


CASES = [  # (episode lengths, capacity, slice_len, strict_length, updates {row id: raw priority})
    ((5, 2, 6, 4), 17, 3, True, {0: 4.0, 3: 9.0, 8: 0.5, 10: 3.0, 14: 2.0}),
    ((3, 7, 2, 5), 12, 2, False, {7: 6.0, 9: 0.25, 15: 5.0, 16: 2.0}),  # the ring wrapped: ids 5..16 held
]


@pytest.mark.requires("prioritized_slice")
def test_prioritized_slice_starts_follow_the_start_priorities(impl):
    """distributional (chi-square, false-alarm rate 1e-4 per case) and
    exact: after priority updates (some on steps that cannot start a slice),
    20000 slice starts follow ``(p_s + eps) ** alpha`` of the start step over
    the valid starts (probability 0 elsewhere, exact); every slice lies in
    one trajectory and never crosses the write cursor; each slice's weight is
    ``(leaf_s / leaf_min) ** -beta`` over the held slots."""
    for lengths, capacity, slice_len, strict, updates in CASES:
        layout = EpisodeLayout(lengths)
        num_slices = 16
        spec = BufferSpec(capacity=capacity, sampler="prioritized_slice", num_slices=num_slices, strict_length=strict,
                          alpha=0.7, beta=0.5, eps=1e-3, seed=capacity)
        trace = Trace(impl, spec)
        episodes = trace.source("episodes", layout)
        buf = trace.wrap(impl.make(spec))
        buf.extend(episodes.batch())
        runs = held_runs(layout, layout.total, capacity)
        raw = {j: 1.0 for run in runs for j in run}  # the max priority seen before the updates: 1.0
        index = torch.tensor([j % capacity for j in updates])
        priority = impl.conventions.priorities(list(updates.values()))
        buf.update_priority(index, priority)
        raw.update(zip(updates, priority.double().tolist()))
        eps = impl.conventions.effective_eps(spec.eps)
        leaf = {j: (p + eps) ** spec.alpha for j, p in raw.items()}
        valid = valid_starts(runs, slice_len, strict)
        starts = sorted(valid)
        held = sorted(raw)
        position = {j: k for k, j in enumerate(held)}
        counts = torch.zeros(len(held), dtype=torch.float64)
        total = sum(leaf[s] for s in starts)
        probs = torch.tensor([leaf[j] / total if j in starts else 0.0 for j in held], dtype=torch.float64)
        low = min(v for v in leaf.values() if v > 0)
        calls = 20000 // num_slices
        for _ in range(calls):
            rows, info = buf.sample(num_slices * slice_len)
            drawn = split_slices(rows, info, runs, capacity, slice_len, trace, f"(case {lengths}, capacity {capacity})")
            for start, _ in drawn:
                if start not in valid:  # exact: probability 0
                    fail(f"slice start id {start} (case {lengths}, capacity {capacity})", start,
                         f"a valid start among {starts} (its slice of {slice_len} inside one trajectory)", trace)
                counts[position[start]] += 1
            if "weight" in info:  # capability prioritized_slice: one weight per row, its slice's
                weight = torch.as_tensor(info["weight"]).double().cpu().reshape(-1)
                want = torch.tensor([(leaf[start] / low) ** -spec.beta for start, m in drawn for _ in range(m)],
                                    dtype=torch.float64)
                if weight.shape != want.shape or not torch.allclose(weight, want, rtol=1e-5, atol=0):
                    fail(f"info['weight'] (case {lengths})", weight[:8], f"{want[:8]} ((leaf_s / leaf_min) ** -beta "
                         "of each slice's start s, leaf_min over the held slots; one per row)", trace)
        assert_chi_square(f"slice starts of {sum(counts):.0f} slices (episodes {lengths}, capacity {capacity}, "
                          f"slice_len {slice_len}, strict_length={strict})", counts, probs, trace,
                          false_alarm=FALSE_ALARM)
