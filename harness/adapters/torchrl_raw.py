"""The raw face of the ``torchrl`` adapter (``Adapter.raw``, harness/raw_calls.py): TorchRL's
``TensorDictReplayBuffer`` over a ``LazyTensorStorage``, with its ``PrioritizedSampler`` (C++
sum/min trees, float32) for a prioritized spec, driven as its users do: ``extend`` of a
TensorDict (priorities in float32 under ``priority``), ``sample``, ``update_priority``,
``dumps``/``loads``. The prioritized buffer needs TorchRL's C++ extension: without it
``why_not`` says why (``torchrl.probe_prioritized``)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from tensordict import TensorDict

from rbcheck.harness.adapters.torchrl import CONVENTIONS, probe_prioritized
from rbcheck.harness.raw_calls import RawCalls


@functools.lru_cache(maxsize=1)
def _prioritized_reason() -> str | None:
    why = probe_prioritized()
    return None if why is None else (f"{why} (`python tools/torchrl_build.py` rebuilds the extension "
                                     "against this torch)")


class TorchRLFace(RawCalls):
    """What every raw face over a TorchRL buffer shares (this one and ``torchrl_ray_raw``'s): the
    ``torchrl`` adapter's conventions, and no prioritized calls without TorchRL's C++ extension."""

    conventions = CONVENTIONS

    @classmethod
    def why_not(cls, op):
        if op in ("sample_prioritized", "update_priorities") and _prioritized_reason():
            return _prioritized_reason()
        return super().why_not(op)

    @classmethod
    def extends_prioritized(cls):
        return cls.why_not("sample_prioritized") is None


class TorchRLRaw(TorchRLFace):
    """``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=spec.batch_size,
    sampler=PrioritizedSampler(capacity, alpha, beta, eps), priority_key="priority")``."""

    def __init__(self, spec):
        super().__init__(spec)
        self.buffer = self._new(self.prioritized)

    def _new(self, prioritized):
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        s = self.spec
        kw = {"sampler": PrioritizedSampler(s.capacity, alpha=s.alpha, beta=s.beta, eps=s.eps),
              "priority_key": "priority"} if prioritized else {}
        return TensorDictReplayBuffer(storage=LazyTensorStorage(s.capacity), batch_size=s.batch_size, **kw)

    def prepare(self, rows, priority):
        data = {k: torch.from_numpy(rows[k]) for k in ("obs", "action", "reward")}
        if priority is not None and self.prioritized:
            data["priority"] = torch.from_numpy(priority.astype(np.float32))
        return TensorDict(data, batch_size=[len(rows["obs"])])

    def add(self, prepared):
        self.buffer.extend(prepared)  # sets prepared["index"] in place (overwritten by each call)

    def sample(self, batch):
        td = self.buffer.sample(batch)
        keys = td.keys()
        weight = td.get("priority_weight") if "priority_weight" in keys else td.get("_weight", None)
        return {"obs": td["obs"], "action": td["action"], "reward": td["reward"], "index": td["index"],
                "weight": weight}

    def rows_at(self, slots):
        td = self.buffer._storage[torch.from_numpy(slots)]
        return {k: td[k].numpy() for k in ("obs", "action", "reward")}

    def priority_at(self, slots):
        tree = self.buffer._sampler._sum_tree
        return np.array([tree[int(s)] for s in slots], dtype=np.float64)

    def prepare_update(self, index, raw):
        return torch.from_numpy(index), torch.from_numpy(raw.astype(np.float32))

    def update_priorities(self, index, priority):
        self.buffer.update_priority(index, priority)

    def save(self, path):
        self.buffer.dumps(path)

    def loader(self, path):
        target = self._loaded(self._new(False))

        def load():
            target.buffer.loads(path)
            return target

        return load


__all__ = ["TorchRLRaw"]
