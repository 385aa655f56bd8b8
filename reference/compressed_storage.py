"""Rows kept compressed: ``TensorStorage``'s contract with every row's leaves as zlib bytes.

Contract
--------
* ``CompressedStorage(capacity)`` keeps ``storage.TensorStorage``'s contract (the same contents
  after any sequence of calls, the same errors, the same state dict). Each held row is one
  ``bytes`` per leaf: the leaf's raw bytes (``view(torch.uint8)``, so every dtype, bool, float16
  and bfloat16 included, and -0.0, inf and subnormals, keeps its exact bit pattern) through
  ``zlib.compress``. The dtype and row shape come from the layout the first write fixed, so a
  row decompresses to exactly the tensor it was: same dtype, same shape (a size-0 dimension
  included), same bits.
* ``get(index)`` decompresses the rows asked for into a new TensorDict (a copy). ``data`` is the
  whole storage decompressed (unwritten slots zero), for what reads columns (the slice sampler,
  ``state_dict``); assigning ``data`` (a load) compresses every row of it.
* CPU only: the bytes live in host memory.

Cost: ``set`` O(len(index) * row size) compression; ``get`` O(len(index) * row size)
decompression; ``data`` O(capacity * row size); memory: the compressed rows.
"""

from __future__ import annotations

import math
import zlib

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference.arguments import check_index, check_int, last_occurrence
from rbcheck.reference.storage import TensorStorage, columns, layout_of


def compress(value: torch.Tensor) -> bytes:
    """The exact bytes of one row's leaf, compressed."""
    return zlib.compress(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def decompress(blob: bytes, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The leaf ``compress`` was given: ``shape``, ``dtype``, bit for bit."""
    raw = zlib.decompress(blob)
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"decompressed bytes={len(raw)}, but should be {math.prod(shape) * dtype.itemsize} "
                         f"for shape {list(shape)} and {dtype}")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


class CompressedStorage(TensorStorage):
    """A ring of rows, each leaf kept as compressed bytes (see module doc)."""

    def __init__(self, capacity: int, device="cpu"):
        self.capacity = check_int("capacity", capacity)
        self.device = torch.device(device)
        if self.device.type != "cpu":
            raise ValueError(f"device={device}, but should be cpu (the compressed rows are host bytes)")
        self.layout: dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]] = {}  # {} until a write
        self.rows: list[dict[tuple[str, ...], bytes] | None] = [None] * self.capacity
        self.size = 0

    def _row(self, slot: int) -> dict[tuple[str, ...], torch.Tensor]:
        blobs = self.rows[slot]
        if blobs is None:  # an unwritten slot reads as zeros, as TensorStorage's do
            return {key: torch.zeros(shape, dtype=dtype) for key, (shape, dtype) in self.layout.items()}
        return {key: decompress(blobs[key], shape, dtype) for key, (shape, dtype) in self.layout.items()}

    def _rows(self, slots: list[int]) -> TensorDictBase | None:
        if not self.layout:
            return None
        out = TensorDict({}, batch_size=[len(slots)])
        rows = [self._row(slot) for slot in slots]
        for key, (shape, dtype) in self.layout.items():
            out.set(key, torch.stack([row[key] for row in rows]) if rows else torch.empty((0, *shape), dtype=dtype))
        return out

    @property
    def data(self) -> TensorDictBase | None:
        """Every slot decompressed (unwritten ones zero); None before the first write."""
        return self._rows(list(range(self.capacity)))

    @data.setter
    def data(self, value: TensorDictBase | None) -> None:
        """Replace every slot by the rows of ``value`` (a full-capacity TensorDict), compressed."""
        self.layout = layout_of(value)
        cols = columns(value)
        self.rows = [None] * self.capacity if value is None else \
            [{key: compress(col[slot]) for key, col in cols.items()} for slot in range(self.capacity)]

    def check(self, data: TensorDictBase) -> None:
        """``TensorStorage.check`` against the layout alone (nothing decompressed)."""
        probe = TensorStorage(self.capacity, self.device)
        probe.data = self._rows([])  # no rows, this storage's keys, row shapes and dtypes
        probe.check(data)

    def set(self, index, data: TensorDictBase) -> None:
        """Compress the rows of ``data`` into the slots ``index`` (last row wins on repeats)."""
        index = check_index(index, self.capacity)
        self.check(data)
        if len(index) != data.batch_size[0]:
            raise ValueError(f"len(index)={len(index)}, but should be len(data)={data.batch_size[0]}")
        if not self.layout:
            self.layout = layout_of(data)
        cols = columns(data)
        keep = torch.nonzero(last_occurrence(index, self.capacity)).reshape(-1).tolist()
        compressed = {int(index[i]): {key: compress(col[i]) for key, col in cols.items()} for i in keep}
        for slot, blobs in compressed.items():  # every row compressed before any slot changes
            self.rows[slot] = blobs
        self.size = max(self.size, int(index.max()) + 1)

    def get(self, index) -> TensorDictBase:
        """The rows at ``index``, decompressed (a copy)."""
        return self._rows(check_index(index, self.size).tolist())
