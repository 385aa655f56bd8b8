"""Seed invariant 5: the trajectory example (episodes, steps, slice sampling)
works: every slice is contiguous in write order, lies inside one episode,
may run across the ring's wrap, and honours ``strict_length``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import EpisodeLayout, episode_layouts

pytestmark = pytest.mark.requires("slice")


def write_episodes(buf, layout: EpisodeLayout, chunks: list[int], trace: Trace) -> None:
    """Extend ``buf`` with the episodes, ``chunks`` rows at a time (``layout``
    a trace's source, so the rows are written as slices of ``episodes.batch()``)."""
    data = layout.batch()
    start = 0
    for n in chunks:
        if start >= layout.total:
            break
        n = min(n, layout.total - start)
        buf.extend(data[start : start + n])
        start += n
    if start < layout.total:
        buf.extend(data[start:])


def check_slices(
    rows, info, runs, capacity: int, slice_len: int, num_slices: int, strict: bool, trace: Trace
) -> list[list[int]]:
    """Split a slice sample into its slices and check each; returns them as id lists."""
    traj_of = {j: t for t, ids in enumerate(runs) for j in ids}
    ids = rows["id"].cpu().tolist()
    index = info["index"].cpu()
    slices, p = [], 0
    while p < len(ids):
        if ids[p] not in traj_of:
            fail(f"sample row {p} id", ids[p], "an id still stored in the ring", trace)
        traj = runs[traj_of[ids[p]]]
        if strict and len(traj) < slice_len:
            fail(
                f"length of the episode of slice {len(slices)}",
                len(traj),
                f">= slice_len={slice_len} (strict_length=True)",
                trace,
            )
        m = slice_len if strict else min(len(traj), slice_len)
        got = ids[p : p + m]
        start = traj.index(ids[p])
        want = traj[start : start + m]
        if got != want:
            fail(
                f"ids of slice {len(slices)}",
                got,
                f"{want} (contiguous in write order, inside one episode of ids {traj[0]}..{traj[-1]})",
                trace,
            )
        assert_tensor_equal(
            f"info['index'] of slice {len(slices)}",
            index[p : p + m],
            torch.tensor(want, dtype=torch.int64) % capacity,
            trace,
        )
        slices.append(got)
        p += m
    assert_same("number of slices", len(slices), num_slices, trace)
    steps = rows["steps"].cpu().tolist()
    episodes = rows["episode"].cpu().tolist()
    p = 0
    for s in slices:
        if len(set(episodes[p : p + len(s)])) != 1:
            fail(
                "episodes within one slice", episodes[p : p + len(s)], "a single episode id", trace
            )
        if steps[p : p + len(s)] != list(range(steps[p], steps[p] + len(s))):
            fail("steps within one slice", steps[p : p + len(s)], "consecutive", trace)
        p += len(s)
    return slices


@st.composite
def slice_setups(draw):
    layout = draw(episode_layouts(max_episodes=6, max_len=8), label="episodes")
    capacity = draw(st.integers(2, layout.total + 2), label="capacity")
    chunks = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=8), label="extend sizes")
    slice_len = draw(st.integers(1, 5), label="slice_len")
    num_slices = draw(st.integers(1, 4), label="num_slices")
    fix = draw(st.sampled_from(["num_slices", "slice_len"]), label="which is fixed")
    strict = draw(st.booleans(), label="strict_length")
    spec = BufferSpec(
        capacity=capacity,
        sampler="slice",
        num_slices=num_slices if fix == "num_slices" else None,
        slice_len=slice_len if fix == "slice_len" else None,
        strict_length=strict,
        seed=draw(st.integers(0, 2**16), label="seed"),
    )
    return spec, layout, chunks, slice_len, num_slices


@given(setup=slice_setups())
def test_slices_are_contiguous_and_inside_one_episode(impl, setup):
    """exact: each slice of a slice sample is a run of consecutive rows (write
    order, physical slots = row id mod capacity, so possibly across the
    ring's end) of ONE surviving episode with consecutive steps; its length
    is slice_len under strict_length (short episodes are never picked), else
    min(episode length, slice_len); rows equal the stored rows. With no
    eligible episode, sampling raises instead of returning a short batch."""
    spec, layout, chunks, slice_len, num_slices = setup
    trace = Trace(impl, spec)
    episodes = trace.source("episodes", layout)
    buf = trace.wrap(impl.make(spec))
    write_episodes(buf, episodes, chunks, trace)
    runs = layout.surviving(spec.capacity)
    batch = slice_len * num_slices
    eligible = [r for r in runs if len(r) >= slice_len or not spec.strict_length]
    if not eligible:
        try:
            buf.sample(batch)
        except Exception as err:  # noqa: BLE001 - must explain itself
            if "length" not in str(err).lower():
                fail(
                    "error message",
                    f"<{type(err).__name__}: {err}>",
                    "a message about the required length (slice_len / strict_length)",
                    trace,
                )
            return
        fail("sample() with no episode of length >= slice_len", "<a batch>", "an error", trace)
    for _ in range(3):
        rows, info = buf.sample(batch)
        assert_td_equal(
            "sample rows", rows, buf.contents()[info["index"].cpu()], trace, check_device=False
        )
        check_slices(
            rows, info, runs, spec.capacity, slice_len, num_slices, spec.strict_length, trace
        )


