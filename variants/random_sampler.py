"""Uniform sampling for device storage: the reference's draws, indices on the device.

Contract: ``reference/random_sampler.py``. The uniforms come from the caller's
(CPU) generator exactly as in the reference, so the same seed gives the same
indices; they are mapped to slots on the storage's device.

Cost: O(batch_size) plus one host-to-device copy of the uniforms.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import RandomSampler as ReferenceRandomSampler
from rbcheck.reference.random_sampler import check_not_empty


class RandomSampler(ReferenceRandomSampler):
    """Reference uniform sampler whose indices live on the storage's device."""

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        return {"index": self.indices_from_uniforms(u.to(storage.device), len(storage))}
