"""Uniform sampling for device storage: the reference's draws, indices on the device.

Contract: ``reference/random_sampler.py``. The uniforms come from the caller's
generator exactly as in the reference (``draw_into``: on the generator's
device), so the same seed gives the same indices; they are mapped to slots on
the storage's device. A generator on the storage's GPU draws them there, with
no host draw and no copy (``torch.Generator("cuda")``). On the CPU, with
``rbcheck.variants.native`` loaded, the uniforms are drawn into a reused
workspace and mapped to slots by one C pass (``native.uniform_slots``: the
reference's ``floor(u * size).long().clamp_(max=size - 1)``, the same bits)
into a pooled index (reused only once the caller has dropped it).

Cost: O(batch_size) plus one host-to-device copy of the uniforms (none when
the generator is on the storage's device).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import RandomSampler as ReferenceRandomSampler
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms
from rbcheck.variants import native
from rbcheck.variants.device_storage import TensorPool, same_device
from rbcheck.variants.vector_tree import workspace


def draw_into(work: dict, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """The reference's draw (``draw_uniforms``: float64[n] from ``generator`` on its
    device) into a workspace of ``work``: on ``device`` when the generator lives
    there (no copy), else on the CPU (the caller moves it)."""
    here = generator.device.type != "cpu" and same_device(generator.device, device)
    u = workspace(work, "u", (n,), torch.float64, generator.device if here else "cpu")
    if here or generator.device.type == "cpu":
        return torch.rand(n, generator=generator, dtype=torch.float64, out=u)
    return u.copy_(draw_uniforms(n, generator))


class RandomSampler(ReferenceRandomSampler):
    """Reference uniform sampler whose indices live on the storage's device."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.work = TensorPool(), {}  # the returned index / the uniforms

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        size = len(storage)
        u = draw_into(self.work, batch_size, generator, storage.device)  # the reference's draw
        if storage.device.type == "cpu" and native.usable():
            index = self.pool.take("index", (batch_size,), torch.long, "cpu")
            return {"index": native.uniform_slots(u, size, index)}
        return {"index": self.indices_from_uniforms(u.to(storage.device), size)}
