"""Sum and min trees as flat float64 tensors on a device, updated and searched
for a whole batch at once.

Contract (the reference's, ``reference/sum_tree.py``, plus batching)
--------
* Same layout as the reference: ``nodes`` has ``2 * size`` entries, node 1 is
  the root, leaf ``i`` is node ``size + i``, node 0 unused; unused leaves hold
  0 (sum) or +inf (min). ``state_dict`` is the reference's, so checkpoints
  move between the two bit for bit.
* float64, like the reference: the same additions in the same order give the
  same bits, so trees built from the same updates are IDENTICAL (not merely
  close), and the same masses descend to the same leaves. float32 would drift
  at large capacity (a 2^20-leaf sum loses ~20 bits of the smaller addends)
  and could not reproduce the reference's choices near interval edges.
* ``update(index, value, mask=None)``: leaves set with a repeated index
  resolved LAST-WRITE-WINS among the entries where ``mask`` is True (as if
  the masked-out entries were absent), then the touched parents recomputed
  level by level as ``left + right`` (resp. ``min(left, right)``). Each
  parent is a function of its two final children only, so the result equals
  the reference's bit for bit.
* ``find_prefix(mass)``: all B masses descend together, one level per step,
  with the reference's rule: go left if ``mass < left or right == 0``, else
  ``mass -= left`` and go right.
* ``update_pair(sum_tree, min_tree, index, value, mask)`` updates both trees in
  one pass (the prioritized sampler's hot path); backend ``"triton"`` runs it
  and ``find_prefix`` as Triton kernels (see ``triton_tree.py``).
* On the CPU (either backend, unless Triton's interpreter is on) descent and
  update run in C (``rbcheck.variants.native``: the same arithmetic, compiled without
  fast-math or FMA contraction) when it builds and loads; otherwise the torch
  ops below, with the reason in ``rbcheck.variants.native.unavailable_reason()``.
* Shadow levels: a C update leaves four levels near the leaves stale
  (``native.shadow_levels``: the ones the C descent recomputes from the
  line of eight nodes below and never reads), which cuts the cache lines
  an update touches per entry from seven to three on the large levels.
  ``nodes`` is exact whenever it is read: the property recomputes those
  levels first (O(size), only after such an update); the hot paths read
  ``raw_nodes`` (leaves, root and every other level exact).

Cost: ``update`` O(k log k + k log capacity) for k indices (a sort to find the
last writes, then one gather/combine/scatter per level; native: no sort, one
pass per level); never O(capacity). ``find_prefix`` O(B log capacity).
Memory: 2 * size float64 per tree.
"""

from __future__ import annotations

import math
import os

import torch

from rbcheck.reference.arguments import check_index
from rbcheck.reference.sum_tree import MinTree, SumTree
from rbcheck.variants import native
from rbcheck.variants.last_writes import last_writes

BACKENDS = ("torch", "triton")


class _VectorTree:
    """Mixin over the reference tree: device placement, batched update and descent."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu", backend: str = "torch"):
        super().__init__(capacity)
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}, but should be one of {BACKENDS}")
        self.device, self.backend = torch.device(device), backend
        if backend == "triton":
            from rbcheck.variants import (
                triton_tree,  # sets TRITON_INTERPRET first when there is no CUDA
            )

            triton_tree.check_available()
        self.depth = self.size.bit_length() - 1
        self.has_shadow = bool(native.shadow_levels(self.depth))
        self.nodes = place(self.nodes, self.device)

    # -- nodes: exact when read, shadow levels possibly stale inside ----------
    @property
    def nodes(self) -> torch.Tensor:
        """All ``2 * size`` nodes, every one the combination of its children (the
        shadow levels recomputed first if an update left them stale)."""
        if self._stale:
            self.materialize()
        return self._nodes

    @nodes.setter
    def nodes(self, value: torch.Tensor) -> None:
        self._nodes, self._stale = value, False

    @property
    def raw_nodes(self) -> torch.Tensor:
        """The node tensor as it is: exact but for the shadow levels (see module doc)."""
        return self._nodes

    def mark_stale(self) -> None:
        """After a shadow update: the shadow levels may be stale."""
        self._stale = self._stale or self.has_shadow

    def materialize(self) -> None:
        """Recompute the shadow levels whole, bottom up (C when it loads, else torch)."""
        nodes = self._nodes
        if native.usable(nodes):
            native.materialize(nodes, isinstance(self, MinTree), self.size)
        else:
            for level in native.shadow_levels(self.depth):
                pairs = nodes[2 << level:4 << level].view(-1, 2)
                nodes[1 << level:2 << level] = self.combine(pairs[:, 0], pairs[:, 1])
        self._stale = False

    # -- reads ---------------------------------------------------------------
    def leaf(self, index) -> torch.Tensor:
        index = self.size + check_index(index, self.capacity).to(self.device)
        return self._nodes.index_select(0, index)

    def root(self) -> torch.Tensor:
        """Node 1 as a 0-d tensor on the device (no synchronisation)."""
        return self._nodes[1]

    # -- writes --------------------------------------------------------------
    def update(self, index, value, mask=None) -> None:
        """Batched ``update`` (see module doc); validates like the reference."""
        index = check_index(index, self.capacity).to(self.device)
        value = torch.as_tensor(value, dtype=torch.float64).to(self.device)
        if value.shape != index.shape:
            raise ValueError(f"value.shape={tuple(value.shape)}, but should be {tuple(index.shape)}")
        if len(index):
            apply_updates([self], index, [value], mask)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.nodes = place(self.nodes, self.device)


class VectorSumTree(_VectorTree, SumTree):
    """Batched reference ``SumTree`` on a device."""

    def total(self) -> float:
        return float(self._nodes[1])

    def find_prefix(self, mass) -> torch.Tensor:
        mass = torch.as_tensor(mass, dtype=torch.float64).to(self.device)
        return find_prefix(self, mass)[0]


class VectorMinTree(_VectorTree, MinTree):
    """Batched reference ``MinTree`` on a device."""

    def min(self) -> float:
        return float(self._nodes[1])


def place(nodes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``nodes`` on ``device``; on the CPU a fresh contiguous copy in memory backed by
    huge pages where the OS allows (see ``native.empty_huge``)."""
    if device.type != "cpu":
        return nodes.to(device)
    return native.empty_huge(nodes.shape, nodes.dtype).copy_(nodes)


