"""tianshou's ``ReplayBuffer`` (written against tianshou 2.0.1) for
invariant 10 (group ``tianshou``). Line numbers are of
``tianshou/data/buffer/buffer_base.py``.

* ``tianshou-obs-next``: ``ReplayBuffer(capacity, random_seed=seed)``,
  ``obs_next`` stored with each row;
* ``tianshou-ignore-obs-next``: ``ignore_obs_next=True`` (:75, :94):
  ``obs_next`` is derived, ``obs[next(i)]`` with ``next(i) = i`` at an
  episode's end or at the newest row, else ``i + 1`` (:328-334, read at
  :605-606).

The suite's rows go in as tianshou's collector hands them over: one
``add(Batch(obs, act, rew, terminated, truncated, obs_next))`` per step (one
env: ``VectorReplayBuffer`` would take several; ``env_id`` not declared).
``sample`` is tianshou's own (:547, its seeded ``_random_state``); each
row's ``id`` is read from its observation (``obs[0]``).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.numpy_rows import OwnRandomness, check_batch_size
from rbcheck.harness.adapters.sb3_transitions import not_applicable
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions


class TianshouTransitions(OwnRandomness):
    LIBRARY = "tianshou"

    def __init__(self, spec: BufferSpec, ignore_obs_next: bool):
        from tianshou.data import ReplayBuffer

        if spec.num_envs != 1:
            raise ValueError(f"spec.num_envs={spec.num_envs}, but should be 1 (one env per ReplayBuffer)")
        self.spec = spec
        self.rb = ReplayBuffer(spec.capacity, ignore_obs_next=ignore_obs_next, random_seed=spec.seed)
        self.written = 0

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        from tianshou.data import Batch

        not_applicable(data)
        start = self.written
        for row in data.unbind(0):
            self.rb.add(Batch(obs=row["obs"].numpy(), act=row["action"].numpy(), rew=float(row["reward"]),
                              terminated=bool(row["terminated"]), truncated=bool(row["truncated"]),
                              obs_next=row["next_obs"].numpy(), info={}))
            self.written += 1
        return (start + torch.arange(len(data), dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    def __len__(self) -> int:
        return len(self.rb)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        b, index = self.rb.sample(batch_size)
        obs = torch.as_tensor(np.asarray(b.obs)).float().reshape(batch_size, -1)
        rows = TensorDict({
            "id": obs[:, 0].round().long(), "obs": obs,
            "action": torch.as_tensor(np.asarray(b.act)).float().reshape(batch_size, -1),
            "reward": torch.as_tensor(np.asarray(b.rew)).float().reshape(-1),
            "terminated": torch.as_tensor(np.asarray(b.terminated)).reshape(-1).bool(),
            "truncated": torch.as_tensor(np.asarray(b.truncated)).reshape(-1).bool(),
            "next_obs": torch.as_tensor(np.asarray(b.obs_next)).float().reshape(batch_size, -1),
        }, batch_size=[batch_size])
        return rows, {"index": torch.as_tensor(np.asarray(index, dtype=np.int64))}

    def contents(self) -> TensorDictBase:
        obs = torch.as_tensor(np.asarray(self.rb.obs[: len(self.rb)])).float()
        return TensorDict({"obs": obs, "id": obs[:, 0].round().long()}, batch_size=[len(obs)])

    @property
    def cursor(self) -> int:
        return int(self.rb._insertion_idx)

    @property
    def write_count(self) -> int:
        return self.written

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("tianshou's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("tianshou's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("tianshou's ReplayBuffer is uniform (capability 'prioritized' is not declared)")


def _adapter(name: str, ignore_obs_next: bool) -> Adapter:
    try:
        importlib.import_module("tianshou.data")
    except ImportError as err:
        raise ImportError(f"tianshou is not installed ({type(err).__name__}: {err}), but should be: "
                          f"install the 'tianshou' dependency group") from err
    from importlib.metadata import version

    def make(spec: BufferSpec) -> TianshouTransitions:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (tianshou's ReplayBuffer)")
        return TianshouTransitions(spec, ignore_obs_next)

    return Adapter(name=name, version=f"{version('tianshou')} (numpy {np.__version__})", make=make,
                   capabilities=frozenset({"transitions"}), conventions=Conventions())


def tianshou_obs_next_adapter() -> Adapter:
    return _adapter("tianshou-obs-next", ignore_obs_next=False)


def tianshou_ignore_obs_next_adapter() -> Adapter:
    return _adapter("tianshou-ignore-obs-next", ignore_obs_next=True)


__all__ = ["TianshouTransitions", "tianshou_ignore_obs_next_adapter", "tianshou_obs_next_adapter"]
