"""SyncCollector (exact): the rows it writes have consistent episodes, steps and
done flags across batch boundaries; the policy is placed with place_policy
(seed invariant 4); one ``extend`` per batch. The buffer here is a stand-in
with ``extend``; the tutorial (tests/test_docs.py) runs it with the real one."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference.collector import SyncCollector
from rbcheck.reference.env import ChainEnv
from rbcheck.reference.policy import NotCopyableError


class Sink:
    """Stand-in buffer: records every extend call."""

    def __init__(self) -> None:
        self.batches: list[TensorDict] = []

    def extend(self, td: TensorDict) -> None:
        self.batches.append(td)


class Threshold(torch.nn.Module):
    """Goes right while its weight is positive, left otherwise."""

    def __init__(self, weight: float = 1.0) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(weight))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (self.weight > 0).to(torch.int64)


class Uncopyable(Threshold):
    def __deepcopy__(self, memo):
        raise RuntimeError("holds a process handle")


def check_rows(rows: TensorDict, max_steps: int) -> None:
    """Every consistency rule between episode, steps, done and next."""
    episode, steps = rows["episode"], rows["steps"]
    done = rows["done"].squeeze(-1)
    assert episode.dtype == steps.dtype == torch.int64
    assert rows["done"].dtype == torch.bool and rows["done"].shape == (len(rows), 1)
    assert torch.equal(rows["next", "done"], rows["done"])
    assert episode[0] == 0 and steps[0] == 0
    new = episode[1:] != episode[:-1]
    assert torch.equal(episode[1:] - episode[:-1], new.long()), "ids must go up by one"
    # a new episode starts exactly after a done row, at step 0; else steps go +1
    assert torch.equal(new, done[:-1])
    assert torch.equal(steps[1:], torch.where(new, 0, steps[:-1] + 1))
    assert int(steps.max()) < max_steps
    # within an episode, the next observation is the following row's observation
    same = ~new
    assert torch.equal(rows["next", "observation"][:-1][same], rows["observation"][1:][same])


def test_episodes_steps_and_done_are_consistent_across_batches():
    sink = Sink()
    env = ChainEnv(length=9, max_steps=12, slip=0.3, seed=1)
    collector = SyncCollector(env, Threshold(), sink, frames_per_batch=7, total_frames=70)
    yielded = list(collector)
    assert len(yielded) == len(sink.batches) == 10
    assert all(a is b for a, b in zip(yielded, sink.batches, strict=True))
    assert all(b.batch_size == torch.Size([7]) for b in yielded)
    assert collector.frames == 70
    rows = torch.cat(yielded)
    check_rows(rows, max_steps=12)
    done = rows["done"].squeeze(-1)
    assert int(done.sum()) >= 5, "the test needs several finished episodes"
    lengths = torch.unique_consecutive(rows["episode"], return_counts=True)[1][:-1]
    assert len(set(lengths.tolist())) > 1, "episode lengths should vary"
    # an episode cut by a batch boundary continues in the next batch
    assert any(not b["done"][-1].item() for b in yielded[:-1])


def test_collection_is_reproducible_from_the_seed():
    def rows(seed):
        collector = SyncCollector(ChainEnv(seed=seed), Threshold(), Sink(), 16, total_frames=32)
        return torch.cat(list(collector))

    assert (rows(0) == rows(0)).all()
    assert not torch.equal(rows(0)["episode"], rows(5)["episode"])


def test_policy_in_place_sees_updates():
    policy = Threshold(1.0)
    collector = SyncCollector(ChainEnv(slip=0.0), policy, Sink(), frames_per_batch=6)
    assert collector.policy is policy
    assert collector.collect()["action"].tolist() == [1] * 6
    with torch.no_grad():
        policy.weight.fill_(-1.0)  # the trainer updates the weights
    assert collector.collect()["action"].tolist() == [0] * 6


def test_private_copy_does_not_see_updates():
    policy = Threshold(1.0)
    collector = SyncCollector(ChainEnv(slip=0.0), policy, Sink(), 4, allow_in_place=False)
    assert collector.policy is not policy
    with torch.no_grad():
        policy.weight.fill_(-1.0)
    assert collector.collect()["action"].tolist() == [1] * 4


def test_uncopyable_policy_is_used_in_place_or_rejected_before_writing():
    sink, policy = Sink(), Uncopyable()
    collector = SyncCollector(ChainEnv(), policy, sink, frames_per_batch=5)
    assert collector.policy is policy
    check_rows(collector.collect(), max_steps=ChainEnv().max_steps)
    sink = Sink()
    with pytest.raises(NotCopyableError, match=r"policy=Uncopyable") as info:
        SyncCollector(ChainEnv(), policy, sink, frames_per_batch=5, device="meta")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert sink.batches == []


def test_preconditions_are_named():
    env, policy, sink = ChainEnv(), Threshold(), Sink()
    with pytest.raises(ValueError, match=r"frames_per_batch=0, but should be an int >= 1"):
        SyncCollector(env, policy, sink, 0)
    with pytest.raises(
        ValueError,
        match=r"total_frames=10, but should be None or a positive multiple of frames_per_batch=4",
    ):
        SyncCollector(env, policy, sink, 4, total_frames=10)
    with pytest.raises(TypeError, match=r"buffer=dict, but should have an extend"):
        SyncCollector(env, policy, {}, 4)
    with pytest.raises(TypeError, match=r"env=object, but should have reset"):
        SyncCollector(object(), policy, sink, 4)
    two_actions = SyncCollector(env, lambda obs: torch.tensor([1, 1]), sink, 4)
    with pytest.raises(
        ValueError, match=r"policy\(observation\).shape=\(2,\), but should hold one"
    ):
        two_actions.collect()
    assert sink.batches == []
