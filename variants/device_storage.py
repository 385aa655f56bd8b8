"""Device-resident storage and ring writer: the reference's ``TensorStorage`` and
``RoundRobinWriter`` with batch writes as slices and fast gathers.

Contract (the reference's, plus)
--------
* ``DeviceStorage(capacity, device)`` is a ``reference.TensorStorage`` (same
  lazy allocation, layout checks, ``get``/``set`` semantics, ``state_dict``).
  ``write(first_slot, data)`` copies a batch of ``n`` rows to the slots
  ``first_slot, first_slot + 1, ...`` modulo capacity: per field ONE copy, or
  two when the batch wraps the ring end (only the last ``capacity`` rows of
  an oversized batch are copied: they are the ones that survive). No loop
  per row.
* ``gather(index)`` (used by the buffer's ``sample``; ``get`` is the checked
  version) is one ``index_select(..., out=)`` per field into memory from a
  ``TensorPool``, wrapped in a TensorDict. Fresh host memory is slow here
  (page faults: a 4096-row gather of obs[8], action[2], reward[1] took
  ~480 us into new tensors and ~125 us into reused ones), but handing out
  the same buffer every time would let the next sample overwrite one the
  user still holds. The pool reuses a buffer only when nothing outside the
  pool references its memory any more (no tensor, view or TensorDict of a
  previous sample is alive), otherwise it allocates a new one: the sample
  behaves like fresh memory and costs like reused memory in a training loop.
  On the CPU the copies are one C call (``variants.native``: prefetched
  row copies, ~2-3x faster than ``index_select`` here) when it loads.
* ``version`` increases on every write or load; samplers that keep
  bookkeeping about the data use it to notice writes they did not see.
* ``DeviceWriter(capacity, device)`` is a ``reference.RoundRobinWriter`` whose
  ``generation`` lives on the device and is updated with at most two slices.

Cost: ``write`` O(n * row size); ``gather`` O(B * row size); memory as the
reference.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from reference.storage import TensorStorage, as_tensor, check_index, columns
from reference.writer import RoundRobinWriter

from . import native


def check_index_fast(index, high: int, name: str = "index") -> torch.Tensor:
    """``reference.storage.check_index`` without its boolean-mask gather on the
    happy path (two reductions instead) and keeping the index on its device;
    the same errors, raised by the reference's function."""
    index = as_tensor(index, name)  # the reference's conversion (rejects unreadable devices)
    if not (index.is_floating_point() or index.is_complex() or index.dtype == torch.bool) \
            and index.dim() == 1:
        index = index.long()
        if not len(index):
            return index
        if native.usable(index):  # one pass in C instead of two reductions
            if native.index_in_range(index, high):
                return index
        elif int(index.min()) >= 0 and int(index.max()) < high:
            return index
    return check_index(index, high, name)


def gather_columns(columns, index: torch.Tensor, outs) -> None:
    """``outs[c] = columns[c][index]`` (rows): one C call with prefetching for
    contiguous CPU tensors when ``variants.native`` loads, else one
    ``index_select(..., out=)`` per column. Both check the index's bounds."""
    if columns and index.dtype == torch.long and native.usable(index, *columns, *outs):
        native.gather_rows(columns, index, outs)
        return
    for column, out in zip(columns, outs, strict=True):
        torch.index_select(column, 0, index, out=out)


def default_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def ring_slices(first: int, n: int, capacity: int):
    """``[(slot_start, slot_stop, row_start, row_stop)]``: where rows ``0..n-1``
    written from slot ``first`` land, keeping only the last ``capacity`` rows."""
    skip = max(n - capacity, 0)
    first, n = (first + skip) % capacity, n - skip
    head = min(n, capacity - first)
    out = [(first, first + head, skip, skip + head)]
    if head < n:
        out.append((0, n - head, skip + head, skip + n))
    return out


class TensorPool:
    """Reusable output tensors that are never handed out while still referenced.

    ``take(key, shape, dtype, device)`` returns an alias of a pooled tensor
    whose memory no live tensor outside the pool shares (checked with the
    storage's reference count), or a new tensor (kept for reuse, up to
    ``per_key`` of them). Without the reference count (another torch), every
    call allocates: correct, only slower.
    """

    def __init__(self, per_key: int = 4):
        self.per_key = per_key
        self.slots: dict = {}

    @staticmethod
    def _count(tensor: torch.Tensor) -> int:
        return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)

    @classmethod
    def _alone(cls) -> int | None:
        """The reference count of memory held by one tensor only, or None when
        the count does not behave as relied on (then nothing is ever reused)."""
        if not hasattr(cls, "_alone_count"):
            cls._alone_count = None
            try:
                probe = torch.empty(1)
                alone = cls._count(probe)
                alias = probe.detach()
                view = probe[:1]
                if cls._count(probe) == alone + 2:
                    del alias, view
                    if cls._count(probe) == alone:
                        cls._alone_count = alone
            except (AttributeError, RuntimeError):  # pragma: no cover - another torch
                pass
        return cls._alone_count

    def _free(self, tensor: torch.Tensor) -> bool:
        alone = self._alone()
        return alone is not None and self._count(tensor) <= alone

    def take(self, key, shape, dtype, device) -> torch.Tensor:
        slot = self.slots.setdefault((key, tuple(shape), dtype, torch.device(device)), [])
        for tensor in slot:
            if self._free(tensor):
                return tensor.detach()  # a new alias: holding it marks the memory as used
        tensor = torch.empty(shape, dtype=dtype, device=device)
        if len(slot) < self.per_key:
            slot.append(tensor)
        return tensor.detach()


