"""What the hindsight (HER) adapters share (``rlox_her``, ``sb3_her``,
``tianshou_her``, ``torchrl_her``): the rows a relabelled sample answers
(``id``, ``episode``, the ``desired_goal`` as relabelled, its ``reward``),
the ``info`` of a library that reports no slots, and the skip of
a column that is a library's HER buffer when the spec asks for a plain ring.
Cost: O(batch) for the rows, O(1) else.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import BufferSpec


def goal_rows(ids: torch.Tensor, episodes: torch.Tensor, desired_goal: torch.Tensor,
              reward: torch.Tensor) -> TensorDict:
    """A relabelled sample's rows: ``id`` and ``episode`` as int64, the goal as given, the reward flat."""
    return TensorDict({"id": ids.long(), "episode": episodes.long(), "desired_goal": desired_goal,
                       "reward": reward.reshape(-1)}, [len(ids)])


def no_slots(n: int) -> dict:
    """The ``info`` of a sample whose library does not say which slots it drew: every index -1."""
    return {"index": torch.full((n,), -1, dtype=torch.int64)}


def skip_without_her(spec: BufferSpec, buffer: str, plain_column: str) -> None:
    """Skip (not applicable) a spec without ``her``: a ring of any rows, which ``plain_column`` answers."""
    if spec.her is None:
        import pytest

        pytest.skip(f"not applicable: this column is {buffer} (spec.her); the '{plain_column}' column checks "
                    "its plain ring")


__all__ = ["goal_rows", "no_slots", "skip_without_her"]
