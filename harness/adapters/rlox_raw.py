"""The raw face of the ``rlox`` and ``rlox-per`` adapters (``Adapter.raw``, harness/raw_calls.py):
rlox 1.2.0's Rust buffers with the rows as rlox's own schema holds them (``obs`` float32 of
``obs_dim = w``, ``action`` of ``act_dim = 2``, ``reward``; ``next_obs`` is the row's ``obs``, the
flags False), driven as its users do:

* uniform ``ReplayBuffer(capacity, w, 2)``: one row is ``push(obs, action, reward, terminated,
  truncated, next_obs=...)``, more are ``push_batch`` of flat arrays (its vectorised write);
  ``sample(batch, seed)`` with a step counter as the seed (rlox's docs: "use step counter for
  reproducibility"). It returns no indices: the rows carry their row number. ``prepare_row``/
  ``add_row``: one ``push`` of one transition with its own ``next_obs`` and ``terminated``.
* ``PrioritizedReplayBuffer(capacity, w, 2, alpha, beta)``: ``push(..., priority=p)`` per row (it
  has no batch push), ``sample(batch, seed)`` (``indices``, ``weights`` over the tree's minimum),
  ``update_priorities(uint64 indices, float64 priorities)``; no eps (``PER_CONVENTIONS``).

The benchmark's extends are timed on the uniform buffer (``extend_into``): its ``push`` and
``push_batch`` are rlox's writes; the prioritized buffer's per-row ``push`` fills it. rlox has
no read of its rows or priorities (``rows_at``/``priority_at`` None: the checks read the rows
through samples) and refuses a sample larger than the rows held (priority.rs:275-279). No
checkpoint."""

from __future__ import annotations

import numpy as np

from rbcheck.harness.adapters.rlox import PER_CONVENTIONS, _core
from rbcheck.harness.raw_calls import RawCalls


class RloxRaw(RawCalls):
    """rlox's ``ReplayBuffer`` or ``PrioritizedReplayBuffer`` (module docstring)."""

    extend_into = "uniform"
    conventions = PER_CONVENTIONS
    unsupported = {op: "no checkpoint: rlox's buffers have no save or load" for op in ("save", "load")}

    def __init__(self, spec):
        super().__init__(spec)
        rlox, s = _core(), spec
        self.buffer = (rlox.PrioritizedReplayBuffer(s.capacity, self.width, 2, alpha=s.alpha, beta=s.beta)
                       if self.prioritized else rlox.ReplayBuffer(s.capacity, self.width, 2))
        self.step = s.seed

    def prepare(self, rows, priority):
        obs, action, reward = (np.ascontiguousarray(rows[k]) for k in ("obs", "action", "reward"))
        n = len(obs)
        if self.prioritized:  # push per row, each with its priority
            return [(obs[i], action[i], float(reward[i]), float(priority[i]) if priority is not None else 1.0)
                    for i in range(n)]
        if n == 1:
            return obs[0], action[0], float(reward[0])
        flags = np.zeros(n, np.uint8)
        return obs.reshape(-1), action.reshape(-1), reward, flags

    def add(self, prepared):
        rb = self.buffer
        if self.prioritized:
            for obs, action, reward, priority in prepared:
                rb.push(obs, action, reward, False, False, next_obs=obs, priority=priority)
        elif len(prepared) == 3:
            obs, action, reward = prepared
            rb.push(obs, action, reward, False, False, next_obs=obs)
        else:
            obs, action, reward, flags = prepared
            rb.push_batch(obs, obs, action, reward, flags, flags)

    def prepare_row(self, row):
        """One transition as the uniform buffer's ``push`` takes it: ``obs``, ``action``, ``reward``,
        ``terminated`` (the row's ``done``, else False), ``truncated`` False and ``next_obs`` (the
        row's, else ``obs``), for ``add_row``."""
        if self.prioritized:
            raise ValueError("spec.sampler='prioritized', but should be 'random' (prepare_row: the uniform push)")
        obs = np.ascontiguousarray(row["obs"], np.float32)
        next_obs = np.ascontiguousarray(row.get("next_obs", obs), np.float32)
        return (obs, np.ascontiguousarray(row["action"], np.float32), float(row["reward"]),
                bool(row.get("done", False)), False, next_obs)

    def add_row(self, prepared):
        """rlox's per-step write (timed): one ``push(obs, action, reward, terminated, truncated,
        next_obs=...)``."""
        obs, action, reward, terminated, truncated, next_obs = prepared
        self.buffer.push(obs, action, reward, terminated, truncated, next_obs=next_obs)

    def sample(self, batch):
        self.step += 1
        out = self.buffer.sample(batch, self.step)
        rows = {"obs": out["obs"], "action": out["actions"], "reward": out["rewards"]}
        if self.prioritized:
            rows.update(index=out["indices"].astype(np.int64), weight=out["weights"])
        return rows

    def prepare_update(self, index, raw):
        return index.astype(np.uint64), np.ascontiguousarray(raw, dtype=np.float64)

    def update_priorities(self, index, priority):
        self.buffer.update_priorities(index, priority)


__all__ = ["RloxRaw"]
