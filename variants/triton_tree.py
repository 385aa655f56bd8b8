"""Triton kernels for the sum/min trees: the batched descent and the batched
update, each one launch.

Contract
--------
* ``find_prefix(nodes, mass, size) -> (index, leaf value)``: one program per
  block of masses; every lane runs the reference descent (go left if
  ``mass < left or right == 0``, else ``mass -= left``) over all levels
  in registers, so it gives the reference's leaves for the same masses.
* ``update_trees(trees, index, values, mask)`` (one or two trees, updated
  together), by default (``FUSED``) ONE launch after one stable sort in torch
  (``key = index``, or ``2 * index + mask``): the sorted positions are cut
  into the subtrees rooted at depth ``TOP_LOG`` (no node below that depth
  lies in two of them); a subtree belongs to the program whose block of
  sorted positions holds its first one, and that program alone writes its
  winning leaves (the last kept write of each index: the last of its run in
  the stable sort, as ``vector_tree.last_writes`` decides) and then its
  nodes level by level up to the subtree's root, a block-wide barrier
  between levels. Each program then fences its stores and counts itself done
  on an atomic counter; the last one recomputes the top ``TOP_LOG`` levels
  whole (at most 2047 nodes, a barrier between levels) and resets the
  counter. Loads in that kernel go to L2 (``.cg``), never a stale L1 line.
  One counter per tree: updates of one tree must not run concurrently on
  two streams (the buffer's are issued in order on one).
  ``FUSED = False`` (or ``fused=False``): the earlier path, kept to measure
  against: the winners gathered in torch, one launch for the leaves, one per
  level wider than ``2**TOP_LOG`` nodes (a parent reached by several lanes
  gets the same value from each), one program for the top. Every node is a
  function of its two final children either way, so the trees are
  bit-identical to the reference's.
* Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)
  on CPU tensors. Triton reads that variable when a kernel is DECORATED, so
  this module sets it (if unset) before defining the kernels when no CUDA
  device is present. It is process-wide: Triton kernels decorated later in
  the process are interpreted too (on a machine that could not run them
  compiled anyway). The interpreter is slow: only small sizes in tests.
* Launched with ``enable_fp_fusion=False``: no multiply-add is ever
  contracted into an FMA, so each ``+``/``-`` rounds exactly as torch's does.
* The kernels were compiled for sm_90 (``triton.compile`` with a
  ``GPUTarget``; the single-launch update's PTX holds the fences, the
  acq_rel atomic and the ``.cg`` loads) on the development machine, which
  has no GPU; they ran there only in the interpreter, which runs programs
  one after another: the concurrency of the single-launch update is checked
  on a GPU by ``bench/gpu_check.sh`` (the tests and the benchmark's
  equality checks at 2^20 and 2^24).
* ``UNAVAILABLE`` is None when Triton imported, else the import error text.

Cost: descent O(B log capacity) in one launch; update O(k log k) sort in
torch plus O(k (log capacity - TOP_LOG) + 2**TOP_LOG) in one launch (the
per-level path: log capacity - TOP_LOG + 2 launches). The single launch
does the top in one program after all others: its critical path is the
busiest subtree's levels plus the top's.
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
    def _descend_kernel(nodes_ptr, mass_ptr, index_ptr, leaf_ptr, B, SIZE, DEPTH,
                        BLOCK: tl.constexpr):
        # SIZE and DEPTH are run-time arguments: one compiled kernel for every capacity
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < B
        mass = tl.load(mass_ptr + offs, mask=live, other=0.0)
        node = tl.full((BLOCK,), 1, tl.int64)
        for _ in range(DEPTH):
            left = tl.load(nodes_ptr + 2 * node, mask=live, other=0.0)
            right = tl.load(nodes_ptr + 2 * node + 1, mask=live, other=0.0)
            go_left = (mass < left) | (right == 0.0)
            mass = tl.where(go_left, mass, mass - left)
            node = 2 * node + tl.where(go_left, 0, 1)
        tl.store(index_ptr + offs, node - SIZE, mask=live)
        tl.store(leaf_ptr + offs, tl.load(nodes_ptr + node, mask=live, other=0.0), mask=live)

    @triton.jit
    def _step(node, mass, left, right):
        """The reference's rule from ``node`` with children sums ``left`` / ``right``."""
        go_right = ~(mass < left) & (right != 0.0)  # not (mass < left or right == 0), NaN too
        return 2 * node + go_right.to(tl.int64), tl.where(go_right, mass - left, mass), go_right

    @triton.jit(do_not_specialize=["B", "SIZE", "TOP", "PASSES", "N_ROWS"])  # one build for all sizes
    def _sample_kernel(nodes_ptr, u_ptr, index_ptr, base_ptr, B, SIZE, TOP, PASSES, N_ROWS,
                       BLOCK: tl.constexpr):
        # total = the root (node 1: what the host read), mass = u * total, the descent, then n_rows * (leaf / total): the prioritized
        # sampler's steps before its pow, in one launch. The first TOP levels one by one
        # (two stored nodes each), then PASSES line passes: the eight nodes three levels
        # down (one line of 64 bytes, eight independent loads) and the two levels between
        # recomputed with the tree's own additions (a stored inner node is exactly the
        # float64 sum of its children), so a lane waits on one load per three levels.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < B
        total = tl.load(nodes_ptr + 1)  # float64 (a Python float argument would be float32)
        mass = tl.load(u_ptr + offs, mask=live, other=0.0) * total
        node = tl.full((BLOCK,), 1, tl.int64)
        for _ in range(TOP):
            left = tl.load(nodes_ptr + 2 * node, mask=live, other=0.0)
            right = tl.load(nodes_ptr + 2 * node + 1, mask=live, other=0.0)
            node, mass, _g = _step(node, mass, left, right)
        for _ in range(PASSES):
            line = nodes_ptr + 8 * node
            e0 = tl.load(line, mask=live, other=0.0)
            e1 = tl.load(line + 1, mask=live, other=0.0)
            e2 = tl.load(line + 2, mask=live, other=0.0)
            e3 = tl.load(line + 3, mask=live, other=0.0)
            e4 = tl.load(line + 4, mask=live, other=0.0)
            e5 = tl.load(line + 5, mask=live, other=0.0)
            e6 = tl.load(line + 6, mask=live, other=0.0)
            e7 = tl.load(line + 7, mask=live, other=0.0)
            p0, p1, p2, p3 = e0 + e1, e2 + e3, e4 + e5, e6 + e7
            k, mass, g1 = _step(tl.full((BLOCK,), 0, tl.int64), mass, p0 + p1, p2 + p3)
            k, mass, g2 = _step(k, mass, tl.where(g1, p2, p0), tl.where(g1, p3, p1))
            left = tl.where(g1, tl.where(g2, e6, e4), tl.where(g2, e2, e0))
            right = tl.where(g1, tl.where(g2, e7, e5), tl.where(g2, e3, e1))
            k, mass, _g = _step(k, mass, left, right)
            node = 8 * node + k
        leaf = tl.load(nodes_ptr + node, mask=live, other=0.0)
        tl.store(index_ptr + offs, node - SIZE, mask=live)
        n_rows = tl.full((BLOCK,), N_ROWS, tl.int64).to(tl.float64)  # exact below 2**53
        tl.store(base_ptr + offs, (leaf / total) * n_rows, mask=live)

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


    @triton.jit
    def _lower(x, y):
        # tl.reduce's combine for a minimum (tl.min itself is a jit function of
        # triton.language, which the interpreter cannot run when triton was imported
        # before TRITON_INTERPRET was set, as tensordict's import does)
        return tl.minimum(x, y)

    @triton.jit
    def _fence(x, FENCE: tl.constexpr):
        # every thread: fence.acq_rel.gpu (its stores visible GPU-wide before a later
        # signal; later loads after an earlier one); the interpreter runs programs
        # one after another and needs none
        if FENCE:
            x = tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [x],
                                          dtype=tl.int32, is_pure=False, pack=1)
        return x

    @triton.jit
    def _combine(nodes_ptr, node, live, IS_MIN: tl.constexpr):
        # _refresh with loads from L2 (".cg"): nodes written by other programs of the
        # same launch are read where they were stored, never from a stale L1 line
        left = tl.load(nodes_ptr + 2 * node, mask=live, other=0.0, cache_modifier=".cg")
        right = tl.load(nodes_ptr + 2 * node + 1, mask=live, other=0.0, cache_modifier=".cg")
        if IS_MIN:
            parent = tl.minimum(left, right)
        else:
            parent = left + right
        tl.store(nodes_ptr + node, parent, mask=live)

    @triton.jit
    def _winners(key_ptr, offs, live, K, MASKED: tl.constexpr):
        # (slot, is the last kept write of its slot) at sorted positions offs
        key = tl.load(key_ptr + offs, mask=live, other=0)
        after = tl.load(key_ptr + offs + 1, mask=live & (offs + 1 < K), other=-1)
        if MASKED:  # key = 2 * slot + kept
            slot = key >> 1
            win = live & ((key & 1) == 1) & ((offs + 1 >= K) | ((after >> 1) != slot))
        else:  # key = slot
            slot = key
            win = live & ((offs + 1 >= K) | (after != slot))
        return slot, win

    @triton.jit
    def _fused_update_kernel(a_ptr, b_ptr, key_ptr, order_ptr, a_val_ptr, b_val_ptr, count_ptr, K,
                             SIZE, SHIFT, CUT, MASKED: tl.constexpr, A_MIN: tl.constexpr,
                             B_MIN: tl.constexpr, TWO: tl.constexpr, HALF: tl.constexpr,
                             FENCE: tl.constexpr, BLOCK: tl.constexpr):
        # Whole update in one launch. The sorted keys are cut into subtrees rooted at
        # depth CUT (SHIFT = depth - CUT levels each); a subtree belongs to the program
        # whose block of BLOCK sorted positions holds its first position, and that
        # program alone writes its leaves and its nodes up to the subtree's root
        # (level by level, a block-wide barrier between levels; its positions may run
        # past its block). The program that finishes last (a counter) recomputes the
        # top CUT levels whole, as _top_kernel does, and resets the counter. SIZE, SHIFT
        # and CUT are run-time arguments: one compiled kernel serves every capacity.
        lanes = tl.arange(0, BLOCK)
        start = tl.program_id(0) * BLOCK
        offs = start + lanes
        live = offs < K
        RANK = SHIFT + MASKED  # key >> RANK: the subtree
        key = tl.load(key_ptr + offs, mask=live, other=0)
        before = tl.load(key_ptr + offs - 1, mask=live & (offs > 0), other=0)
        first = live & ((offs == 0) | ((before >> RANK) != (key >> RANK)))
        own = tl.reduce(tl.where(first, offs, K), 0, _lower)  # K: no subtree starts here
        end = own * 0 + K  # a tensor even where K is specialised to a constant
        scan = tl.where(own < K, start + BLOCK, end)
        while scan < K:  # the next subtree's first position at or after the next block
            o = scan + lanes
            ok = o < K
            k = tl.load(key_ptr + o, mask=ok, other=0)
            p = tl.load(key_ptr + o - 1, mask=ok, other=0)
            found = tl.reduce(tl.where(ok & ((p >> RANK) != (k >> RANK)), o, K), 0, _lower)
            end = found
            scan = tl.where(found < K, K, scan + BLOCK)
        for c in range(own, end, BLOCK):  # the winning leaves
            o = c + lanes
            slot, win = _winners(key_ptr, o, o < end, K, MASKED)
            j = tl.load(order_ptr + o, mask=win, other=0)
            tl.store(a_ptr + slot + SIZE, tl.load(a_val_ptr + j, mask=win, other=0.0), mask=win)
            if TWO:
                tl.store(b_ptr + slot + SIZE, tl.load(b_val_ptr + j, mask=win, other=0.0), mask=win)
        tl.debug_barrier()
        for level in range(1, SHIFT + 1):  # their parents, up to the subtree roots
            for c in range(own, end, BLOCK):
                o = c + lanes
                slot, win = _winners(key_ptr, o, o < end, K, MASKED)
                node = (slot + SIZE) >> level
                _combine(a_ptr, node, win, A_MIN)
                if TWO:
                    _combine(b_ptr, node, win, B_MIN)
            tl.debug_barrier()
        _fence(lanes, FENCE)
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if done == tl.num_programs(0) - 1:  # every subtree root is final: the top
            _fence(lanes, FENCE)
            tl.debug_barrier()
            top = tl.arange(0, HALF)
            for up in range(0, CUT):
                depth = CUT - 1 - up
                node = (1 << depth) + top
                alive = top < (1 << depth)
                _combine(a_ptr, node, alive, A_MIN)
                if TWO:
                    _combine(b_ptr, node, alive, B_MIN)
                tl.debug_barrier()
            tl.store(count_ptr, 0)

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
                              size, size.bit_length() - 1, BLOCK=block,
                              enable_fp_fusion=False)
    return index, leaf


