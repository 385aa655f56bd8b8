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

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.numpy_rows import OwnRandomness, check_batch_size
from rbcheck.harness.adapters.sb3_transitions import not_applicable
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions


class TianshouTransitions(CountedWrites, OwnRandomness):
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
        return self.slots(start, len(data))

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


class TianshouNstep(TianshouTransitions):
    """``tianshou-nstep``: the ``tianshou-obs-next`` buffer, each sample's
    n-step quantities computed by tianshou's own
    ``Algorithm.compute_nstep_return`` (a static method,
    ``tianshou/algorithm/algorithm_base.py:721-817``, with ``_nstep_return``
    :1160-1222), as DQN's ``_preprocess_batch`` calls it on the sampled
    indices (``algorithm/modelfree/dqn.py:257-276``).

    How the spec's fields map onto tianshou 2.0.1:

    * the window: ``indices`` then ``buffer.next`` ``n - 1`` times
      (algorithm_base.py:775-778), ``next`` staying put at an episode's end
      (``done = terminated or truncated``) and at the newest row
      (buffer_base.py:328-334); the window's last row is the bootstrap row;
    * ``_nstep_return`` stops the return at ``end_flag = done``, with the
      newest unfinished row also flagged (algorithm_base.py:798-800), and
      discounts ``target_q`` by ``gamma**m`` (:1213-1221); ``value_mask``
      (``~terminated`` of the bootstrap row, :634-651, applied at :798) turns
      it off;
    * ``target_q_fn(buffer, idx)`` is what DQN's ``_target_q`` reads,
      ``buffer[idx].obs_next`` (dqn.py:365-369), here without a network: it
      returns the ``(I, 5)`` values ``[0, 1, obs_next[:, 0], obs_next[:, 1],
      obs_next[:, 2]]`` (``compute_nstep_return`` takes any output width
      ``A``, :764), so the returns read back, column by column:
      ``nstep_return`` (Q = 0), ``nstep_discount`` = returns(Q = 1) -
      returns(Q = 0), and ``nstep_obs`` = (returns(Q = obs_next_k) -
      returns(Q = 0)) / discount, as float32 like the stored observations
      (NaN where the discount is 0: nothing is bootstrapped there, and the
      suite does not read it);
    * ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``,
      ``next_obs``: the sampled rows' own (``buffer[indices]``).

    Windows cut by the newest row are shortened and bootstrap from its
    ``obs_next`` (the spec's ``incomplete_windows="shorten"``); one env.
    """

    def __init__(self, spec: BufferSpec):
        super().__init__(spec, ignore_obs_next=False)

    def sample(self, batch_size: int | None = None):
        from tianshou.algorithm import Algorithm

        rows, info = super().sample(batch_size)
        indices = info["index"].numpy()
        n = self.spec.nstep or 1

        def target_q_fn(buffer, idx):
            nxt = torch.as_tensor(np.asarray(buffer[idx].obs_next), dtype=torch.float64).reshape(len(idx), -1)
            return torch.cat([torch.zeros(len(idx), 1, dtype=torch.float64),
                              torch.ones(len(idx), 1, dtype=torch.float64), nxt], 1)

        out = Algorithm.compute_nstep_return(self.rb[indices], self.rb, indices, target_q_fn,
                                             gamma=self.spec.gamma, n_step=n)
        returns = torch.as_tensor(out.returns, dtype=torch.float64).reshape(len(indices), -1)
        ret, discount = returns[:, 0], returns[:, 1] - returns[:, 0]
        obs = (returns[:, 2:] - ret[:, None]) / discount[:, None]
        rows["nstep_return"] = ret
        rows["nstep_discount"] = discount
        # float32, the observations' dtype: the read-back's own float64 rounding (about 1e-16) is far below it
        rows["nstep_obs"] = torch.where(discount[:, None] > 0, obs, torch.full_like(obs, float("nan"))).float()
        return rows, info


def tianshou_nstep_adapter() -> Adapter:
    base = _adapter("tianshou-nstep", ignore_obs_next=False)

    def make(spec: BufferSpec) -> TianshouNstep:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (tianshou's ReplayBuffer)")
        return TianshouNstep(spec)

    return Adapter(name="tianshou-nstep", version=base.version, make=make,
                   capabilities=frozenset({"transitions", "nstep"}), conventions=Conventions())


__all__ = ["TianshouNstep", "TianshouTransitions", "tianshou_ignore_obs_next_adapter", "tianshou_nstep_adapter",
           "tianshou_obs_next_adapter"]
