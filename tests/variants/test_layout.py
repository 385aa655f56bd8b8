"""The variants' CPU data layout: interleaved rows and ring generations.

Kinds (see docs/design.md, "Kinds of check"):
* exact: ``interleaved_columns`` gives every field its own bytes (writing one
  field changes no other), aligned, with contiguous rows; gathers from those
  strided columns equal ``index_select``; a storage filled by ``extend``,
  ``set`` or ``load_state_dict`` + ``repack`` holds interleaved rows and the same values as
  the reference's; ``DeviceWriter.generation_at`` equals ``generation[index]``
  for every write count (native and torch paths).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import native
from rbcheck.variants.device_storage import (
    DeviceStorage,
    DeviceWriter,
    gather_columns,
    interleaved_columns,
)

LAYOUT = {
    ("obs",): ((8,), torch.float32),
    ("flag",): ((), torch.bool),
    ("next", "obs"): ((2, 3), torch.float64),
    ("small",): ((3,), torch.int8),
    ("half",): ((1,), torch.float16),
    ("empty",): ((0,), torch.float32),
    ("count",): ((), torch.int64),
}


def test_interleaved_fields_are_disjoint_aligned_and_row_contiguous():
    cols = interleaved_columns(5, LAYOUT)
    assert list(cols) == list(LAYOUT), "columns should keep the layout's order"
    for key, (shape, dtype) in LAYOUT.items():
        col = cols[key]
        assert col.shape == (5, *shape) and col.dtype == dtype, key
        assert not col.any(), f"{key} should start zeroed"
        assert col.data_ptr() % col.element_size() == 0, f"{key} misaligned"
        if col.numel():
            assert native.row_layout(col) is not None, f"{key} rows should be contiguous"
    written = set()
    for key, col in cols.items():  # fill one field at a time: no other may change
        if not col.numel():
            continue
        col.fill_(1)
        written.add(key)
        for other, o in cols.items():
            assert bool(o.all()) if other in written else not o.any(), (key, other)
    shared = {c.untyped_storage().data_ptr() for c in cols.values() if c.numel()}
    assert len(shared) == 1, "fields with bytes should share one array of rows"


def test_gather_from_interleaved_columns_equals_index_select():
    g = torch.Generator().manual_seed(0)
    cols = interleaved_columns(300, LAYOUT)
    for col in cols.values():
        col.copy_((torch.rand(col.shape, generator=g) * 100).to(col.dtype))
    index = torch.randint(0, 300, (200,), generator=g)
    keys = list(cols)
    outs = [torch.empty((200, *cols[k].shape[1:]), dtype=cols[k].dtype) for k in keys]
    gather_columns([cols[k] for k in keys], index, outs)
    for key, out in zip(keys, outs, strict=True):
        assert torch.equal(out, torch.index_select(cols[key], 0, index)), key
    with pytest.raises((ValueError, IndexError)):
        gather_columns([cols[("obs",)]], torch.tensor([0, 300]), [torch.empty(2, 8)])


def rows(n: int, g: torch.Generator) -> TensorDict:
    return TensorDict({"obs": torch.randn(n, 8, generator=g), "flag": torch.rand(n, generator=g) < 0.5,
                       "next": {"obs": torch.randn(n, 2, 3, generator=g, dtype=torch.float64)}},
                      batch_size=[n])


def assert_interleaved(storage: DeviceStorage) -> None:
    cols = [c for _, c in storage._cols]
    assert len({c.untyped_storage().data_ptr() for c in cols}) == 1, "columns should be interleaved rows"


@pytest.mark.parametrize("how", ["write", "set", "load_state_dict"])
def test_storage_holds_interleaved_rows_with_the_reference_values(how):
    g = torch.Generator().manual_seed(1)
    data = rows(7, g)
    ref, var = reference.TensorStorage(10), DeviceStorage(10, "cpu")
    slots = torch.tensor([3, 4, 5, 6, 7, 8, 9])
    ref.set(slots, data)
    if how == "write":
        var.write(3, data)
    elif how == "set":
        var.set(slots, data)
    else:  # the buffer repacks once a load is accepted (a load never writes into held rows)
        var.load_state_dict(ref.state_dict(), len(ref))
        var.repack()
    assert_interleaved(var)
    state, want = var.state_dict(), ref.state_dict()
    assert state["keys"] == want["keys"]
    for got, exp in zip(state["columns"], want["columns"], strict=True):
        assert got.is_contiguous(), "state_dict should hand out ordinary contiguous tensors"
        assert torch.equal(got, exp)
    assert (var.get(slots) == ref.get(slots)).all()


@pytest.mark.parametrize("capacity", [1, 2, 5, 8, 1000])
@pytest.mark.parametrize("native_on", [True, False])
def test_ring_generation_equals_the_generation_column(capacity, native_on):
    g = torch.Generator().manual_seed(capacity)
    for count in sorted({0, 1, capacity - 1, capacity, capacity + 1, 2 * capacity, 3 * capacity + 2,
                         2**40 + 3, 2**40 * capacity}):
        writer = DeviceWriter(capacity)
        writer.load_state_dict({"write_count": count})
        index = torch.cat([torch.arange(capacity), torch.randint(0, capacity, (64,), generator=g)])
        if native_on and not native.available():
            pytest.skip(f"native path unavailable: {native.unavailable_reason()}")
        with native.suspended() if not native_on else contextlib.nullcontext():
            got = writer.generation_at(index)
        assert torch.equal(got, writer.generation[index]), (count, got, writer.generation[index])


def test_sample_reports_the_generations_the_writer_holds():
    g = torch.Generator().manual_seed(2)
    buffer = variants.ReplayBuffer(6, sampler=variants.PrioritizedSampler(6, 0.6, 0.4), generator=0,
                                   device="cpu")
    for n in (4, 3, 5):  # wraps the ring twice
        buffer.extend(rows(n, g))
        _, info = buffer.sample(32)
        assert torch.equal(info["generation"], buffer.writer.generation[info["index"]])
