"""Proportional prioritized sampling (Schaul et al., 2016) with importance weights.

Contract
--------
* Priorities handed in are RAW, finite and ``>= 0``, and their transform is finite: the tree
  stores ``(p + eps) ** alpha``, computed in float64, whichever path wrote it: ``on_write`` for
  new rows (with or without a priority) and ``update_priority``. A priority whose transform
  overflows float64 (``1e200`` with ``alpha = 2``) is bad input like NaN: ``check_priority``
  refuses it (ValueError, nothing changed), stale update entries included; stored as inf it
  would give NaN weights and a checkpoint that no load takes. A state whose ``max_priority``
  (a new row's priority) overflows so is refused by ``load_state_dict``.
* ``max_priority`` is a Python float: the largest raw priority seen over the buffer's life (any
  path), starting at 1.0. A new row written without a priority gets ``max_priority``.
* A draw picks slot ``i`` with probability ``P_i = leaf_i / total``: with
  ``u = draw_uniforms(B, generator)`` (``random_sampler.py``) the slots are ``SumTree.find_prefix(u * total)``.
* ``weight_i = (N * P_i) ** -beta / (N * P_min) ** -beta``, in float64 returned as float32, with
  ``N`` the number of stored rows and ``P_min`` the smallest positive probability over the STORED
  rows (not the batch), so the largest possible weight is 1. A stored 0 (raw 0 with ``eps = 0``)
  is never sampled and is left out of ``P_min``. When ``(N * P_min) ** -beta`` is not a finite
  float (a subnormal smallest priority next to a large total: ``P_min`` underflows to 0, or its
  power overflows), ``sample`` refuses before drawing (``weight_divisor``: ValueError).
* ``update_priority`` ignores entries whose ``generation`` differs from the slot's
  ``current_generation`` (overwritten since sampled) and rejects slots never written.
* The state is the parameters, ``max_priority`` and the sum tree's leaves; the min tree is
  rebuilt from the leaves on load.

Cost: ``on_write`` / ``update_priority`` O(k log capacity) for k slots (the transform is
computed twice: once to check it), ``sample`` O(B log capacity); memory O(capacity) for the
two trees.
"""

from __future__ import annotations

import math

import torch

from rbcheck.reference.arguments import (
    check_generation,
    check_index,
    check_int,
    check_number,
    check_priority,
    transform_priority,
)
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms
from rbcheck.reference.sum_tree import MinTree, SumTree


class PrioritizedSampler:
    """Sum tree + min tree over ``capacity`` slots (see module doc)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8):
        self.capacity, self.max_priority = capacity, 1.0
        self.alpha, self.eps = check_number("alpha", alpha), check_number("eps", eps)
        self.beta = check_number("beta", beta, high=1.0)
        self.sum_tree = SumTree(capacity)
        self.min_tree = MinTree(capacity)  # holds +inf for zero leaves: they are never sampled

    def check_priority(self, priority, n: int) -> torch.Tensor:
        """Raw priorities as float64[n] (``arguments.check_priority``); ValueError also when
        their transform overflows float64 (before anything changes)."""
        raw = check_priority(priority, n)
        transform_priority(raw, self.alpha, self.eps)
        return raw

    def _store(self, index: torch.Tensor, raw: torch.Tensor) -> None:
        """The ONLY place a raw priority is transformed and stored."""
        value = transform_priority(raw, self.alpha, self.eps)
        self.sum_tree.update(index, value)
        self.min_tree.update(index, torch.where(value > 0, value, math.inf))
        if raw.numel():
            self.max_priority = max(self.max_priority, float(raw.max()))

    def on_write(self, index, priority=None) -> None:
        """New rows at ``index``: their raw ``priority``, or ``max_priority`` if None."""
        index = check_index(index, self.capacity)
        raw = (torch.full((len(index),), self.max_priority, dtype=torch.float64) if priority is None
               else self.check_priority(priority, len(index)))
        self._store(index, raw)

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        """Set raw priorities; entries with a stale ``generation`` are skipped."""
        index = check_index(index, self.capacity)
        raw = self.check_priority(priority, len(index))
        keep = check_generation(index, generation, current_generation)
        if keep is not None:
            index, raw = index[keep], raw[keep]
        self._store(index, raw)

    def indices_from_uniforms(self, u: torch.Tensor, size: int | None = None) -> torch.Tensor:
        """Map float64 uniforms in [0, 1) to slots; ``size`` is unused (the tree knows).
        Uniforms on another device are read where the trees are (the CPU)."""
        u = torch.as_tensor(u, dtype=torch.float64).cpu()
        return self.sum_tree.find_prefix(u * self.sum_tree.total())

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        """``{"index": int64[B], "weight": float32[B]}``; ``cursor`` is unused."""
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        total = self.sum_tree.total()
        if not total > 0:
            raise ValueError(f"total priority={total}, but should be > 0 to sample")
        n = len(storage)
        divisor = weight_divisor(n, self.min_tree.min(), total, self.beta)  # before the draw
        u = draw_uniforms(batch_size, generator)
        index = self.indices_from_uniforms(u)
        weight = (n * (self.sum_tree.leaf(index) / total)) ** -self.beta / divisor
        return {"index": index, "weight": weight.to(torch.float32)}

    def state_dict(self) -> dict:
        return {"type": "PrioritizedSampler", "alpha": self.alpha, "beta": self.beta, "eps": self.eps,
                "max_priority": self.max_priority, "sum_tree": self.sum_tree.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Replace params, trees and max priority; ValueError before any change if invalid."""
        if state.get("type") != "PrioritizedSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'PrioritizedSampler'")
        alpha, eps = check_number("alpha", state["alpha"]), check_number("eps", state["eps"])
        beta = check_number("beta", state["beta"], high=1.0)
        max_priority = check_number("max_priority", state["max_priority"])
        transform_priority(torch.tensor([max_priority], dtype=torch.float64), alpha, eps, "max_priority")
        sum_tree, min_tree = SumTree(self.capacity), MinTree(self.capacity)
        sum_tree.load_state_dict(state["sum_tree"])
        leaves = sum_tree.leaf(torch.arange(self.capacity))
        min_tree.update(torch.arange(self.capacity), torch.where(leaves > 0, leaves, math.inf))
        self.alpha, self.beta, self.eps, self.max_priority = alpha, beta, eps, max_priority
        self.sum_tree, self.min_tree = sum_tree, min_tree


def weight_divisor(n: int, low: float, total: float, beta: float) -> float:
    """``(n * (low / total)) ** -beta``, the weights' divisor (Python floats), or ValueError
    when it is not a finite float: a smallest stored priority ``low`` so small next to
    ``total`` that ``low / total`` underflows to 0 (then ``0 ** -beta``), or its power
    overflows (``5e-324 ** -1``)."""
    try:
        divisor = (n * (low / total)) ** -beta
    except (ZeroDivisionError, OverflowError):
        divisor = math.inf
    if not 0 < divisor < math.inf:
        raise ValueError(f"(len(buffer) * min priority / total) ** -beta={divisor} (len={n}, min stored "
                         f"priority={low!r}, total={total!r}, beta={beta}), but should be a finite float > 0 "
                         "to weight a sample: the smallest priority underflows next to the total (use eps > 0, "
                         "or priorities of normal magnitude)")
    return divisor
