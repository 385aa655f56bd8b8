"""torchrl 0.14.1's ``PrioritizedSampler`` (docs/findings.md R15, R19): strict
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


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: update_priority stores torch.pow(priority + self._eps, self._alpha) into the float32 "
    "sum/min trees (data/replay_buffers/samplers/prioritized.py:659-661, trees of dtype=torch.float, "
    ":331-333) with no floor, so a raw 0 whose eps ** alpha is positive but below float32's smallest "
    "number (eps=2.26e-249; or the default eps=1e-8 with alpha=6: 1e-48) is stored as 0, and sample then "
    "refuses the whole buffer, rows of priority 1 included: 'non-positive p_min' (:496-497)"))
@pytest.mark.parametrize("eps, alpha", [(2.26e-249, 0.5), (1e-8, 6.0)], ids=["tiny_eps", "default_eps_alpha_6"])
def test_a_zero_priority_plus_eps_leaves_the_buffer_sampleable(eps, alpha):
    rb = ReplayBuffer(storage=LazyTensorStorage(6), sampler=PrioritizedSampler(6, alpha=alpha, beta=1.0, eps=eps))
    rb.extend(torch.arange(6.0))
    rb.update_priority(torch.arange(4), torch.zeros(4))  # rows 4 and 5 keep priority 1
    assert eps ** alpha > 0  # every row's (p + eps) ** alpha is positive, as eps is documented to ensure
    try:
        _, info = rb.sample(4, return_info=True)
    except RuntimeError as err:
        raise AssertionError(f"sample(4) raised {err!r}, but should draw from rows of stored priority "
                             f"(0 + {eps}) ** {alpha} = {eps ** alpha:.3g} > 0 and 1") from err
    assert info["index"].shape == (4,)


def test_a_zero_priority_plus_the_default_eps_is_sampleable():
    """The control of the repro above: where (0 + eps) ** alpha stays positive in float32 (the default
    eps=1e-8, alpha=0.5: 1e-4), the same buffer samples."""
    rb = ReplayBuffer(storage=LazyTensorStorage(6), sampler=PrioritizedSampler(6, alpha=0.5, beta=1.0, eps=1e-8))
    rb.extend(torch.arange(6.0))
    rb.update_priority(torch.arange(4), torch.zeros(4))
    _, info = rb.sample(4, return_info=True)
    assert info["index"].shape == (4,)
