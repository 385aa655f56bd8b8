"""stable-baselines3's transition buffers (written against stable-baselines3
2.9.2) for invariant 10: ``ReplayBuffer`` with ``optimize_memory_usage`` and
``handle_timeout_termination`` on and off, and ``NStepReplayBuffer``. Line
numbers are of ``stable_baselines3/common/buffers.py``.

Built-in names (group ``sb3``):

* ``sb3-transitions``: ``ReplayBuffer(handle_timeout_termination=True)``,
  next observations stored (:217);
* ``sb3-transitions-no-timeouts``: ``handle_timeout_termination=False``:
  a timeout is a termination (``dones`` at :322), declared
  ``terminal_flag="done"``;
* ``sb3-transitions-memopt``: ``optimize_memory_usage=True`` (only with
  ``handle_timeout_termination=False``, :206-210: the combination of #934 is
  refused), next observation read from the next slot (:269, :312);
* ``sb3-nstep`` and ``sb3-nstep-no-timeouts``: ``NStepReplayBuffer(n_steps,
  gamma)`` (:847): ``rewards`` is the n-step return, ``next_observations``
  the bootstrap observation, ``discounts`` gamma**m and ``dones`` the
  termination (:947-954); the newest row is taken as truncated while sampling
  (:901-905): windows are shortened at the write cursor.

How the suite's rows reach SB3, as SB3's off-policy collector hands them
over: one ``add(obs, next_obs, action, reward, done, infos)`` per step of the
``num_envs`` envs (``n_envs``; SB3 divides ``buffer_size`` by it, :198) with
``done = terminated or truncated``, ``infos[k]["TimeLimit.truncated"] =
truncated and not terminated`` and ``next_obs`` the final observation at an
episode's end (what the collector puts there from ``terminal_observation``).
``sample`` is SB3's own, on NumPy's global generator with this buffer's state
swapped in; each row's ``id`` is read from its observation (``obs[0]``, the
stream writes it there), the returned fields are SB3's.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.numpy_rows import GlobalNumpyStream, OwnRandomness, check_batch_size
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

OBS_DIM = 3  # harness.transition_streams: obs = [id, episode, step]
STEP_KEYS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")


def not_applicable(data: TensorDictBase) -> None:
    """Rows that are not env steps (the ring and model properties write any
    layout): not a question for this column, whose buffer stores transitions;
    the ``sb3`` column answers them for the same buffer."""
    missing = [k for k in STEP_KEYS if k not in data.keys()]
    if missing:
        import pytest

        pytest.skip(f"not applicable: this column stores env steps ({', '.join(STEP_KEYS)}); rows without "
                    f"{missing} are checked by the 'sb3' column")


class SB3TransitionBuffer(OwnRandomness):
    """A transitions :class:`BufferUnderTest` over an SB3 replay buffer."""

    LIBRARY = "SB3"

    def __init__(self, spec: BufferSpec, *, memopt: bool, timeouts: bool, nstep_buffer: bool):
        from gymnasium import spaces
        from stable_baselines3.common import buffers

        self.spec, self.nstep_buffer = spec, nstep_buffer
        obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        kwargs: dict[str, Any] = dict(device="cpu", n_envs=spec.num_envs, optimize_memory_usage=memopt,
                                      handle_timeout_termination=timeouts)
        if nstep_buffer:
            self.rb = buffers.NStepReplayBuffer(spec.capacity, obs_space, act_space, n_steps=spec.nstep or 1,
                                                gamma=spec.gamma, **kwargs)
        else:
            self.rb = buffers.ReplayBuffer(spec.capacity, obs_space, act_space, **kwargs)
        self.written = 0
        self.stream = GlobalNumpyStream(spec.seed)

    def __repr__(self) -> str:
        return f"SB3TransitionBuffer({type(self.rb).__name__}, {self.spec})"

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        e = self.rb.n_envs
        if len(data) % e:
            raise ValueError(f"len(data)={len(data)}, but should be a multiple of num_envs={e} (one row per env)")
        start = self.written
        for k in range(0, len(data), e):
            step = data[k:k + e]
            term = step["terminated"].numpy().astype(bool)
            trunc = step["truncated"].numpy().astype(bool)
            infos = [{"TimeLimit.truncated": bool(tr and not te)} for te, tr in zip(term, trunc, strict=True)]
            self.rb.add(step["obs"].numpy(), step["next_obs"].numpy(), step["action"].numpy(),
                        step["reward"].numpy(), (term | trunc).astype(np.float32), infos)
            self.written += e
        return (start + torch.arange(len(data), dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    def __len__(self) -> int:
        return int(self.rb.size()) * self.rb.n_envs

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.stream.active():
            s = self.rb.sample(batch_size)
        obs = s.observations.float()
        rows = {"id": obs[:, 0].round().long(), "obs": obs, "action": s.actions.float()}
        if self.nstep_buffer:
            rows["nstep_return"] = s.rewards.reshape(-1).double()
            rows["nstep_obs"] = s.next_observations.float()
            rows["nstep_discount"] = (s.discounts.reshape(-1) * (1 - s.dones.reshape(-1))).double()
        else:
            rows.update(reward=s.rewards.reshape(-1).float(), terminated=s.dones.reshape(-1) != 0,
                        next_obs=s.next_observations.float())
        return TensorDict(rows, batch_size=[batch_size]), {"index": rows["id"] % self.spec.capacity}

    def contents(self) -> TensorDictBase:
        n = self.rb.size()
        obs = torch.as_tensor(self.rb.observations[:n]).reshape(-1, OBS_DIM)
        return TensorDict({"obs": obs, "id": obs[:, 0].round().long()}, batch_size=[len(obs)])

    @property
    def cursor(self) -> int:
        return int(self.rb.pos) * self.rb.n_envs

    @property
    def write_count(self) -> int:
        return self.written

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("SB3's replay buffers are uniform (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("SB3's replay buffers are uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("SB3's replay buffers are uniform (capability 'prioritized' is not declared)")


DONE_NOTE = ("handle_timeout_termination=False: a timeout is stored as done and taken as a termination "
             "(stable_baselines3/common/buffers.py:322, ReplayBuffer docstring)")


def _adapter(name: str, *, memopt: bool = False, timeouts: bool = True, nstep_buffer: bool = False) -> Adapter:
    try:
        importlib.import_module("stable_baselines3.common.buffers")
    except ImportError as err:
        raise ImportError(f"stable-baselines3 is not installed ({type(err).__name__}: {err}), but should be: "
                          f"install the 'sb3' dependency group") from err
    from importlib.metadata import version

    notes = {} if timeouts else {"terminal_flag": DONE_NOTE}
    if nstep_buffer:
        fields = ("obs", "action")
        notes["transition_fields"] = ("NStepReplayBuffer returns the n-step return in rewards and the bootstrap "
                                      "observation in next_observations (buffers.py:947-954)")
        caps = {"transitions", "nstep", "env_id"}
    else:
        fields = ("obs", "action", "reward", "terminated", "next_obs")
        notes["transition_fields"] = "ReplayBufferSamples has no truncated field, only dones (buffers.py:322)"
        caps = {"transitions", "env_id"}
    conventions = Conventions(transition_fields=fields, terminal_flag="terminated" if timeouts else "done",
                              notes=notes)

    def make(spec: BufferSpec) -> SB3TransitionBuffer:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (SB3's buffers are uniform)")
        return SB3TransitionBuffer(spec, memopt=memopt, timeouts=timeouts, nstep_buffer=nstep_buffer)

    return Adapter(name=name, version=f"{version('stable-baselines3')} (numpy {np.__version__})", make=make,
                   capabilities=frozenset(caps), conventions=conventions)


def sb3_transitions_adapter() -> Adapter:
    return _adapter("sb3-transitions")


def sb3_transitions_no_timeouts_adapter() -> Adapter:
    return _adapter("sb3-transitions-no-timeouts", timeouts=False)


def sb3_transitions_memopt_adapter() -> Adapter:
    return _adapter("sb3-transitions-memopt", memopt=True, timeouts=False)


def sb3_nstep_adapter() -> Adapter:
    return _adapter("sb3-nstep", nstep_buffer=True)


def sb3_nstep_no_timeouts_adapter() -> Adapter:
    return _adapter("sb3-nstep-no-timeouts", nstep_buffer=True, timeouts=False)


__all__ = ["SB3TransitionBuffer", "sb3_nstep_adapter", "sb3_nstep_no_timeouts_adapter", "sb3_transitions_adapter",
           "sb3_transitions_memopt_adapter", "sb3_transitions_no_timeouts_adapter"]
