"""torchrl 0.14.1's ``PrioritizedSampler`` (docs/findings.md R15): a strict
xfail stating the spec's behaviour. Skipped where torchrl is not installed
(``nox -s thirdparty`` installs it) or where its C++ extension does not load
(``tools/torchrl_build.py`` rebuilds it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import PrioritizedSampler  # noqa: E402

from rbcheck.harness.adapters.torchrl import probe_prioritized  # noqa: E402

VERSION = "torchrl 0.14.1"
WHY_NOT = probe_prioritized()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"TorchRL's PrioritizedSampler cannot run here: {WHY_NOT}")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: PrioritizedSampler.sample reads the weights with torch.as_tensor(self._sum_tree[index]) "
    "(data/replay_buffers/samplers/prioritized.py:517, again at :525); the C++ tree's first __getitem__ "
    "overload takes an int64_t (csrc/segment_tree.h:320-321), which pybind11 also accepts for a one-element "
    "integer tensor (torch.Tensor has __index__), so a batch of 1 gets a Python float: weights of shape [] "
    "beside an index of shape [1]"))
def test_weights_of_a_batch_of_one_have_the_batch_shape():
    rb = ReplayBuffer(storage=LazyTensorStorage(4), sampler=PrioritizedSampler(4, alpha=0.7, beta=0.6))
    rb.extend(torch.arange(3.0))
    _, info = rb.sample(2, return_info=True)
    assert info["priority_weight"].shape == info["index"].shape == (2,)  # a batch of 2 is fine
    _, info = rb.sample(1, return_info=True)
    assert tuple(info["index"].shape) == (1,)
    assert tuple(info["priority_weight"].shape) == (1,), f"weights of shape {tuple(info['priority_weight'].shape)}"
