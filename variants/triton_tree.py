"""Triton kernels for the sum/min trees: the batched descent and the batched
update, each one launch.

Contract
--------
* ``find_prefix(nodes, mass, size) -> (index, leaf value)``: one program per
  block of masses; every lane runs the reference descent (go left if
  ``mass < left or right == 0``, else ``mass -= left``) over all levels
  in registers, so it gives the reference's leaves for the same masses.
* ``update_trees(trees, index, values, mask)`` (one or two trees, updated
  together): the last write of each index is found in torch (a stable sort,
  see ``vector_tree.last_writes``); one launch writes the winning leaves; one
  launch per level recomputes their parents (``left + right`` or ``min``) for
  the levels wider than ``2**TOP_LOG`` nodes, where a parent reached by
  several lanes gets the same value from each; then ONE program recomputes
  the top ``TOP_LOG`` levels whole (at most 2047 nodes, a block-wide barrier
  between levels). Every node is a function of its two final children, so
  the trees are bit-identical to the reference's.
* Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)
  on CPU tensors. Triton reads that variable when a kernel is DECORATED, so
  this module sets it (if unset) before defining the kernels when no CUDA
  device is present. It is process-wide: Triton kernels decorated later in
  the process are interpreted too (on a machine that could not run them
  compiled anyway). The interpreter is slow: only small sizes in tests.
* Launched with ``enable_fp_fusion=False``: no multiply-add is ever
  contracted into an FMA, so each ``+``/``-`` rounds exactly as torch's does.
* Both kernels were compiled to PTX for sm_90 (``triton.compile`` with a
  ``GPUTarget``) on the development machine, which has no GPU; they ran
  there only in the interpreter.
* ``UNAVAILABLE`` is None when Triton imported, else the import error text.

Cost: descent O(B log capacity) in one launch; update O(k log k) sort in
torch plus O(k (log capacity - TOP_LOG) + 2**TOP_LOG) in log capacity - TOP_LOG
+ 2 launches (for capacities up to 2**TOP_LOG: two launches and a constant
2**TOP_LOG of work).
"""

from __future__ import annotations

import os

import torch

from rbcheck.variants.last_writes import last_writes

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
except Exception as error:  # ImportError, or a broken install raising something else
    triton = tl = None
    UNAVAILABLE: str | None = f"{type(error).__name__}: {error}"
else:
    UNAVAILABLE = None

