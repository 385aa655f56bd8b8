"""Prioritized trajectory slices: a slice's start is drawn by its own row's priority.

Contract
--------
* Priorities are the prioritized sampler's (``prioritized_sampler.py``): one per slot, stored
  transformed ``(p + eps) ** alpha``; new rows get ``max_priority``; ``update_priority(index,
  ...)`` sets exactly the slots named (stale generations skipped).
* Trajectories, valid starts, ``num_slices`` / ``slice_len`` and ``strict_length`` are the
  slice samplers' (``slice_without_replacement_sampler.valid_starts``): a slice lies in one
  trajectory and never crosses the write cursor.
* THE DECLARED RULE: each slice's start is drawn independently (with replacement) among the
  valid starts, start ``s`` with probability ``leaf_s / sum_{valid v} leaf_v``: the priority of
  the START STEP, not of its trajectory or the slice's other rows (a high-priority row too close
  to its trajectory's end is never a start). With ``u = draw_uniforms(num_slices, generator)``
  the start is the first valid start whose cumulative mass exceeds ``u * total``.
* ``weight`` (per row, its slice's): ``(leaf_s / leaf_min) ** -beta`` with ``leaf_min`` the
  smallest positive stored priority over the HELD slots (the prioritized sampler's normaliser);
  float32. No valid start of positive mass -> ValueError.

Replacement law: with (slice starts are independent draws).

Cost: O(len(storage)) per sample (trajectories and the valid starts' mass), O(B) gathering.
"""

from __future__ import annotations

import math

import torch

from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms
from rbcheck.reference.slice_sampler import SliceSampler
from rbcheck.reference.slice_without_replacement_sampler import SliceWithoutReplacementSampler, per_row


class PrioritizedSliceSampler(PrioritizedSampler):
    """Slices whose starts follow the start rows' priorities (see module doc)."""

    replacement = "with"

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8, *, num_slices=None,
                 slice_len=None, episode_key="episode", strict_length=True):
        super().__init__(capacity, alpha, beta, eps)
        self.slices = SliceWithoutReplacementSampler(num_slices=num_slices, slice_len=slice_len,
                                                     episode_key=episode_key, strict_length=strict_length)

    def shape(self, batch_size: int) -> tuple[int, int]:
        return self.slices.shape(batch_size)

    def start_probabilities(self, storage, slice_len: int, cursor: int = 0) -> tuple:
        """``(order, start, length, valid, p)``: the trajectories, the valid start positions and
        each one's probability (the closed form the draws follow)."""
        order, start, length = self.slices.trajectories(storage, cursor)
        valid = self.slices.valid_starts(start, length, slice_len)
        mass = self.sum_tree.leaf(order[valid])
        total = float(mass.sum())
        if not total > 0:
            raise ValueError(f"priority mass of the valid slice starts={total} ({len(valid)} starts of length "
                             f"{slice_len}), but should be > 0 to sample")
        return order, start, length, valid, mass / total

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        check_not_empty(storage)
        order, start, length, valid, p = self.start_probabilities(storage, slice_len, cursor)
        valid, p = valid[p > 0], p[p > 0]  # a start of zero mass is never drawn
        held = self.sum_tree.leaf(order)
        low = float(held.masked_fill(held <= 0, math.inf).min())
        cumulative = torch.cumsum(p, 0)
        pick = torch.searchsorted(cumulative, draw_uniforms(num_slices, generator) * float(cumulative[-1]),
                                  right=True).clamp_(max=len(valid) - 1)
        first = valid[pick]
        traj = torch.searchsorted(start, first, right=True) - 1
        rows = (start[traj] + length[traj] - first).clamp(max=slice_len)
        position = torch.cat([torch.arange(f, f + r) for f, r in zip(first.tolist(), rows.tolist(), strict=True)])
        end = torch.zeros(len(position), dtype=torch.bool)
        end[rows.cumsum(0) - 1] = True
        weight = (self.sum_tree.leaf(order[first]) / low) ** -self.beta
        return {"index": order[position], "traj": per_row(traj, rows), "slice_end": end,
                "weight": per_row(weight, rows).to(torch.float32)}

    def indices_from_uniforms(self, u, size=None):
        raise NotImplementedError("a prioritized slice sampler draws slice starts, not slots (no shared_rng)")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "type": "PrioritizedSliceSampler",
                "slices": {k: getattr(self.slices, k) for k in SliceSampler.params if k != "done_key"}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "PrioritizedSliceSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'PrioritizedSliceSampler'")
        slices = state["slices"]
        checked = SliceWithoutReplacementSampler(**{k: tuple(v) if isinstance(v, list) else v for k, v in slices.items()})
        super().load_state_dict({**state, "type": "PrioritizedSampler"})
        self.slices = checked
