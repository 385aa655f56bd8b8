"""cpprb's ``ReplayBuffer(next_of=("obs",))`` (written against cpprb 11.0.0)
for invariant 10, built-in name ``cpprb-next-of`` (group ``cpprb``).

With ``next_of``, cpprb keeps one ``obs`` array and reads a row's next
observation from the next slot; the newest row's next observation and, at an
episode's end (``on_episode_end()``), the final one are kept in a cache
(``PyReplayBuffer.pyx``, ``ReplayBuffer.__cinit__``: ``next_of``,
``cache``). The suite's rows go in as a cpprb user writes them: one
``add(obs, act, rew, next_obs, done=terminated, trunc=truncated)`` per step
(``trunc`` is an extra field of the ``env_dict``), then ``on_episode_end()``
after a terminated or truncated step. cpprb has no env id (one env:
``env_id`` not declared). ``sample`` is cpprb's own, on NumPy's global
generator with this buffer's state swapped in; each row's ``id`` is read
from its observation (``obs[0]``).

cpprb's ``Nstep`` is the column ``cpprb-nstep`` (:class:`CpprbNstep` below).
"""

from __future__ import annotations

import importlib

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
    the ``cpprb`` column answers them for the same buffer."""
    missing = [k for k in STEP_KEYS if k not in data.keys()]
    if missing:
        import pytest

        pytest.skip(f"not applicable: this column stores env steps ({', '.join(STEP_KEYS)}); rows without "
                    f"{missing} are checked by the 'cpprb' column")


class CpprbNextOf(OwnRandomness):
    LIBRARY = "cpprb"

    def __init__(self, spec: BufferSpec):
        from cpprb import ReplayBuffer

        if spec.num_envs != 1:
            raise ValueError(f"spec.num_envs={spec.num_envs}, but should be 1 (cpprb's buffer has no env id)")
        self.spec = spec
        self.rb = ReplayBuffer(spec.capacity, {"obs": {"shape": OBS_DIM}, "act": {"shape": 1}, "rew": {},
                                               "done": {}, "trunc": {}}, next_of=("obs",))
        self.written = 0
        self.stream = GlobalNumpyStream(spec.seed)

    #: the stored flags: termination as "done", truncation as "trunc"
    FLAGS = ("done", "trunc")

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        start = self.written
        for row in data.unbind(0):
            term, trunc = bool(row["terminated"]), bool(row["truncated"])
            flags = {"done": float(term), "trunc": float(trunc)}
            self.rb.add(obs=row["obs"].numpy(), act=row["action"].numpy(), rew=float(row["reward"]),
                        next_obs=row["next_obs"].numpy(), **{k: flags[k] for k in self.FLAGS})
            if term or trunc:
                self.rb.on_episode_end()
            self.written += 1
        return (start + torch.arange(len(data), dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    def __len__(self) -> int:
        return int(self.rb.get_stored_size())

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.stream.active():
            s = self.rb.sample(batch_size)
        obs = torch.as_tensor(s["obs"]).float()
        ids = obs[:, 0].round().long()
        rows = TensorDict({
            "id": ids, "obs": obs, "action": torch.as_tensor(s["act"]).float(),
            "reward": torch.as_tensor(s["rew"]).reshape(-1).float(),
            "terminated": torch.as_tensor(s["done"]).reshape(-1) != 0,
            "truncated": torch.as_tensor(s["trunc"]).reshape(-1) != 0,
            "next_obs": torch.as_tensor(s["next_obs"]).float(),
        }, batch_size=[batch_size])
        return rows, {"index": ids % self.spec.capacity}

    def contents(self) -> TensorDictBase:
        obs = torch.as_tensor(self.rb.get_all_transitions()["obs"]).float()
        return TensorDict({"obs": obs, "id": obs[:, 0].round().long()}, batch_size=[len(obs)])

    @property
    def cursor(self) -> int:
        return int(self.rb.get_next_index())

    @property
    def write_count(self) -> int:
        return self.written

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("cpprb's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("cpprb's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("cpprb's ReplayBuffer is uniform (capability 'prioritized' is not declared)")


def cpprb_next_of_adapter() -> Adapter:
    try:
        importlib.import_module("cpprb")
    except ImportError as err:
        raise ImportError(f"cpprb is not installed ({type(err).__name__}: {err}), but should be: "
                          f"install the 'cpprb' dependency group") from err
    from importlib.metadata import version

    def make(spec: BufferSpec) -> CpprbNextOf:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (cpprb's ReplayBuffer)")
        return CpprbNextOf(spec)

    return Adapter(name="cpprb-next-of", version=f"{version('cpprb')} (numpy {np.__version__})", make=make,
                   capabilities=frozenset({"transitions"}), conventions=Conventions())


class CpprbNstep(CpprbNextOf):
    """cpprb's ``ReplayBuffer(Nstep={"size": n, "gamma": gamma, "rew": "rew",
    "next": "next_obs"})``, built-in name ``cpprb-nstep`` (group ``cpprb``).

    How the spec's fields map onto cpprb 11.0.0 (``cpprb/PyReplayBuffer.pyx``
    of the 11.0.0 sdist; line numbers are those of the compiled module's
    tracebacks):

    * the ring: ``ReplayBuffer.add`` (:1145-1148) first hands the step to the
      local ``NstepBuffer`` (``n - 1`` rows, :632), which returns nothing
      until it holds ``n`` steps (:693-723, "case 1"); then it returns the
      oldest step with its window complete (:725-790), and
      ``on_episode_end()`` (:1521-1524, ``NstepBuffer.on_episode_end``
      :822-832) flushes the steps still held. So a step enters the ring only
      once its window is complete or its episode ended, and the ring's
      ``capacity`` counts such steps: ``Conventions.nstep_ring=
      "completed_windows"``, with ``incomplete_windows="exclude"``;
    * ``nstep_return``: the returned ``rew`` (summed at :706-720 and
      :734-761 with ``gamma * (1 - done)`` per step, float32);
    * ``nstep_obs``: the returned ``next_obs`` (``Nstep["next"]``: the
      window's last step's, :768-770);
    * ``nstep_discount``: cpprb returns none; its documentation's target
      multiplies "a fixed gamma^N" by ``1 - done``, with ``done`` summed over
      the window (:780-787), so the adapter returns
      ``gamma**n * (1 - done)`` as a cpprb user computes it;
    * ``obs``, ``action``: the step's own (the only step fields returned
      unchanged: ``rew`` and ``done`` are the window's, so
      ``transition_fields=("obs", "action")``).

    The steps go in as a cpprb user writes them: ``done=terminated``, then
    ``on_episode_end()`` after a terminated or truncated step (cpprb's
    documentation: call it at every episode's end). One env (no env id).
    ``spec.nstep`` is handed over as is (``Nstep["size"]=1`` is real bug
    C12); without one (the ring and model properties, whose rows are not env
    steps and are skipped here as not applicable) the size is 1.
    """

    def __init__(self, spec: BufferSpec):
        from cpprb import ReplayBuffer

        if spec.num_envs != 1:
            raise ValueError(f"spec.num_envs={spec.num_envs}, but should be 1 (cpprb's buffer has no env id)")
        self.spec = spec
        self.rb = ReplayBuffer(spec.capacity, {"obs": {"shape": OBS_DIM}, "act": {"shape": 1}, "rew": {},
                                               "next_obs": {"shape": OBS_DIM}, "done": {}},
                               Nstep={"size": spec.nstep or 1, "gamma": spec.gamma, "rew": "rew", "next": "next_obs"})
        self.written = 0
        self.stream = GlobalNumpyStream(spec.seed)

    #: no truncation field: a truncation only ends the episode (on_episode_end)
    FLAGS = ("done",)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.stream.active():
            s = self.rb.sample(batch_size)
        obs = torch.as_tensor(s["obs"]).float()
        ids = obs[:, 0].round().long()
        done = torch.as_tensor(s["done"]).reshape(-1).double()
        rows = TensorDict({
            "id": ids, "obs": obs, "action": torch.as_tensor(s["act"]).float(),
            "nstep_return": torch.as_tensor(s["rew"]).reshape(-1).double(),
            "nstep_obs": torch.as_tensor(s["next_obs"]).float(),
            "nstep_discount": self.spec.gamma ** (self.spec.nstep or 1) * (1.0 - done),
        }, batch_size=[batch_size])
        return rows, {"index": ids % self.spec.capacity}


def cpprb_nstep_adapter() -> Adapter:
    base = cpprb_next_of_adapter()

    def make(spec: BufferSpec) -> CpprbNstep:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (cpprb's ReplayBuffer)")
        return CpprbNstep(spec)

    conventions = Conventions(
        transition_fields=("obs", "action"), incomplete_windows="exclude", nstep_ring="completed_windows",
        notes={"nstep_ring": "PyReplayBuffer.pyx:1145-1148, :693-723, :1521-1524: a step enters the ring when "
                             "its window is complete or at on_episode_end()",
               "incomplete_windows": "held in NstepBuffer until complete (PyReplayBuffer.pyx:693-723)",
               "transition_fields": "rew and done are the window's (PyReplayBuffer.pyx:706-720, :780-787)"})
    return Adapter(name="cpprb-nstep", version=base.version, make=make,
                   capabilities=frozenset({"transitions", "nstep"}), conventions=conventions)


__all__ = ["CpprbNextOf", "CpprbNstep", "cpprb_next_of_adapter", "cpprb_nstep_adapter"]
