"""Device-resident storage and ring writer: the reference's ``TensorStorage`` and
``RoundRobinWriter`` with batch writes as slices and fast gathers.

Contract (the reference's, plus)
--------
* ``DeviceStorage(capacity, device)`` is a ``reference.TensorStorage`` (same
  lazy allocation, layout checks, ``get``/``set`` semantics, ``state_dict``).
  On the CPU its columns are fields of one array of rows
  (``interleaved_columns``: strided views, rows contiguous), so a random row
  is one or two cache lines, not one per field; ``state_dict`` clones them
  into ordinary contiguous tensors, and columns made by ``set`` are moved
  into such rows; columns made by ``load_state_dict`` are moved by
  ``repack()``, which the buffer calls once a load is accepted (a load never
  writes into rows it already holds: a shallow copy may share them).
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
  On the CPU the copies are one C call (``rbcheck.variants.native``: prefetched
  row copies, ~2-3x faster than ``index_select`` here) when it loads.
* ``state_view()`` is ``state_dict()`` without its clone (the columns as views of the
  rows: what a save streams to disk), and ``load_state_dict`` adopts columns given as
  ``FreshColumns`` (a checkpoint just read into new memory) instead of cloning them; when
  they are already new interleaved rows (``packed``: a checkpoint read straight into
  them) they become this storage's rows, nothing moved.
* ``version`` increases on every write or load; samplers that keep
  bookkeeping about the data use it to notice writes they did not see.
* ``DeviceWriter(capacity, device)`` is a ``reference.RoundRobinWriter`` whose
  ``generation`` lives on the device and is updated with at most two slices.
  ``generation_at(index)`` is ``generation[index]``; on the CPU computed
  from ``write_count`` (a ring's generations always are
  ``rbcheck.reference.writer.ring_generation``: its writes and its loader keep
  them so), without a random read of the generation column per index; on
  an accelerator one gather. Its loader fills them with two ``arange`` slices
  (``ring_generations``).

Cost: ``write`` O(n * row size); ``gather`` O(B * row size); memory as the
reference, plus on the CPU each row padded to a multiple of its largest
element size (obs float32[8], action float32[2], reward float32[1]: 44 bytes
padded to 48).
"""

from __future__ import annotations

import math
import threading

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference.arguments import as_tensor, check_index, check_int
from rbcheck.reference.storage import TensorStorage, columns
from rbcheck.reference.writer import RoundRobinWriter, ring_generation
from rbcheck.variants import native
from rbcheck.variants.vector_tree import kept


def check_index_fast(index, high: int, name: str = "index") -> torch.Tensor:
    """``rbcheck.reference.arguments.check_index`` without its boolean-mask gather on the
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


def gather_columns(columns, index: torch.Tensor, outs, layouts=None) -> None:
    """``outs[c] = columns[c][index]`` (rows): one C call with prefetching for CPU
    columns whose rows are contiguous (row-major, or fields of interleaved
    rows; ``layouts``: their ``native.row_layout``s when known) when
    ``rbcheck.variants.native`` loads, else one ``index_select(..., out=)`` per column.
    Both check the index's bounds."""
    if columns and index.dtype == torch.long and native.usable(index, *outs) \
            and all(c.device.type == "cpu" for c in columns):
        layouts = [native.row_layout(c) for c in columns] if layouts is None else layouts
        if all(layout is not None for layout in layouts):
            native.gather_rows(columns, index, outs, layouts)
            return
    for column, out in zip(columns, outs, strict=True):
        torch.index_select(column, 0, index, out=out)


def layout_of(cols: dict) -> dict:
    """``{key: (row shape, dtype)}`` of columns (``rbcheck.reference.storage.columns``)."""
    return {key: (tuple(value.shape[1:]), value.dtype) for key, value in cols.items()}