@st.composite
def wrapping_setups(draw):
    capacity = draw(st.integers(3, 16), label="capacity")
    length = draw(st.integers(capacity // 2 + 1, capacity), label="wrapping episode length")
    first = draw(st.integers(max(capacity - length + 1, 1), capacity - 1), label="its first slot")
    return capacity, length, first, draw(st.integers(0, 2**16), label="seed")


@given(setup=wrapping_setups())
def test_slices_run_across_the_ring_wrap(impl, setup):
    """exact: an episode written from slot ``first`` past the ring's last
    slot into slots 0, 1, ... is one trajectory: with slice_len equal to its
    length (the only eligible one under strict_length), every slice is
    exactly its slots ``first, ..., capacity-1, 0, ...`` in write order."""
    capacity, length, first, seed = setup
    layout = EpisodeLayout((first, length))
    spec = BufferSpec(
        capacity=capacity, sampler="slice", slice_len=length, strict_length=True, seed=seed
    )
    trace = Trace(impl, spec)
    episodes = trace.source("episodes", layout)
    buf = trace.wrap(impl.make(spec))
    write_episodes(buf, episodes, [capacity], trace)
    want_slots = torch.tensor([(first + i) % capacity for i in range(length)], dtype=torch.int64)
    rows, info = buf.sample(2 * length)
    for s in range(2):
        part = slice(s * length, (s + 1) * length)
        assert_tensor_equal(
            f"info['index'] of slice {s}", info["index"].cpu()[part], want_slots, trace
        )
        assert_tensor_equal(
            f"rows['steps'] of slice {s}",
            rows["steps"].cpu()[part],
            torch.arange(length, dtype=torch.int64),
            trace,
        )


class GoRight(torch.nn.Module):
    """The tutorial's policy: asks to go right while its weight is positive."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))

    def forward(self, observation):
        return (self.weight > 0).to(torch.int64)


def test_trajectory_example_runs_as_written(impl):
    """exact: the tutorial's trajectory example (docs/tutorial.md) with the
    implementation's buffer: ChainEnv(length=9, max_steps=12, slip=0.3,
    seed=0) + SyncCollector (16 frames a batch, 96 frames) into a 64-row
    slice buffer (slice_len=4, batch_size=32): the policy is used in place,
    write_count 96, len 64, cursor 32; each sample() gives 8 slices of 4 rows,
    each contiguous in write order inside one episode (consecutive steps, only
    the last row may be done) and equal to the stored rows."""
    from rbcheck.reference import ChainEnv, SyncCollector

    capacity, slice_len, batch = 64, 4, 32
    spec = BufferSpec(
        capacity=capacity, sampler="slice", slice_len=slice_len, batch_size=batch, seed=0
    )
    trace = Trace(impl, spec)
    trace.need("from rbcheck.reference import ChainEnv, SyncCollector")
    trace.need("from rbcheck.conformance.test_trajectory_slices import GoRight")
    trace.op(
        "collector = SyncCollector(ChainEnv(length=9, max_steps=12, slip=0.3, seed=0), GoRight(), buf, "
        "frames_per_batch=16, total_frames=96); list(collector)"
    )
    buf = trace.wrap(impl.make(spec))
    policy = GoRight()
    env = ChainEnv(length=9, max_steps=12, slip=0.3, seed=0)
    # the collector's writes are the setup line above: given the buffer itself, not the recorder
    collector = SyncCollector(env, policy, buf.inner, frames_per_batch=16, total_frames=96)
    written = [b for b in collector]
    if collector.policy is not policy:
        fail("collector.policy is policy", False, "True (already on the CPU: used in place)", trace)
    assert_same("buf.write_count", buf.write_count, 96, trace)
    assert_same("len(buf)", len(buf), capacity, trace)
    assert_same("buf.cursor", buf.cursor, 96 % capacity, trace)
    every = torch.cat([b["episode"] for b in written]).tolist()
    kept = list(range(96 - capacity, 96))
    runs: list[list[int]] = []
    for j in kept:
        if runs and every[j] == every[runs[-1][-1]]:
            runs[-1].append(j)
        else:
            runs.append([j])
    slot_to_id = {j % capacity: j for j in kept}
    for _ in range(3):
        rows, info = buf.sample()
        assert_same("rows.batch_size", list(rows.batch_size), [batch], trace)
        stored = buf.contents()[info["index"].cpu()]
        assert_td_equal("sample rows", rows, stored, trace, check_device=False)
        done = rows["done"].cpu().reshape(batch // slice_len, slice_len)
        if bool(done[:, :-1].any()):
            fail("done flags inside a slice", done, "True only on a slice's last row", trace)
        # the rows carry no global row id: rebuild it from the slot (newest 64 rows)
        rows = rows.clone()
        rows.set("id", torch.tensor([slot_to_id[s] for s in info["index"].cpu().tolist()]))
        check_slices(rows, info, runs, capacity, slice_len, batch // slice_len, True, trace)
