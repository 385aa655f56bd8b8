"""torchrl 0.14.1's issue-40 samplers (docs/findings.md R16-R18): strict xfails
stating the spec's behaviour. Skipped where torchrl is not installed
(``nox -s thirdparty`` installs it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement, StalenessAwareSampler  # noqa: E402

VERSION = "torchrl 0.14.1"


def staleness_buffer(seed: int) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=StalenessAwareSampler(),
                                generator=torch.Generator().manual_seed(seed))
    rb.extend(TensorDict({"policy_version": torch.tensor([0, 0, 0, 9])}, [4]))
    rb.sampler.consumer_version = 9  # staleness 9, 9, 9, 0: weights 0.1, 0.1, 0.1, 1
    return rb


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: StalenessAwareSampler.sample draws torch.multinomial(weights, batch_size, "
    "replacement=batch_size > len(valid_indices)) (data/replay_buffers/samplers/staleness.py:191-192): a batch "
    "no larger than the eligible rows is drawn without replacement, so its draws are not proportional to the "
    "freshness weights the class documents ('Sample proportionally to a weight that decays with staleness'); "
    "a batch of all the eligible rows is a permutation of them, whatever the weights"))
def test_staleness_draws_are_proportional_to_the_freshness_weights():
    rb = staleness_buffer(0)
    counts = torch.zeros(4)
    for _ in range(200):
        counts += torch.bincount(rb.sample(4, return_info=True)[1]["index"], minlength=4)
    # weights 1 : 0.1: the fresh row should take 1 / 1.3 of the 800 draws (615), not one in four (200)
    assert counts[3] > 500, f"draws of the fresh row={int(counts[3])} of 800, but should be about 615"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: StalenessAwareSampler.sample calls torch.multinomial without generator=self._rng "
    "(data/replay_buffers/samplers/staleness.py:191), so the buffer's generator (ReplayBuffer(generator=...)) "
    "does not fix its draws: two buffers seeded alike draw differently"))
def test_staleness_draws_follow_the_buffers_generator():
    torch.manual_seed(1)
    first = [staleness_buffer(5).sample(2, return_info=True)[1]["index"].tolist() for _ in range(6)]
    torch.manual_seed(2)
    second = [staleness_buffer(5).sample(2, return_info=True)[1]["index"].tolist() for _ in range(6)]
    assert first == second, f"draws of two buffers seeded 5={first} and {second}, but should be equal"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: ReplayBuffer.sample with prefetch=N serves the queued futures (self._prefetch_queue.popleft()"
    ".result(), data/replay_buffers/replay_buffers/base.py sample) and extend never takes them back "
    "(_extend does not touch the queue): a batch drawn and gathered before a write is returned after it, "
    "with rows the buffer no longer holds; the prefetch argument documents none of this"))
def test_prefetch_never_returns_rows_overwritten_before_the_sample():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=SamplerWithoutReplacement(), batch_size=2,
                                prefetch=2, generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    rb.sample()  # queues the next batches, gathered now
    rb.extend(TensorDict({"obs": torch.arange(4.0) + 100}, [4]))  # every row overwritten
    obs = rb.sample()["obs"].tolist()
    assert all(o >= 100 for o in obs), f"rows of a sample after every row was overwritten={obs}, but should be >= 100"
