"""What the variant checkpoint tests share: their rows, their specs, and a
state moved to the CPU to be compared."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import BufferSpec
from rbcheck.variants import native

#: The variants whose checkpoints must be the reference's, bit for bit.
VARIANTS = ("device", "triton")


def rows(n: int, start: int = 0, done: bool = True) -> TensorDict:
    """``n`` rows numbered from ``start``: a 2-wide float obs, an action, an
    episode (3 rows each) and, with ``done``, a nested ``next.done``."""
    x = torch.arange(start, start + n)
    data = {"obs": torch.stack([x.float(), x / 3], 1), "action": x, "episode": x // 3}
    if done:
        data["next"] = {"done": x % 3 == 2}
    return TensorDict(data, batch_size=[n])


def specs(capacity: int) -> dict[str, BufferSpec]:
    """One spec per sampler, all seeded alike."""
    return {
        "random": BufferSpec(capacity=capacity, sampler="random", seed=4),
        "prioritized": BufferSpec(capacity=capacity, sampler="prioritized", alpha=0.7, beta=0.5,
                                  eps=1e-3, seed=4),
        "slice": BufferSpec(capacity=capacity, sampler="slice", slice_len=2, seed=4),
    }


def cpu(state):
    """``state`` with every tensor on the CPU (a variant may keep it on a device)."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [cpu(v) for v in state]
    return state


def use_library(monkeypatch, library) -> None:
    """Route every native call through ``library`` (a test's stand-in wrapping the real
    one): the ctypes handle and the hot calls alike (``native.CtypesCalls`` over it)."""
    monkeypatch.setitem(native._state, "lib", library)
    monkeypatch.setitem(native._state, "calls", native.CtypesCalls(library))
