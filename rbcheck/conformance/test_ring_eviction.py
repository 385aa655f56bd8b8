"""Ring buffer bookkeeping: which slot each row goes to, what is evicted,
cursor, length and write count -- against the reference and the closed form."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, assert_tensor_equal
from rbcheck.harness.strategies import capacities, layouts, operations, specs


@given(data=st.data())
def test_ring_eviction_matches_reference_and_closed_form(impl, reference_impl, data):
    """exact: after every extend / add / sample, len == min(write_count,
    capacity), cursor == write_count % capacity, the slots returned are the
    next ones round the ring, and contents equal both the reference's and
    the closed form (slot s holds the last row id written with id % capacity
    == s), bit-identical."""
    spec = data.draw(specs(("random",), capacity=capacities(1, 12)), label="spec")
    layout = data.draw(layouts(), label="layout")
    ops = data.draw(operations(spec.capacity, max_ops=14), label="operations")
    trace = Trace(impl, spec)
    trace.let("layout", layout)
    buf, ref = impl.make(spec), reference_impl.make(spec)
    written = 0
    cap = spec.capacity
    for op in ops:
        if op[0] == "extend":
            n = op[1]
            trace.op(f"buf.extend(layout.batch({written}, {n}))")
            got = buf.extend(layout.batch(written, n))
            ref.extend(layout.batch(written, n))
            want = torch.arange(written, written + n, dtype=torch.int64) % cap
            assert_tensor_equal("extend(...) slots", torch.as_tensor(got).cpu(), want, trace)
            written += n
        elif op[0] == "add":
            trace.op(f"buf.add(layout.row({written}))")
            slot = buf.add(layout.row(written))
            ref.add(layout.row(written))
            assert_same("add(...) slot", int(slot), written % cap, trace)
            written += 1
        else:
            trace.op(f"buf.sample({op[1]})")
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
