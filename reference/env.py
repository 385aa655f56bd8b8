"""ChainEnv: a tiny built-in environment (a 1-D random walk) with no extra dependency.

Contract
--------
The agent sits on positions ``0 .. length-1`` of a chain and starts in the
middle, ``length // 2``. The action is an int64 scalar: 0 moves left, 1 moves
right; with probability ``slip`` the move goes the other way (drawn from the
env's own ``torch.Generator``, so a seed fixes every episode). Reaching
position 0 or ``length-1`` terminates the episode (reward 1.0 at the right
end, 0.0 elsewhere); ``max_steps`` steps without reaching an end truncate it.
Episode lengths therefore vary, even under a fixed policy.

TensorDicts, in the layout TorchRL uses:

* ``reset() -> TensorDict(observation=float32[1], done=bool[1])``, batch size [].
* ``step(td)`` reads ``td["action"]`` and returns a shallow copy of ``td``
  with ``"next"`` = ``TensorDict(observation, reward=float32[1], done,
  terminated, truncated)`` (all ``[1]``); ``td`` itself is not modified.
  Stepping after ``done`` without ``reset()`` raises RuntimeError.

Cost: O(1) per step (one draw from the generator).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


class ChainEnv:
    num_actions = 2

    def __init__(
        self,
        length: int = 7,
        max_steps: int = 20,
        slip: float = 0.25,
        seed: int | torch.Generator = 0,
    ) -> None:
        if not isinstance(length, int) or length < 3:
            raise ValueError(f"length={length!r}, but should be an int >= 3")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r}, but should be an int >= 1")
        if not 0.0 <= float(slip) <= 1.0:
            raise ValueError(f"slip={slip!r}, but should be in [0, 1]")
        if isinstance(seed, torch.Generator):
            self.generator = seed
        elif isinstance(seed, int):
            self.generator = torch.Generator().manual_seed(seed)
        else:
            raise TypeError(f"seed={seed!r}, but should be an int or a torch.Generator")
        self.length = length
        self.max_steps = max_steps
        self.slip = float(slip)
        self.position = length // 2
        self.steps = 0
        self.done = True  # reset() must come first

    def _observation(self) -> torch.Tensor:
        return torch.tensor([float(self.position)], dtype=torch.float32)

    def reset(self) -> TensorDict:
        """Start a new episode in the middle of the chain."""
        self.position = self.length // 2
        self.steps = 0
        self.done = False
        return TensorDict(
            {"observation": self._observation(), "done": torch.zeros(1, dtype=torch.bool)},
            batch_size=[],
        )

    def step(self, td: TensorDict) -> TensorDict:
        """Apply ``td["action"]``; return a copy of ``td`` with the ``"next"`` entry."""
        if self.done:
            raise RuntimeError("step() after the episode ended, but should call reset() first")
        action = td["action"]
        if action.numel() != 1 or int(action.reshape(())) not in (0, 1):
            raise ValueError(
                f"action={action.tolist()}, but should be one int: 0 (left) or 1 (right)"
            )
        move = 1 if int(action.reshape(())) == 1 else -1
        if torch.rand((), generator=self.generator, dtype=torch.float64).item() < self.slip:
            move = -move
        self.position += move
        self.steps += 1
        terminated = self.position in (0, self.length - 1)
        truncated = not terminated and self.steps >= self.max_steps
        self.done = terminated or truncated
        reward = 1.0 if self.position == self.length - 1 else 0.0
        out = td.copy()
        out["next"] = TensorDict(
            {
                "observation": self._observation(),
                "reward": torch.tensor([reward], dtype=torch.float32),
                "done": torch.tensor([self.done]),
                "terminated": torch.tensor([terminated]),
                "truncated": torch.tensor([truncated]),
            },
            batch_size=[],
        )
        return out
