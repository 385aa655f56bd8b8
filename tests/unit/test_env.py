"""ChainEnv (exact): layout, dynamics, termination, truncation, seeding."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference.env import ChainEnv


def act(env: ChainEnv, state: TensorDict, action: int) -> TensorDict:
    return env.step(state.copy().set("action", torch.tensor(action)))


def run_episode(env: ChainEnv, action: int = 1) -> list[TensorDict]:
    state, out = env.reset(), []
    while True:
        stepped = act(env, state, action)
        out.append(stepped)
        if stepped["next", "done"].item():
            return out
        state = stepped["next"].select("observation", "done")


def test_reset_and_step_layout():
    env = ChainEnv(length=5)
    state = env.reset()
    assert state.batch_size == torch.Size([])
    assert state["observation"].dtype == torch.float32 and state["observation"].shape == (1,)
    assert state["done"].dtype == torch.bool and not state["done"].item()
    assert state["observation"].item() == 2.0
    query = state.copy().set("action", torch.tensor(1))
    stepped = env.step(query)
    assert "next" not in query.keys()  # the input is not modified
    for key in ("observation", "reward", "done", "terminated", "truncated"):
        assert stepped["next", key].shape == (1,), key
    assert stepped["next", "reward"].dtype == torch.float32


def test_no_slip_goes_where_told_and_terminates_at_the_ends():
    env = ChainEnv(length=7, slip=0.0)
    right = run_episode(env, action=1)
    assert [s["next", "observation"].item() for s in right] == [4.0, 5.0, 6.0]
    assert [s["next", "reward"].item() for s in right] == [0.0, 0.0, 1.0]
    assert right[-1]["next", "terminated"].item() and not right[-1]["next", "truncated"].item()
    left = run_episode(env, action=0)
    assert [s["next", "observation"].item() for s in left] == [2.0, 1.0, 0.0]
    assert sum(s["next", "reward"].item() for s in left) == 0.0


def test_full_slip_reverses_the_move():
    env = ChainEnv(length=7, slip=1.0)
    assert [s["next", "observation"].item() for s in run_episode(env, 1)] == [2.0, 1.0, 0.0]


def test_truncation_at_max_steps():
    env = ChainEnv(length=101, max_steps=4, slip=0.5, seed=3)
    episode = run_episode(env)
    assert len(episode) == 4
    assert episode[-1]["next", "truncated"].item() and not episode[-1]["next", "terminated"].item()
    assert not any(s["next", "done"].item() for s in episode[:-1])


def test_episode_lengths_vary_and_are_fixed_by_the_seed():
    def lengths(seed):
        env = ChainEnv(length=9, max_steps=30, slip=0.3, seed=seed)
        return [len(run_episode(env)) for _ in range(30)]

    first = lengths(0)
    assert len(set(first)) > 2
    assert lengths(0) == first
    assert lengths(1) != first
    generator = torch.Generator().manual_seed(0)
    env = ChainEnv(length=9, max_steps=30, slip=0.3, seed=generator)
    assert env.generator is generator
    assert [len(run_episode(env)) for _ in range(30)] == first


def test_misuse_is_reported():
    env = ChainEnv()
    with pytest.raises(RuntimeError, match=r"call reset\(\) first"):
        env.step(TensorDict({"action": torch.tensor(1)}, []))
    state = env.reset()
    with pytest.raises(ValueError, match=r"action=2, but should be one int: 0 \(left\) or 1"):
        act(env, state, 2)
    for kwargs, pattern in [
        ({"length": 2}, r"length=2, but should be an int >= 3"),
        ({"max_steps": 0}, r"max_steps=0, but should be an int >= 1"),
        ({"slip": 1.5}, r"slip=1.5, but should be in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            ChainEnv(**kwargs)
    with pytest.raises(TypeError, match=r"seed='x', but should be an int or a torch.Generator"):
        ChainEnv(seed="x")
