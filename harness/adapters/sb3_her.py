"""stable-baselines3's ``HerReplayBuffer`` (written against stable-baselines3
2.9.2; issue 42), built-in name ``sb3-her``. Line numbers are of
``stable_baselines3/her/her_replay_buffer.py``.

* buffer: ``HerReplayBuffer(capacity, Dict(observation=Box((2,), float64),
  achieved_goal=Box((2,)), desired_goal=Box((2,))), Box((1,)), env,
  device="cpu", n_sampled_goal=k, goal_selection_strategy=strategy)`` with
  ``env`` a ``DummyVecEnv`` of :class:`GoalEnv`, a goal env whose
  ``compute_reward(achieved, desired, info)`` is the spec's
  ``reference.her.goal_reward`` (``-sum |a - g|``): SB3 recomputes a
  relabelled row's reward through ``env.env_method("compute_reward",
  next_obs["achieved_goal"], new goal, ...)`` (:320-334).
* ratio: SB3 takes ``n_sampled_goal = k`` virtual goals per real one and
  relabels ``her_ratio = 1 - 1 / (k + 1)`` (:90): ``spec.her`` ratio ``r``
  is handed over as ``k = r / (1 - r)``, which must be a whole number (the
  suite's ratios 0.5, 0.75, 0.8 are k = 1, 3, 4).
* rows: one ``add`` per env step (n_envs=1): ``observation = [id,
  episode]``, ``achieved_goal``, ``desired_goal``; the next observation
  carries ``next_achieved_goal``; ``done = terminated | truncated`` with
  ``infos = [{"TimeLimit.truncated": truncated}]``.
* ``sample``: SB3's own, on NumPy's global generator with this buffer's state
  swapped in (seeded with ``spec.seed``). SB3 returns the real rows first,
  then the virtual ones, and no index (``info["index"]`` is -1).
* ``save``/``load``: SB3's ``save_to_pkl``/``load_from_pkl`` of the buffer
  (what ``save_replay_buffer`` does; the env is not pickled, :101-110), then
  ``set_env`` (:124), without ``truncate_last_trajectory``: the stream
  carries on the episode in progress. The episode bookkeeping (``ep_start``,
  ``ep_length``, ``_current_ep_start``) rides in the pickle (SB3 #1542).

Declared (``Conventions.hindsight``): ``her_count="floor"``: exactly
``nb_virtual = int(self.her_ratio * batch_size)`` rows of a batch are
relabelled (:218); ``episodes="whole_only"``: SB3 samples only rows of
finished episodes none of whose rows was overwritten (``ep_length > 0``,
:196; a write over an episode's first row zeroes the whole episode's length,
:144-154) and refuses to sample without one (:197-201).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.hindsight import (
    goal_rows,
    no_slots,
    skip_without_her,
)
from rbcheck.harness.adapters.numpy_rows import GlobalNumpyStream, check_batch_size
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "stable-baselines3 2.9.2"


def sampled_goals(ratio: float) -> int:
    """SB3's ``n_sampled_goal`` for a relabelled share ``ratio = k / (k + 1)`` (ValueError otherwise)."""
    k = round(ratio / (1.0 - ratio)) if ratio < 1.0 else -1
    if k < 0 or abs(1.0 - 1.0 / (k + 1) - ratio) > 1e-12:
        raise ValueError(f"spec.her ratio={ratio!r}, but should be k / (k + 1) for a whole k >= 0 (SB3 takes "
                         "n_sampled_goal = k, her_replay_buffer.py:90)")
    return k


def goal_env_class():
    import gymnasium as gym
    from gymnasium import spaces

    class GoalEnv(gym.Env):
        """A goal env of 2-d goals whose reward is the spec's ``-sum |achieved - desired|``."""

        observation_space = spaces.Dict({
            "observation": spaces.Box(-np.inf, np.inf, (2,), np.float64),
            "achieved_goal": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "desired_goal": spaces.Box(-np.inf, np.inf, (2,), np.float32)})
        action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

        def compute_reward(self, achieved_goal, desired_goal, info):
            from rbcheck.reference.her import goal_reward

            return goal_reward(torch.as_tensor(np.asarray(achieved_goal)),
                               torch.as_tensor(np.asarray(desired_goal))).numpy()

        def reset(self, *, seed=None, options=None):
            return {k: np.zeros(s.shape, s.dtype) for k, s in self.observation_space.spaces.items()}, {}

        def step(self, action):
            obs, _ = self.reset()
            return obs, 0.0, False, False, {}

    return GoalEnv


