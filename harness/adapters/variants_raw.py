"""The raw face of the ``device`` variant (``Adapter.raw``, harness/raw_calls.py): rbcheck's
``variants.ReplayBuffer`` on the CPU, driven as its users do: ``extend`` of a TensorDict of the
rows (with their raw priorities in float64, the dtype of its trees, under ``priority``),
``sample``, ``update_priority`` of tensors, ``dumps``/``loads`` of a checkpoint directory. The
rows and the trees are read back from the storage and the sum tree's leaves (untimed)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.harness.raw_calls import RawCalls


class DeviceRaw(RawCalls):
    """``rbcheck.variants.ReplayBuffer(capacity, sampler=PrioritizedSampler(...) | None, generator=seed,
    device="cpu")``."""

    def __init__(self, spec):
        super().__init__(spec)
        from rbcheck import variants

        s = spec
        sampler = variants.PrioritizedSampler(s.capacity, s.alpha, s.beta, s.eps) if self.prioritized else None
        self.buffer = variants.ReplayBuffer(s.capacity, sampler=sampler, generator=s.seed, device="cpu")

    def prepare(self, rows, priority):
        data = {k: torch.from_numpy(rows[k]) for k in ("obs", "action", "reward")}
        if priority is not None and self.prioritized:
            data["priority"] = torch.from_numpy(priority)
        return TensorDict(data, batch_size=[len(rows["obs"])])

    def add(self, prepared):
        self.buffer.extend(prepared)

    def sample(self, batch):
        rows, info = self.buffer.sample(batch)
        return {"obs": rows["obs"], "action": rows["action"], "reward": rows["reward"], "index": info["index"],
                "weight": info.get("weight")}

    def rows_at(self, slots):
        data, s = self.buffer.storage.data, torch.from_numpy(slots)
        return {k: data[k][s].numpy() for k in ("obs", "action", "reward")}

    def priority_at(self, slots):
        tree = self.buffer.sampler.sum_tree
        return tree.nodes[tree.size + torch.from_numpy(slots)].numpy()

    def prepare_update(self, index, raw):
        return torch.from_numpy(index), torch.from_numpy(raw)  # float64: the dtype of its trees

    def update_priorities(self, index, priority):
        self.buffer.update_priority(index, priority)

    def save(self, path):
        self.buffer.dumps(path)

    def loader(self, path):
        from rbcheck import variants

        target = self._loaded(variants.ReplayBuffer(self.spec.capacity, generator=self.spec.seed, device="cpu"))

        def load():
            target.buffer.loads(path)
            return target

        return load


__all__ = ["DeviceRaw"]
