"""Ring buffer bookkeeping: which slot each row goes to, what is evicted,
cursor, length and write count -- against the reference and the closed form;
the last ``capacity`` rows kept for any batch size; a new buffer holds
nothing it was not given, even after another buffer of the same
description was filled, saved and dropped."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import (
    Field,
    Layout,
    capacities,
    layouts,
    operations,
    specs,
    training_batch_sizes,
)


@given(data=st.data())
def test_ring_eviction_matches_reference_and_closed_form(impl, reference_impl, data):
    """exact: after every extend / add / sample, len == min(write_count,
    capacity), cursor == write_count % capacity, the slots returned are the
    next ones round the ring, and contents equal both the reference's and
    the closed form (slot s holds the last row id written with id % capacity
    == s), bit-identical. Capacities from 1 to 2**16 (4097, 40000 and
    2**16 beside the small ones), samples of 1 to 4096 rows."""
    spec = data.draw(specs(("random",), capacity=capacities(1, 12, large=True)), label="spec")
    layout = data.draw(layouts(), label="layout")
    ops = data.draw(operations(spec.capacity, max_ops=14, sample_sizes=training_batch_sizes()),
                    label="operations")
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf, ref = trace.wrap(impl.make(spec)), reference_impl.make(spec)
    written = 0
    cap = spec.capacity
    for op in ops:
        if op[0] == "extend":
            n = op[1]
            got = buf.extend(layout.batch(written, n))
            ref.extend(layout.batch(written, n))
            want = torch.arange(written, written + n, dtype=torch.int64) % cap
            assert_tensor_equal("extend(...) slots", torch.as_tensor(got).cpu(), want, trace)
            written += n
        elif op[0] == "add":
            slot = buf.add(layout.row(written))
            ref.add(layout.row(written))
            assert_same("add(...) slot", int(slot), written % cap, trace)
            written += 1
        else:
            buf.sample(op[1])
        assert_same("buf.write_count", buf.write_count, written, trace)
        assert_same("len(buf)", len(buf), min(written, cap), trace)
        assert_same("buf.cursor", buf.cursor, written % cap, trace)
        assert_same("buf.cursor vs reference", buf.cursor, ref.cursor, trace)
        contents = buf.contents()
        assert_td_equal(
            "buf.contents() vs reference", contents, ref.contents(), trace, check_device=False
        )
        size = min(written, cap)
        newest = torch.arange(written - size, written, dtype=torch.int64)
        want_ids = torch.empty(size, dtype=torch.int64)
        want_ids[newest % cap] = newest
        assert_tensor_equal(
            "buf.contents()['id'] (slot s = newest row with id % capacity == s)",
            contents["id"].cpu(),
            want_ids,
            trace,
        )


#: batch sizes as (multiple of capacity, offset): 1, cap - 1, cap, cap + 1, 2 cap, 2 cap + 1, 3 cap + 2
SIZES = {"1": (0, 1), "cap-1": (1, -1), "cap": (1, 0), "cap+1": (1, 1), "2cap": (2, 0),
         "2cap+1": (2, 1), "3cap+2": (3, 2)}
RING_SIZES = st.sampled_from(sorted(SIZES))


def _size(name: str, cap: int) -> int:
    times, offset = SIZES[name]
    return max(1, times * cap + offset)


@given(capacity=st.integers(1, 9),
       sizes=st.lists(RING_SIZES, min_size=1, max_size=5, unique=False),
       empty_first=st.booleans())
@example(capacity=40000, sizes=["cap-1", "cap+1"], empty_first=False)  # past slot 2**15, not a power of 2
@example(capacity=2**16, sizes=["cap+1", "1"], empty_first=True)
@example(capacity=4097, sizes=["2cap+1", "cap"], empty_first=False)
def test_ring_keeps_the_last_capacity_rows_for_any_batch_size(impl, capacity, sizes, empty_first):
    """exact: after extends of 1, capacity - 1, capacity, capacity + 1, 2 x
    capacity, more than 2 x capacity rows (in any order) the buffer holds
    exactly the last ``capacity`` rows written, slot s the newest row with
    id % capacity == s; len, cursor and write count follow; an empty batch
    is refused or ignored, and changes nothing. Capacities from 1 to 2**16:
    small ones drawn, and 4097, 40000 and 2**16 as fixed examples (rings of
    a real run, past slot 2**15)."""
    spec = BufferSpec(capacity=capacity, sampler="random", seed=3, layout=LAYOUT.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    written = 0
    steps = (["empty"] if empty_first else []) + sizes + ["empty"]
    for step in steps:
        if step == "empty":
            before = (len(buf), buf.cursor, buf.write_count)
            trace.note("an empty batch")
            try:
                buf.extend(layout.batch(written, 0))
            except Exception:  # noqa: BLE001 - refusing an empty batch is allowed
                pass
            after = (len(buf), buf.cursor, buf.write_count)
            assert_same("(len, cursor, write_count) after an empty batch", after, before, trace)
        else:
            n = _size(step, capacity)
            trace.note(f"{step} rows")
            try:
                buf.extend(layout.batch(written, n))
            except Exception as err:  # noqa: BLE001 - any batch size must be taken
                fail(f"buf.extend of {n} rows", f"{type(err).__name__}: {err}",
                     "the rows written (any batch size)", trace)
            written += n
        size = min(written, capacity)
        assert_same("buf.write_count", buf.write_count, written, trace)
        assert_same("len(buf)", len(buf), size, trace)
        assert_same("buf.cursor", buf.cursor, written % capacity, trace)
        if size:
            newest = torch.arange(written - size, written, dtype=torch.int64)
            want = torch.empty(size, dtype=torch.int64)
            want[newest % capacity] = newest
            assert_tensor_equal("buf.contents()['id'] (slot s: newest id with id % capacity == s)",
                                buf.contents()["id"].cpu(), want, trace)


LAYOUT = Layout((Field(("obs",), (2,), "float32"),))


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_new_buffer_holds_nothing_it_was_not_given(impl, sampler, tmp_path):
    """exact: after a buffer of the same description was filled (and saved,
    when save_load is declared) and dropped, or while it still lives, a new
    buffer has len 0, cursor 0, write count 0, refuses to sample, and after
    k rows holds exactly those k rows."""
    if not impl.has(sampler):
        pytest.skip(f"not declared: {sampler}")
    spec = BufferSpec(capacity=6, sampler=sampler, seed=9, layout=LAYOUT.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    trace.directory(tmp_path)
    old = trace.make(spec, "old")
    old.extend(layout.batch(1000, 6))
    if impl.has("save_load"):
        old.save(tmp_path / "old")
    for alive in (True, False):
        if not alive:
            del old
            gc.collect()
            trace.op("del old; import gc; gc.collect()")
        trace.note(f"a new buffer of the same description, the first one {'alive' if alive else 'dropped'}")
        buf = trace.make(spec, "buf")
        state = (len(buf), buf.cursor, buf.write_count)
        assert_same("(len, cursor, write_count) of a new buffer", state, (0, 0, 0), trace)
        try:
            buf.sample(2)
        except Exception:  # noqa: BLE001 - an empty buffer must refuse
            pass
        else:
            fail("buf.sample(2) on a new buffer", "<returned a batch>", "an error: the buffer is empty", trace)
        buf.extend(layout.batch(0, 2))
        assert_same("len(buf)", len(buf), 2, trace)
        assert_td_equal("buf.contents()", buf.contents(), LAYOUT.batch(0, 2), trace, check_device=False)
