"""TorchRL's ``("next", ...)`` keys and ``MultiStep`` (written against
torchrl 0.14.1) for invariant 10 (group ``torchrl``). Line numbers are of
``torchrl/data/postprocs/postprocs.py``.

* ``torchrl-next``: a ``ReplayBuffer(storage=LazyTensorStorage(capacity))``
  of TorchRL rows: ``observation``, ``action`` and ``("next", "observation")``,
  ``("next", "reward")``, ``("next", "terminated")``, ``("next",
  "truncated")``, ``("next", "done")``, as a collector writes them;
* ``torchrl-multistep``: the same buffer fed through ``MultiStep(gamma,
  n_steps)`` as a collector's ``postproc`` (:168): the steps written since
  the last sample form one collector batch (``[num_envs, T]``), which
  ``MultiStep`` turns into n-step rows (``("next", "reward")`` the return,
  ``("next", "observation")`` the bootstrap observation, ``"gamma"``
  gamma**m, :277-284) before they are extended, so windows are shortened at
  the batch's end, as TorchRL documents (``MultiStep``'s note). The discount
  returned is ``gamma * (1 - ("next", "terminated"))``: what TorchRL's value
  estimators bootstrap with.

Each row's ``id`` is stored with it; sampling is TorchRL's
``RandomSampler`` with the buffer's generator seeded by ``spec.seed``.
"""

from __future__ import annotations

import importlib

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.numpy_rows import OwnRandomness, check_batch_size
from rbcheck.harness.adapters.sb3_transitions import not_applicable
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions


def torchrl_rows(data: TensorDictBase) -> TensorDict:
    """The suite's rows as TorchRL's collector writes them."""
    n = len(data)
    term, trunc = data["terminated"].reshape(n, 1), data["truncated"].reshape(n, 1)
    return TensorDict({
        "id": data["id"], "observation": data["obs"], "action": data["action"],
        "next": TensorDict({"observation": data["next_obs"], "reward": data["reward"].reshape(n, 1),
                            "terminated": term, "truncated": trunc, "done": term | trunc}, [n]),
    }, [n])


