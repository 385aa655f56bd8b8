"""Uniform sampling with replacement.

Contract
--------
* ``sample(storage, batch_size, generator)`` draws ``u = draw_uniforms(batch_size, generator)``
  and returns ``{"index": indices_from_uniforms(u, len(storage))}`` with
  ``indices_from_uniforms(u, size) = min(floor(u * size), size - 1)``: the same uniforms give
  the same indices in every implementation that shares the randomness.
* ``draw_uniforms`` is every sampler's draw: ``torch.rand(n, generator=generator,
  dtype=torch.float64)`` on the GENERATOR's device (torch's stream there: a CPU generator's
  Mersenne twister, a CUDA generator's Philox), read on the CPU. So a seed gives the same draws
  wherever the rows live, and a buffer on a GPU with a generator on that GPU can draw them in
  place: the same bits, no host draw.
* Every valid row has probability ``1 / len(storage)`` per draw.

Cost: O(batch_size). No state besides the caller's generator.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int


def draw_uniforms(n: int, generator: torch.Generator) -> torch.Tensor:
    """float64[n] uniforms in [0, 1) from ``generator``, drawn on its device, on the CPU."""
    return torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device).cpu()


def check_not_empty(storage) -> None:
    if len(storage) == 0:
        raise ValueError("len(buffer)=0, but should be >= 1 to sample")


class RandomSampler:
    """Uniform sampling with replacement over the valid rows (see module doc)."""

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        """``{"index": int64[batch_size]}``; ``cursor`` is unused (same signature as the others)."""
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        u = draw_uniforms(batch_size, generator)
        return {"index": self.indices_from_uniforms(u, len(storage))}

    def indices_from_uniforms(self, u: torch.Tensor, size: int) -> torch.Tensor:
        """Map float64 uniforms in [0, 1) to slots ``0 .. size-1``."""
        return torch.floor(u * size).long().clamp_(max=size - 1)

    def on_write(self, index: torch.Tensor, priority=None) -> None:
        """Nothing to track: every row is equally likely."""

    def state_dict(self) -> dict:
        return {"type": "RandomSampler"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "RandomSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'RandomSampler'")
