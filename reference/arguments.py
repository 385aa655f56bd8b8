"""Argument checks shared by every component.

Contract: each check returns the value in the form the caller uses, or raises
``ValueError("<name>=<got>, but should be <allowed>")`` before anything changes.
"""

from __future__ import annotations

import math
import sys

import torch

#: Device types whose tensors can be read (copied) by the buffer.
READABLE_DEVICES = ("cpu", "cuda")


def check_int(name: str, value, low: int = 1, high: int | None = None) -> int:
    """An int (not a bool) in ``[low, high)`` (no upper bound when ``high`` is None)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value >= high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name}={value!r}, but should be an int {allowed}")
    return value


def check_number(name: str, value, high: float = math.inf) -> float:
    """A finite number in ``[0, high]`` as a float (``alpha``, ``eps``; ``beta`` with ``high=1``)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not 0 <= value <= high:
        allowed = "a finite number >= 0" if high == math.inf else f"a number in [0, {high}]"
        raise ValueError(f"{name}={value!r}, but should be {allowed}")
    return float(value)


def as_tensor(value, name: str, integer: bool = False) -> torch.Tensor:
    """``value`` as a tensor on a readable device (``integer``: of an integer dtype, as int64)."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name}={value!r:.80}, but should be a tensor of numbers ({error})") from None
    if tensor.device.type not in READABLE_DEVICES:
        raise ValueError(f"{name}.device={tensor.device}, but should be one of {READABLE_DEVICES}")
    if integer and (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool):
        raise ValueError(f"{name}.dtype={tensor.dtype}, but should be an integer dtype")
    return tensor.long() if integer else tensor


def check_index(index, high: int, name: str = "index") -> torch.Tensor:
    """``index`` as a 1-D int64 CPU tensor with ``0 <= index < high``."""
    index = as_tensor(index, name, integer=True).cpu()
    if index.dim() != 1:
        raise ValueError(f"{name}.shape={tuple(index.shape)}, but should be 1-D")
    bad = index[(index < 0) | (index >= high)]
    if bad.numel():
        raise ValueError(f"{name}={bad[:5].tolist()}, but should be in [0, {high})")
    return index


def check_priority(priority, n: int, device="cpu") -> torch.Tensor:
    """Raw priorities as float64[n] on ``device``; ValueError on a wrong shape, dtype or value."""
    priority = as_tensor(priority, "priority").detach()
    if priority.is_complex() or priority.dtype == torch.bool:
        raise ValueError(f"priority.dtype={priority.dtype}, but should be a real number dtype")
    priority = priority.to(device, torch.float64)
    if tuple(priority.shape) != (n,):
        raise ValueError(f"priority.shape={tuple(priority.shape)}, but should be ({n},)")
    bad = ~torch.isfinite(priority) | (priority < 0)
    if bool(bad.any()):  # Reverb's rule: NaN, inf and negative are refused, zero is allowed
        raise ValueError(f"priority={priority[bad][:5].tolist()}, but should be finite and >= 0")
    return priority


def transform_priority(raw: torch.Tensor, alpha: float, eps: float, name: str = "priority") -> torch.Tensor:
    """``(raw + eps) ** alpha`` in float64: how every path stores raw priorities (the one
    expression). ValueError naming the raw priorities whose transform overflows to inf."""
    value = (raw + eps) ** alpha
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        try:  # (bound + eps) ** alpha is about the largest float64; only p + eps overflows for alpha <= 1
            bound = sys.float_info.max ** (1 / alpha) if alpha > 1 else sys.float_info.max
        except OverflowError:
            bound = sys.float_info.max
        raise ValueError(f"{name}={raw[bad][:5].tolist()}, but should be at most about {bound:.3g} (its "
                         f"transform (p + eps) ** alpha overflows float64 at alpha={alpha}, eps={eps})")
    return value


def check_generation(index: torch.Tensor, generation, current) -> torch.Tensor | None:
    """The mask of entries to apply (None: all); every slot must be written (``current >= 0``)."""
    if current is None:
        return None
    current = torch.as_tensor(current)
    if bool((current < 0).any()):
        raise ValueError(f"index={index[current.to(index.device) < 0][:5].tolist()}, "
                         f"but should be slots already written")
    if generation is None:
        return None
    generation = as_tensor(generation, "generation", integer=True)
    if generation.shape != index.shape:
        raise ValueError(f"generation.shape={tuple(generation.shape)}, but should be {tuple(index.shape)}")
    return generation.to(current.device) == current


def last_occurrence(index: torch.Tensor, high: int) -> torch.Tensor:
    """Boolean mask keeping only the last occurrence of each value of ``index``."""
    position = torch.arange(len(index))
    last = torch.full((high,), -1, dtype=torch.long)
    last.scatter_reduce_(0, index, position, reduce="amax")
    return last[index] == position


def as_generator(generator) -> torch.Generator:
    """An int seeds a new Generator; None gives one with torch's default seed."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.Generator() if generator is None else generator
    if not isinstance(generator, int) or isinstance(generator, bool):
        raise ValueError(f"generator={generator!r}, but should be None, an int seed or a torch.Generator")
    return torch.Generator().manual_seed(generator)


def check_generator_state(state, device: torch.device) -> None:
    """ValueError unless ``state`` is a valid state of a generator on ``device``'s kind
    (a CPU generator's differs in size from a CUDA one's)."""
    try:
        torch.Generator(device).set_state(state)
    except RuntimeError as error:  # a byte tensor of the wrong size (other types: TypeError)
        raise ValueError(f"generator state={state.numel()} bytes ({error}), but should be the state of a "
                         f"{device.type} generator, the buffer's") from error