#: The triton sampler's ``sample`` runs ``sample_prefix`` (one launch); False: the
#: earlier per-op path (``u * total``, ``find_prefix``, four torch ops), kept to measure.
SAMPLE_FUSED = True


def sample_prefix(nodes: torch.Tensor, u: torch.Tensor, size: int, n_rows: int,
                  index: torch.Tensor, base: torch.Tensor, block: int = 256) -> None:
    """``index`` = the leaves of masses ``u * total``; ``base`` = ``n_rows * (leaf / total)``,
    with ``total`` the root ``nodes[1]`` (contiguous float64 ``u``, int64 ``index`` and
    float64 ``base`` on ``nodes``' device, ``0 <= n_rows < 2**53``): ``native.sample_prefix``'s
    contract, in one launch (``_sample_kernel``: line passes)."""
    check_available()
    if u.numel():
        depth = size.bit_length() - 1
        grid = (triton.cdiv(u.numel(), block),)
        _sample_kernel[grid](nodes, u, index, base, u.numel(), size, depth % 3, depth // 3, n_rows,
                             BLOCK=block, enable_fp_fusion=False)


#: Levels with at most this many nodes (the top of the tree) are recomputed
#: whole by one program; the levels below, by one launch per level over the
#: winning indices. 2**11: one block of 1024 lanes for the widest top level.
TOP_LOG = 11


