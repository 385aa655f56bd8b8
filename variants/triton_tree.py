"""Triton kernels for the sum/min trees: the batched descent and the batched
update, each one launch.

Contract
--------
* ``find_prefix(nodes, mass, size) -> (index, leaf value)``: one program per
  block of masses; every lane runs the reference descent (go left if
  ``mass < left or right == 0``, else ``mass -= left``) over all levels
  in registers, so it gives the reference's leaves for the same masses.
* ``update_trees(trees, index, values, mask)``: the last write of each index
  is found in torch (a stable sort, see ``vector_tree.last_writes``), then ONE
  program per tree writes the winning leaves and recomputes their parents
  level by level (``left + right`` or ``min``), with a block-wide barrier
  between levels; a parent reached by several lanes gets the same value from
  each. Bit-identical to the reference.
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
torch plus O(k log capacity) in one launch per tree.
"""

from __future__ import annotations

import os

import torch

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
    def _update_kernel(nodes_ptr, index_ptr, value_ptr, win_ptr, K,
                       SIZE: tl.constexpr, DEPTH: tl.constexpr, IS_MIN: tl.constexpr,
                       BLOCK: tl.constexpr):
        # leaves: only the last write of each index (win) stores
        for start in range(0, K, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            win = (offs < K) & (tl.load(win_ptr + offs, mask=offs < K, other=0) != 0)
            leaf = tl.load(index_ptr + offs, mask=win, other=0) + SIZE
            tl.store(nodes_ptr + leaf, tl.load(value_ptr + offs, mask=win, other=0.0), mask=win)
        tl.debug_barrier()
        # parents, bottom up; the barrier makes a level's writes visible to the next
        for level in range(1, DEPTH + 1):
            for start in range(0, K, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                win = (offs < K) & (tl.load(win_ptr + offs, mask=offs < K, other=0) != 0)
                node = (tl.load(index_ptr + offs, mask=win, other=0) + SIZE) >> level
                left = tl.load(nodes_ptr + 2 * node, mask=win, other=0.0)
                right = tl.load(nodes_ptr + 2 * node + 1, mask=win, other=0.0)
                if IS_MIN:
                    parent = tl.minimum(left, right)
                else:
                    parent = left + right
                tl.store(nodes_ptr + node, parent, mask=win)
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


def update_trees(trees, index: torch.Tensor, values, mask=None, block: int = 1024) -> None:
    """Batched update of each tree in ``trees`` (see module doc)."""
    check_available()
    from .vector_tree import last_writes

    order, win = last_writes(index, mask)
    index = index[order].contiguous()
    win = win.to(torch.int8)
    for tree, value in zip(trees, values, strict=True):
        _update_kernel[(1,)](tree.nodes, index, value[order].contiguous(), win, len(index),
                             SIZE=tree.size, DEPTH=tree.depth,
                             IS_MIN=tree.empty == float("inf"),
                             BLOCK=block, num_warps=8, enable_fp_fusion=False)
