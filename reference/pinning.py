"""The single pinning step of ``ReplayBuffer.sample(pin_memory=True)``.

Contract
--------
* ``require_accelerator()`` raises RuntimeError when no CUDA device is available: pinned memory
  only exists to speed up host-to-device copies, so ``pin_memory=True`` without one is an error,
  never a silent no-op.
* ``pin_sample(sample, info)`` returns the sample and the info dict with EVERY tensor in
  page-locked memory (also when the TensorDict's device is None, e.g. built by a transform).
* The buffer runs this step LAST, after all transforms, and looks both functions up on this
  module at call time, so tests can replace them.

Cost: one host copy of every tensor of the sample and the info.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def require_accelerator() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("pin_memory=True needs an accelerator, but torch.cuda.is_available() is "
                           "False; pass pin_memory=False on a machine without a GPU")


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    """Pin a host tensor; one already pinned or on a device is returned as is."""
    return tensor if tensor.device.type != "cpu" or tensor.is_pinned() else tensor.pin_memory()


def pin_sample(sample: TensorDictBase, info: dict) -> tuple[TensorDictBase, dict]:
    """Pin every tensor of ``sample`` (leaf by leaf, whatever its device) and ``info``."""
    return sample.apply(_pin), {k: _pin(v) if isinstance(v, torch.Tensor) else v for k, v in info.items()}
