"""Writers that choose which rows to keep, or keep none (exact).

* A max-value writer (TorchRL's ``TensorDictMaxValueWriter``) holds the
  ``capacity`` rows with the largest value of ``spec.value_key`` among every
  row ever written; a tie goes to the earlier-written row; a row it does not
  keep gets slot -1 from ``extend`` and is never held nor sampled.
* An immutable writer (TorchRL's ``ImmutableDatasetWriter``) refuses every
  write (extend, add, an in-place edit) with an error, and nothing changes:
  length, cursor, write count and contents. It is filled by a checkpoint load
  (with "save_load") and samples as any buffer.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_tensor_equal, fail
from rbcheck.harness.disk_checks import bookkeeping
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout, layouts, spec_layout

LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
VALUE_DTYPES = (torch.float32, torch.float64, torch.int64)


def top_k(ids: list[int], values: list[float], k: int) -> list[int]:
    """The ids of the top ``k`` rows, larger value first, ties to the earlier id."""
    return sorted(sorted(range(len(ids)), key=lambda j: (-values[j], ids[j]))[:k])


@pytest.mark.requires("max_value_writer")
@given(data=st.data())
def test_max_value_writer_holds_the_top_k_of_everything_written(impl, data):
    """exact: after every extend (values drawn from a few numbers, so ties
    are common) the held rows are the top ``capacity`` of all rows written by
    ``value_key``, ties to the earlier-written row; len == min(rows written,
    capacity), write count == rows written; extend gives each kept row the
    slot that now holds it and -1 to each row not kept; a sample returns only
    held rows."""
    capacity = data.draw(st.integers(1, 6), label="capacity")
    dtype = data.draw(st.sampled_from(VALUE_DTYPES), label="value dtype")
    batches = data.draw(st.lists(st.lists(st.integers(-2, 3), min_size=1, max_size=2 * capacity),
                                 min_size=1, max_size=6), label="values per extend")
    first = LAYOUT.batch(0, 1, value=torch.zeros(1, dtype=dtype))
    spec = BufferSpec(capacity=capacity, writer="max_value", value_key="value", seed=1, layout=spec_layout(first))
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    ids: list[int] = []
    values: list[float] = []
    for batch in batches:
        start, n = len(ids), len(batch)
        value = torch.tensor(batch, dtype=dtype)
        index = torch.as_tensor(buf.extend(layout.batch(start, n, value=value))).cpu()
        ids += range(start, start + n)
        values += [float(v) for v in batch]
        want = top_k(ids, values, capacity)
        assert_same("len(buf)", len(buf), min(len(ids), capacity), trace)
        assert_same("buf.write_count", buf.write_count, len(ids), trace)
        held = buf.contents()["id"].cpu()
        assert_same("sorted ids held (the top capacity by value, ties to the earlier row)",
                    sorted(held.tolist()), want, trace)
        kept = [start + j in want for j in range(n)]
        for j in range(n):
            slot = int(index[j])
            if not kept[j]:
                assert_same(f"extend's slot of row {start + j} (not kept)", slot, -1, trace)
            elif not 0 <= slot < len(held) or int(held[slot]) != start + j:
                fail(f"extend's slot of row {start + j} (kept)", slot,
                     f"the slot holding it ({held.tolist().index(start + j)})", trace)
        rows, info = buf.sample(8)
        stray = sorted(set(rows["id"].cpu().tolist()) - set(want))
        assert_same("sampled ids not held", stray, [], trace)


def attempt_write(buf, what: str, call, trace) -> None:
    """``call()`` must raise and leave the buffer's bookkeeping and contents as they were."""
    before = bookkeeping(buf)
    contents = buf.contents() if len(buf) else None
    try:
        call()
    except Exception:  # noqa: BLE001 - any error is a refusal
        pass
    else:
        fail(f"{what} on an immutable buffer", "<returned>", "an error (writes are refused)", trace)
    assert_same(f"(len, cursor, write_count) after the refused {what}", bookkeeping(buf), before, trace)
    if contents is not None:
        for key, value in contents.items(include_nested=True, leaves_only=True):
            assert_tensor_equal(f"buf.contents()[{key!r}] after the refused {what}", buf.contents()[key],
                                value, trace, check_device=False)


@pytest.mark.requires("immutable_writer")
@given(data=st.data())
def test_immutable_writer_refuses_every_write_and_nothing_changes(impl, tmp_path_factory, data):
    """exact: an immutable buffer (filled from a checkpoint of a round-robin
    buffer when "save_load" is declared, else empty) refuses each drawn write
    -- extend, add, and an edit with "edit" -- with an error, and its length,
    cursor, write count and contents stay as they were; it samples its rows."""
    layout = data.draw(layouts(max_fields=2), label="layout")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    rows = data.draw(st.integers(1, 2 * capacity), label="rows in the checkpoint")
    writes = data.draw(st.lists(st.sampled_from(["extend", "add", "edit"]), min_size=1, max_size=5), label="writes")
    spec = BufferSpec(capacity=capacity, writer="immutable", seed=2, layout=layout.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = trace.wrap(impl.make(spec))
    if impl.has("save_load"):
        path = trace.directory(tmp_path_factory.mktemp("dataset")) / "ckpt"
        source = trace.make(spec.but(writer="round_robin"), "src")
        source.extend(layout.batch(0, rows))
        source.save(path)
        buf.load(path)
        assert_same("(len, cursor, write_count) after the load", bookkeeping(buf), bookkeeping(source), trace)
    for i, kind in enumerate(writes):
        start = 10**6 + i
        if kind == "extend":
            attempt_write(buf, f"buf.extend(layout.batch({start}, 2))", lambda s=start: buf.extend(layout.batch(s, 2)), trace)
        elif kind == "add":
            attempt_write(buf, f"buf.add(layout.row({start}))", lambda s=start: buf.add(layout.row(s)), trace)
        elif impl.has("edit") and len(buf):
            attempt_write(buf, f"buf.set([0], layout.batch({start}, 1))",
                          lambda s=start: buf.set([0], layout.batch(s, 1)), trace)
    if len(buf):
        got, _ = buf.sample(4)
        stray = sorted(set(got["id"].cpu().tolist()) - set(buf.contents()["id"].cpu().tolist()))
        assert_same("sampled ids not held", stray, [], trace)
