"""The raw face of the ``tianshou`` adapter (``Adapter.raw``, harness/raw_calls.py): tianshou's
``ReplayBuffer`` / ``PrioritizedReplayBuffer`` (NumPy segment tree, float64), driven as its users
do. Its buffers take one transition per ``add`` (a batch goes to a ``VectorReplayBuffer`` of one
sub-buffer per environment, another layout): an ``add`` of n rows is n adds of a ``Batch``, and
a prioritized one then ``update_weight`` of their slots with their own priorities (``add`` gives
the largest). ``sample``, ``update_weight``, ``save_hdf5``/``load_hdf5``. ``fill`` writes its
arrays at once (2^20 adds take minutes; the contents are checked afterwards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rbcheck.harness.adapters.tianshou import PER_CONVENTIONS
from rbcheck.harness.raw_calls import RawCalls


class TianshouRaw(RawCalls):
    """``PrioritizedReplayBuffer(capacity, alpha, beta, random_seed=seed)`` or
    ``ReplayBuffer(capacity, random_seed=seed)``."""

    conventions = PER_CONVENTIONS  # weights over the batch's largest (weight_norm=True, prio.py:106)

    def __init__(self, spec):
        super().__init__(spec)
        from tianshou.data import PrioritizedReplayBuffer, ReplayBuffer

        s = spec
        self.buffer = (PrioritizedReplayBuffer(s.capacity, alpha=s.alpha, beta=s.beta, random_seed=s.seed)
                       if self.prioritized else ReplayBuffer(s.capacity, random_seed=s.seed))

    @staticmethod
    def _batch(rows, i):
        from tianshou.data import Batch

        return Batch(obs=rows["obs"][i], act=rows["action"][i], rew=rows["reward"][i], terminated=False,
                     truncated=False)

    def fill(self, rows, priority):
        buf, n = self.buffer, len(rows["obs"])
        buf.add(self._batch(rows, 0))  # allocates its arrays from the first transition
        buf._meta.obs[:n] = rows["obs"]
        buf._meta.act[:n] = rows["action"]
        buf._meta.rew[:n] = rows["reward"]
        buf._size, buf._insertion_idx = n, n % self.spec.capacity
        if priority is not None and self.prioritized:
            buf.update_weight(np.arange(n), priority)
            buf._max_prio = float(np.abs(priority).max() + np.finfo(np.float32).eps.item())

    def prepare(self, rows, priority):
        batches = [self._batch(rows, i) for i in range(len(rows["obs"]))]
        return batches, (priority if self.prioritized else None)

    def add(self, prepared):
        batches, priority = prepared
        ptrs = [self.buffer.add(b)[0] for b in batches]
        if priority is not None:
            self.buffer.update_weight(np.concatenate(ptrs), priority)

    def sample(self, batch):
        out, index = self.buffer.sample(batch)
        return {"obs": out.obs, "action": out.act, "reward": out.rew, "index": index,
                "weight": getattr(out, "weight", None)}

    def rows_at(self, slots):
        meta = self.buffer._meta
        return {"obs": meta.obs[slots], "action": meta.act[slots], "reward": meta.rew[slots]}

    def priority_at(self, slots):
        return self.buffer.weight[slots]

    def update_priorities(self, index, priority):
        self.buffer.update_weight(index, priority)

    def save(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        self.buffer.save_hdf5(str(Path(path) / "buffer.hdf5"))

    def loader(self, path):
        from tianshou.data import ReplayBuffer

        def load():
            return self._loaded(ReplayBuffer.load_hdf5(str(Path(path) / "buffer.hdf5")))

        return load


__all__ = ["TianshouRaw"]
