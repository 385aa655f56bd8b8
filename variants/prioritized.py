"""Prioritized sampling with device-resident, batch-updated float64 trees.

Contract: the reference's (``reference/prioritized_sampler.py``), with
* trees ``VectorSumTree`` / ``VectorMinTree`` on ``device`` (float64: see
  ``vector_tree.py`` for why), updated in one batched pass per call;
* the transform ``(p + eps) ** alpha`` in ONE place (``_store``), with the
  reference's torch expression, so on the CPU the stored values are the
  reference's bits. (On CUDA, torch's float64 ``pow`` may differ from the
  CPU's in the last bit; everything downstream of the leaves is exact.)
* the same random stream: uniforms are drawn from the caller's generator
  exactly as the reference draws them (on the generator's device), so with
  the same seed the variant samples the reference's indices; a generator on
  the trees' GPU draws them there (no host draw, no copy), one on the CPU
  draws them there and they are moved (``random_sampler.draw_into``);
* ``max_priority`` a Python float (property) backed by a 0-d device tensor,
  so new rows and updates need no host round trip for it;
* stale entries (generation != current) dropped by a mask, without
  compacting the batch (no device synchronisation on that path);
* ``state_dict`` / ``load_state_dict`` the reference's keys and layout;
* a priority whose transform overflows float64 refused as the reference
  refuses it (``check_priority``, before anything changes), decided on the
  same expression over the same vector, so on the CPU the same inputs;
* on the CPU, when ``rbcheck.variants.native`` loads, ``update_priority`` (no
  generations) is one C pass of checks, widening, ``+ eps`` and max, torch's
  ``pow``, one C pass checking that no transform overflowed and committing
  the max, and one C update of both trees (all in one native call where the
  pow may run in C, made by ``update_fast.try_update`` with what does not
  change between updates bound once); ``sample`` is one C call for
  ``mass = u * total``, the descent and ``n * (leaf / total)``, torch's
  ``pow`` (the reference's, so the same bits), and one C call for the
  division and the float32 conversion; the trees' updates run in C too;
* with the ``triton`` backend, ``sample`` is one launch for ``u * total``, the
  descent and ``n * (leaf / total)`` (``triton_tree.sample_prefix``), torch's
  ``pow``, and one torch op for the division and the float32 conversion;
* off the CPU, ``update_priority`` (no generations) reads its checks back in
  one host synchronisation (``_update_one_sync``: index range, priorities
  finite and >= 0, no overflowing transform, from four reductions) instead
  of one per check; on any failure the full path runs and raises the
  reference's error, nothing changed before. With the ``triton`` backend on
  CUDA the rest (transform and trees) replays a CUDA graph per batch size
  (``update_graph``).

Cost: ``on_write`` / ``update_priority`` O(k log k + k log capacity);
``sample`` O(B log capacity) plus one host read of (total, min).
"""

from __future__ import annotations

import math
import sys

import torch

from rbcheck.reference.arguments import (
    check_generation,
    check_int,
    check_priority,
    transform_priority,
)
from rbcheck.reference.prioritized_sampler import PrioritizedSampler as ReferencePrioritizedSampler
from rbcheck.reference.prioritized_sampler import weight_divisor
from rbcheck.reference.random_sampler import check_not_empty
from rbcheck.variants import native
from rbcheck.variants.device_storage import TensorPool, resolved
from rbcheck.variants.device_storage import check_index_fast as check_index
from rbcheck.variants.native import torch_pow
from rbcheck.variants.random_sampler import draw_into
from rbcheck.variants.update_fast import try_update
from rbcheck.variants.update_graph import graphed_store, transform_and_update
from rbcheck.variants.vector_tree import (
    VectorMinTree,
    VectorSumTree,
    find_prefix,
    interpreting,
    kept,
    place,
    workspace,
)


