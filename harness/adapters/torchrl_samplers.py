"""TorchRL 0.14.1's samplers of issue 40 as BufferUnderTest columns (group ``torchrl``).

Read from ``torchrl/data/replay_buffers/samplers/`` (``random.py``, ``slice_without_replacement.py``,
``prioritized_slice.py``, ``staleness.py``) and ``replay_buffers/base.py``; nothing emulated.
Every buffer is a ``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=...,
batch_size=spec.batch_size, generator=torch.Generator().manual_seed(spec.seed))``, wrapped by
:class:`~rbcheck.harness.adapters.torchrl.TorchRLBuffer` (its ``"index"`` column hidden).

* ``torchrl-samplers``: ``SamplerWithoutReplacement(drop_last, shuffle)``,
  ``ConsumingSampler(max_sample_count)``, ``SliceSamplerWithoutReplacement(num_slices | slice_len,
  traj_key=spec.episode_key, strict_length, drop_last, shuffle, truncated_key=None)``,
  ``PrioritizedSliceSampler(capacity, alpha, beta, eps, ..., truncated_key=None)`` (weights:
  ``info["priority_weight"]``) and ``StalenessAwareSampler(max_staleness)`` (``set_consumer_version``
  sets ``sampler.consumer_version``); ``iterate()`` is ``iter(rb)`` (each batch's index read from its
  ``"index"`` column). ``truncated_key=None``: the end flags are ``torchrl-slices``' subject.
* ``torchrl-prefetch``: the same buffer with ``prefetch=spec.prefetch`` over
  ``SamplerWithoutReplacement`` and ``PrioritizedSampler`` (``ConsumingSampler`` refuses prefetching:
  ``base.py`` ``_validate_consuming_sampler``, "Prefetching is not supported with ConsumingSampler").

Conventions (documented, each checked in its own terms):

* ``epoch_on_growth="restart"``: ``SamplerWithoutReplacement``'s docstring, "If the size of the
  storage changes in between two calls, the samples will be re-shuffled" (``random.py``, class doc).
* ``slice_epoch="trajectories"``: ``SliceSamplerWithoutReplacement`` permutes trajectories
  (``sample``: ``SamplerWithoutReplacement.sample(self, storage, num_slices)`` over
  ``_storage_len_buffer = len(start_idx)``, one slice per trajectory; its docstring: "only one
  slice of a given trajectory will appear").
* ``prefetch_batches="constructor_size"``: the ``batch_size`` argument's note, "This option is
  incompatible with prefetching (since this requires to know the batch-size in advance)"; and
  ``prefetch`` requires a constructor batch size (``base.py``: "When using prefetch, the
  batch-size must be specified").
* ``priority_dtype=float32`` and the ``param_ranges`` of ``torchrl.CONVENTIONS``.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rbcheck.harness.adapters.torchrl import CONVENTIONS, KNOWN_FAILURES_DIR, TorchRLBuffer, probe_prioritized
from rbcheck.harness.protocol import Adapter, BufferSpec

SAMPLERS = "https://github.com/pytorch/rl/blob/v0.14.1/torchrl/data/replay_buffers/samplers"
BASE = "https://github.com/pytorch/rl/blob/v0.14.1/torchrl/data/replay_buffers/replay_buffers/base.py"
SAMPLER_CAPABILITIES = frozenset({"without_replacement", "consuming", "slice_without_replacement",
                                  "prioritized_slice", "staleness", "iteration"})
PREFETCH_CAPABILITIES = frozenset({"without_replacement", "prioritized", "prefetch"})
SAMPLER_RULES = {"epoch_on_growth": "restart", "slice_epoch": "trajectories", "prefetch_batches": "constructor_size"}
NOTES = {
    **CONVENTIONS.notes,
    "sampler_rules": f"SamplerWithoutReplacement: 'If the size of the storage changes in between two calls, the "
                     f"samples will be re-shuffled' ({SAMPLERS}/random.py); SliceSamplerWithoutReplacement permutes "
                     f"trajectories, one slice each ({SAMPLERS}/slice_without_replacement.py, sample); prefetch "
                     f"needs the constructor's batch size ({BASE}: batch_size's note)",
}


class TorchRLSamplers(TorchRLBuffer):
    """A ``TensorDictReplayBuffer`` over one of TorchRL's issue-40 samplers."""

    def sample(self, batch_size: int | None = None):
        rows, info = super().sample(batch_size)
        info.pop(("next", "truncated"), None)
        return rows, info

    def set_consumer_version(self, version: int) -> None:
        self.rb.sampler.consumer_version = version

    def iterate(self):
        for data in self.rb:  # TorchRL's __iter__ yields sample()'s data; the index is its "index" column
            yield self._visible(data), {"index": torch.as_tensor(data.get("index"), dtype=torch.long)}

    def _sampler(self) -> Any:
        return self.rb.sampler

    @property
    def max_priority(self) -> float:
        raw = self.rb.sampler._max_priority[0]
        return 1.0 if raw is None else float(raw)


