"""A compressed storage gives back exactly what it was given (exact).

A storage that keeps its rows compressed (TorchRL's ``CompressedListStorage``)
is still a storage: after every call of a drawn sequence (extends across the
ring's wrap, adds, samples) the buffer under test, on
``storage="compressed"``, has the in-memory reference's length, cursor, write
count and contents, leaf for leaf with the same dtype, the same row shape and
the same bits, and every sampled row is the held row of its slot. The rows use
every bit of their dtype (``harness/bit_layout.py``: every dtype from bool to
bfloat16 and float64, full-range integers, -0.0, infinities, subnormals, row
shapes of rank 0..3 with size-0 dimensions), so a lossy cast or a flattened
shape cannot pass by luck.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, fail
from rbcheck.harness.bit_layout import bit_layouts
from rbcheck.harness.disk_checks import bookkeeping
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("compressed")


def _call(what: str, call, trace):
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - the buffer's error is the verdict
        fail(what, f"<raised {type(err).__name__}: {err}>", "the call taken (valid rows of the declared layout)",
             trace)


@given(data=st.data())
def test_compressed_storage_round_trips_every_dtype_and_shape(impl, reference_impl, data):
    """exact: after every call of a drawn sequence (extends of up to 2x the
    capacity, adds, samples) the buffer on storage="compressed" has the
    in-memory reference's (len, cursor, write_count) and contents, every leaf
    with the written dtype, row shape and bits (every dtype, full-range
    values, size-0 dimensions); each sampled row is the held row of its slot."""
    layout = data.draw(bit_layouts(), label="layout")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    spec = BufferSpec(capacity=capacity, sampler="random", seed=data.draw(st.integers(0, 99), label="seed"),
                      layout=layout.spec_layout(), storage="compressed")
    trace = Trace(impl, spec)
    trace.need("from rbcheck.harness.bit_layout import BitField, BitLayout")
    layout = trace.source("layout", layout)
    buf = trace.wrap(_call("make(spec)", lambda: impl.make(spec), trace))
    model = reference_impl.make(spec.but(storage="memory"))
    ops = data.draw(st.lists(st.one_of(st.tuples(st.just("extend"), st.integers(1, 2 * capacity)),
                                       st.tuples(st.just("add"), st.just(1)),
                                       st.tuples(st.just("sample"), st.integers(1, 4))),
                             min_size=1, max_size=8), label="operations")
    written = 0
    for kind, n in [("extend", data.draw(st.integers(1, 2 * capacity), label="first extend"))] + ops:
        if kind == "extend":
            _call(f"buf.extend(layout.batch({written}, {n}))", lambda w=written, k=n: buf.extend(layout.batch(w, k)),
                  trace)
            model.extend(layout.batch(written, n))
            written += n
        elif kind == "add":
            _call(f"buf.add(layout.row({written}))", lambda w=written: buf.add(layout.row(w)), trace)
            model.add(layout.row(written))
            written += 1
        else:
            rows, info = _call(f"buf.sample({n})", lambda k=n: buf.sample(k), trace)
            held = model.contents()
            assert_td_equal("sampled rows (vs the held rows of info['index'])", rows.cpu(),
                            held[info["index"].cpu()], trace, check_device=False)
        assert_same(f"(len, cursor, write_count) after {kind}", bookkeeping(buf), bookkeeping(model), trace)
        assert_td_equal(f"buf.contents() after {kind}", buf.contents(), model.contents(), trace, check_device=False)