def interleaved_columns(capacity: int, layout: dict, zeroed: bool = True) -> dict:
    """CPU columns for ``layout`` (``{key: (row shape, dtype)}``; zeroed unless
    ``zeroed=False``) that are fields of ONE row-major byte array: row ``i`` of every column lies side by
    side in memory (fields ordered by decreasing element size, so each is
    aligned; the row padded to the largest element size). A random row then
    costs one or two cache lines instead of one per field: a sample's gather
    of obs float32[8], action float32[2], reward float32[1] (48-byte rows) was
    ~1.5x faster than from three separate arrays on the machine measured.
    Each column is a strided view (rows contiguous, ``stride(0)`` the row
    size); fields of no bytes get a tensor of their own."""
    size = {key: math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for key, (shape, dtype) in layout.items()}
    item = {key: torch.empty((), dtype=dtype).element_size() for key, (_, dtype) in layout.items()}
    offset, row = {}, 0
    for key in sorted(layout, key=lambda k: -item[k]):  # powers of two: each offset aligned
        offset[key], row = row, row + size[key]
    align = max(item.values(), default=1)
    row = max(-(-row // align) * align, 1)
    backing = native.empty_huge((capacity, row), torch.uint8)
    if zeroed:
        backing.zero_()
    out = {}
    for key, (shape, dtype) in layout.items():
        if size[key] == 0:
            out[key] = torch.empty((capacity, *shape), dtype=dtype)  # no bytes to zero
        else:
            field = backing[:, offset[key]:offset[key] + size[key]].view(dtype)
            out[key] = field.view(capacity, *shape)
    return out


def default_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolved(device) -> torch.device:
    """``device`` with its index: ``cuda`` is the current CUDA device. (torch compares
    devices as written: ``torch.device("cuda") != torch.device("cuda:0")``.)"""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a, b) -> bool:
    """Whether ``a`` and ``b`` name one device (``resolved``)."""
    return resolved(a) == resolved(b)


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
    ``per_key`` of them). A tensor whose memory became shared (``share_memory_()``,
    or a handed-out alias sent through a ``torch.multiprocessing`` queue, which moves
    the memory in place) is never reused: another process may still read it, which
    no reference count here can see. It leaves the pool. Without the reference count (another torch), every
    call allocates: correct, only slower. At most ``max_keys`` keys (a key per
    name and shape: a caller cycling through batch sizes adds one each) are
    kept: past that the pool forgets them all and starts again (tensors
    handed out stay valid: the caller holds them).
    """

    def __init__(self, per_key: int = 4, max_keys: int = 64):
        self.per_key, self.max_keys = per_key, max_keys
        self.slots: dict = {}
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:  # a copy or a pickle gets its own lock
        return {"per_key": self.per_key, "max_keys": self.max_keys, "slots": self.slots}

    def __setstate__(self, state: dict) -> None:
        self.per_key, self.slots, self.lock = state["per_key"], state["slots"], threading.Lock()
        self.max_keys = state.get("max_keys", 64)

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
        """Under the pool's lock: the check that a tensor is free and the alias that marks
        it used are one step for concurrent callers (torch releases the GIL inside
        ``detach``, so without it two threads sampling at once could both find the same
        tensor free and gather their rows into the same memory)."""
        with self.lock:
            slot = kept(self.slots, (key, tuple(shape), dtype, torch.device(device)), list, self.max_keys)
            for tensor in slot:
                if self._free(tensor):
                    if tensor.is_shared():  # another process may read it: it leaves the pool
                        slot.remove(tensor)
                        break
                    return tensor.detach()  # a new alias: holding it marks the memory as used
            tensor = torch.empty(shape, dtype=dtype, device=device)
            if len(slot) < self.per_key:
                slot.append(tensor)
            return tensor.detach()


class DeviceStorage(TensorStorage):
    """Reference storage on a device, with ring-slice writes (see module doc)."""

    def __init__(self, capacity: int, device: str | torch.device | None = None):
        super().__init__(capacity, default_device() if device is None else device)
        self.device = resolved(self.device)  # "cuda" -> the current CUDA device: its tensors' device
        self.version = 0
        self._cols: list[tuple[tuple[str, ...], torch.Tensor]] = []
        self._layouts: list = []
        self._packed = None  # the TensorDict whose columns are interleaved rows
        self.pool = TensorPool()
        self._adopt = False  # set only during a load of FreshColumns

    def _refresh(self, pack: bool = True) -> None:
        if pack and self.data is not None and self.device.type == "cpu" and self.data is not self._packed:
            self._pack()  # columns made by the reference's set or load_state_dict
        self._cols = list(columns(self.data).items()) if self.data is not None else []
        self._layouts = [native.row_layout(c) for _, c in self._cols]
        self.version += 1

    def repack(self) -> None:
        """Move columns left by ``load_state_dict`` into the interleaved rows this
        storage holds (or new ones): call once the load is accepted (the variant
        buffer does, after its last check)."""
        self._refresh()

    def _pack(self) -> None:
        """Move the columns (allocated by ``set`` or ``load_state_dict``) into interleaved
        rows: the ones already allocated when the layout is the same (a reload), else
        new ones. Never called by ``load_state_dict``: it would write into memory that a
        shallow copy shares (see there)."""
        cols = columns(self.data)
        layout = layout_of(cols)
        if self._packed is not None and layout_of(columns(self._packed)) == layout:
            packed = columns(self._packed)
        else:
            packed = interleaved_columns(self.capacity, layout, zeroed=False)  # all overwritten
        for key, value in cols.items():
            packed[key].copy_(value)
        self._install(packed)

    def _allocate(self, data: TensorDictBase) -> TensorDictBase:
        """The columns of ``data``'s layout, installed as the storage's data and
        returned (the reference's ``set`` assigns what ``_allocate`` returns)."""
        layout = layout_of(columns(data))
        if self.device.type == "cpu":  # one array of rows; huge pages (fewer TLB misses)
            self._install(interleaved_columns(self.capacity, layout))
        else:
            self._install({key: torch.zeros((self.capacity, *shape), dtype=dtype, device=self.device)
                           for key, (shape, dtype) in layout.items()})
        return self.data

    def _install(self, cols: dict) -> None:
        """Make ``cols`` (``{key: column}``, in layout order) the storage's data."""
        self.data = self._packed = TensorDict({}, batch_size=[self.capacity], device=self.device)
        for key, column in cols.items():
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

    def gather(self, index: torch.Tensor) -> TensorDictBase:
        """The rows at ``index`` (unchecked: the caller guarantees ``0 <= index < size``),
        into outputs from the pool: one C call through the table of this storage's columns
        (``native.GatherBlock``, rebuilt when the column list is) where it applies."""
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
        block = self.__dict__.get("_gather_block")
        if block is None or block.cols is not self._cols or block.moved():  # columns replaced or moved
            block = self._gather_block = native.GatherBlock(self._cols, [c for _, c in self._cols],
                                                            self._layouts)
        if block.usable and index.dtype == torch.long and index.device.type == "cpu" \
                and index.is_contiguous() and native.lib() is not None:
            block.gather(index, outs)  # one C call; the outputs come from the pool (contiguous, CPU)
        else:
            gather_columns([column for _, column in self._cols], index, outs, self._layouts)
        return _to_tensordict(tree, batch, self.device)

    def load_state_dict(self, state: dict, size: int) -> None:
        """The reference's load into NEW memory only (the columns it clones), never
        into the rows already held: the buffer stages a load on a shallow copy of
        its storage before it knows the whole checkpoint fits, so writing into the
        shared rows would change the live buffer even when the load is refused.
        The loaded columns are plain tensors until ``repack`` moves them into
        interleaved rows (the variant buffer calls it once the load is accepted)."""
        self._adopt = isinstance(state, dict) and isinstance(state.get("columns"), FreshColumns)
        packed = self._adopt and getattr(state["columns"], "packed", False) and self.device.type == "cpu"
        try:
            super().load_state_dict(state, size)
        finally:
            self._adopt = False
        given = {(v.data_ptr(), v.stride()) for v in state["columns"]} if packed else set()
        if packed and self.data is not None and all(  # adopted as they were given: our rows
                (c.data_ptr(), c.stride()) in given for c in columns(self.data).values()):
            self._packed = self.data
        self._refresh(pack=False)

    def _take(self, value: torch.Tensor) -> torch.Tensor:
        """The reference's copy, except for ``FreshColumns`` already on this device: those
        are adopted as they are (nobody else holds them; ``repack`` copies them into rows)."""
        if self._adopt and value.device == self.device:  # both carry an index (resolved)
            return value.detach()
        return super()._take(value)

    def state_view(self) -> dict:
        """``state_dict()`` without the clone: the columns as they lie in this storage (views
        of its rows), for a caller that only reads them before the next write (a save)."""
        cols = columns(self.data)
        return {"keys": [list(k) for k in cols], "columns": list(cols.values())}


class FreshColumns(list):
    """The columns of a storage state that nothing else refers to (a checkpoint just read
    into new memory): ``DeviceStorage.load_state_dict`` takes them without its copy.
    ``packed``: they are the fields of new interleaved rows (``interleaved_columns``),
    which the storage keeps as its rows (``repack`` has nothing to move)."""

    packed = False


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
        self.device = resolved(device)
        self.generation = self.generation.to(self.device)

    def next_indices(self, n: int) -> torch.Tensor:
        check_int("n", n)
        index = (self.cursor + torch.arange(n, device=self.device)) % self.capacity
        for s0, s1, r0, _ in ring_slices(self.cursor, n, self.capacity):
            self.generation[s0:s1] = torch.arange(self.write_count + r0,
                                                  self.write_count + r0 + s1 - s0, device=self.device)
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index

    def generation_at(self, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``generation[index]`` (int64, on ``index``'s device; into ``out`` when given)
        for an index in ``[0, capacity)`` (the caller checked it)."""
        count, capacity = self.write_count, self.capacity
        if out is None:
            out = torch.empty_like(index)
        if native.usable(index, out):
            return native.ring_generation(index, count, capacity, out)
        if index.device.type != "cpu":  # one gather kernel; the arithmetic would be several
            return torch.index_select(self.generation, 0, index, out=out)
        return out.copy_(ring_generation(index, count, capacity))

    def load_state_dict(self, state: dict) -> None:
        """The reference's, with the generations filled by two ``arange`` slices on the
        device (``ring_generations``) instead of its arithmetic over every slot."""
        count = check_int("write_count", state["write_count"], 0, 2**62)
        self.generation = ring_generations(count, self.capacity, self.device)
        self.write_count, self.cursor = count, count % self.capacity


def ring_generations(count: int, capacity: int, device) -> torch.Tensor:
    """``ring_generation(arange(capacity), count, capacity)`` as slices: after ``count``
    writes (``k`` full turns and ``r`` more), slot ``s < r`` last held row ``k * capacity + s``
    and slot ``s >= r`` row ``(k - 1) * capacity + s`` (-1 while ``k == 0``: never written)."""
    out = torch.empty(capacity, dtype=torch.long, device=device)
    turns, r = divmod(count, capacity)
    torch.arange(turns * capacity, turns * capacity + r, out=out[:r])
    if turns:
        torch.arange((turns - 1) * capacity + r, turns * capacity, out=out[r:])
    else:
        out[r:] = -1
    return out