def make_sampler(spec: BufferSpec) -> Any:
    samplers = importlib.import_module("torchrl.data.replay_buffers.samplers")
    slices = dict(num_slices=spec.num_slices, slice_len=spec.slice_len, traj_key=spec.episode_key,
                  strict_length=spec.strict_length, truncated_key=None)
    if spec.sampler == "without_replacement":
        return samplers.SamplerWithoutReplacement(drop_last=spec.drop_last, shuffle=spec.shuffle)
    if spec.sampler == "consuming":
        return samplers.ConsumingSampler(max_sample_count=spec.max_sample_count)
    if spec.sampler == "slice_without_replacement":
        return samplers.SliceSamplerWithoutReplacement(**slices, drop_last=spec.drop_last, shuffle=spec.shuffle)
    if spec.sampler == "prioritized_slice":
        return samplers.PrioritizedSliceSampler(spec.capacity, spec.alpha, spec.beta, spec.eps, **slices)
    if spec.sampler == "staleness":
        return samplers.StalenessAwareSampler(max_staleness=spec.max_staleness)
    if spec.sampler == "prioritized":
        return samplers.PrioritizedSampler(spec.capacity, alpha=spec.alpha, beta=spec.beta, eps=spec.eps)
    raise ValueError(f"spec.sampler={spec.sampler!r}, but should be one this column declares")


def _make(spec: BufferSpec) -> TorchRLSamplers:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    kwargs: dict[str, Any] = dict(storage=LazyTensorStorage(spec.capacity), sampler=make_sampler(spec),
                                  batch_size=spec.batch_size, generator=torch.Generator().manual_seed(spec.seed))
    if spec.prefetch:
        kwargs["prefetch"] = spec.prefetch
    return TorchRLSamplers(TensorDictReplayBuffer(**kwargs), spec)


def _adapter(name: str, capabilities: frozenset) -> Adapter:
    torchrl = importlib.import_module("torchrl")
    unavailable = {}
    why = probe_prioritized()
    if why:
        unavailable.update({c: why for c in ("prioritized", "prioritized_slice") if c in capabilities})
    conventions = CONVENTIONS.__class__(**{**{f: getattr(CONVENTIONS, f) for f in ("priority_dtype", "param_ranges")},
                                           "sampler_rules": SAMPLER_RULES, "notes": NOTES})
    return Adapter(name=name, version=f"{torchrl.__version__} (torch {torch.__version__})", make=_make,
                   capabilities=capabilities, unavailable=unavailable,
                   known_failures=KNOWN_FAILURES_DIR / f"{name}.txt",
                   conventions=conventions)


def torchrl_samplers_adapter() -> Adapter:
    """TorchRL's samplers without replacement, consuming, slice epochs, prioritized slices,
    staleness, and iteration over a buffer."""
    return _adapter("torchrl-samplers", SAMPLER_CAPABILITIES)


def torchrl_prefetch_adapter() -> Adapter:
    """TorchRL's ``prefetch=N`` over the without-replacement and prioritized samplers."""
    return _adapter("torchrl-prefetch", PREFETCH_CAPABILITIES)


__all__ = ["TorchRLSamplers", "torchrl_prefetch_adapter", "torchrl_samplers_adapter"]