def find_prefix(tree: VectorSumTree, mass: torch.Tensor, index=None, leaf=None, work=None):
    """``(leaf index, leaf value)`` per mass, with the tree's backend; ``index``
    / ``leaf`` are optional output tensors (int64 / float64, like ``mass``);
    ``work`` an optional dict the torch path keeps its temporaries in."""
    if tree.backend == "triton" and (mass.is_cuda or interpreting()):
        from rbcheck.variants.triton_tree import find_prefix as triton_find_prefix

        return triton_find_prefix(tree.nodes, mass, tree.size, index=index, leaf=leaf)
    if mass.dtype == torch.float64 and native.usable(tree.raw_nodes, mass):  # reads no shadow level
        return find_prefix_native(tree.raw_nodes, mass, tree.size, index=index, leaf=leaf)
    return find_prefix_torch(tree.nodes, mass, tree.size, index=index, leaf=leaf, work=work)


def find_prefix_native(nodes: torch.Tensor, mass: torch.Tensor, size: int, index=None, leaf=None):
    """``find_prefix_torch``'s result computed by ``rbcheck.variants.native`` (CPU, contiguous
    float64 ``nodes`` / ``mass``; the library must be loaded)."""
    n = mass.shape[0]
    out_index = index if index is not None and index.is_contiguous() else torch.empty(n, dtype=torch.long)
    out_leaf = leaf if leaf is not None and leaf.is_contiguous() else torch.empty(n, dtype=torch.float64)
    native.find_prefix(nodes, mass, size, out_index, out_leaf)
    if index is not None and out_index is not index:
        out_index = index.copy_(out_index)
    if leaf is not None and out_leaf is not leaf:
        out_leaf = leaf.copy_(out_leaf)
    return out_index, out_leaf


#: Temporaries kept in one ``work`` dict (one per name, shape, dtype and device): past this
#: many, the dict is emptied and refilled on demand, so a caller that cycles through many
#: batch sizes does not keep a set of buffers per size for good.
WORK_LIMIT = 64


def forget_all(cache: dict) -> None:
    """Empty ``cache`` (of tensors, tuples or lists of tensors). When one is on CUDA, the
    device finishes its work first: a kernel on another stream than the one a tensor was
    allocated on may still use it, and the allocator would hand its memory out again."""
    if any(isinstance(t, torch.Tensor) and t.is_cuda
           for value in cache.values() for t in (value if isinstance(value, (tuple, list)) else (value,))):
        torch.cuda.synchronize()
    cache.clear()


def kept(work: dict, key, make, limit: int = WORK_LIMIT):
    """``work[key]``, made by ``make()`` when absent (emptying ``work`` first when it holds
    ``limit`` entries: a value in use stays alive through its caller's reference)."""
    found = work.get(key)
    if found is None:
        if len(work) >= limit:
            forget_all(work)
        found = work[key] = make()
    return found


def workspace(work: dict | None, name: str, shape, dtype, device) -> torch.Tensor:
    """A temporary kept in ``work`` between calls (allocated if absent or mis-shaped)."""
    if work is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return kept(work, (name, tuple(shape), dtype, torch.device(device)),
                lambda: torch.empty(shape, dtype=dtype, device=device))


