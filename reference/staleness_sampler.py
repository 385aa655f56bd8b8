"""Staleness-aware sampling: fresher rows are drawn more often, too-stale ones never.

Contract
--------
* Each row carries its policy version under ``version_key`` (an integer, one per row). The
  sampler holds ``consumer_version`` (the learner's; 0 at first, set by the training loop).
  A row's STALENESS is ``s = consumer_version - version``; a row newer than the consumer
  (``s < 0``) is bad state: ``sample`` raises ValueError naming it.
* Gate: with ``max_staleness >= 0`` only rows with ``s <= max_staleness`` are eligible (-1: all
  rows). No eligible row -> ValueError.
* THE DECLARED WEIGHTING: each draw is independent (with replacement, within a batch and across
  batches) and picks eligible row ``i`` with probability ``w_i / sum_eligible w`` where
  ``w = 1 / (s + 1)``. With ``u = draw_uniforms(B, generator)`` the slot is the first eligible
  one whose cumulative weight exceeds ``u * total``.
* Returns ``index`` and ``staleness`` (int64, of the drawn rows). The state is
  ``consumer_version`` and ``max_staleness``.

Replacement law: with.

Cost: O(len(storage)) per sample (the weights are recomputed from the stored versions), plus
O(B log len) for the draws.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms


def staleness_weight(staleness: torch.Tensor) -> torch.Tensor:
    """The declared weight of a row of staleness ``s >= 0``: ``1 / (s + 1)``, float64."""
    return 1.0 / (staleness.to(torch.float64) + 1.0)


class StalenessSampler:
    """Freshness-weighted draws over the rows not too stale (see module doc)."""

    replacement = "with"

    def __init__(self, max_staleness: int = -1, version_key: str = "policy_version"):
        self.max_staleness = check_int("max_staleness", max_staleness, -1)
        if not (isinstance(version_key, str) and version_key):
            raise ValueError(f"version_key={version_key!r}, but should be a non-empty str")
        self.version_key, self.consumer_version = version_key, 0

    def set_consumer_version(self, version: int) -> None:
        self.consumer_version = check_int("consumer_version", version, 0)

    def eligible(self, storage) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots, staleness)`` of the eligible held rows, in slot order."""
        check_not_empty(storage)
        n = len(storage)
        if self.version_key not in storage.data.keys():
            raise ValueError(f"version_key={self.version_key!r}, but should be a key of the stored data")
        staleness = self.consumer_version - storage.data[self.version_key][:n].reshape(n).to(torch.int64).cpu()
        if bool((staleness < 0).any()):
            slot = int(torch.nonzero(staleness < 0)[0])
            raise ValueError(f"policy version of slot {slot}={self.consumer_version - int(staleness[slot])}, but "
                             f"should be <= consumer_version={self.consumer_version}")
        keep = staleness <= self.max_staleness if self.max_staleness >= 0 else torch.ones(n, dtype=torch.bool)
        if not bool(keep.any()):
            raise ValueError(f"rows with staleness <= max_staleness={self.max_staleness}: 0 of {n} (consumer_version="
                             f"{self.consumer_version}), but should be >= 1")
        slots = torch.nonzero(keep).flatten()
        return slots, staleness[slots]

    def probabilities(self, storage) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots, p)``: the eligible slots and each one's draw probability."""
        slots, staleness = self.eligible(storage)
        weight = staleness_weight(staleness)
        return slots, weight / weight.sum()

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        check_int("batch_size", batch_size)
        slots, p = self.probabilities(storage)
        cumulative = torch.cumsum(p, 0)
        pick = torch.searchsorted(cumulative, draw_uniforms(batch_size, generator) * float(cumulative[-1]),
                                  right=True).clamp_(max=len(slots) - 1)
        index = slots[pick]
        versions = storage.data[self.version_key][:len(storage)].reshape(-1).cpu()[index].to(torch.int64)
        return {"index": index, "staleness": self.consumer_version - versions}

    def on_write(self, index, priority=None) -> None:
        """Nothing to track: the weights are read from the stored versions at each sample."""

    def state_dict(self) -> dict:
        return {"type": "StalenessSampler", "max_staleness": self.max_staleness, "version_key": self.version_key,
                "consumer_version": self.consumer_version}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "StalenessSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'StalenessSampler'")
        checked = StalenessSampler(state["max_staleness"], state["version_key"])
        checked.set_consumer_version(state["consumer_version"])
        self.__dict__.update(checked.__dict__)