def goal_vec_env():
    from stable_baselines3.common.vec_env import DummyVecEnv

    cls = goal_env_class()
    return DummyVecEnv([cls])


class SB3Her(CountedWrites):
    def __init__(self, spec: BufferSpec):
        from stable_baselines3 import HerReplayBuffer

        strategy, ratio = spec.her
        env = goal_vec_env()
        self.spec, self.written = spec, 0
        self.rb = HerReplayBuffer(spec.capacity, env.observation_space, env.action_space, env, device="cpu",
                                  n_sampled_goal=sampled_goals(ratio), goal_selection_strategy=strategy)
        self.numpy = GlobalNumpyStream(spec.seed)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        n = len(data)
        start = self.written
        for k in range(n):
            row = data[k]
            ident = np.array([[float(row["id"]), float(row["episode"])]], np.float64)
            term, trunc = bool(row["terminated"]), bool(row["truncated"])
            obs = {"observation": ident, "achieved_goal": row["achieved_goal"].numpy()[None],
                   "desired_goal": row["desired_goal"].numpy()[None]}
            nxt = {"observation": ident, "achieved_goal": row["next_achieved_goal"].numpy()[None],
                   "desired_goal": row["desired_goal"].numpy()[None]}
            self.rb.add(obs, nxt, np.zeros((1, 1), np.float32), np.array([float(row["reward"])], np.float32),
                        np.array([term or trunc]), [{"TimeLimit.truncated": trunc}])
            self.written += 1
        return self.slots(start, n)

    def __len__(self) -> int:
        return self.rb.size()

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.numpy.active():
            s = self.rb.sample(batch_size)
        ident = s.observations["observation"].reshape(-1, 2)
        rows = goal_rows(ident[:, 0], ident[:, 1], s.observations["desired_goal"].reshape(-1, 2).float(),
                         s.rewards.float())
        return rows, no_slots(len(ident))

    def contents(self) -> TensorDictBase:
        ids = self.rb.observations["observation"][: self.rb.size(), 0, 0]
        return TensorDict({"id": torch.as_tensor(ids.copy()).long()}, [len(ids)])

    @property
    def cursor(self) -> int:
        return int(self.rb.pos)

    def save(self, path) -> None:
        from stable_baselines3.common.save_util import save_to_pkl

        save_to_pkl(Path(path) / "her_replay_buffer.pkl", self.rb)
        (Path(path) / "rbcheck_write_count.pkl").write_bytes(pickle.dumps(self.written))

    def load(self, path) -> None:
        from stable_baselines3.common.save_util import load_from_pkl

        rb = load_from_pkl(Path(path) / "her_replay_buffer.pkl")
        rb.set_env(goal_vec_env())
        self.rb, self.written = rb, pickle.loads((Path(path) / "rbcheck_write_count.pkl").read_bytes())


def _version() -> str:
    from importlib.metadata import version

    return version("stable-baselines3")


def _make(spec: BufferSpec) -> SB3Her:
    skip_without_her(spec, "stable-baselines3's HerReplayBuffer", "sb3")
    return SB3Her(spec)


def sb3_her_adapter() -> Adapter:
    return Adapter(
        name="sb3-her", version=_version(), make=_make, capabilities=frozenset({"her", "save_load"}),
        known_failures=Path(__file__).resolve().parent.parent / "known_failures" / "sb3-her.txt",
        conventions=Conventions(hindsight={"her_count": "floor", "episodes": "whole_only"}, notes={
            "hindsight": "nb_virtual = int(self.her_ratio * batch_size) rows relabelled (her_replay_buffer.py:218); "
                         "only rows of finished episodes none of whose rows was overwritten are sampled "
                         "(ep_length > 0, :196; :144-154), and sample() refuses without one (:197-201)"}),
    )


__all__ = ["SB3Her", "sb3_her_adapter"]
