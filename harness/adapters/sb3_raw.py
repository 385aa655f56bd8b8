"""The raw face of the ``sb3`` adapter (``Adapter.raw``, harness/raw_calls.py):
stable-baselines3's ``ReplayBuffer`` (uniform only; NumPy arrays; ``n_envs=1``, Box spaces of the
rows' ``obs`` and ``action``), driven as its users do: ``extend`` (``BaseBuffer.extend``: one
``add`` per row, with ``next_obs``, ``done`` and ``infos``), its per-step ``add`` of one
transition (``prepare_row``/``add_row``), ``sample``, and its
``save_replay_buffer`` (``save_to_pkl``) / ``load_from_pkl``. ``fill`` writes its arrays at once
(the contents are checked afterwards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rbcheck.harness.raw_calls import RawCalls


class SB3Raw(RawCalls):
    """``ReplayBuffer(capacity, Box(obs), Box(action), device="cpu", n_envs=1,
    handle_timeout_termination=False)``."""

    samplers = ("random",)

    def __init__(self, spec):
        super().__init__(spec)
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        obs_space = spaces.Box(-np.inf, np.inf, (self.width,), np.float32)
        act_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.buffer = ReplayBuffer(spec.capacity, obs_space, act_space, device="cpu", n_envs=1,
                                   handle_timeout_termination=False)

    def fill(self, rows, priority):
        buf, n = self.buffer, len(rows["obs"])
        buf.observations[:n, 0] = rows["obs"]
        buf.next_observations[:n, 0] = rows["obs"]
        buf.actions[:n, 0] = rows["action"]
        buf.rewards[:n, 0] = rows["reward"]
        buf.pos, buf.full = n % self.spec.capacity, n >= self.spec.capacity

    def prepare(self, rows, priority):
        n = len(rows["obs"])
        obs = rows["obs"].reshape(n, 1, -1)
        return (obs, obs, rows["action"].reshape(n, 1, 2), rows["reward"].reshape(n, 1),
                np.zeros((n, 1), np.float32), [[{}]] * n)

    def add(self, prepared):
        self.buffer.extend(*prepared)  # BaseBuffer.extend: one add per row

    def prepare_row(self, row):
        """One transition as ``add`` takes it (``n_envs=1``): ``obs``, ``action``, ``reward``, and
        ``next_obs`` and ``done`` where the row has them (else ``obs`` and 0), for ``add_row``."""
        obs = np.asarray(row["obs"], np.float32)[None]
        next_obs = np.asarray(row.get("next_obs", row["obs"]), np.float32)[None]
        return (obs, next_obs, np.asarray(row["action"], np.float32)[None], np.array([row["reward"]]),
                np.array([row.get("done", 0.0)]), [{}])

    def add_row(self, prepared):
        """stable-baselines3's per-step write (timed): one ``ReplayBuffer.add`` of one transition."""
        self.buffer.add(*prepared)

    def sample(self, batch):
        out = self.buffer.sample(batch)
        return {"obs": out.observations.numpy(), "action": out.actions.numpy(),
                "reward": out.rewards.numpy().reshape(-1)}

    def rows_at(self, slots):
        buf = self.buffer
        return {"obs": buf.observations[slots, 0], "action": buf.actions[slots, 0], "reward": buf.rewards[slots, 0]}

    def save(self, path):
        from stable_baselines3.common.save_util import save_to_pkl

        Path(path).mkdir(parents=True, exist_ok=True)
        save_to_pkl(Path(path) / "replay_buffer.pkl", self.buffer)  # what save_replay_buffer does

    def loader(self, path):
        from stable_baselines3.common.save_util import load_from_pkl

        def load():
            return self._loaded(load_from_pkl(Path(path) / "replay_buffer.pkl"))

        return load


__all__ = ["SB3Raw"]