#: ``update_trees`` runs the single-launch kernel (``_fused_update_kernel``);
#: False: the per-level launches (kept to measure one against the other).
FUSED = True


def update_trees(trees, index: torch.Tensor, values, mask=None, block: int | None = None,
                 fused: bool | None = None) -> None:
    """Batched update of one or two trees of one capacity (see module doc)."""
    check_available()
    if not 1 <= len(trees) <= 2:
        raise ValueError(f"len(trees)={len(trees)}, but should be 1 or 2")
    if FUSED if fused is None else fused:
        _update_fused(trees, index, values, mask, block or 256)
        return
    block = block or 1024
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


def _counter(tree) -> torch.Tensor:
    """The tree's int32 completion counter for ``_fused_update_kernel`` (zero
    between launches: the last program resets it)."""
    count = getattr(tree, "_triton_counter", None)
    if count is None or count.device != tree.nodes.device:
        count = tree._triton_counter = torch.zeros(1, dtype=torch.int32, device=tree.nodes.device)
    return count


def _update_fused(trees, index: torch.Tensor, values, mask, block: int) -> None:
    """``update_trees`` in one kernel launch after one stable sort (see module doc)."""
    a, b = trees[0], trees[-1]
    k = len(index)
    if not k:
        return
    key = index if mask is None else index * 2 + mask.long()
    key, order = torch.sort(key, stable=True)
    cut = min(TOP_LOG, a.depth)
    a_val = values[0].contiguous()
    b_val = values[-1].contiguous() if len(trees) == 2 else a_val
    _fused_update_kernel[(triton.cdiv(k, block),)](
        a.nodes, b.nodes, key, order, a_val, b_val, _counter(a), k, a.size, a.depth - cut, cut,
        MASKED=int(mask is not None), A_MIN=a.empty == float("inf"), B_MIN=b.empty == float("inf"),
        TWO=len(trees) == 2, HALF=1 << (TOP_LOG - 1) if TOP_LOG > 1 else 2, FENCE=index.is_cuda,
        BLOCK=block,
        num_warps=8 if block >= 1024 else 4, enable_fp_fusion=False)
