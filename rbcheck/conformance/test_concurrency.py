"""A buffer shared by K writers, M samplers, an updater and a saver at once
(capability "concurrent"; the driver is ``rbcheck.harness.concurrency``).

Hypothesis draws how many writers and samplers, the sizes of every extend and
sample, and the timing jitter; the run itself interleaves as the machine
schedules it, so these are properties of every interleaving the run hit. The
spec of sharing: the result is one the operations could give run one at a time,
each whole: the reference behind one lock (``reference-locked``, ``--impl
rbcheck.harness.concurrency:locked_reference_adapter``).
Every run is bounded (``harness.concurrency.run_limit``: ``TIMEOUT_S`` plus the
per-call bound the buffer declares, so never shorter than one round trip to a
served buffer) and a hang fails, naming the thread and the call it is in.
Every buffer a property makes is closed on every path, the failing one
included.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_chi_square, fail
from rbcheck.harness.concurrency import MAX_SAVES, Workload
from rbcheck.harness.concurrency_checks import (
    State,
    identical_batches,
    make_rows,
    repeat_bound,
    ring_problems,
    slot_problems,
    tags,
    torn_rows,
    update_priority_of,
)
from rbcheck.harness.plugin.skips import capability_skip_reason
from rbcheck.harness.protocol import CAPABILITIES, BufferSpec

#: probability that one case fails on a correct implementation (distributional checks)
FALSE_ALARM = 1e-4
#: draws per sampler batch in the distribution property: large enough that two
#: independent batches coincide with probability below REPEAT_ALARM
DIST_BATCH = 32
REPEAT_ALARM = 1e-6
#: most extends per writer in the properties that look for a race: a race
#: shows only when a thread switch falls in its window (nothing widens it), so
#: each run gives it many windows: many extends, samplers that go on while
#: the writers write, saves one after another while they write
RACE_EXTENDS = 12
READBACK = ("priority_readback",) if "priority_readback" in CAPABILITIES else ()


@st.composite
def workloads(draw, *, min_writers: int = 1, max_writers: int = 3, max_samplers: int = 2, max_batch: int = 8,
              max_extends: int = 5, **fixed) -> Workload:
    k = draw(st.integers(min_writers, max_writers), label="writers")
    writers = tuple(
        tuple(draw(st.lists(st.integers(1, max_batch), min_size=1, max_size=max_extends),
                   label=f"writer {w} extends"))
        for w in range(k)
    )
    fields = dict(
        writers=writers,
        delays=tuple(draw(st.lists(st.sampled_from((0.0, 0.0, 1e-4, 5e-4, 2e-3)), min_size=1, max_size=6),
                          label="jitter (s)")),
        samplers=draw(st.integers(1, max_samplers), label="samplers"),
        sample_batch=draw(st.integers(1, 8), label="sample batch"),
        samples=draw(st.integers(1, 6), label="samples per sampler"),
        width=draw(st.integers(1, 4), label="payload width"),
    )
    fields.update(fixed)
    return Workload(**fields)


def capacities_for(workload: Workload) -> st.SearchStrategy[int]:
    """From "nothing overwritten" to "overwritten several times"."""
    total = sum(workload.totals)
    return st.integers(max(2, total // 4), max(2, total + 2))


@contextmanager
def _run(impl, spec, workload, trace, save_to=None):
    """Make a buffer, run ``workload`` on it and yield ``(buf, record)``; a
    run with errors (a raise, a hang) fails. The buffer is closed on every
    path, the failing one included."""
    from rbcheck.harness.concurrency import run_workload

    buf = impl.make(spec)  # not recorded: the workload's threads call it, the snippet runs the workload
    try:
        saving = "" if save_to is None else f", save_to={trace.render(save_to)}"
        trace.op(f"record = run_workload(buf, {workload!r}{saving})")
        record = run_workload(buf, workload, save_to=save_to)
        if record.errors:
            first = record.errors[0]
            first = first if len(first) <= 160 else first[:157] + "..."
            detail = "\n  ".join(record.errors)
            if record.hung:
                detail += f"\n  threads left running (stuck in a call)={record.hung}"
            fail("errors raised during the concurrent run", f"<{len(record.errors)}, the first: {first}>",
                 "none", trace, detail)
        yield buf, record
    finally:
        _close(buf)


def _trace(impl, spec) -> Trace:
    trace = Trace(impl, spec)
    trace.lets.append("from rbcheck.harness.concurrency import Workload, run_workload")
    trace.lets.append("from rbcheck.harness.concurrency_checks import State, make_rows")
    return trace


def _close(buf) -> None:
    close = getattr(buf, "close", None)
    if close is not None:
        close()


@pytest.mark.requires("concurrent")
@given(data=st.data())
def test_concurrent_samples_never_see_a_torn_row(impl, data):
    """exact: while K writers extend, every row M samplers get is whole (its
    checksum matches its writer, sequence number and payload) and was really
    written (no never-written slot, no row mixed from two writes). The
    samplers go on sampling while the writers run (``keep_sampling``), so a
    torn row has many chances to be seen."""
    workload = data.draw(workloads(keep_sampling=True, max_extends=RACE_EXTENDS), label="workload")
    spec = BufferSpec(capacity=data.draw(capacities_for(workload), label="capacity"))
    trace = _trace(impl, spec)
    with _run(impl, spec, workload, trace) as (buf, record):
        for n, sample in enumerate(record.samples):
            bad = torn_rows(sample.rows, workload.totals)
            if bad:
                fail(f"sample {n} (sampler {sample.sampler}): torn or unwritten rows", bad, "none", trace)
            index = torch.as_tensor(sample.info["index"]).reshape(-1)
            if index.numel() != workload.sample_batch or bool(((index < 0) | (index >= spec.capacity)).any()):
                fail(f"sample {n}: info['index']", index.tolist(),
                     f"{workload.sample_batch} slots in [0, {spec.capacity})", trace)


@pytest.mark.requires("concurrent")
@given(data=st.data())
def test_concurrent_writes_lose_and_duplicate_nothing(impl, data):
    """exact: once the writers finish, write_count is the number of rows
    written, len == min(write_count, capacity), cursor == write_count %
    capacity, and the rows held (oldest to newest from the cursor) are the
    last ``capacity`` rows of one interleaving that keeps each writer's order:
    per writer, its last rows, each once, in order; each in the slot its
    extend returned. Samplers run at the same time. At least two writers
    (one cannot race itself), each with up to RACE_EXTENDS extends."""
    workload = data.draw(workloads(min_writers=2, max_extends=RACE_EXTENDS), label="workload")
    spec = BufferSpec(capacity=data.draw(capacities_for(workload), label="capacity"))
    trace = _trace(impl, spec)
    with _run(impl, spec, workload, trace) as (buf, record):
        state = State.of(buf, spec.capacity)
        trace.op(f"state = State.of(buf, {spec.capacity})")
        bad = torn_rows(state.rows, workload.totals)
        if bad:
            fail("rows held after the writers finished: torn or unwritten rows", bad, "none", trace)
        for what, got, want in ring_problems(state, workload.totals, final=True) + slot_problems(state, record.slots):
            fail(what, got, want, trace, f"tags in ring order: {_tags_in_order(state)}")


def _tags_in_order(state: State, limit: int = 24) -> str:
    order = [tags(state.rows[[i]])[0] for i in state.ring_order()]
    return str(order[:limit]) + (" ..." if len(order) > limit else "")


@pytest.mark.requires("concurrent", "stale_updates")
@given(data=st.data())
def test_concurrent_stale_updates_never_land_on_the_new_occupant(impl, data):
    """exact (up to the declared dtype's rounding): an updater samples, then
    calls update_priority(index, p, generation) while writers overwrite
    slots, and once more after they finish with a sample taken at the start
    (every slot of it overwritten if more than capacity rows came after).
    Each p is a function of the sampled row's tag. Afterwards every slot holds
    either its row's default priority (1.0, transformed) or the update made
    for THAT row, never one made for an earlier occupant."""
    # checked here, not in the marker: without stale_updates the reason is "not declared"
    reason = capability_skip_reason(impl, ("prioritized", *READBACK))
    if reason:
        pytest.skip(reason)
    workload = data.draw(workloads(updates=data.draw(st.integers(1, 6), label="updates")), label="workload")
    total = sum(workload.totals)
    spec = BufferSpec(capacity=data.draw(st.integers(2, max(2, total - 1)), label="capacity"),
                      sampler="prioritized", alpha=0.5, beta=0.4, eps=1e-6)
    trace = _trace(impl, spec)
    with _run(impl, spec, workload, trace) as (buf, record):
        state = State.of(buf, spec.capacity)
        rows = state.rows
        stored = torch.as_tensor(buf.stored_priority(torch.arange(state.length))).to(torch.float64)
        own = update_priority_of(rows.get("writer"), rows.get("seq"))
        as_updated = (own + spec.eps) ** spec.alpha
        default = (1.0 + spec.eps) ** spec.alpha
        rtol = 1e-6  # float32 trees store these values within 6e-8
        ok = torch.isclose(stored, as_updated, rtol=rtol, atol=0) | torch.isclose(
            stored, torch.full_like(stored, default), rtol=rtol, atol=0)
        if not bool(ok.all()):
            slot = int(torch.nonzero(~ok)[0])
            w, s = tags(rows[[slot]])[0]
            sources = [u for u in record.updates if slot in u.index.tolist()]
            fail(f"stored_priority of slot {slot} (row writer={w} seq={s})", float(stored[slot]),
                 f"{default:.9g} (its default) or {float(as_updated[slot]):.9g} (the update made for this row)",
                 trace, f"{len(sources)} updates named slot {slot}; a value from another row's update "
                        f"means an update for an earlier occupant landed on this one")


@pytest.mark.requires("concurrent")
@given(data=st.data())
def test_concurrent_sampling_matches_closed_form(impl, data):
    """distributional (false alarm FALSE_ALARM per case) and exact: writers
    fill the buffer, then M samplers draw at once. Pooled over all samplers,
    slot frequencies match 1/len (chi-square); each sampled row is the row
    held in the slot its index names; and no two batches are identical
    (samplers draw independently, not copies of one stream: the chance of a
    repeat among independent batches is below REPEAT_ALARM)."""
    workload = data.draw(workloads(max_samplers=3, samplers=data.draw(st.integers(2, 3), label="samplers"),
                                   sample_batch=DIST_BATCH, samples=data.draw(st.integers(8, 16), label="batches"),
                                   after_writers=True), label="workload")
    total = sum(workload.totals)
    spec = BufferSpec(capacity=data.draw(st.integers(2, max(2, min(total, 24))), label="capacity"),
                      seed=data.draw(st.integers(0, 2**16), label="seed"))
    trace = _trace(impl, spec)
    with _run(impl, spec, workload, trace) as (buf, record):
        state = State.of(buf, spec.capacity)
        counts = torch.zeros(state.length, dtype=torch.float64)
        held = tags(state.rows)
        for n, sample in enumerate(record.samples):
            index = torch.as_tensor(sample.info["index"]).reshape(-1).cpu()
            got = tags(sample.rows)
            want = [held[i] for i in index.tolist()]
            if got != want:
                fail(f"sample {n}: rows (writer, seq)", got[:8], f"{want[:8]}, the rows held at info['index']", trace)
            counts += torch.bincount(index, minlength=state.length).to(torch.float64)[: state.length]
        if state.length == 1:  # one row: every draw is slot 0 (exact)
            if counts[0] != counts.sum():
                fail("draws of slot 0 (the only row)", int(counts[0]), int(counts.sum()), trace)
        else:
            assert_chi_square("slot frequencies pooled over concurrent samplers", counts,
                              torch.full((state.length,), 1.0 / state.length), trace,
                              false_alarm=FALSE_ALARM)
        bound = repeat_bound(len(record.samples), DIST_BATCH, state.length)
        repeats = identical_batches(record.samples)
        if state.length > 1 and bound < REPEAT_ALARM and repeats:
            a, b = repeats[0]
            fail(f"identical index batches (samples {a} of sampler {record.samples[a].sampler} and "
                 f"{b} of sampler {record.samples[b].sampler})", len(repeats),
                 f"0: independent draws repeat a batch with probability < {bound:.1e}", trace)


@pytest.mark.requires("concurrent", "save_load")
@given(data=st.data())
def test_checkpoint_taken_during_writes_is_a_consistent_snapshot(impl, data):
    """exact: saves while K writers extend (one after another, up to
    MAX_SAVES while the writers run, each into its own directory) give
    checkpoints that each load into a new buffer holding a state the
    interleaving passed through: every row whole, len == min(write_count,
    capacity), cursor == write_count % capacity, and per writer a run of
    consecutive rows ending at its last row written by then. The loaded
    buffer samples whole rows and accepts writes (the next rows go to the
    next slots)."""
    workload = data.draw(workloads(checkpoint=True, saves=MAX_SAVES, max_extends=RACE_EXTENDS), label="workload")
    spec = BufferSpec(capacity=data.draw(capacities_for(workload), label="capacity"))
    trace = _trace(impl, spec)
    tmp = trace.directory(Path(tempfile.mkdtemp(prefix="rbcheck-concurrent-")))
    try:
        with _run(impl, spec, workload, trace, save_to=tmp / "ckpt") as (_, record):
            for n, path in enumerate(record.checkpoints):
                _check_snapshot(impl, spec, workload, trace, path, n, len(record.checkpoints))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_snapshot(impl, spec, workload, trace, path, n: int, count: int) -> None:
    """Checkpoint ``n`` (of ``count``), at ``path``, loads into a state the
    interleaving passed through, samples whole rows and accepts writes."""
    which = f"checkpoint {n} of {count}"
    loaded = trace.make(spec, f"loaded{n}")
    try:
        try:
            loaded.load(path)
        except Exception as err:  # noqa: BLE001
            fail(f"load of {which}, taken during writes", f"<raised {type(err).__name__}: {err}>",
                 "a buffer (the snapshot must be consistent)", trace)
        state = State.of(loaded, spec.capacity)
        bad = torn_rows(state.rows, workload.totals)
        if bad:
            fail(f"rows of {which}, taken during writes: torn or unwritten rows", bad, "none", trace)
        for what, got, want in ring_problems(state, workload.totals, final=False):
            fail(f"{which}: {what}", got, want, trace, f"tags in ring order: {_tags_in_order(state)}")
        rows, _ = loaded.sample(4)
        bad = torn_rows(rows, workload.totals)
        if bad:
            fail(f"sample of the loaded {which}: torn or unwritten rows", bad, "none", trace)
        extra = len(workload.writers)  # a new writer id
        n = 3
        rows = trace.name(make_rows(extra, 0, n, workload.width), f"make_rows({extra}, 0, {n}, {workload.width})")
        slots = torch.as_tensor(loaded.extend(rows)).reshape(-1).tolist()
        want = [(state.write_count + i) % spec.capacity for i in range(n)]
        if slots != want or loaded.write_count != state.write_count + n:
            fail(f"extend after loading {which}: (slots, write_count)", (slots, loaded.write_count),
                 (want, state.write_count + n), trace)
    finally:
        _close(loaded)
