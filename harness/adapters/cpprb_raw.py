"""The raw face of the ``cpprb`` adapter (``Adapter.raw``, harness/raw_calls.py): cpprb's
``ReplayBuffer`` / ``PrioritizedReplayBuffer`` (C++ segment trees, float32) built as the adapter
builds them (``CpprbBuffer._construct``: ``env_dict`` from ``spec.layout``), driven as its users
do: ``add(**arrays)`` (with ``priorities=`` float32), ``sample(batch[, beta])``,
``update_priorities``. Its uniform sample returns no indices (the rows carry their row number);
the rows are read back with its private ``_encode_sample`` (pyx:1329), the priorities not at
all (a C++ sampler the Python class does not expose). No checkpoint."""

from __future__ import annotations

import numpy as np

from rbcheck.harness.adapters.cpprb import PER_CONVENTIONS, CpprbBuffer
from rbcheck.harness.raw_calls import RawCalls


class CpprbRaw(RawCalls):
    """cpprb's buffer of ``CpprbBuffer(spec)`` (``.rb``)."""

    conventions = PER_CONVENTIONS
    unsupported = {op: "no checkpoint: save_transitions exports rows without priorities or ring position and "
                       "load_transitions appends them" for op in ("save", "load")}

    def __init__(self, spec):
        super().__init__(spec)
        self.buffer = CpprbBuffer(spec).rb

    def prepare(self, rows, priority):
        kw = {k: rows[k] for k in ("obs", "action", "reward")}
        if priority is not None and self.prioritized:
            kw["priorities"] = priority.astype(np.float32)
        return kw

    def add(self, prepared):
        self.buffer.add(**prepared)

    def sample(self, batch):
        if self.prioritized:
            out = self.buffer.sample(batch, beta=self.spec.beta)
            return {"obs": out["obs"], "action": out["action"], "reward": out["reward"],
                    "index": out["indexes"].astype(np.int64), "weight": out["weights"]}
        out = self.buffer.sample(batch)  # returns no indices: the rows carry their row number
        return {"obs": out["obs"], "action": out["action"], "reward": out["reward"]}

    def rows_at(self, slots):
        out = self.buffer._encode_sample(slots)
        return {k: out[k] for k in ("obs", "action", "reward")}

    def prepare_update(self, index, raw):
        return index, raw.astype(np.float32)

    def update_priorities(self, index, priority):
        self.buffer.update_priorities(index, priority)


__all__ = ["CpprbRaw"]
