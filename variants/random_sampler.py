"""Uniform sampling for device storage: the reference's draws, indices on the device.

Contract: ``reference/random_sampler.py``. The uniforms come from the caller's
(CPU) generator exactly as in the reference, so the same seed gives the same
indices; they are mapped to slots on the storage's device. On the CPU, with
``rbcheck.variants.native`` loaded, the uniforms are drawn into a reused
workspace and mapped to slots by one C pass (``native.uniform_slots``: the
reference's ``floor(u * size).long().clamp_(max=size - 1)``, the same bits)
into a pooled index (reused only once the caller has dropped it).

Cost: O(batch_size) plus one host-to-device copy of the uniforms.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import RandomSampler as ReferenceRandomSampler
from rbcheck.reference.random_sampler import check_not_empty
from rbcheck.variants import native
from rbcheck.variants.device_storage import TensorPool
from rbcheck.variants.vector_tree import workspace


class RandomSampler(ReferenceRandomSampler):
    """Reference uniform sampler whose indices live on the storage's device."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.work = TensorPool(), {}  # the returned index / the uniforms

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        size = len(storage)
        if storage.device.type == "cpu" and native.usable():
            u = workspace(self.work, "u", (batch_size,), torch.float64, "cpu")
            torch.rand(batch_size, generator=generator, dtype=torch.float64, out=u)  # the reference's draw
            index = self.pool.take("index", (batch_size,), torch.long, "cpu")
            return {"index": native.uniform_slots(u, size, index)}
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        return {"index": self.indices_from_uniforms(u.to(storage.device), size)}
