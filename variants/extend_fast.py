"""``extend``'s fast path: the reference's checks and results, less Python.

Profiled (rows obs float32[8], action float32[2], reward float32[1], priority,
one torch thread, 2^16 slots, a busy 2-core machine): ``extend`` of one row
took ~270 us at best, nearly all of it Python around a few small copies:
the layout check walked the batch's and the storage's TensorDicts
(``columns`` twice, ``layout_of`` twice: ~25%), the priority was checked
twice (``priority_of``, then again in ``on_write``: two conversions, two
finiteness passes, two ``max`` reductions for the overflow guard), the
writer built its slots with ``arange`` + ``%`` and the generations with
another ``arange``, and the storage walked the batch's items once more.

``try_extend(buffer, data)`` does the same work once, in this order:

1. the layout: the batch is a plain ``TensorDict`` whose top-level tensors are
   exactly the storage's columns (same keys, shapes, dtypes, on the CPU),
   compared against a per-storage plan (``_Plan``: the columns' keys, dtypes and
   row shapes, and the native call's table of destination addresses, row
   strides and row bytes; rebuilt when the storage's columns are replaced);
   anything else (nested keys, another class, the first write that allocates,
   another device) returns None and the full path runs (and raises the
   reference's errors);
2. the priority column (when the sampler is prioritized): one C pass
   (``rb_extend_prepare``) checks the priorities (finite, >= 0; without the
   column: the max priority, as ``on_write``) and computes ``priority + eps``
   and the new max priority into a reused workspace, then the reference's
   transform finishes with torch's ``pow``: in the same C call, as torch
   computes it (``native.torch_pow``), where that is known to give torch's
   bits, else torch's own;
3. ONE native call (``rb_extend``, every argument in one packed block): it
   checks that no transform overflowed (else nothing is written and the full
   path raises), then writes both trees' leaves and recomputes each ancestor
   of the range once (one or two ranges: the ring), commits the max
   priority, copies the rows into the storage's interleaved rows, sets the
   generations and the slots returned (into a tensor made ahead:
   ``_Plan.slots``). Python then moves the write count, cursor and size.

Without the native library (or with a sampler whose trees run Triton's
interpreter) ``_try_extend_torch`` does the same with torch copies
(``ring_slices``), the trees through ``PrioritizedSampler._update_native``.

The pow runs in ``rb_extend_prepare`` (``rb_pow_like_torch``: torch's vector
pow and libm's, element by element as torch's kernel assigns them) when
``torch_pow.agrees(alpha)`` and the batch is below torch's parallel grain;
torch's ``pow`` otherwise. Cold, torch's ``pow`` of 256 priorities took
67-81 us of a 235-276 us extend.

Profiled after (one row, obs float32[8], action float32[2], reward
float32[1], 2^20 slots, one torch thread, a busy 2-core machine, medians;
"cold": after 32 MiB of unrelated writes): a uniform ``extend`` of one row
~7 us called in a loop (stable-baselines3's ``add``: ~8.5 us), ~9 us
interleaved with it (its ``add``: ~11 us), 165-195 us cold (its ``add``:
140-150 us). Of that, the slot tensor returned (the reference's API) ~2 us
(~45 us cold: a torch allocation), the layout checks (dtype, shape, device,
contiguity per column) ~1.7 us (~13 us cold), the native call ~0.5 us; the
rest is Python (attribute reads, the block's fields, the counters). A
prioritized one row: ~9 us in a loop, ~22 us interleaved with cpprb's ``add``
(~68 us), ~190 us cold (cpprb ~285 us).

Applies to ``DeviceStorage`` on the CPU, ``DeviceWriter`` and the variants'
``RandomSampler`` / ``PrioritizedSampler`` (CPU trees), for
``1 <= n <= capacity`` rows; the state afterwards is the reference's bit for
bit (tests/variants/test_extend_fast_path.py).
"""

from __future__ import annotations

import ctypes
import threading

import torch
from tensordict import TensorDict

from rbcheck.variants import native
from rbcheck.variants.device_storage import DeviceStorage, DeviceWriter, TensorPool, ring_slices
from rbcheck.variants.native import extend_args as A
from rbcheck.variants.native import torch_pow
from rbcheck.variants.prioritized import PrioritizedSampler
from rbcheck.variants.random_sampler import RandomSampler
from rbcheck.variants.vector_tree import interpreting

# A.<FIELD>: a field's position in the argument block (native.EXTEND_ARGS); A.EXTEND, A.WHOLE,
# A.PREPARE: the modes of native.calls().extend (native/extend_args.py, the one place for both).