def find_prefix_torch(nodes: torch.Tensor, mass: torch.Tensor, size: int, index=None, leaf=None,
                      work=None):
    """``(leaf index, leaf value)`` for each mass: the reference descent, one
    level per step for all masses at once, in place on preallocated
    temporaries (new host memory costs page faults). ``mass -= where(go,
    left, 0)`` equals the reference's ``where(go, mass - left, mass)`` bit
    for bit (``m - 0 == m``, also for an infinite ``left``). Gathers use
    ``index_select``, not ``nodes[node]``: advanced indexing was far slower on
    the CPU here."""
    n = mass.shape[0]
    pairs = nodes.view(-1, 2)  # pairs[k] = (node 2k, node 2k+1): the children of node k
    dev = nodes.device
    node = torch.ones(n, dtype=torch.long, device=dev) if index is None else index.fill_(1)
    mass = workspace(work, "mass", (n,), nodes.dtype, dev).copy_(mass)
    children = workspace(work, "children", (n, 2), nodes.dtype, dev)
    go = workspace(work, "go", (n,), torch.bool, dev)
    nonzero = workspace(work, "nonzero", (n,), torch.bool, dev)
    step = workspace(work, "step", (n,), nodes.dtype, dev)
    zero = workspace(work, "zero", (n,), nodes.dtype, dev).zero_()
    left, right = children[:, 0], children[:, 1]
    for _ in range(size.bit_length() - 1):
        torch.index_select(pairs, 0, node, out=children)
        torch.ge(mass, left, out=go)  # go right == not (mass < left or right == 0)
        torch.ne(right, 0, out=nonzero)
        go.logical_and_(nonzero)
        mass.sub_(torch.where(go, left, zero, out=step))
        node.mul_(2).add_(go)
    if leaf is None:
        leaf = torch.empty(n, dtype=nodes.dtype, device=dev)
    torch.index_select(nodes, 0, node, out=leaf)
    return node.sub_(size), leaf


def update_pair(sum_tree, min_tree, index: torch.Tensor, value: torch.Tensor, mask=None) -> None:
    """``value`` at leaves ``index`` of ``sum_tree`` and ``value if value > 0 else
    inf`` of ``min_tree`` (last write wins among ``mask``); parents refreshed."""
    if _native_ok([sum_tree, min_tree], index, [value], mask):
        native.update(sum_tree.raw_nodes, False, min_tree.raw_nodes, True, sum_tree.size,
                      sum_tree.capacity, index.contiguous(), value.contiguous(), None,
                      None if mask is None else mask.contiguous(), shadow=True)
        sum_tree.mark_stale()
        min_tree.mark_stale()
        return
    apply_updates([sum_tree, min_tree], index, [value, torch.where(value > 0, value, math.inf)], mask,
                  try_native=False)


def _native_ok(trees, index, values, mask) -> bool:
    """Whether ``rbcheck.variants.native`` can run this update (CPU, dtypes, not Triton's turn)."""
    first = trees[0]
    if first.backend == "triton" and (index.is_cuda or interpreting()):
        return False
    return (index.dtype == torch.long and all(v.dtype == torch.float64 for v in values)
            and (mask is None or mask.dtype == torch.bool)
            and native.usable(*(t.raw_nodes for t in trees), index, *values,
                              *(() if mask is None else (mask,))))


def apply_updates(trees, index: torch.Tensor, values, mask=None, try_native=True) -> None:
    """Set ``values[t]`` at leaves ``index`` of each tree ``t`` (last write wins
    among ``mask``), then refresh the touched parents. Trees share a capacity."""
    first = trees[0]
    if first.backend == "triton" and (index.is_cuda or interpreting()):
        from rbcheck.variants.triton_tree import update_trees

        update_trees(trees, index, values, mask)
        return
    if try_native and len(trees) <= 2 and _native_ok(trees, index, values, mask):
        second = trees[1] if len(trees) == 2 else None
        native.update(first.raw_nodes, isinstance(first, MinTree),
                      None if second is None else second.raw_nodes, isinstance(second, MinTree),
                      first.size, first.capacity, index.contiguous(), values[0].contiguous(),
                      None if second is None else values[1].contiguous(),
                      None if mask is None else mask.contiguous(), shadow=True)
        for tree in trees:
            tree.mark_stale()
        return
    apply_updates_torch(trees, index, values, mask)


def apply_updates_torch(trees, index: torch.Tensor, values, mask=None) -> None:
    """``apply_updates`` with torch ops only (the fallback and the native path's check)."""
    first = trees[0]
    order, is_last = last_writes(index, mask)
    keep = order[is_last]  # positions of the winning entries, sorted by index
    node = index.index_select(0, keep) + first.size
    for tree, value in zip(trees, values, strict=True):
        tree.nodes.index_copy_(0, node, value.index_select(0, keep))
    for _ in range(first.depth):
        node = torch.unique_consecutive(node >> 1)  # still sorted: dedupe is one pass
        for tree in trees:
            children = tree.nodes.view(-1, 2).index_select(0, node)
            tree.nodes.index_copy_(0, node, tree.combine(children[:, 0], children[:, 1]))


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
