"""``sample``'s fast path on the CPU: the reference's draws and results, fewer calls.

A sample of the variant buffer strings together a dozen small steps, each a
Python function or a torch call of its own: the checks, a pooled output per
tensor (index, weight, generation, each column), the sampler's workspaces,
the native calls one by one, the TensorDict. Called in a loop they are cheap.
Called between other work, as an agent samples between environment steps
and a benchmark between the operations of other libraries, each distinct
call first reloads its code and data into the caches. Profiled (prioritized,
2^20 rows of obs float32[8], action float32[2], reward float32[1], 4096
draws, one torch thread, after 32 MiB of unrelated writes, medians of 80,
both paths in one process, two runs): the full path 1024-1217 us, this one
773-924 us (1.32x), with the same indices, weights, generations and rows;
uniform 570-599 against 423-461 us; at width 64 1.21x for both.

``try_sample(buffer, batch_size)`` returns ``(rows, info)`` as ``sample``
does, or None when it does not apply (nothing changed, the generator not
advanced: the full path runs and raises the reference's errors):

1. it applies to the variants' ``DeviceStorage`` on the CPU (columns with
   contiguous rows, nested keys too), ``DeviceWriter``, a CPU generator, no
   transform, no ``pin_memory``, an int ``batch_size >= 1``, a buffer that
   holds rows, and the variants' ``RandomSampler`` or ``PrioritizedSampler``
   (backend ``torch``, trees on the CPU) whose total is > 0 and whose
   weights' divisor ``(n * p_min) ** -beta`` is a finite float
   (``weight_divisor``: the full path raises otherwise, before its draw);
2. every tensor the call writes or returns lies in ONE block per batch size
   (``_Outputs``: the uniforms, the weights' bases, the index, the weights,
   the generations, the rows), with its native argument block
   (``native.SampleArgs``) filled once; the block is reused only when no
   tensor handed out from it is alive (its storage's reference count, as
   ``TensorPool``), else another is made (four kept per batch size). A block
   whose memory moved in place (``share_memory_()``, or a pickle through
   torch.multiprocessing, of a tensor handed out; ``resize_``) is dropped, and
   the plan is rebuilt when a column or a tree moved: no address is ever
   stale. One consequence of the single block: every tensor of a sample is a
   view of it, so keeping ``info["index"]`` keeps the sample's rows in memory,
   and ``torch.save`` (or sending to another process) of one of them alone
   writes the whole block; ``clone()`` it first to keep it alone;
3. the draw is torch's, into the block: the reference's (``draw_uniforms``);
   a prioritized sample then makes ONE C call for ``mass = u * total``, the
   descent and ``n * (leaf / total)`` (``rb_sample_descend``), and ONE C call
   for the weights' pow (as torch's ``pow`` computes it, ``native.torch_pow``,
   where that is known to give its bits; else torch's ``pow`` runs between the
   two calls), division and float32 conversion, the generations and the rows
   (``rb_sample_rows``); a uniform sample makes one call for its slots,
   generations and rows.

Thread safety: a block is claimed under the plan's lock by the aliases it
hands out (its reference count), so two concurrent samples never share one.

Cost: the full path's, O(B log capacity + B * row bytes), with one native
call fewer per step and one output block instead of one pooled tensor each.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from rbcheck.reference.prioritized_sampler import weight_divisor
from rbcheck.variants import native
from rbcheck.variants.device_storage import DeviceStorage, DeviceWriter, TensorPool, _to_tensordict
from rbcheck.variants.native import torch_pow
from rbcheck.variants.prioritized import PrioritizedSampler
from rbcheck.variants.random_sampler import RandomSampler

#: Set to False to turn the fast path off (the tests compare both paths).
ENABLED = True
#: Output blocks kept per (batch size, kind), and batch sizes kept at most.
PER_SIZE, SIZES = 4, 8
#: Draws from which the descent may split over torch's threads (rb_sample_prefix's
#: chunks of at least 16384 draws: below two chunks it runs on one thread anyway).
THREADED = 2 * 16384



def _use_count(cdata: int) -> int | None:
    """The reference count of a storage (``TensorPool``'s measure), None on a torch without it."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else count(cdata)


class _Outputs:
    """One sample's tensors as views of ONE byte block, and the native argument block
    that points at them (the columns' sources from the plan's table)."""

    __slots__ = ("base", "storage", "cdata", "alone", "address", "nbytes", "u", "leaf", "index", "weight",
                 "generation", "rows", "args", "table", "args_at")

    def __init__(self, plan: _Plan, n: int, prioritized: bool):
        parts = [("u", torch.float64, (n,)), ("index", torch.long, (n,)), ("generation", torch.long, (n,))]
        if prioritized:
            parts += [("leaf", torch.float64, (n,)), ("weight", torch.float32, (n,))]
        parts += [(None, dtype, (n, *shape)) for _, dtype, shape in plan.specs]
        sizes = [n * torch.empty(shape[1:], dtype=dtype).nbytes for _, dtype, shape in parts]
        starts, end = [], 0
        for size in sizes:  # each part 64-byte aligned
            starts.append(end)
            end += -(-size // 64) * 64
        self.base = torch.empty(max(end, 1), dtype=torch.uint8)
        self.leaf = self.weight = None
        views = [self.base[s:s + size].view(dtype).view(shape)
                 for s, size, (_, dtype, shape) in zip(starts, sizes, parts, strict=True)]
        self.rows = []
        for (name, _, _), view in zip(parts, views, strict=True):
            if name is None:
                self.rows.append(view)
            else:
                setattr(self, name, view)
        k = len(self.rows)
        self.table = (ctypes.c_int64 * (4 * k))(*plan.sources, *(r.data_ptr() for r in self.rows))
        a = self.args = native.SampleArgs()
        self.args_at = ctypes.addressof(a)  # the block's address, for native.calls().sample
        a.n_cols, a.cols, a.n, a.u = k, ctypes.addressof(self.table), n, self.u.data_ptr()
        a.index, a.generation, a.capacity = self.index.data_ptr(), self.generation.data_ptr(), plan.capacity
        a.threads = 1
        if prioritized:
            a.leaf, a.weight = self.leaf.data_ptr(), self.weight.data_ptr()
        self.storage = self.base.untyped_storage()  # kept: its reference is part of the count
        self.cdata = self.storage._cdata
        self.alone = _use_count(self.cdata)  # the block, its views, nothing handed out
        self.address, self.nbytes = self.storage.data_ptr(), self.storage.nbytes()

    def state(self) -> str:
        """``"free"``: nothing handed out from the block is alive; ``"held"``: something is;
        ``"moved"``: its memory moved in place (``share_memory_()`` or a pickle through
        torch.multiprocessing of a tensor handed out, ``resize_``), so the addresses in
        its argument block are stale: never reused."""
        if self.storage.data_ptr() != self.address or self.storage.nbytes() != self.nbytes:
            return "moved"
        return "free" if self.alone is not None and _use_count(self.cdata) == self.alone else "held"


class _Plan:
    """What every fast sample from one storage reuses, rebuilt when its columns are
    replaced (``storage._cols`` is then a new list): the columns' keys, dtypes and
    row shapes, their sources for the native table, and the output blocks."""

    __slots__ = ("cols", "watched", "specs", "sources", "capacity", "blocks", "lock", "generator", "trees")

    def __init__(self, storage: DeviceStorage):
        self.cols, self.capacity = storage._cols, storage.capacity
        self.blocks: dict = {}
        self.lock = threading.Lock()
        self.generator = None  # the last generator found to be on the CPU
        self.trees = (None, None, 0, 0, 0, None)  # sum nodes, min nodes, size, their addresses, roots
        self.specs = None
        self.watched = native.watch([column for _, column in self.cols])
        layouts = [native.row_layout(column) for _, column in self.cols]
        if storage.device.type != "cpu" or not self.cols or any(lay is None for lay in layouts):
            return  # another device or rows that are not contiguous: the full path
        self.specs = [(key, column.dtype, tuple(column.shape[1:])) for key, column in self.cols]
        self.sources = [*(c.data_ptr() for _, c in self.cols), *(lay[0] for lay in layouts),
                        *(lay[1] for lay in layouts)]

    def __reduce__(self):
        """A copy or a pickle of the storage carries no plan (its addresses are this
        storage's memory): the next sample builds its own."""
        return _no_plan, ()

    def moved(self) -> bool:
        """Whether a column's memory moved since the plan was built (``native.moved``)."""
        return native.moved(self.watched)

    def take(self, n: int, prioritized: bool) -> tuple:
        """A free output block for ``n`` draws, claimed (under the lock) by the aliases
        returned with it: ``(block, index, generation, weight or None, rows)``."""
        with self.lock:
            slot = self.blocks.get((n, prioritized))
            if slot is None:
                if len(self.blocks) >= SIZES:
                    self.blocks.clear()  # blocks handed out stay alive with their tensors
                slot = self.blocks[(n, prioritized)] = []
            for out in list(slot):
                state = out.state()
                if state == "free":
                    break
                if state == "moved":
                    slot.remove(out)  # stale addresses: dropped (its tensors stay valid for their holders)
            else:
                out = _Outputs(self, n, prioritized)
                if len(slot) < PER_SIZE and TensorPool._alone() is not None:
                    slot.append(out)
            weight = out.weight.detach() if prioritized else None
            return out, out.index.detach(), out.generation.detach(), weight, [r.detach() for r in out.rows]

    def bind_trees(self, sampler: PrioritizedSampler) -> tuple | None:
        """The sampler's trees as the fast path reads them, ``(sum nodes, min nodes, size,
        their addresses, the two roots)`` (kept for the next call), or None when they cannot
        be read natively. The caller holds the tuple for its call: the nodes stay alive
        even if another thread binds other trees meanwhile."""
        s, m = sampler.sum_tree._nodes, sampler.min_tree._nodes
        if not all(t.is_cpu and t.is_contiguous() and t.dtype == torch.float64 for t in (s, m)):
            return None
        a, b = s.data_ptr(), m.data_ptr()
        roots = (ctypes.c_double.from_address(a + 8), ctypes.c_double.from_address(b + 8))
        self.trees = trees = (s, m, sampler.sum_tree.size, a, b, roots)
        return trees


def _no_plan() -> None:
    return None


def try_sample(buffer, batch_size) -> tuple | None:
    """``(rows, info)`` as the variant buffer's ``sample`` returns them, or None (nothing
    changed, the generator not advanced) when the fast path does not apply (module doc)."""
    if not ENABLED or type(batch_size) is not int or batch_size < 1 or buffer.transform is not None \
            or buffer.pin_memory:
        return None
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    prioritized = type(sampler) is PrioritizedSampler
    if type(storage) is not DeviceStorage or type(writer) is not DeviceWriter or storage.data is None \
            or storage.size < 1 or not (prioritized or type(sampler) is RandomSampler):
        return None
    calls = native._state.get("calls") or native.calls()
    if calls is None:
        return None
    plan = storage.__dict__.get("_sample_plan")
    if plan is None or plan.cols is not storage._cols:  # columns replaced
        plan = storage._sample_plan = _Plan(storage)
    if plan.specs is None or writer.device.type != "cpu":
        return None
    if plan.moved():  # the rows' memory moved in place: a new plan (new output blocks too)
        plan = storage._sample_plan = _Plan(storage)
    generator = buffer.generator
    if generator is not plan.generator:
        if not (isinstance(generator, torch.Generator) and generator.device.type == "cpu"):
            return None
        plan.generator = generator
    n = storage.size
    if prioritized:
        if sampler.backend != "torch" or sampler.device.type != "cpu":
            return None
        trees, s, m = plan.trees, sampler.sum_tree._nodes, sampler.min_tree._nodes
        if trees[0] is not s or trees[1] is not m or s.data_ptr() != trees[3] or m.data_ptr() != trees[4]:
            trees = plan.bind_trees(sampler)  # other trees, or their memory moved
            if trees is None:
                return None
        _, _, tree_size, nodes, _, (sum_root, min_root) = trees
        total, low = sum_root.value, min_root.value
        if not total > 0:
            return None  # the full path raises the reference's error
        try:
            divisor = weight_divisor(n, low, total, sampler.beta)  # the reference's
        except ValueError:
            return None  # the full path raises it, before its draw
    out, index, generation, weight, rows = plan.take(batch_size, prioritized)
    args = out.args
    args.size, args.write_count = n, writer.write_count
    torch.rand(batch_size, generator=generator, dtype=torch.float64, out=out.u)  # the reference's draw
    if prioritized:
        args.nodes, args.tree_size, args.total, args.divisor = nodes, tree_size, total, divisor
        args.threads = torch.get_num_threads() if batch_size >= THREADED else 1
        exponent = -sampler.beta
        args.do_pow = torch_pow.in_c(batch_size, exponent)
        calls.sample(out.args_at, 0)  # rb_sample_descend
        if args.do_pow:  # (n * p) ** -beta in rb_sample_rows, as torch's pow computes it
            args.exponent, args.vector_pow = exponent, torch_pow.vector_pow() or None
        else:
            out.leaf.pow_(exponent)  # torch's pow, the reference's bits
    else:
        args.nodes = None
    code = calls.sample(out.args_at, 1)  # rb_sample_rows
    if code > 0:  # pragma: no cover - the slots come from the trees or the uniforms, all in range
        raise ValueError(f"index={int(index[code - 1])}, but should be in [0, {plan.capacity})")
    tree: dict = {}
    for (key, _, _), row in zip(plan.specs, rows, strict=True):
        node = tree
        for part in key[:-1]:  # nested keys ("next", "reward"): nested TensorDicts
            node = node.setdefault(part, {})
        node[key[-1]] = row
    data = _to_tensordict(tree, torch.Size([batch_size]), storage.device)
    if prioritized:
        return data, {"index": index, "weight": weight, "generation": generation}
    return data, {"index": index, "generation": generation}
