"""Rows whose values use every bit of their dtype, for storages that transform rows
(compress, serialise, map to disk) and must give them back exactly.

:class:`Layout`'s values are small numbers (``id * 64 + offset``, floats in quarters): exact
in float32, in int32, in float16 for small ids, so a storage that casts a float64 column to
float32, or an int64 one to int32, still gives them back. A :class:`BitLayout` draws each
element's bytes from a generator seeded by the row id and the field (the same row every
time): floats over their whole range with -0.0, +-inf, the smallest subnormal and the
largest finite value mixed in (no NaN: an exact comparison cannot hold it), integers over
their whole range, bool 0/1. Dtypes include float16, bfloat16, int8 and int16, and row
shapes may hold a size-0 dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.strategies import ID_KEY

#: Every dtype a row may hold here.
BIT_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def _specials(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    return torch.tensor([-0.0, math.inf, -math.inf, info.smallest_normal / 2 ** 3, info.max], dtype=torch.float64
                        ).to(dtype)


@dataclass(frozen=True)
class BitField:
    """One leaf: a (possibly nested) key, a row shape and a dtype name of :data:`BIT_DTYPES`."""

    key: tuple[str, ...]
    shape: tuple[int, ...] = ()
    dtype: str = "float64"

    def row(self, i: int, salt: int) -> torch.Tensor:
        """Row ``i``'s value: the same bits for the same ``(i, salt)``."""
        dtype = getattr(torch, self.dtype)
        numel = math.prod(self.shape)
        gen = torch.Generator().manual_seed(i * 1009 + salt)
        if dtype is torch.bool:
            return torch.randint(0, 2, self.shape, generator=gen).to(torch.bool)
        raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
        value = raw.view(dtype).reshape(self.shape)
        if dtype.is_floating_point and numel:
            flat = value.reshape(-1).clone()
            pick = torch.randint(0, 4, (numel,), generator=gen) == 0  # a quarter of them special
            specials = _specials(dtype)
            flat[pick] = specials[torch.arange(numel)[pick] % len(specials)]
            nan = torch.isnan(flat)
            flat[nan] = specials[torch.arange(numel)[nan] % len(specials)]
            value = flat.reshape(self.shape)
        return value


@dataclass(frozen=True)
class BitLayout:
    """The rows: int64 ``id`` and :class:`BitField` leaves (see module doc)."""

    fields: tuple[BitField, ...] = ()

    def batch(self, start: int, n: int) -> TensorDict:
        ids = torch.arange(start, start + n, dtype=torch.int64)
        td = TensorDict({ID_KEY: ids}, batch_size=[n])
        for salt, f in enumerate(self.fields):
            key = f.key if len(f.key) > 1 else f.key[0]
            rows = [f.row(i, salt + 1) for i in range(start, start + n)]
            td.set(key, torch.stack(rows) if rows else torch.empty((0, *f.shape), dtype=getattr(torch, f.dtype)))
        return td

    def row(self, i: int) -> TensorDict:
        return self.batch(i, 1)[0]

    def spec_layout(self) -> dict:
        out: dict = {ID_KEY: ((), torch.int64)}
        for f in self.fields:
            out[f.key if len(f.key) > 1 else f.key[0]] = (tuple(f.shape), getattr(torch, f.dtype))
        return out


@st.composite
def bit_layouts(draw: st.DrawFn, max_fields: int = 4) -> BitLayout:
    """One field of every dtype of :data:`BIT_DTYPES` (its key drawn, some nested under
    ``"next"``), then up to ``max_fields`` more of drawn dtypes; row shapes of rank 0..3 with
    dimensions 0..3."""
    shape = st.lists(st.integers(0, 3), max_size=3).map(tuple)
    nest = st.sampled_from([(), ("next",)])
    every = [BitField(draw(nest, label=f"{dtype} nested") + (dtype,), draw(shape, label=f"{dtype} shape"), dtype)
             for dtype in BIT_DTYPES]
    names = st.sampled_from(["obs", "action", "reward", "mask", "pixels"])
    field = st.builds(BitField, st.tuples(nest, names).map(lambda p: p[0] + (p[1],)), shape,
                      st.sampled_from(BIT_DTYPES))
    more = draw(st.lists(field, max_size=max_fields, unique_by=lambda f: f.key), label="more fields")
    return BitLayout(tuple(every + more))


__all__ = ["BIT_DTYPES", "BitField", "BitLayout", "bit_layouts"]
