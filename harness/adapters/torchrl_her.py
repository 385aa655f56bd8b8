"""TorchRL's ``HERReplayBuffer`` and ``OfflineToOnlineReplayBuffer``
(written against torchrl 0.14.1; issue 42, group ``torchrl``). Line numbers
are of ``torchrl/data/replay_buffers/her.py`` and ``offline_to_online.py``.

* ``torchrl-her``: ``HERReplayBuffer(reward_fn, her_ratio=ratio,
  strategy=strategy, storage=LazyTensorStorage(capacity))`` over TorchRL rows
  (``desired_goal``, ``achieved_goal`` and ``("next", ...)``: ``achieved_goal``,
  ``desired_goal``, ``reward``, ``done``, ``terminated``, ``truncated``), the
  reward function ``reference.her.goal_reward(("next", "achieved_goal"),
  "desired_goal")``. It relabels exactly ``int(n * her_ratio)`` rows of a
  batch (:379): declared ``her_count="floor"``.
* ``torchrl-offline-to-online``: ``OfflineToOnlineReplayBuffer(offline,
  online_capacity=capacity, offline_fraction=fraction)`` with ``offline`` a
  ``ReplayBuffer(LazyTensorStorage)`` holding ``reference.mixing.offline_rows``;
  it draws exactly ``round(fraction * batch_size)`` offline rows (:163):
  declared ``mix_count="round"``. Its ``offline_fraction`` must be in (0, 1)
  (:97), which the suite's fractions are.

Sampling draws from torch's global generator, seeded with ``spec.seed`` at
``make``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.hindsight import goal_rows, no_slots
from rbcheck.harness.adapters.numpy_rows import check_batch_size
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions


def her_rows(data: TensorDictBase) -> TensorDict:
    n = len(data)
    term, trunc = data["terminated"].reshape(n, 1), data["truncated"].reshape(n, 1)
    return TensorDict({
        "id": data["id"], "episode": data["episode"], "observation": data["obs"], "action": data["action"],
        "achieved_goal": data["achieved_goal"], "desired_goal": data["desired_goal"],
        "next": TensorDict({"observation": data["next_obs"], "achieved_goal": data["next_achieved_goal"],
                            "desired_goal": data["desired_goal"], "reward": data["reward"].reshape(n, 1),
                            "terminated": term, "truncated": trunc, "done": term | trunc}, [n]),
    }, [n])


def reward_fn(td: TensorDictBase) -> torch.Tensor:
    from rbcheck.reference.her import goal_reward

    return goal_reward(td["next", "achieved_goal"], td["desired_goal"]).unsqueeze(-1)


class TorchRLIssue42(CountedWrites):
    """One TorchRL buffer of issue 42 (``her``: HERReplayBuffer, else OfflineToOnlineReplayBuffer)."""

    def __init__(self, spec: BufferSpec):
        from torchrl.data import (
            HERReplayBuffer,
            LazyTensorStorage,
            OfflineToOnlineReplayBuffer,
            ReplayBuffer,
        )

        torch.manual_seed(spec.seed)
        self.spec, self.written = spec, 0
        if spec.her is not None:
            strategy, ratio = spec.her
            self.rb = HERReplayBuffer(reward_fn, her_ratio=ratio, strategy=strategy,
                                      storage=LazyTensorStorage(spec.capacity))
        else:
            from rbcheck.reference.mixing import offline_rows

            size, fraction = spec.mixing
            offline = ReplayBuffer(storage=LazyTensorStorage(size))
            offline.extend(offline_rows(size))
            self.rb = OfflineToOnlineReplayBuffer(offline, online_capacity=spec.capacity,
                                                  offline_fraction=fraction)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        start = self.written
        self.rb.extend(her_rows(data) if self.spec.her is not None else data.clone())
        self.written += len(data)
        return self.slots(start, len(data))

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        s = self.rb.sample(batch_size)
        if self.spec.her is None:
            return s.select("id", "obs"), no_slots(len(s))
        return goal_rows(s["id"], s["episode"], s["desired_goal"], s["next", "reward"]), no_slots(len(s))

    def contents(self) -> TensorDictBase:
        rb = self.rb if self.spec.her is not None else self.rb.online_buffer
        return rb[:].select("id")

    def save(self, path) -> None:
        self.rb.dumps(path)

    def load(self, path) -> None:
        self.rb.loads(path)


def _version() -> str:
    from importlib.metadata import version

    return version("torchrl")


def _make(spec: BufferSpec) -> TorchRLIssue42:
    if spec.her is None and spec.mixing is None:  # a ring of any rows: the 'torchrl' column answers it
        import pytest

        pytest.skip("not applicable: this column is TorchRL's hindsight or mixing buffer (spec.her or "
                    "spec.mixing); the 'torchrl' column checks its plain ring")
    return TorchRLIssue42(spec)


def torchrl_her_adapter() -> Adapter:
    return Adapter(
        name="torchrl-her", version=_version(), make=_make, capabilities=frozenset({"her", "save_load"}),
        known_failures=Path(__file__).resolve().parent.parent / "known_failures" / "torchrl-her.txt",
        conventions=Conventions(hindsight={"her_count": "floor"}, notes={
            "hindsight": "HERReplayBuffer._sample relabels the first int(n * her_ratio) rows (her.py:379)"}),
    )


def torchrl_offline_to_online_adapter() -> Adapter:
    return Adapter(
        name="torchrl-offline-to-online", version=_version(), make=_make, capabilities=frozenset({"mixing"}),
        conventions=Conventions(hindsight={"mix_count": "round"}, notes={
            "hindsight": "OfflineToOnlineReplayBuffer.sample draws round(offline_fraction * batch_size) offline "
                         "rows (offline_to_online.py:163)"}),
    )