class DeviceStorage(TensorStorage):
    """Reference storage on a device, with ring-slice writes (see module doc)."""

    def __init__(self, capacity: int, device: str | torch.device | None = None):
        super().__init__(capacity, default_device() if device is None else device)
        self.version = 0
        self._cols: list[tuple[tuple[str, ...], torch.Tensor]] = []
        self.pool = TensorPool()

    def _refresh(self) -> None:
        self._cols = list(columns(self.data).items()) if self.data is not None else []
        self.version += 1

    def _allocate(self, data: TensorDictBase) -> None:
        self.data = TensorDict({}, batch_size=[self.capacity], device=self.device)
        for key, value in columns(data).items():
            shape = (self.capacity, *value.shape[1:])
            if self.device.type == "cpu":  # huge pages: random row gathers miss the TLB less
                column = native.empty_huge(shape, value.dtype).zero_()
            else:
                column = torch.zeros(shape, dtype=value.dtype, device=self.device)
            self.data.set(key, column)

    def write(self, first: int, data: TensorDictBase, checked: bool = False) -> None:
        """Rows of ``data`` to slots ``first, first + 1, ...`` (mod capacity); checked
        here unless the caller already did (``checked=True``)."""
        if not checked:
            self.check(data)
        if self.data is None:
            self._allocate(data)
            self._refresh()
        n = data.batch_size[0]
        source = columns(data)
        for key, column in self._cols:
            value = source[key]
            for s0, s1, r0, r1 in ring_slices(first, n, self.capacity):
                column[s0:s1].copy_(value[r0:r1])
        self.size = max(self.size, min(first + n, self.capacity))  # a ring writer fills 0, 1, ...
        self.version += 1

    def set(self, index, data: TensorDictBase) -> None:
        super().set(index, data)
        self._refresh()

    def get(self, index) -> TensorDictBase:
        return self.gather(check_index_fast(index, self.size).to(self.device))

    def gather(self, index: torch.Tensor, extra=()) -> TensorDictBase:
        """The rows at ``index`` (unchecked: the caller guarantees ``0 <= index < size``);
        ``extra``: ``(column, out)`` pairs gathered at ``index`` in the same pass
        (the buffer's writer generations)."""
        index = index.to(self.device)
        batch = torch.Size([len(index)])
        tree: dict = {}
        outs = []
        for key, column in self._cols:
            node = tree
            for part in key[:-1]:
                node = node.setdefault(part, {})
            out = self.pool.take(key, (len(index), *column.shape[1:]), column.dtype, column.device)
            outs.append(out)
            node[key[-1]] = out
        gather_columns([column for _, column in self._cols] + [c for c, _ in extra], index,
                       outs + [o for _, o in extra])
        return _to_tensordict(tree, batch, self.device)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._refresh()


def _to_tensordict(tree: dict, batch: torch.Size, device) -> TensorDictBase:
    source = {k: _to_tensordict(v, batch, device) if isinstance(v, dict) else v
              for k, v in tree.items()}
    try:  # skips the constructor's checks: every leaf was built with the right shape
        return TensorDict._new_unsafe(source, batch_size=batch, device=device)
    except (AttributeError, TypeError):  # pragma: no cover - older/newer tensordict
        return TensorDict(source, batch_size=batch, device=device)


class DeviceWriter(RoundRobinWriter):
    """Reference ring writer with ``generation`` on the device (see module doc)."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        super().__init__(capacity)
        self.device = torch.device(device)
        self.generation = self.generation.to(self.device)

    def next_indices(self, n: int) -> torch.Tensor:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r}, but should be an int >= 1")
        index = (self.cursor + torch.arange(n, device=self.device)) % self.capacity
        for s0, s1, r0, _ in ring_slices(self.cursor, n, self.capacity):
            self.generation[s0:s1] = torch.arange(self.write_count + r0,
                                                  self.write_count + r0 + s1 - s0, device=self.device)
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.generation = self.generation.to(self.device)