if triton is not None:

    @triton.jit
    def _descend_kernel(nodes_ptr, mass_ptr, index_ptr, leaf_ptr, B,
                        SIZE: tl.constexpr, DEPTH: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < B
        mass = tl.load(mass_ptr + offs, mask=live, other=0.0)
        node = tl.full((BLOCK,), 1, tl.int64)
        for _ in tl.static_range(DEPTH):
            left = tl.load(nodes_ptr + 2 * node, mask=live, other=0.0)
            right = tl.load(nodes_ptr + 2 * node + 1, mask=live, other=0.0)
            go_left = (mass < left) | (right == 0.0)
            mass = tl.where(go_left, mass, mass - left)
            node = 2 * node + tl.where(go_left, 0, 1)
        tl.store(index_ptr + offs, node - SIZE, mask=live)
        tl.store(leaf_ptr + offs, tl.load(nodes_ptr + node, mask=live, other=0.0), mask=live)

    @triton.jit
    def _refresh(nodes_ptr, node, live, IS_MIN: tl.constexpr):
        # node = left + right (or min) from its two children, where live
        left = tl.load(nodes_ptr + 2 * node, mask=live, other=0.0)
        right = tl.load(nodes_ptr + 2 * node + 1, mask=live, other=0.0)
        if IS_MIN:
            parent = tl.minimum(left, right)
        else:
            parent = left + right
        tl.store(nodes_ptr + node, parent, mask=live)

    @triton.jit
    def _leaves_kernel(a_ptr, b_ptr, index_ptr, a_val_ptr, b_val_ptr, win_ptr, K,
                       SIZE: tl.constexpr, TWO: tl.constexpr, BLOCK: tl.constexpr):
        # only the last write of each index (win) stores its leaf
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        win = (offs < K) & (tl.load(win_ptr + offs, mask=offs < K, other=0) != 0)
        leaf = tl.load(index_ptr + offs, mask=win, other=0) + SIZE
        tl.store(a_ptr + leaf, tl.load(a_val_ptr + offs, mask=win, other=0.0), mask=win)
        if TWO:
            tl.store(b_ptr + leaf, tl.load(b_val_ptr + offs, mask=win, other=0.0), mask=win)

    @triton.jit
    def _level_kernel(a_ptr, b_ptr, index_ptr, win_ptr, K, level,
                      SIZE: tl.constexpr, A_MIN: tl.constexpr, B_MIN: tl.constexpr,
                      TWO: tl.constexpr, BLOCK: tl.constexpr):
        # the parents at one level of every winning leaf; a parent reached from
        # several lanes or programs gets the same value from each
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        win = (offs < K) & (tl.load(win_ptr + offs, mask=offs < K, other=0) != 0)
        node = (tl.load(index_ptr + offs, mask=win, other=0) + SIZE) >> level
        _refresh(a_ptr, node, win, A_MIN)
        if TWO:
            _refresh(b_ptr, node, win, B_MIN)

    @triton.jit
    def _top_kernel(a_ptr, b_ptr, TOP_LOG: tl.constexpr, A_MIN: tl.constexpr,
                    B_MIN: tl.constexpr, TWO: tl.constexpr, HALF: tl.constexpr):
        # every node above depth TOP_LOG (nodes 1 .. 2**TOP_LOG - 1), whole
        # levels, bottom up, in one program; the barrier orders the levels
        lanes = tl.arange(0, HALF)
        for up in range(0, TOP_LOG):
            depth = TOP_LOG - 1 - up
            node = (1 << depth) + lanes
            live = lanes < (1 << depth)
            _refresh(a_ptr, node, live, A_MIN)
            if TWO:
                _refresh(b_ptr, node, live, B_MIN)
            tl.debug_barrier()


def check_available() -> None:
    if UNAVAILABLE is not None:
        raise RuntimeError(f"triton={UNAVAILABLE}, but should import to use backend='triton'")


def find_prefix(nodes: torch.Tensor, mass: torch.Tensor, size: int, block: int = 256,
                index=None, leaf=None):
    """``(index int64[B], leaf float64[B])`` for float64 masses (see module doc);
    ``index`` / ``leaf`` are optional contiguous output tensors."""
    check_available()
    mass = mass.contiguous()
    if index is None:
        index = torch.empty(mass.shape, dtype=torch.long, device=nodes.device)
    if leaf is None:
        leaf = torch.empty(mass.shape, dtype=torch.float64, device=nodes.device)
    if mass.numel():
        grid = (triton.cdiv(mass.numel(), block),)
        _descend_kernel[grid](nodes, mass, index, leaf, mass.numel(),
                              SIZE=size, DEPTH=size.bit_length() - 1, BLOCK=block,
                              enable_fp_fusion=False)
    return index, leaf


#: Levels with at most this many nodes (the top of the tree) are recomputed
#: whole by one program; the levels below, by one launch per level over the
#: winning indices. 2**11: one block of 1024 lanes for the widest top level.
TOP_LOG = 11


def update_trees(trees, index: torch.Tensor, values, mask=None, block: int = 1024) -> None:
    """Batched update of one or two trees of one capacity (see module doc)."""
    check_available()
    if not 1 <= len(trees) <= 2:
        raise ValueError(f"len(trees)={len(trees)}, but should be 1 or 2")
    order, win = last_writes(index, mask)
    index = index.index_select(0, order).contiguous()
    win = win.to(torch.int8)
    a, b = trees[0], trees[-1]
    a_val = values[0].index_select(0, order).contiguous()
    b_val = values[-1].index_select(0, order).contiguous() if len(trees) == 2 else a_val
    flags = dict(SIZE=a.size, TWO=len(trees) == 2, enable_fp_fusion=False)
    kinds = dict(A_MIN=a.empty == float("inf"), B_MIN=b.empty == float("inf"))
    k = len(index)
    grid = (triton.cdiv(k, block),)
    _leaves_kernel[grid](a.nodes, b.nodes, index, a_val, b_val, win, k, BLOCK=block, **flags)
    top = min(TOP_LOG, a.depth)
    for level in range(1, a.depth - top + 1):
        _level_kernel[grid](a.nodes, b.nodes, index, win, k, level, BLOCK=block, **kinds, **flags)
    if top:
        flags.pop("SIZE")
        _top_kernel[(1,)](a.nodes, b.nodes, TOP_LOG=top, HALF=max(1 << (top - 1), 2), num_warps=8,
                          **kinds, **flags)