class TorchRLTransitions(CountedWrites, OwnRandomness):
    LIBRARY = "TorchRL"

    def __init__(self, spec: BufferSpec, multistep: bool):
        from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer

        self.spec, self.multistep = spec, multistep
        self.rb = ReplayBuffer(storage=LazyTensorStorage(spec.capacity), sampler=RandomSampler(),
                               generator=torch.Generator().manual_seed(spec.seed))
        self.pending: list[TensorDict] = []
        self.written = 0

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        start = self.written
        rows = torchrl_rows(data)
        if self.multistep:
            self.pending.append(rows)  # one collector batch, post-processed at the next sample
        else:
            self.rb.extend(rows)
        self.written += len(data)
        return self.slots(start, len(data))

    def _flush(self) -> None:
        if not self.pending:
            return
        from torchrl.data.postprocs import MultiStep

        e = self.spec.num_envs
        batch = torch.cat(self.pending, 0)
        self.pending = []
        steps = batch.reshape(-1, e).transpose(0, 1)  # [num_envs, T], as a collector's batch
        out = MultiStep(gamma=self.spec.gamma, n_steps=self.spec.nstep or 1)(steps.clone())
        self.rb.extend(out.transpose(0, 1).reshape(-1))  # back to write order

    def __len__(self) -> int:
        return len(self.rb) + sum(len(p) for p in self.pending)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        self._flush()
        s, info = self.rb.sample(batch_size, return_info=True)
        rows = {"id": s["id"], "obs": s["observation"], "action": s["action"]}
        if self.multistep:
            rows["nstep_return"] = s["next", "reward"].reshape(-1).double()
            rows["nstep_obs"] = s["next", "observation"]
            alive = ~s["next", "terminated"].reshape(-1)
            rows["nstep_discount"] = s["gamma"].reshape(-1).double() * alive
        else:
            rows.update(reward=s["next", "reward"].reshape(-1), terminated=s["next", "terminated"].reshape(-1),
                        truncated=s["next", "truncated"].reshape(-1), next_obs=s["next", "observation"])
        index = info["index"]
        index = index[0] if isinstance(index, tuple) else index  # a SliceSampler's: one tensor per storage dim
        return TensorDict(rows, batch_size=[len(s)]), {"index": torch.as_tensor(index)}

    def contents(self) -> TensorDictBase:
        self._flush()
        return self.rb[:].select("id", "observation")

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("a uniform TorchRL buffer (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("a uniform TorchRL buffer (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("a uniform TorchRL buffer (capability 'prioritized' is not declared)")


def _adapter(name: str, multistep: bool) -> Adapter:
    try:
        importlib.import_module("torchrl.data")
    except ImportError as err:
        raise ImportError(f"torchrl is not installed ({type(err).__name__}: {err}), but should be: "
                          f"install the 'torchrl' dependency group") from err
    from importlib.metadata import version

    def make(spec: BufferSpec) -> TorchRLTransitions:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (a RandomSampler column)")
        return TorchRLTransitions(spec, multistep)

    if multistep:
        conventions = Conventions(transition_fields=("obs", "action"), notes={
            "transition_fields": "MultiStep replaces ('next', 'reward') and ('next', 'observation') by the n-step "
                                 "return and the bootstrap observation (postprocs.py:277-282)"})
        caps = {"transitions", "nstep", "env_id"}
    else:
        conventions = Conventions()
        caps = {"transitions", "env_id"}
    return Adapter(name=name, version=version("torchrl"), make=make, capabilities=frozenset(caps),
                   conventions=conventions)


def torchrl_next_adapter() -> Adapter:
    return _adapter("torchrl-next", multistep=False)


def torchrl_multistep_adapter() -> Adapter:
    return _adapter("torchrl-multistep", multistep=True)


class TorchRLSlices(TorchRLTransitions):
    """``torchrl-slices``: the ``torchrl-next`` rows (with the episode id at
    the top level, ``"episode"``) in a ``TensorDictReplayBuffer``; a
    ``spec.sampler == "slice"`` spec gets TorchRL's ``SliceSampler(
    slice_len=..., traj_key="episode", strict_length=...,
    truncated_key=("next", "truncated"))``, any other its ``RandomSampler``.

    How the spec's fields map onto torchrl 0.14.1
    (``torchrl/data/replay_buffers/samplers/slice.py``):

    * ``truncated``: the sample's ``("next", "truncated")``, which the
      sampler sets to 1 at each slice's last row and 0 elsewhere, not OR-ed
      with the stored flag (``_finalize_index``, :1242-1260), written into
      the sample by ``TensorDictReplayBuffer.sample``
      (``replay_buffers/tensordict.py:474-481``);
    * ``terminated``: ``("next", "terminated")``, the stored flags of the
      sampled rows (:1268-1274); ``("next", "done")`` is the stored done OR
      the slice-end marker (:1263-1267);
    * ``obs``, ``action``, ``reward``, ``next_obs``: the rows' own
      (``observation``, ``action``, ``("next", "reward")``,
      ``("next", "observation")``);
    * a slice: ``slice_len`` consecutive rows of one trajectory (runs of
      equal ``"episode"``), slices one after the other in the sample.

    One env (the slice sampler needs each episode's rows adjacent in the
    storage: ``env_id`` not declared).
    """

    def __init__(self, spec: BufferSpec):
        from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import SliceSampler

        if spec.num_envs != 1:
            raise ValueError(f"spec.num_envs={spec.num_envs}, but should be 1 (slices need each episode's rows "
                             f"adjacent)")
        self.spec, self.multistep = spec, False
        if spec.sampler == "slice":
            sampler = SliceSampler(num_slices=spec.num_slices, slice_len=spec.slice_len, traj_key="episode",
                                   strict_length=spec.strict_length, truncated_key=("next", "truncated"))
        else:
            sampler = RandomSampler()
        self.rb = TensorDictReplayBuffer(storage=LazyTensorStorage(spec.capacity), sampler=sampler,
                                         generator=torch.Generator().manual_seed(spec.seed))
        self.pending: list[TensorDict] = []
        self.written = 0

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        start = self.written
        rows = torchrl_rows(data)
        rows["episode"] = data["episode"]
        self.rb.extend(rows)
        self.written += len(data)
        return self.slots(start, len(data))


def torchrl_slices_adapter() -> Adapter:
    base = _adapter("torchrl-slices", multistep=False)

    def make(spec: BufferSpec) -> TorchRLSlices:
        if spec.sampler not in ("random", "slice"):
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'slice'")
        return TorchRLSlices(spec)

    return Adapter(name="torchrl-slices", version=base.version, make=make,
                   capabilities=frozenset({"transitions", "slice"}), conventions=Conventions())


__all__ = ["TorchRLSlices", "TorchRLTransitions", "torchrl_multistep_adapter", "torchrl_next_adapter", "torchrl_rows",
           "torchrl_slices_adapter"]
