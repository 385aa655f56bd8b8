"""The raw face of the ``rllib`` adapter (``Adapter.raw``, harness/raw_calls.py): RLlib's
old-stack ``ReplayBuffer`` / ``PrioritizedReplayBuffer`` (``storage_unit="timesteps"``: each row
one stored ``SampleBatch``; pure-Python sum/min trees over a list of floats), driven as its users
do. ``add`` gives every new row the largest priority so far (prioritized_replay_buffer.py:77-81):
an ``add`` with the rows' own priorities is ``add`` then ``update_priorities`` of their slots. It
takes no eps (stores ``p ** alpha``, ``PER_CONVENTIONS``) and no seed (it draws from Python's
global ``random``, seeded here with ``spec.seed``). ``save``/``load``: its checkpoint state,
``get_state()`` pickled to a file and ``set_state`` of the unpickled dict on a new buffer (what an
old-stack Algorithm checkpoint with ``store_buffer_in_checkpoints`` holds); RLlib has no file
format of its own."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np

from rbcheck.harness.adapters.rllib import PER_CONVENTIONS
from rbcheck.harness.raw_calls import RawCalls


class RLlibRaw(RawCalls):
    """``PrioritizedReplayBuffer(capacity, storage_unit="timesteps", alpha=alpha)`` or
    ``ReplayBuffer(capacity, storage_unit="timesteps")``."""

    conventions = PER_CONVENTIONS

    def __init__(self, spec):
        super().__init__(spec)
        random.seed(spec.seed)  # RLlib draws from Python's global `random` and takes no seed
        self.buffer = self._new()

    def _new(self):
        from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer, ReplayBuffer

        s = self.spec
        return (PrioritizedReplayBuffer(s.capacity, storage_unit="timesteps", alpha=s.alpha) if self.prioritized
                else ReplayBuffer(s.capacity, storage_unit="timesteps"))

    def prepare(self, rows, priority):
        from ray.rllib.policy.sample_batch import SampleBatch

        batch = SampleBatch({k: rows[k] for k in ("obs", "action", "reward")})
        return batch, (priority if self.prioritized else None)

    def add(self, prepared):
        batch, priority = prepared
        first = self.buffer._next_idx
        self.buffer.add(batch)
        if priority is not None:
            self.buffer.update_priorities((first + np.arange(len(priority))) % self.buffer.capacity, priority)

    def sample(self, batch):
        if self.prioritized:
            out = self.buffer.sample(batch, beta=self.spec.beta)
            return {"obs": out["obs"], "action": out["action"], "reward": out["reward"],
                    "index": out["batch_indexes"], "weight": out["weights"]}
        out = self.buffer.sample(batch)  # returns no indices: the rows carry their row number
        return {"obs": out["obs"], "action": out["action"], "reward": out["reward"]}

    def rows_at(self, slots):
        storage = self.buffer._storage
        return {k: np.concatenate([storage[int(s)][k] for s in slots]) for k in ("obs", "action", "reward")}

    def priority_at(self, slots):
        tree = self.buffer._it_sum  # leaves: value[capacity:] (rllib/execution/segment_tree.py)
        return np.array([tree.value[tree.capacity + int(s)] for s in slots], dtype=np.float64)

    def update_priorities(self, index, priority):
        self.buffer.update_priorities(index, priority)

    def save(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        with open(Path(path) / "buffer.pkl", "wb") as f:
            pickle.dump(self.buffer.get_state(), f, protocol=pickle.HIGHEST_PROTOCOL)

    def loader(self, path):
        target = self._loaded(self._new())

        def load():
            with open(Path(path) / "buffer.pkl", "rb") as f:
                target.buffer.set_state(pickle.load(f))
            return target

        return load


__all__ = ["RLlibRaw"]
