"""What a checkpoint's state means: a state no buffer could have saved is refused.

The checksum of ``meta.json`` and the digest of the tensor file show that the files are as
they were sealed, not who sealed them: anyone can recompute both. So a load also checks the
state's meaning, against itself and the buffer loaded into, before anything changes.

Contract
--------
* ``check_meaning(state, buffer)`` raises ``CheckpointError`` naming the field and what it
  should be (``state.writer.write_count=3 ..., but should be ...``) unless
  - **no unknown keys**: the state holds only the keys ``ReplayBuffer.state_dict`` writes
    (``TOP``); its storage only ``keys`` and ``columns`` (a ``TensorStorage``; another storage:
    the keys of its own ``state_dict``); its writer, and its sampler when of the loading
    buffer's sampler type, only the keys their own ``state_dict`` has, nested dicts included
    (the sum tree's ``leaves``). Missing keys and wrong types are left to ``load_state_dict``.
  - **cursor and generations**: schema 2 stores neither; both are rebuilt from the write count
    (``writer.ring_generation``), an int in ``[0, 2**62)``, so they are in range and agree by
    construction. A ``cursor`` or ``generation`` key beside it is an unknown key.
  - **tree nodes**: only the sum tree's leaves are stored; every inner node (and the min tree)
    is rebuilt from its children on load, so none can disagree. A ``nodes`` key is unknown.
  - **held rows against the leaves**: a ring of ``write_count`` rows holds slots
    ``0 .. min(write_count, capacity) - 1``; a slot never written has no priority, so every
    leaf from there on is 0 (a full buffer said to hold 3 rows would never sample again).
    A writer that tells its own ``size`` (``max_value_writer``, ``consuming_sampler``) is
    not a plain ring: its ``load_state_dict`` checks its own rules.
  - **max priority against the leaves**: ``max_priority`` starts at 1.0 and only grows, over
    every raw priority stored, so it is ``>= 1.0`` and no leaf exceeds its transform
    ``(max_priority + eps) ** alpha`` (within ``SLACK``, relative: float64 ``pow`` on another
    device may differ from the CPU's in the last bits).
* It changes nothing and reads the state only; ``load_checkpoint`` calls it first.

Cost: O(capacity) time and memory: one pass over the leaves, and the writer's and sampler's
own ``state_dict`` for their keys (the sampler's copies its leaves once); no pass over rows.
"""

from __future__ import annotations

import math

import torch

from rbcheck.reference.arguments import transform_priority
from rbcheck.reference.checkpoint_format import require
from rbcheck.reference.storage import TensorStorage

TOP = ("capacity", "storage", "writer", "sampler", "generator")  # ReplayBuffer.state_dict's keys
STORAGE = ("keys", "columns")  # TensorStorage.state_dict's keys
SLACK = 2.0**-40  # relative: a leaf computed by another device's pow may be a few ulp higher


def check_meaning(state, buffer) -> None:
    """Refuse (``CheckpointError``) a ``state`` no buffer like ``buffer`` could have saved."""
    if not isinstance(state, dict):
        return  # load_state_dict refuses it
    _only_known_keys(state, buffer)
    writer, sampler = state.get("writer"), state.get("sampler")
    count = writer.get("write_count") if isinstance(writer, dict) else None
    if isinstance(count, int) and not isinstance(count, bool):
        require(0 <= count < 2**62, f"state.writer.write_count={count}, but should be an int in [0, 2**62)")
    else:
        count = None
    tree = sampler.get("sum_tree") if isinstance(sampler, dict) else None
    leaves = tree.get("leaves") if isinstance(tree, dict) else None
    if not (isinstance(leaves, torch.Tensor) and leaves.dtype == torch.float64 and leaves.dim() == 1):
        return  # no sum tree, or one load_state_dict refuses
    leaves = leaves.cpu()
    if not bool((torch.isfinite(leaves) & (leaves >= 0)).all()):
        return  # SumTree.load_state_dict names them
    if count is not None and not hasattr(buffer.writer, "size"):  # a plain ring (module doc)
        _held_rows_against_leaves(count, leaves)
    _max_priority_against_leaves(sampler, leaves)


def _only_known_keys(state: dict, buffer) -> None:
    _unknown(state, dict.fromkeys(TOP), "state")
    storage, live = state.get("storage"), buffer.storage
    if isinstance(storage, dict):
        known = STORAGE if isinstance(live, TensorStorage) else getattr(live, "state_view", live.state_dict)()
        _unknown(storage, dict.fromkeys(known), "state.storage")
    if isinstance(state.get("writer"), dict):
        _unknown(state["writer"], buffer.writer.state_dict(), "state.writer")
    sampler = state.get("sampler")
    if isinstance(sampler, dict):
        own = buffer.sampler.state_dict()
        if sampler.get("type") == own.get("type"):  # another type: load_state_dict refuses it
            _unknown(sampler, own, "state.sampler")


def _unknown(got: dict, want: dict, where: str) -> None:
    """Refuse keys of ``got`` that ``want`` lacks, in nested dicts too."""
    extra = sorted(str(k) for k in set(got) - set(want))
    require(not extra, f"{where} has the key(s) {extra!r:.200}, but should hold only {sorted(want)} "
            "(no unknown keys; what derives from the state is rebuilt on load, never read)")
    for key, value in got.items():
        if isinstance(value, dict) and isinstance(want.get(key), dict):
            _unknown(value, want[key], f"{where}.{key}")


def _held_rows_against_leaves(count: int, leaves: torch.Tensor) -> None:
    held = min(count, len(leaves))
    stray = torch.nonzero(leaves[held:]).flatten() + held
    require(not len(stray), f"state.writer.write_count={count} ({held} rows held), but should be "
            f"at least {int(stray.max()) + 1 if len(stray) else held}: state.sampler.sum_tree.leaves "
            f"of slots {stray[:8].tolist()} are non-zero, but a slot never written has no priority")


def _max_priority_against_leaves(sampler: dict, leaves: torch.Tensor) -> None:
    top, alpha, eps = sampler.get("max_priority"), sampler.get("alpha"), sampler.get("eps")
    numbers = (top, alpha, eps)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers) \
            or alpha < 0 or eps < 0:
        return  # load_state_dict refuses it
    require(top >= 1.0, f"state.sampler.max_priority={top!r}, but should be >= 1.0 (it starts at 1.0 "
            "and only grows)")
    try:
        bound = float(transform_priority(torch.tensor([float(top)], dtype=torch.float64), alpha, eps)[0])
    except ValueError:
        return  # its transform overflows: load_state_dict refuses it
    largest = float(leaves.max()) if len(leaves) else 0.0
    require(largest <= bound * (1 + SLACK), f"state.sampler.max_priority={top!r}, but should be at least "
            f"the largest priority stored: a leaf of state.sampler.sum_tree.leaves is {largest!r}, above "
            f"(max_priority + eps) ** alpha = {bound!r} (alpha={alpha}, eps={eps})")
