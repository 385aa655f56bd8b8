"""rlox's ``HERBuffer`` (written against rlox 1.2.0; issue 42), built-in name
``rlox-her``. Source lines are of the rlox repository: ``her.rs`` and
``episode.rs`` in ``crates/rlox-core/src/buffer/``, ``buffer.rs`` in
``crates/rlox-python/src/`` (the snapshot read is 1.1.0 plus later commits;
the 1.2.0 wheel's ``HERBuffer`` signature, ``help()``, is the same).

* buffer: ``HERBuffer(capacity, obs_dim=6, act_dim=1, goal_dim=2,
  achieved_goal_start=2, desired_goal_start=4, strategy=strategy)``. rlox's
  goals live inside the float32 observation (her.rs:39-40), so rows are not
  packed as the ``rlox`` column packs them (a tag and raw bytes,
  ``harness/adapters/rlox.py``) but as ``obs = [id, episode,
  achieved_goal, desired_goal]`` and ``next_obs = [id, episode,
  next_achieved_goal, desired_goal]`` (ids are exact in float32 below
  2**24), with the row's reward and flags; one ``push`` per env step.
* ``sample``: ``sample(batch_size, her_ratio=ratio, seed)`` with a seed
  drawn from the adapter's NumPy generator (seeded with ``spec.seed``; rlox
  takes the seed per call). rlox draws ``n_relabeled =
  ceil(batch_size * her_ratio)`` relabelled rows from its complete episodes
  and the other ``n_original`` rows with the ring's uniform ``sample``
  (her.rs:146-162), which refuses ``n_original > len`` (ringbuf.rs:302-306)
  although its draws are with replacement: a larger batch is taken in calls
  of ``m * (k + 1)`` rows for ``ratio = k / (k + 1)`` (each relabels exactly
  ``m * k`` rows, ``m <= len`` original ones) and one last call of the rest,
  so the batch relabels ``ceil(batch_size * ratio)`` rows as one call would.
  rlox returns no index (``info["index"]`` is -1).
* no ``save``/``load`` (rlox has none).

Declared (``Conventions.hindsight``): ``her_count="ceil"`` (her.rs:146);
``reward="sparse"``: a relabelled row's reward is ``0.0`` if
``||next achieved goal - new goal||_2 < goal_tolerance`` else ``-1.0``
(``sparse_goal_reward``, her.rs:210, :275-286; rlox takes no reward
function), with the default tolerance 0.05, below the suite's goal spacing
of 1: 0 exactly where the goals are equal; ``episodes="whole_only"``: an
episode with an overwritten row is dropped from the relabelling
(``invalidate_overwritten``, episode.rs:104-107) and ``sample`` refuses while
no complete episode is tracked (her.rs:139-143).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from tensordict import TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.hindsight import goal_rows, no_slots, skip_without_her
from rbcheck.harness.adapters.numpy_rows import check_batch_size
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "rlox 1.2.0"
OBS_DIM, GOAL_DIM, ACHIEVED_AT, DESIRED_AT = 6, 2, 2, 4


def _core():
    from rbcheck.harness.adapters.rlox import _core as core

    return core()


class RloxHer(CountedWrites):
    def __init__(self, spec: BufferSpec):
        strategy, ratio = spec.her
        self.spec, self.written, self.ratio = spec, 0, float(ratio)
        self.rb = _core().HERBuffer(spec.capacity, OBS_DIM, 1, GOAL_DIM, ACHIEVED_AT, DESIRED_AT, strategy=strategy)
        self.rng = np.random.default_rng(spec.seed)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        start = self.written
        for row in data.unbind(0):
            ident = [float(row["id"]), float(row["episode"])]
            goal = row["desired_goal"].tolist()
            obs = np.array(ident + row["achieved_goal"].tolist() + goal, np.float32)
            nxt = np.array(ident + row["next_achieved_goal"].tolist() + goal, np.float32)
            self.rb.push(obs, nxt, np.zeros(1, np.float32), float(row["reward"]), bool(row["terminated"]),
                         bool(row["truncated"]))
            self.written += 1
        return self.slots(start, len(data))

    def calls(self, batch_size: int) -> list[int]:
        """The batch sizes of the calls that together relabel ``ceil(batch_size * ratio)`` rows (module doc)."""
        per = Fraction(self.ratio).limit_denominator(64)
        if per.numerator + 1 != per.denominator or batch_size - math.ceil(batch_size * self.ratio) <= len(self):
            return [batch_size]
        whole = len(self) * per.denominator  # m = len(self) original rows per call
        sizes = [whole] * (batch_size // whole)
        return sizes + ([batch_size % whole] if batch_size % whole else [])

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        parts = [self.rb.sample(size, her_ratio=self.ratio, seed=int(self.rng.integers(0, 2**63)))
                 for size in self.calls(batch_size)]
        obs = np.concatenate([np.asarray(p["obs"]).reshape(-1, OBS_DIM) for p in parts])
        reward = np.concatenate([np.asarray(p["rewards"]).reshape(-1) for p in parts])
        rows = goal_rows(torch.as_tensor(obs[:, 0]), torch.as_tensor(obs[:, 1]),
                         torch.as_tensor(obs[:, DESIRED_AT:DESIRED_AT + GOAL_DIM].copy()), torch.as_tensor(reward).float())
        return rows, no_slots(len(obs))


def _version() -> str:
    from importlib.metadata import version

    _core()
    return version("rlox")


def _make(spec: BufferSpec) -> RloxHer:
    skip_without_her(spec, "rlox's HERBuffer", "rlox")
    return RloxHer(spec)


def rlox_her_adapter() -> Adapter:
    from pathlib import Path

    return Adapter(
        name="rlox-her", version=_version(), make=_make, capabilities=frozenset({"her"}),
        known_failures=Path(__file__).resolve().parent.parent / "known_failures" / "rlox-her.txt",
        conventions=Conventions(hindsight={"her_count": "ceil", "reward": "sparse", "episodes": "whole_only"}, notes={
            "hindsight": "n_relabeled = ceil(batch_size * her_ratio) (her.rs:146); reward sparse_goal_reward: 0.0 "
                         "if ||achieved - desired||_2 < goal_tolerance (0.05) else -1.0 (her.rs:210, :275-286); an "
                         "episode with an overwritten row is dropped (episode.rs:104-107), sample() refuses "
                         "without a complete one (her.rs:139-143)"}),
    )


__all__ = ["RloxHer", "rlox_her_adapter"]
