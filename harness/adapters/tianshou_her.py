"""tianshou's ``HERReplayBuffer`` (written against tianshou 2.0.1; issue 42),
built-in name ``tianshou-her``. Line numbers are of
``tianshou/data/buffer/her.py`` (``buffer_base.py`` where named).

* buffer: ``HERReplayBuffer(capacity, compute_reward_fn=goal_reward_np,
  horizon=capacity, future_k=k + 1, random_seed=spec.seed)``: the reward
  function is the spec's ``reference.her.goal_reward`` on NumPy arrays
  (``compute_reward_fn(achieved_goal, desired_goal)``, :19-22, called with
  ``obs_next.achieved_goal``, :172); ``horizon`` bounds the trajectory
  ``rewrite_transitions`` follows from a sampled row with ``next()``
  (:118-120), and no held episode is longer than the ring; tianshou relabels
  a share ``future_p = 1 - 1 / future_k`` (:43), so ``spec.her`` ratio
  ``r = k / (k + 1)`` is handed over as ``future_k = k + 1``. tianshou has
  only the ``"future"`` strategy (:16).
* rows: one ``add(Batch(obs, act, rew, terminated, truncated, obs_next,
  info))`` per env step with ``obs = Batch(observation=[id, episode],
  achieved_goal, desired_goal)`` and ``obs_next`` carrying
  ``next_achieved_goal``.
* ``sample``: tianshou's ``sample(batch_size)`` (rows drawn by the buffer's
  seeded ``_random_state``, buffer_base.py:517; the relabelling's draws
  from NumPy's global generator, :127 and :139, with this buffer's own state
  swapped in, seeded with ``spec.seed``). The rows are ``batch.obs`` as
  tianshou returns them (relabelled in place until the next call, :183-188),
  the reward ``batch.rew``, ``info["index"]`` the indices.
* ``save``/``load``: ``save_hdf5`` / ``load_hdf5`` (buffer_base.py:252,
  :258; ``save_hdf5`` restores the relabelled rows first, :67-69).

Declared (``Conventions.hindsight``): ``strategies="future"``;
``her_count="floor_episodes"``: of the ``E`` distinct episodes (trajectory
ends) a batch draws from, ``int(E * future_p)`` have all their sampled rows
relabelled, with one goal each (:134-143, :165); ``unfinished="relabelled"``:
the trajectory of a sampled row is followed with ``next()`` (:118-125), which
stops at an episode's end *or the newest row* (``buffer_base.py:333``), so the
episode in progress is relabelled as if its newest row ended it (with goals
reached after its held steps; nothing in tianshou's docs says so, the code
does it on purpose: ``last_index`` is an end flag there).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.hindsight import goal_rows, skip_without_her
from rbcheck.harness.adapters.numpy_rows import GlobalNumpyStream, check_batch_size
from rbcheck.harness.adapters.sb3_her import sampled_goals
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "tianshou 2.0.1"


def goal_reward_np(achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """``reference.her.goal_reward`` on NumPy arrays, as tianshou's ``compute_reward_fn`` takes them."""
    from rbcheck.reference.her import goal_reward

    return goal_reward(torch.as_tensor(np.asarray(achieved_goal)), torch.as_tensor(np.asarray(desired_goal))).numpy()


class TianshouHer(CountedWrites):
    def __init__(self, spec: BufferSpec):
        from tianshou.data import HERReplayBuffer

        strategy, ratio = spec.her
        if strategy != "future":
            raise ValueError(f"spec.her strategy={strategy!r}, but should be 'future' (tianshou's only one, her.py:16)")
        self.spec, self.written = spec, 0
        self.rb = HERReplayBuffer(spec.capacity, compute_reward_fn=goal_reward_np, horizon=spec.capacity,
                                  future_k=float(sampled_goals(ratio) + 1), random_seed=spec.seed)
        self.numpy = GlobalNumpyStream(spec.seed)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        from tianshou.data import Batch

        start = self.written
        for row in data.unbind(0):
            ident = np.array([float(row["id"]), float(row["episode"])], np.float64)
            goal = row["desired_goal"].numpy()
            self.rb.add(Batch(
                obs=Batch(observation=ident, achieved_goal=row["achieved_goal"].numpy(), desired_goal=goal),
                act=np.zeros(1, np.float32), rew=float(row["reward"]), terminated=bool(row["terminated"]),
                truncated=bool(row["truncated"]),
                obs_next=Batch(observation=ident, achieved_goal=row["next_achieved_goal"].numpy(),
                               desired_goal=goal),
                info={}))
            self.written += 1
        return self.slots(start, len(data))

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.numpy.active():
            batch, indices = self.rb.sample(batch_size)
        ident = torch.as_tensor(np.asarray(batch.obs.observation)).reshape(-1, 2)
        rows = goal_rows(ident[:, 0], ident[:, 1],
                         torch.as_tensor(np.asarray(batch.obs.desired_goal)).reshape(-1, 2).float(),
                         torch.as_tensor(np.asarray(batch.rew)).float())
        return rows, {"index": torch.as_tensor(np.asarray(indices).astype(np.int64))}

    def contents(self) -> TensorDictBase:
        self.rb._restore_cache()  # the rows as written (a sample's relabelled goals are put back)
        ids = np.asarray(self.rb._meta.obs.observation)[: len(self.rb), 0]
        return TensorDict({"id": torch.as_tensor(ids.copy()).long()}, [len(ids)])

    @property
    def cursor(self) -> int:
        return int(self.rb._insertion_idx)

    def save(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.rb.rbcheck_write_count = self.written  # rides in the __dict__ save_hdf5 stores
        self.rb.save_hdf5(str(path / "buffer.hdf5"))

    def load(self, path) -> None:
        rb = type(self.rb).load_hdf5(str(Path(path) / "buffer.hdf5"))
        self.rb, self.written = rb, int(getattr(rb, "rbcheck_write_count", len(rb)))


def _version() -> str:
    from importlib.metadata import version

    return version("tianshou")


def _make(spec: BufferSpec) -> TianshouHer:
    skip_without_her(spec, "tianshou's HERReplayBuffer", "tianshou")
    return TianshouHer(spec)


def tianshou_her_adapter() -> Adapter:
    return Adapter(
        name="tianshou-her", version=_version(), make=_make, capabilities=frozenset({"her", "save_load"}),
        known_failures=Path(__file__).resolve().parent.parent / "known_failures" / "tianshou-her.txt",
        conventions=Conventions(hindsight={"strategies": "future", "her_count": "floor_episodes",
                                           "unfinished": "relabelled"}, notes={
            "hindsight": "only the 'future' strategy (her.py:16); int(len(unique_ep_open_indices) * self.future_p) "
                         "episodes of a batch relabelled, all their sampled rows with one goal (her.py:139-143, :165); "
                         "an episode's trajectory follows next() (her.py:118-125), which stops at the newest row "
                         "(buffer_base.py:333), so the episode in progress is relabelled as if that row ended it"}),
    )


__all__ = ["TianshouHer", "tianshou_her_adapter"]
