"""Hindsight experience replay: relabelled goals from the same episode (the spec).

Rows are env steps of goal-conditioned episodes (``reference/transitions.py``'s
keys, one env) with three goal keys: ``achieved_goal`` (the goal the step's
observation achieves), ``next_achieved_goal`` (the goal achieved after the
step) and ``desired_goal`` (the episode's goal).

Contract
--------
:class:`HindsightReplayBuffer` is the ring of ``buffer.py`` (uniform
sampling) that knows its episodes from the rows it holds, in write order
(``transitions.write_order``): an episode ends at a ``terminated`` or
``truncated`` row, and it is *finished* once that row is held. ``sample``
draws rows as the ring does, then, for each sampled row ``t`` of a finished
episode, independently with probability ``her_ratio``, relabels it:

* ``desired_goal`` becomes ``next_achieved_goal`` of a held step ``t'`` of
  the same episode: ``"future"``: ``t'`` uniform over ``t, ..., end``;
  ``"final"``: ``t' = end``; ``"episode"``: uniform over the episode's held
  steps (its oldest may have been overwritten);
* ``reward`` becomes ``her_reward(next_achieved_goal[t], new goal)``.

A row of an unfinished episode (its end not written yet) is never relabelled,
and no relabelling reads across the write cursor (the newest row has no
successor, the oldest no predecessor). Other rows keep their goal and stored
reward. ``info["relabelled"]`` marks the relabelled rows.

The episode bookkeeping is derived from the held rows, never stored, so a
checkpoint (``dumps``/``loads``, unchanged) carries it exactly.

Cost: O(N) per ``sample`` over the N held rows (one pass links each row to
its neighbours), plus O(B * episode length); two uniforms per sampled row,
from the buffer's generator.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.random_sampler import draw_uniforms
from rbcheck.reference.transitions import Transitions, write_order

GOAL, ACHIEVED, NEXT_ACHIEVED = "desired_goal", "achieved_goal", "next_achieved_goal"
STRATEGIES = ("future", "final", "episode")


def check_her_spec(strategy, ratio) -> None:
    """Refuse hindsight arguments outside their ranges (ValueError naming them)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"her_strategy={strategy!r}, but should be one of {list(STRATEGIES)}")
    if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0.0 <= ratio <= 1.0):
        raise ValueError(f"her_ratio={ratio!r}, but should be a number in [0, 1]")


def goal_reward(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
    """The suite's reward function: ``-sum |achieved - desired|`` over the
    last dimension, float32 (exact for the suite's small integer goals)."""
    return -(achieved.float() - desired.float()).abs().sum(-1)


class Episodes:
    """The episodes of the held rows ``rows`` (slot order) of a ring at ``cursor``."""

    def __init__(self, rows: TensorDictBase, cursor: int, capacity: int):
        self.order = write_order(rows.shape[0], cursor, capacity)  # position -> slot
        self.position = torch.empty_like(self.order)
        self.position[self.order] = torch.arange(len(self.order))
        self.tr = Transitions(rows[self.order])
        self.predecessor: list[int | None] = [None] * len(self.tr)
        for p, nxt in enumerate(self.tr.successor):
            if nxt is not None:
                self.predecessor[nxt] = p

    def steps(self, slot: int) -> tuple[list[int], bool]:
        """The held positions of ``slot``'s episode, oldest first, and whether it is finished."""
        p = int(self.position[slot])
        start = p
        while self.predecessor[start] is not None and not self.tr.ends_episode(self.predecessor[start]):
            start = self.predecessor[start]
        out = [start]
        while not self.tr.ends_episode(out[-1]) and self.tr.successor[out[-1]] is not None:
            out.append(self.tr.successor[out[-1]])
        return out, self.tr.ends_episode(out[-1])


def goal_step(strategy: str, steps: list[int], p: int, u: float) -> int:
    """The position ``t'`` whose achieved goal relabels position ``p`` (``u`` uniform in [0, 1))."""
    if strategy == "final":
        return steps[-1]
    choices = steps[steps.index(p):] if strategy == "future" else steps
    return choices[min(int(u * len(choices)), len(choices) - 1)]


class HindsightReplayBuffer(ReplayBuffer):
    """The ring with hindsight relabelling on ``sample`` (see the module doc)."""

    def __init__(self, capacity=None, *, her_strategy="future", her_ratio=0.8, her_reward=goal_reward, **kwargs):
        check_her_spec(her_strategy, her_ratio)
        if not callable(her_reward):
            raise ValueError(f"her_reward={her_reward!r}, but should be callable (next_achieved_goal, goal) -> reward")
        super().__init__(capacity, **kwargs)
        self.her_strategy, self.her_ratio, self.her_reward = her_strategy, float(her_ratio), her_reward

    def episodes(self) -> Episodes:
        return Episodes(self.storage.get(torch.arange(len(self), dtype=torch.long)), self.cursor, self.capacity)

    def sample(self, batch_size: int | None = None) -> tuple[TensorDictBase, dict]:
        rows, info = super().sample(batch_size)
        n = rows.shape[0]
        u = draw_uniforms(2 * n, self.generator).reshape(n, 2).tolist()
        eps, relabelled = self.episodes(), torch.zeros(n, dtype=torch.bool)
        achieved = eps.tr.rows.get(NEXT_ACHIEVED)
        goals, rewards = rows.get(GOAL).clone(), rows.get("reward").clone()
        for k, slot in enumerate(info["index"].tolist()):
            steps, finished = eps.steps(slot)
            if not finished or u[k][0] >= self.her_ratio:
                continue
            src = goal_step(self.her_strategy, steps, int(eps.position[slot]), u[k][1])
            goals[k] = achieved[src].to(goals.dtype)
            rewards[k] = self.her_reward(rows.get(NEXT_ACHIEVED)[k], goals[k]).to(rewards.dtype)
            relabelled[k] = True
        rows = rows.clone()
        rows.set(GOAL, goals)
        rows.set("reward", rewards)
        info["relabelled"] = relabelled
        return rows, info


__all__ = ["ACHIEVED", "Episodes", "GOAL", "HindsightReplayBuffer", "NEXT_ACHIEVED", "goal_reward", "goal_step"]
