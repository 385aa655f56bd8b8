"""Putting a policy on the collection device, and target parameters without a copy.

Contract
--------
``place_policy(policy, device, allow_in_place=True)`` returns the object the
collector should call:

* no copy is needed (every parameter and buffer is already on ``device``, or
  the policy has none, e.g. a plain function) and ``allow_in_place`` is True:
  the policy itself is returned, so it keeps seeing the trainer's updates;
* otherwise a private copy is made: ``copy.deepcopy(policy).to(device)``.
  The caller's policy is never moved or mutated;
* a policy that cannot be deep-copied -- its ``__deepcopy__`` (or pickling
  hooks) raise, or its class sets the marker ``rbcheck_copyable = False`` --
  is fine as long as no copy is needed; when one is needed
  :class:`NotCopyableError` is raised, naming the policy's class and the fix,
  with the original error kept as ``__cause__``. A raw traceback from
  ``deepcopy`` never escapes.

``make_target_params(module)`` returns a TensorDict of detached clones of the
module's parameters and buffers (for a loss' target network) without ever
deep-copying the module, so it works on non-copyable modules too. Use it with
``params.to_module(module)`` as a context manager for a functional call.

Cost: ``needs_move`` is O(number of tensors); a copy is O(size of the model);
``make_target_params`` copies every parameter and buffer once.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDict

#: Class (or instance) attribute a policy sets to ``False`` to declare that it
#: must never be deep-copied (e.g. it holds a socket, a lock or a big shared
#: table); the policy is then only ever used in place.
COPYABLE_MARKER = "rbcheck_copyable"


class NotCopyableError(RuntimeError, TypeError):
    """A copy of the policy is needed but the policy cannot be deep-copied."""


def _as_device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device={device!r}, but should be a torch.device or a device string such as "
            "'cpu' or 'cuda:0'"
        ) from err


def _same_device(have: torch.device, want: torch.device) -> bool:
    if have.type != want.type:
        return False
    if want.type == "cuda" and torch.cuda.is_available():  # bare "cuda" is the current one
        current = torch.cuda.current_device()
        have_index = current if have.index is None else have.index
        return have_index == (current if want.index is None else want.index)
    return want.index is None or have.index is None or have.index == want.index


def policy_devices(policy: Any) -> set[torch.device]:
    """The devices holding the policy's parameters and buffers (empty if none)."""
    if not isinstance(policy, torch.nn.Module):
        return set()
    tensors = list(policy.parameters()) + list(policy.buffers())
    return {t.device for t in tensors}


def needs_move(policy: Any, device: Any) -> bool:
    """True when some parameter or buffer of ``policy`` is not on ``device``."""
    want = _as_device(device)
    return any(not _same_device(have, want) for have in policy_devices(policy))


def is_copyable(policy: Any) -> bool:
    """False when the policy declares itself non-copyable with the marker."""
    return getattr(policy, COPYABLE_MARKER, True) is not False


def place_policy(policy: Any, device: Any = "cpu", allow_in_place: bool = True) -> Any:
    """Return ``policy`` itself when it can be used in place, else a copy on ``device``."""
    if not callable(policy):
        raise TypeError(f"policy={type(policy).__name__}, but should be a callable (an nn.Module)")
    if not isinstance(allow_in_place, bool):
        raise TypeError(f"allow_in_place={allow_in_place!r}, but should be True or False")
    want = _as_device(device)
    move = needs_move(policy, want)
    if not move and allow_in_place:
        return policy
    name = type(policy).__qualname__
    if move:
        where = ", ".join(sorted(str(d) for d in policy_devices(policy)))
        why = f"its parameters are on {where}, so a copy is needed to place it on device={str(want)!r}"
        fix = (
            f"move it yourself first (policy.to({str(want)!r})) and pass it in, so it is "
            f"used in place; or make {name} deep-copyable"
        )
    else:
        why = "allow_in_place=False asks for a private copy"
        fix = f"pass allow_in_place=True to use it in place, or make {name} deep-copyable"
    if not is_copyable(policy):
        raise NotCopyableError(
            f"policy={name} is marked {COPYABLE_MARKER}=False, but should be deep-copyable: "
            f"{why}. Fix: {fix}."
        )
    try:
        clone = copy.deepcopy(policy)
    except Exception as err:
        raise NotCopyableError(
            f"policy={name} cannot be deep-copied ({type(err).__name__}: {err}), but should be "
            f"deep-copyable: {why}. Fix: {fix}."
        ) from err
    return clone.to(want) if isinstance(clone, torch.nn.Module) else clone


def make_target_params(module: torch.nn.Module) -> TensorDict:
    """Detached clones of ``module``'s parameters and buffers, made without deepcopy."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module={type(module).__name__}, but should be a torch.nn.Module")
    return TensorDict.from_module(module).data.clone()
