"""stable-baselines3 2.9.2's ``HerReplayBuffer`` (docs/bugs.toml, issue 42): a
strict xfail stating the spec's behaviour. Skipped where SB3 is not installed
(``nox -s thirdparty`` installs it)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (nox -s thirdparty installs it)")
import gymnasium as gym  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3 import HerReplayBuffer  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

VERSION = "stable-baselines3 2.9.2"
GOAL = spaces.Box(-np.inf, np.inf, (1,), np.float32)


class GoalEnv(gym.Env):
    observation_space = spaces.Dict({"observation": GOAL, "achieved_goal": GOAL, "desired_goal": GOAL})
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -np.abs(achieved_goal - desired_goal).sum(-1)


def step(t: float, done: bool):
    """Step ``t``: from state t to state t + 1 (goals [t] and [t + 1]); the episode's goal is -1."""
    obs = {"observation": np.array([[t]], np.float32), "achieved_goal": np.array([[t]], np.float32),
           "desired_goal": np.array([[-1.0]], np.float32)}
    nxt = {**obs, "achieved_goal": np.array([[t + 1]], np.float32)}
    return obs, nxt, np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.array([done]), [{}]


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    f"{VERSION}: HerReplayBuffer._compute_episode_length takes episode_end = self.pos and adds buffer_size "
    "only when episode_end < episode_start (her/her_replay_buffer.py:176-182): an episode of exactly "
    "buffer_size steps (any multiple of it) ends where it began, so np.arange(start, end) is empty and no row "
    "gets a length, and sample() refuses with 'Unable to sample before the end of the first episode' (:197-201) "
    "although the buffer holds that finished episode whole"))
def test_an_episode_as_long_as_the_buffer_can_be_sampled():
    env = DummyVecEnv([GoalEnv])
    buf = HerReplayBuffer(3, env.observation_space, env.action_space, env, device="cpu", n_sampled_goal=4,
                          goal_selection_strategy="final")
    for t in range(3):  # one finished episode of 3 steps in a buffer of 3: held whole
        buf.add(*step(float(t), done=t == 2))
    np.random.seed(0)
    goals = buf.sample(8).observations["desired_goal"].reshape(-1).tolist()
    assert set(goals) <= {-1.0, 3.0}, f"goals {sorted(set(goals))}, but should be -1 (kept) or 3 (the final state)"