class PrioritizedSampler(ReferencePrioritizedSampler):
    """Batched prioritized sampler on a device (see module doc)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8, *,
                 device: str | torch.device = "cpu", backend: str = "torch"):
        self.device, self.backend = resolved(device), backend  # "cuda": its tensors' "cuda:0"
        self._max_priority = torch.tensor(1.0, dtype=torch.float64, device=self.device)
        super().__init__(capacity, alpha, beta, eps)  # validates alpha, beta, eps; builds trees
        self.sum_tree = VectorSumTree(capacity, self.device, backend)
        self.min_tree = VectorMinTree(capacity, self.device, backend)
        self.pool, self.work = TensorPool(), {}  # returned tensors / internal temporaries

    def to(self, device: str | torch.device) -> PrioritizedSampler:
        """Move trees and max priority to ``device`` (the buffer calls this)."""
        device = resolved(device)
        if device != self.sum_tree.raw_nodes.device:
            self.sum_tree.nodes = place(self.sum_tree.nodes, device)
            self.min_tree.nodes = place(self.min_tree.nodes, device)
        self.device = self.sum_tree.device = self.min_tree.device = device
        self._max_priority = self._max_priority.to(self.device)
        self.__dict__.pop("_update_plan", None)  # update_fast's: it would keep the old trees alive
        return self

    @property
    def max_priority(self) -> float:
        return float(self._max_priority)

    @max_priority.setter
    def max_priority(self, value: float) -> None:
        self._max_priority = torch.tensor(float(value), dtype=torch.float64, device=self.device)

    def check_priority(self, priority, n: int) -> torch.Tensor:
        """The reference's check; raw priorities as float64[n] on the device (on the
        CPU the happy path is one C pass; anything else gets the reference's check),
        refused too when their transform overflows (the reference's expression)."""
        raw = None
        if isinstance(priority, torch.Tensor) and priority.is_floating_point() \
                and priority.device.type == "cpu" and self.device.type == "cpu" \
                and tuple(priority.shape) == (n,):
            value = priority.detach().to(torch.float64).contiguous()
            if native.usable(value) and native.all_finite_nonneg(value):
                raw = value
        if raw is None:
            raw = check_priority(priority, n, self.device)
        self._refuse_overflow(raw)
        return raw

    def _refuse_overflow(self, raw: torch.Tensor) -> None:
        """The reference's refusal of a transform that overflows (``transform_priority``)
        at less cost: the transform is computed only when the largest base
        ``max(raw) + eps`` is within 2**-20 (relative) of the bound where
        ``base ** alpha`` reaches the largest float64. Below that no pow can
        overflow (its error is far smaller), so the decision is the reference's."""
        if not len(raw):
            return
        bound = sys.float_info.max if self.alpha <= 1 else sys.float_info.max ** (1 / self.alpha)
        if float(raw.max()) + self.eps <= bound * (1 - 2.0**-20):
            return
        transform_priority(raw, self.alpha, self.eps)  # near the bound: the reference's own check

    def _store(self, index: torch.Tensor, raw: torch.Tensor, keep: torch.Tensor | None = None,
               high: float | None = None) -> None:
        """The ONLY place a raw priority is transformed and stored; ``keep`` masks entries
        out. ``raw`` went through ``check_priority`` (or is the max priority, whose
        transform ``load_state_dict`` checks): no transform overflows here. ``high``:
        ``max(raw)`` already read on the host (no ``keep``), which spares a reduction."""
        if not len(index):
            return
        assert high is None or keep is None, "high is max(raw): no entry may be masked out"
        if high is None or not graphed_store(self, index, raw):  # graphed: CUDA, triton, one replay
            value = workspace(self.work, "value", (len(index),), torch.float64, raw.device)
            transform_and_update(self, index.to(self.device), raw, value, keep)
        if high is not None:
            self._max_priority = torch.clamp(self._max_priority, min=high)  # a new tensor, as below
            return
        seen = raw if keep is None else torch.where(keep, raw, -math.inf)
        self._max_priority = torch.maximum(self._max_priority, seen.max())

    def on_write(self, index, priority=None) -> None:
        index = check_index(index, self.capacity).to(self.device)
        if priority is None:
            raw = self._max_priority.expand(len(index))
        else:
            raw = self.check_priority(priority, len(index))
        self._store(index, raw)

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        if generation is None and current_generation is None and (
                self._update_native(index, priority) or self._update_one_sync(index, priority)):
            return
        index = check_index(index, self.capacity).to(self.device)
        raw = self.check_priority(priority, len(index))
        keep = check_generation(index, generation, current_generation)  # None: keep all
        keep = None if keep is None else keep.to(self.device)
        self._store(index, raw, keep)

    def _update_one_sync(self, index, priority, off_cpu_only: bool = True) -> bool:
        """``update_priority``'s happy path off the CPU (where ``_update_native`` does not
        run): the reference's checks (index in range, priorities finite and >= 0, no
        transform overflowing) decided on four reductions read back in ONE host
        synchronisation instead of one per check. An int64 index read as float64
        may round, but never across 0 or ``capacity`` (exact in float64, and rounding
        is monotone), and a NaN fails both comparisons of its min and max (``aminmax``
        propagates NaN). False when it does not apply or a check fails (nothing
        changed): the full path then runs and raises the reference's error.
        ``off_cpu_only=False``: also on the CPU (tests)."""
        if (off_cpu_only and self.device.type == "cpu") \
                or not (type(index) is torch.Tensor and type(priority) is torch.Tensor) \
                or index.dtype != torch.long or index.dim() != 1 or not len(index) \
                or not priority.is_floating_point() or priority.shape != index.shape \
                or index.device != self.device or priority.device != self.device:
            return False
        raw = priority.detach().to(torch.float64)
        first, last = torch.aminmax(index)
        low, high = torch.aminmax(raw)
        first, last, low, high = torch.stack([first.double(), last.double(), low, high]).tolist()
        if not (first >= 0 and last < self.capacity and low >= 0 and high < math.inf):
            return False
        bound = sys.float_info.max if self.alpha <= 1 else sys.float_info.max ** (1 / self.alpha)
        if high + self.eps > bound * (1 - 2.0**-20):
            return False  # near the bound: the full path's own check decides
        self._store(index, raw, high=high)
        return True

    def _update_native(self, index, priority, first: int | None = None) -> bool:
        """``update_priority``'s happy path on the CPU: one C pass checks the indices
        and priorities, widens them to float64, adds eps and finds the new max
        priority; the pow finishes the transform (the reference's bits: torch's, or the
        same in C, ``native.torch_pow``); one C pass (the pow's, when in C) checks that no
        transform overflowed and only then commits the max;
        one C call updates both trees (``first``: ``index`` is the ring slots ``first,
        first + 1, ...``, written as one or two ranges). False when it does not apply or a check fails
        (nothing changed): the full path then runs (and raises the reference's error).
        Without ``first``, ``update_fast.try_update`` makes the call first where it applies
        (its fixed arguments bound once); its answer stands, so a failed check in C runs once."""
        if first is None:
            done = try_update(self, index, priority)
            if done is not None:
                return done
        if not (type(index) is torch.Tensor and type(priority) is torch.Tensor) \
                or index.dtype != torch.long or index.dim() != 1 or not len(index) \
                or priority.dtype not in (torch.float32, torch.float64) \
                or priority.shape != index.shape or self.device.type != "cpu" \
                or (self.backend == "triton" and interpreting()) \
                or not native.usable(index, priority, self.sum_tree.raw_nodes, self.min_tree.raw_nodes):
            return False
        n = len(index)
        value, high = kept(self.work, ("update", n),  # this size's workspaces
                           lambda: (torch.empty(n, dtype=torch.float64), torch.empty(1, dtype=torch.float64)))
        c_pow = torch_pow.in_c(len(index), self.alpha)  # the pow in C, as torch's
        if first is None and c_pow:  # every step below in one C call
            if native.update_whole(index, self.capacity, priority, self.eps, value, self._max_priority, high,
                                   self.alpha, torch_pow.vector_pow(), self.sum_tree.raw_nodes,
                                   self.min_tree.raw_nodes, self.sum_tree.size):
                return False  # a check failed (nothing changed): the full path raises
        else:
            if not native.prepare_update(index, self.capacity, priority, self.eps, value, self._max_priority,
                                         high):
                return False
            if c_pow:
                done = native.finish_update(value, high, self._max_priority, self.alpha, torch_pow.vector_pow())
            else:
                value.pow_(self.alpha)  # (raw + eps) ** alpha: torch's pow, the reference's bits
                done = native.finish_update(value, high, self._max_priority)
            if not done:
                return False  # a transform overflowed float64
            trees = (self.sum_tree.raw_nodes, False, self.min_tree.raw_nodes, True, self.sum_tree.size,
                     self.capacity)
            if first is None:
                native.update(*trees, index, value, None, None, shadow=True)
            else:  # index is first, first + 1, ... (mod capacity): an extend's slots, each ancestor once
                head = min(len(index), self.capacity - first)
                native.update_range(*trees, first, value[:head], shadow=True)
                if head < len(index):
                    native.update_range(*trees, 0, value[head:], shadow=True)
        self.sum_tree.mark_stale()
        self.min_tree.mark_stale()
        return True

    def indices_from_uniforms(self, u: torch.Tensor, size: int | None = None) -> torch.Tensor:
        u = torch.as_tensor(u, dtype=torch.float64).to(self.device)
        return self.sum_tree.find_prefix(u * self.sum_tree.total())

    def _native(self) -> bool:
        """Whether ``sample`` runs the fused C draw (CPU trees, native path loaded)."""
        return (self.device.type == "cpu" and not (self.backend == "triton" and interpreting())
                and native.usable(self.sum_tree.raw_nodes))

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        fused = self._native()
        if fused:  # plain reads: no stacking, no tensor round trip
            total, low = self.sum_tree.raw_nodes[1].item(), self.min_tree.raw_nodes[1].item()
        else:
            total, low = torch.stack([self.sum_tree.root(), self.min_tree.root()]).tolist()
        if not total > 0:
            raise ValueError(f"total priority={total}, but should be > 0 to sample")
        n = len(storage)
        divisor = weight_divisor(n, low, total, self.beta)  # the reference's, before the draw
        work, dev = self.work, self.device
        u = draw_into(work, batch_size, generator, dev)  # the reference's draw
        index = self.pool.take("index", (batch_size,), torch.long, dev)
        leaf = workspace(work, "leaf", (batch_size,), torch.float64, dev)
        out = self.pool.take("weight", (batch_size,), torch.float32, dev)
        # the reference's (n * (leaf / total)) ** -beta / divisor, op by op
        if fused:  # C: mass = u * total, descent, n * (leaf / total), the pow, / and float32
            native.sample_prefix(self.sum_tree.raw_nodes, self.sum_tree.size, u, total, n, index, leaf)
            torch_pow.pow_(leaf, -self.beta)  # torch's pow, or the same bits in C
            return {"index": index, "weight": native.divide_to_float(leaf, divisor, out)}
        if self.backend == "triton" and (dev.type == "cuda" or interpreting()):
            from rbcheck.variants import triton_tree  # imported by the trees already

            if triton_tree.SAMPLE_FUSED:
                # one launch: u * total, the descent (line passes), n * (leaf / total) (a true
                # division, as the reference's on the CPU); torch: the pow, then / and float32 in
                # one op (on the CPU in float64, rounded once: the per-op path's bits; on CUDA
                # torch divides by a scalar through its reciprocal, as the per-op path's div_)
                triton_tree.sample_prefix(self.sum_tree.nodes, u.to(dev), self.sum_tree.size, n, index, leaf)
                leaf.pow_(-self.beta)
                return {"index": index, "weight": torch.div(leaf, divisor, out=out)}
        mass = u.to(dev) if dev.type != "cpu" else u
        mass.mul_(total)  # == u * total
        find_prefix(self.sum_tree, mass, index=index, leaf=leaf, work=work)
        weight = leaf.div_(total).mul_(n).pow_(-self.beta).div_(divisor)
        return {"index": index, "weight": out.copy_(weight)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)  # validates, builds reference trees on the CPU
        sum_tree = VectorSumTree(self.capacity, self.device, self.backend)
        min_tree = VectorMinTree(self.capacity, self.device, self.backend)
        sum_tree.load_state_dict(self.sum_tree.state_dict())
        min_tree.load_state_dict(self.min_tree.state_dict())
        self.sum_tree, self.min_tree = sum_tree, min_tree
        self.__dict__.pop("_update_plan", None)  # update_fast's: bound to the trees replaced
