"""Iterating a buffer and prefetching its samples (reference/iteration.py).

* iteration gives the batches that repeated ``sample()`` from the same state
  gives, in the same order: one epoch (to the end of the one in progress)
  with a without-replacement sampler, as many as asked otherwise;
* prefetching (``spec.prefetch = N``) never changes what ``sample()``
  returns: over drawn interleavings of writes, samples of varying sizes,
  priority updates, saves and loads, the stream equals the stream without
  prefetching, and every index is a held slot (checked first).

Both compare twin buffers built from one spec and fed the same calls, so
they need a seedable buffer (``exact_replay``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, assert_tensor_equal, fail
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.sampler_laws import sampler_rule
from rbcheck.harness.stateful import declared_samplers
from rbcheck.harness.strategies import Field, Layout

LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
SAMPLERS = ("random", "prioritized", "without_replacement", "consuming")


def sampler_spec(impl, data, capacity: int, **fields) -> BufferSpec:
    sampler = data.draw(st.sampled_from(declared_samplers(impl, SAMPLERS)), label="sampler")
    return BufferSpec(capacity=capacity, sampler=sampler, drop_last=data.draw(st.booleans(), label="drop_last"),
                      shuffle=data.draw(st.booleans(), label="shuffle"),
                      max_sample_count=data.draw(st.integers(1, 3), label="max_sample_count"),
                      seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT.spec_layout(), **fields)


def outcome(call):
    """``(rows, info)`` of ``call()``, or the name of the error it raised."""
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - compared with the twin's outcome
        return f"<raised {type(err).__name__}>"


def assert_same_batch(what: str, got, want, trace: Trace, held: int | None = None) -> None:
    """The two outcomes are the same error, or the same index and rows (index
    checked to be held slots of ``held`` first, when given)."""
    if isinstance(got, str) or isinstance(want, str):
        assert_same(what, got if isinstance(got, str) else "<a batch>", want if isinstance(want, str) else "<a batch>",
                    trace)
        return
    index = torch.as_tensor(got[1]["index"]).cpu()
    if held is not None and bool(((index < 0) | (index >= held)).any()):
        fail(f"info['index'] of {what}", index[(index < 0) | (index >= held)][:8], f"held slots in [0, {held})", trace)
    assert_tensor_equal(f"info['index'] of {what}", index, torch.as_tensor(want[1]["index"]).cpu(), trace)
    assert_td_equal(f"rows of {what}", got[0], want[0], trace, check_device=False)


@pytest.mark.requires("iteration")
@pytest.mark.exact_replay
@given(data=st.data())
def test_iteration_gives_the_batches_of_repeated_sample(impl, data):
    """exact (seedable): twins fed the same writes and samples; iterating one
    gives the batches repeated ``sample()`` gives the other, in order. With
    a without-replacement sampler the iteration stops at the end of the
    epoch in progress (a new one when none is): ``ceil(left / batch)``
    batches (``floor`` with drop_last); otherwise the first few are
    compared. Afterwards both draw the same next batch."""
    capacity = data.draw(st.integers(1, 512), label="capacity")
    rows = data.draw(st.integers(1, 2 * capacity), label="rows written")
    held = min(rows, capacity)
    batch = data.draw(st.integers(1, held + 2), label="batch size")
    spec = sampler_spec(impl, data, capacity, batch_size=batch)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    it, twin = trace.wrap(impl.make(spec)), trace.make(spec, "twin")
    it.extend(layout.batch(0, rows))
    twin.extend(layout.batch(0, rows))
    position = held  # rows of the epoch in progress drawn (held: none in progress)
    for _ in range(data.draw(st.integers(0, 3), label="samples before iterating")):
        first, second = outcome(lambda: it.sample(batch)), outcome(lambda: twin.sample(batch))
        assert_same_batch("a sample before iterating", first, second, trace, held)
        if not isinstance(first, str):
            position = 0 if position == held or (spec.drop_last and held - position < batch) else position
            position += min(batch, held - position)
    if spec.sampler == "without_replacement":
        left = held - position if position < held and not (spec.drop_last and held - position < batch) else held
        want_count = left // batch if spec.drop_last else -(-left // batch)
        got = []
        try:
            got.extend(it.iterate())
        except Exception as err:  # noqa: BLE001 - compared with the twin's outcome
            got.append(f"<raised {type(err).__name__}>")
        assert_same(f"batches of one epoch by iteration ({left} rows of the epoch left, batch {batch}, "
                    f"drop_last={spec.drop_last})", len(got), want_count, trace)
    else:
        want_count = data.draw(st.integers(1, 4), label="batches taken")
        iterator = it.iterate()
        got = [outcome(lambda: next(iterator)) for _ in range(want_count)]
    for k, batch_got in enumerate(got):
        assert_same_batch(f"batch {k} of the iteration (twin: sample() number {k})", batch_got,
                          outcome(lambda: twin.sample(batch)), trace, held)
        if isinstance(batch_got, str):
            break
    assert_same_batch("the sample after the iteration", outcome(lambda: it.sample(batch)),
                      outcome(lambda: twin.sample(batch)), trace, held)


@pytest.mark.requires("prefetch")
@pytest.mark.exact_replay
@given(data=st.data())
def test_prefetch_gives_the_stream_without_prefetch(impl, data):
    """exact (seedable): a buffer with ``prefetch = N`` (1 to 4) and its twin
    without, fed the same drawn calls (writes, samples of drawn sizes,
    priority updates, then a save, more calls, and a load of that earlier,
    smaller state, then more calls), return the same samples: the same
    indices (each checked first to be a held slot), rows and errors."""
    capacity = data.draw(st.integers(1, 256), label="capacity")
    spec = sampler_spec(impl, data, capacity)
    depth = data.draw(st.integers(1, 4), label="prefetch")
    # mostly one batch size (the queue is used), sometimes another (the queue is taken back)
    usual, other = data.draw(st.integers(1, 2 * capacity), label="batch size"), data.draw(st.integers(1, 8), label="other")
    if sampler_rule(impl.conventions, "prefetch_batches") == "constructor_size":  # declared: one size, built in
        other, spec = usual, spec.but(batch_size=usual)
    trace = Trace(impl, spec.but(prefetch=depth))
    layout = trace.source("layout", LAYOUT)
    buf, twin = trace.wrap(impl.make(spec.but(prefetch=depth))), trace.make(spec, "twin")
    written = [0]
    saving = impl.has("save_load")

    def calls(phase: str) -> None:
        for step in range(data.draw(st.integers(1, 8), label=f"calls {phase}")):
            kind = data.draw(st.sampled_from(["write", "sample", "sample", "update"]), label=f"call {phase} {step}")
            if kind == "write" or written[0] == 0:
                n = data.draw(st.integers(1, capacity + 1), label="rows written")
                buf.extend(layout.batch(written[0], n))
                twin.extend(layout.batch(written[0], n))
                written[0] += n
            elif kind == "update" and spec.sampler == "prioritized":
                slot = data.draw(st.integers(0, len(twin) - 1), label="slot updated")
                value = data.draw(st.sampled_from([0.5, 2.0, 8.0]), label="priority")
                priority = impl.conventions.priorities([value])
                buf.update_priority(torch.tensor([slot]), priority)
                twin.update_priority(torch.tensor([slot]), priority)
            else:
                size = data.draw(st.sampled_from([usual, usual, usual, other]), label="batch size")
                want = outcome(lambda: twin.sample(size))
                assert_same_batch(f"sample {phase} (prefetch={depth}; twin: no prefetch)",
                                  outcome(lambda: buf.sample(size)), want, trace, len(buf))

    calls("before the save")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = trace.directory(Path(tmp)) if saving else Path(tmp)
        if saving:
            buf.save(tmp / "a")
            twin.save(tmp / "b")
        calls("after the save")
        if saving:
            buf.load(tmp / "a")
            twin.load(tmp / "b")
        calls("after the load")