#: Set to False to turn the fast path off (the tests compare both paths).
ENABLED = True
#: Set to False to skip ``_write``'s Python checks of the batch (each column's type, dtype, shape,
#: device, contiguity; the rows' memory not moved; the generation column, trees, max priority,
#: alpha and eps still the ones bound): for the ablation of bench/check_costs.py ONLY, on a buffer
#: whose plan an earlier extend of the same layout bound. The checks of values in C stay.
CHECKS = True


def _sources(storage: DeviceStorage, data) -> list | None:
    """The batch's tensors in the storage's column order when its layout is exactly the
    storage's (top-level keys only), else None."""
    source = getattr(data, "_tensordict", None)
    cols = storage._cols
    if type(source) is not dict or len(source) != len(cols):
        return None
    out = []
    for key, column in cols:
        if len(key) != 1:
            return None
        value = source.get(key[0])
        if type(value) is not torch.Tensor or value.dtype != column.dtype \
                or value.device.type != "cpu" or value.shape[1:] != column.shape[1:]:
            return None
        out.append(value)
    return out




class _Plan:
    """What every extend into one storage reuses, rebuilt when its columns are replaced
    (``storage._cols`` is then a new list): the batch layout to check (``specs``: key,
    dtype, row shape; ``layouts``: the full shapes for the last batch sizes) and ONE
    int64 block holding the native calls' arguments (``native.EXTEND_ARGS``) followed by
    the column table (per column: source address, set per call; destination address,
    destination row stride and row bytes). The fields that change rarely (the writer's
    generation column, the trees, the max priority tensor, eps, the priority workspace)
    are rewritten only when the object they come from is another one (``bound``: the
    objects last written; these tensors are the buffer's own and are never resized in
    place), the others every call."""

    __slots__ = ("cols", "watched", "specs", "layouts", "block", "address", "bound", "value", "views", "high",
                 "priority", "c_pow", "free", "at", "large", "room")

    def __init__(self, storage: DeviceStorage):
        self.cols = storage._cols
        self.watched: tuple = ()  # the destination columns' memory, as the table holds it
        self.specs = None
        self.layouts: dict = {}
        self.views: dict = {}
        self.bound: dict = {}
        self.at: dict = {}  # the addresses the block holds for the bound objects, as ints (read warm)
        self.value, self.room = None, 0
        self.c_pow = False  # rb_extend_prepare may finish the transform (see bind_sampler)
        self.free: dict = {}  # n -> slot tensors made ahead (``slots``)
        self.large = TensorPool(per_key=2, max_keys=4)  # a large batch's slot tensors (``slots``)
        self.priority = (None, None)  # (priority key, (column, is_float32) or None)
        layouts = [native.row_layout(column) for _, column in self.cols]
        if storage.device.type != "cpu" or any(len(key) != 1 for key, _ in self.cols) \
                or any(lay is None for lay in layouts):
            return  # another device, nested keys or rows that are not contiguous: no native copies
        self.specs = [(key[0], column.dtype, column.shape[1:]) for key, column in self.cols]
        self.watched = native.watch([column for _, column in self.cols])
        self.block = (ctypes.c_int64 * (A.FIELDS + 4 * len(self.cols)))()
        self.address = ctypes.addressof(self.block)
        for c, ((_, column), (stride, row_bytes)) in enumerate(zip(self.cols, layouts, strict=True)):
            self.block[A.FIELDS + 4 * c + 1:A.FIELDS + 4 * c + 4] = [column.data_ptr(), stride, row_bytes]
        self.block[A.N_COLS], self.block[A.COLS] = len(self.cols), self.address + 8 * A.FIELDS
        self.block[A.CAPACITY], self.block[A.SHADOW] = storage.capacity, 1
        self.high = torch.empty(1, dtype=torch.float64)
        self.block[A.HIGH] = self.high.data_ptr()

    def __reduce__(self):
        """A copy or a pickle of the storage carries no plan (its addresses are this
        storage's memory): the next extend builds its own."""
        return _no_plan, ()

    def moved(self) -> bool:
        """Whether a destination column's memory moved since the table was built (``native.moved``)."""
        return native.moved(self.watched)

    def layout(self, n: int) -> list:
        """``[(key, dtype, shape)]``: the batch's columns for ``n`` rows, in the table's order."""
        if len(self.layouts) >= 8:
            self.layouts.clear()
        layout = self.layouts[n] = [(key, dtype, torch.Size((n, *shape))) for key, dtype, shape in self.specs]
        return layout

    def values(self, n: int) -> torch.Tensor:
        """A float64[n] workspace for the transformed priorities (one buffer, grown to
        the largest n, its address in the block; a few views kept)."""
        if self.value is None or len(self.value) < n:
            self.value = torch.empty(max(n, 256), dtype=torch.float64)
            self.room = max(n, 256)  # len(self.value), for _write
            self.block[A.VALUE] = self.value.data_ptr()
            self.views.clear()
        if len(self.views) >= 8:
            self.views.clear()
        view = self.views[n] = self.value[:n]
        return view

    def bind_generation(self, generation: torch.Tensor) -> bool:
        """Whether the writer's generation column can be written natively (then its address is set)."""
        if not (generation.is_cpu and generation.is_contiguous() and generation.dtype == torch.int64):
            return False
        self.block[A.GENERATION] = self.at["generation"] = generation.data_ptr()
        self.bound["generation"] = generation
        return True

    def bind_sampler(self, sampler: PrioritizedSampler) -> bool:
        """Whether the sampler's trees and max priority can be written natively (then
        their addresses, the trees' size and eps are set)."""
        sum_nodes, min_nodes, high = sampler.sum_tree._nodes, sampler.min_tree._nodes, sampler._max_priority
        if not all(t.is_cpu and t.is_contiguous() and t.dtype == torch.float64
                   for t in (sum_nodes, min_nodes, high)):
            return False
        block = self.block
        block[A.SUM], block[A.MIN], block[A.MAX] = at = sum_nodes.data_ptr(), min_nodes.data_ptr(), high.data_ptr()
        self.at["trees"] = at
        block[A.SIZE] = sampler.sum_tree.size
        block[A.EPS], block[A.ALPHA] = _bits(sampler.eps), _bits(sampler.alpha)
        if self.value is None:
            self.values(1)
        self.c_pow = torch_pow.agrees(sampler.alpha)
        block[A.VECTOR_POW] = torch_pow.vector_pow() or 0
        self.bound.update(sum=sum_nodes, min=min_nodes, max=high, eps=sampler.eps, alpha=sampler.alpha)
        return True

    def slots(self, n: int) -> torch.Tensor:
        """An int64[n] tensor for the slots an extend returns, its caller's own memory: no
        other extend writes into it while anything refers to it.

        Up to ``SLOTS_AHEAD // 2`` rows, the tensors are made ``SLOTS_AHEAD // n`` at a
        time (at most 64; for up to four batch sizes at once) as rows of one new tensor,
        and handed out one per extend. Made one at a time, a cold 1-row extend spent
        75-87 us of its 182-198 us on this allocation. Made together, the allocations
        run warm, each for about 1 us. The cost is memory: one tensor kept alive keeps
        its whole batch alive, at most ``SLOTS_AHEAD`` int64 (32 KiB).

        A larger batch, up to ``POOLED`` rows, gets the memory an earlier extend of its
        size returned once nothing refers to it any more, else a new tensor
        (``TensorPool``: two per size, four sizes, so at most 4 MiB kept). A new 512 KiB
        tensor (65536 slots) is sometimes fresh memory from the OS: in a loop of
        65536-row extends, 2 of 60 calls took 96-128 page faults and 638-727 us against
        ~250 us (docs/benchmarks.md). Larger batches get a new tensor each: their rows'
        copy dwarfs the faults."""
        ahead = min(64, SLOTS_AHEAD // n)
        if ahead < 2:  # a large batch: memory no one refers to any more, else a new tensor
            if n > POOLED:
                return torch.empty(n, dtype=torch.int64)
            return self.large.take("slots", (n,), torch.int64, "cpu")
        if n not in self.free and len(self.free) >= 4:  # a fifth batch size: start again
            self.free.clear()
        made = self.free[n] = list(torch.empty((ahead, n), dtype=torch.int64))
        return made.pop()

    def priority_column(self, key) -> tuple | None:
        """``(position, is_float32)`` of the priority column ``key`` among the storage's
        columns (float32 or float64), else None."""
        if self.priority[0] != key or key is None:
            found = None
            for c, (name, dtype, shape) in enumerate(self.specs):
                if name == key and shape == () and dtype in (torch.float32, torch.float64):
                    found = (c, dtype == torch.float32)
            self.priority = (key, found)
        return self.priority[1]


#: Slots made ahead at most (``_Plan.slots``), int64 entries.
SLOTS_AHEAD = 4096
#: The largest batch whose slot tensor comes from the plan's pool (``_Plan.slots``).
POOLED = 1 << 16


def _no_plan() -> None:
    return None


class _ExtendLock:
    """One storage's extend lock (``extend_lock``): a shallow copy of the storage shares it
    (the same rows), a deep copy or a pickle gets a new one (another storage)."""

    __slots__ = ("lock",)

    def __init__(self):
        self.lock = threading.Lock()

    def __reduce__(self):
        return _ExtendLock, ()


def extend_lock(storage) -> threading.Lock:
    """The ONE lock every extend into ``storage`` holds (``ReplayBuffer.extend``: the fast
    paths and the full path alike) from before it reads the writer's count and cursor until
    it has moved them. Made once per storage (``dict.setdefault`` is atomic) and never
    replaced: unlike the plan, which the first fast extend builds and a new column list
    rebuilds, it is there before any thread could race to make it."""
    holder = storage.__dict__.get("_extend_lock")
    if holder is None:
        holder = storage.__dict__.setdefault("_extend_lock", _ExtendLock())
    return holder.lock


def _bits(x: float) -> int:
    """The int64 whose bytes are the double ``x``."""
    return ctypes.c_int64.from_buffer_copy(ctypes.c_double(x)).value


def try_extend(buffer, data) -> torch.Tensor | None:
    """The slots of ``data``'s rows, written as the reference writes them, or None when the
    fast path does not apply or a check fails (nothing changed: the caller runs the full
    path, which raises the reference's error). With the native library: the checks in
    Python, then for a prioritized buffer ``rb_extend_prepare`` (the priorities' checks,
    ``+ eps``, the max, and the pow as torch computes it; else torch's pow after it), then
    ONE native call (``rb_extend``) that checks no
    transform overflowed and writes the trees, the max priority, the rows, the generations
    and the slots returned. Without it (or with Triton's interpreter), ``_try_extend_torch``.
    The caller holds ``extend_lock(buffer.storage)`` (the native calls release the GIL and
    read the plan's one block; the write count is read, then moved)."""
    if type(data) is not TensorDict or not ENABLED:
        return None
    calls = native._state.get("calls") or native.calls()
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    prioritized = type(sampler) is PrioritizedSampler
    if calls is None or (prioritized and sampler.backend == "triton" and interpreting()):
        return _try_extend_torch(buffer, data)
    if type(storage) is not DeviceStorage or type(writer) is not DeviceWriter or storage.data is None \
            or not (prioritized or type(sampler) is RandomSampler):
        return None
    batch = data._batch_size
    if len(batch) != 1:
        return None
    n, capacity = batch[0], storage.capacity
    if not 1 <= n <= capacity:
        return None
    plan = storage.__dict__.get("_extend_plan")
    if plan is None or plan.cols is not storage._cols:  # columns replaced (moved: seen in _write)
        plan = storage._extend_plan = _Plan(storage)
    source = data._tensordict
    if plan.specs is None or type(source) is not dict:
        return _try_extend_torch(buffer, data)
    if len(source) != len(plan.specs):
        return None
    return _write(buffer, data, plan, calls, source, n, capacity, prioritized)


def _write(buffer, data, plan: _Plan, calls, source: dict, n: int, capacity: int,
           prioritized: bool) -> torch.Tensor | None:
    """``try_extend`` from the layout check on (under the storage's ``extend_lock``)."""
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    bound, block = plan.bound, plan.block
    if not CHECKS:  # bench/check_costs.py's ablation: the addresses only
        sources = [source[name].data_ptr() for name, _, _ in plan.layouts.get(n) or plan.layout(n)]
    else:
        sources = []  # the columns' addresses, in the block's order
        for name, dtype, shape in plan.layouts.get(n) or plan.layout(n):
            value = source.get(name)
            if type(value) is not torch.Tensor or value.dtype is not dtype or value.shape != shape \
                    or not value.is_cpu:
                return None  # another layout: the full path (raises the reference's error)
            if not value.is_contiguous():
                return _try_extend_torch(buffer, data)
            sources.append(value.data_ptr())
        # the addresses the block keeps, checked after the sources' (data_ptr is warm by now)
        if plan.moved():  # the rows' memory moved in place: a new plan, then this extend again
            storage._extend_plan = _Plan(storage)
            return try_extend(buffer, data)
        generation = writer.generation
        if (generation is not bound.get("generation") or generation.data_ptr() != plan.at["generation"]) \
                and not plan.bind_generation(generation):
            return _try_extend_torch(buffer, data)
    free = plan.free.get(n)
    index = free.pop() if free else plan.slots(n)  # the slots returned, made ahead
    count, first = writer.write_count, writer.cursor
    if prioritized:
        sum_tree, min_tree = sampler.sum_tree, sampler.min_tree
        if CHECKS and (sum_tree._nodes is not bound.get("sum") or min_tree._nodes is not bound.get("min")
                or sampler._max_priority is not bound.get("max") or sampler.eps != bound.get("eps")
                or sampler.alpha != bound.get("alpha")
                or (sum_tree._nodes.data_ptr(), min_tree._nodes.data_ptr(), sampler._max_priority.data_ptr())
                != plan.at["trees"]) \
                and not plan.bind_sampler(sampler):  # another object, or its memory moved: bound again
            return _try_extend_torch(buffer, data)
        key = buffer.priority_key
        column = plan.priority_column(key)
        if column is not None:
            block[A.PRIORITY], block[A.IS_FLOAT32] = sources[column[0]], column[1]
        elif key is not None and key in data.keys(include_nested=True):
            return None  # a priority the storage does not hold as a float column: the full path
        else:
            block[A.PRIORITY] = 0  # none: the max priority, as on_write
        if plan.c_pow and n < torch_pow.GRAIN:  # the transform in C, as torch's pow computes it
            block[A.DO_POW] = 1
            if n > plan.room:  # an int: Tensor.__len__ is Python in torch (~10-15 us cold)
                plan.values(n)
            # rb_extend_prepare then rb_extend, one call
            if calls.extend(plan.address, A.WHOLE, first, n, count, index.data_ptr(), *sources):
                return None  # a bad priority or an overflow: nothing changed, the full path raises
        else:
            block[A.DO_POW] = 0
            values = plan.views.get(n)
            if values is None:
                values = plan.values(n)
            if not calls.extend(plan.address, A.PREPARE, first, n, count, index.data_ptr(), *sources):
                return None  # a bad priority: nothing changed, the full path raises
            values.pow_(sampler.alpha)  # (raw + eps) ** alpha: torch's pow, the reference's bits
            if calls.extend(plan.address, A.EXTEND, first, n, count, index.data_ptr(), *sources):
                return None  # a transform overflowed (nothing written): the full path raises
        sum_tree._stale = sum_tree._stale or sum_tree.has_shadow  # mark_stale(), inlined
        min_tree._stale = min_tree._stale or min_tree.has_shadow
    else:
        if "sum" in bound:  # trees bound before (another sampler): none now
            block[A.SUM] = 0  # no trees: rb_extend writes rows, generations and slots only
            del bound["sum"]
        if calls.extend(plan.address, A.EXTEND, first, n, count, index.data_ptr(), *sources):
            return None  # pragma: no cover - the arguments were checked above
    if storage.size < capacity:
        storage.size = max(storage.size, min(first + n, capacity))
    storage.version += 1
    writer.write_count = count + n
    writer.cursor = (count + n) % capacity
    return index


def _try_extend_torch(buffer, data) -> torch.Tensor | None:
    """``try_extend`` without the native library (or with a sampler whose trees run
    Triton's interpreter): the same checks, the writes as torch copies."""
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    if type(data) is not TensorDict or type(storage) is not DeviceStorage \
            or type(writer) is not DeviceWriter or storage.data is None or storage.device.type != "cpu" \
            or writer.device.type != "cpu":
        return None
    batch = data.batch_size
    if len(batch) != 1:
        return None
    n, capacity = batch[0], storage.capacity
    if not 1 <= n <= capacity:
        return None
    sources = _sources(storage, data)
    if sources is None:
        return None
    prioritized = type(sampler) is PrioritizedSampler
    if not prioritized and type(sampler) is not RandomSampler:
        return None
    first = writer.cursor
    end = first + n
    if end <= capacity:
        index = torch.arange(first, end)
    else:
        index = torch.arange(first, end) % capacity
    if prioritized:
        key = buffer.priority_key
        priority = data._tensordict.get(key) if isinstance(key, str) else None
        if priority is None and key is not None and key in data.keys(include_nested=True):
            return None  # a nested priority key: the full path
        if priority is not None:
            if priority.dim() != 1 or not sampler._update_native(index, priority, first):
                return None  # another shape, or a check failed: nothing changed
        else:
            sampler._store(index, sampler._max_priority.expand(n))
    # the writes (nothing below can fail)
    count = writer.write_count
    generation = writer.generation
    for s0, s1, r0, r1 in ring_slices(first, n, capacity):
        for (_, column), value in zip(storage._cols, sources, strict=True):
            column[s0:s1].copy_(value[r0:r1])
        torch.arange(count + r0, count + r1, out=generation[s0:s1])
    storage.size = max(storage.size, min(end, capacity))
    storage.version += 1
    writer.write_count = count + n
    writer.cursor = writer.write_count % capacity
    return index
