"""TorchRL's replay buffer (written against torchrl 0.14.1) as a BufferUnderTest.

Mapping (read from TorchRL's source, nothing emulated):

* buffer: ``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity,
  device=...), sampler=..., transform=..., batch_size=..., pin_memory=...,
  generator=torch.Generator().manual_seed(seed), priority_key=...)``;
  ``priority_key=None`` in the spec keeps TorchRL's default ``"td_error"``.
* samplers: ``RandomSampler()``; ``PrioritizedSampler(capacity, alpha, beta,
  eps)`` (TorchRL's default float32 trees); ``SliceSampler(num_slices=...,
  slice_len=..., traj_key=spec.episode_key, strict_length=...)``.
* ``sample`` calls ``sample(batch_size, return_info=True, include_info=False)``;
  the info dict is passed through and, in addition, TorchRL's
  ``"priority_weight"`` is also given as ``"weight"`` and a tuple index is
  unpacked into a tensor.
* TorchRL's tensordict writer writes an ``"index"`` column into the stored
  rows (and into the caller's TensorDict). The adapter hands TorchRL a shallow
  copy of the caller's data and leaves that bookkeeping column out of
  ``contents()`` and of samples, unless the caller writes an ``"index"`` key
  of its own (then nothing is hidden: TorchRL overwrites it).
* ``update_priority(index, priority)`` maps to TorchRL's; TorchRL takes no
  write generation, so a call with ``generation`` raises NotImplementedError
  and "stale_updates" is not declared. There is no way to feed TorchRL given
  uniforms, so "shared_rng" is not declared.
* ``stored_priority`` reads the sum tree's leaves, ``max_priority`` is
  TorchRL's ``default_priority`` (its raw max priority, 1.0 before any).
* ``save`` / ``load``: ``dumps`` / ``loads``.
* pin step: TorchRL pins what ``_sample`` returns through
  ``torchrl.data.replay_buffers.utils._pin_memory`` (each of sample and info;
  only objects with ``.pin_memory`` whose ``device`` is cpu). The patch hook
  keeps that decision and replaces only the pinning call by
  ``recorder(obj, {})``.
* policy placement: the collectors' ``BaseCollector._get_policy_and_device``
  (TorchRL has no ``allow_in_place`` switch; the argument is ignored).

Capabilities that TorchRL has but that cannot run here are listed in
``unavailable`` with the error they raise, found by trying them when the
adapter is loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from tensordict import TensorDictBase

from rbcheck.harness.adapters.reference import cuda_unavailable_reason
from rbcheck.harness.protocol import Adapter, BufferSpec

CAPABILITIES = frozenset(
    {
        "random",
        "prioritized",
        "slice",
        "transforms",
        "pin_memory",
        "save_load",
        "policy_copy",
        "cuda",
        "priority_key",
        "bad_input",
    }
)

BOOKKEEPING_KEY = "index"


def _strip_paths(text: str) -> str:
    """Drop directories from file paths in an error text (keep the file name)."""
    return re.sub(r"(?<![\w:/.])(?:/[^/\s:]+)+/([^/\s:]+)", r"\1", text)


def _error_text(err: BaseException) -> str:
    return _strip_paths(f"{type(err).__name__}: {err}")


def probe_prioritized() -> str | None:
    """Why TorchRL's PrioritizedSampler cannot be built here, or None."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    try:
        PrioritizedSampler(2, alpha=0.6, beta=0.4)
    except Exception as err:
        why = _error_text(err)
        try:
            importlib.import_module("torchrl._torchrl")
        except Exception as cause:
            why += f" (cause: the C++ extension torchrl._torchrl does not load: {_error_text(cause)})"
        return why
    return None


class TorchRLBuffer:
    """A :class:`BufferUnderTest` over a TorchRL ``TensorDictReplayBuffer``."""

    def __init__(self, rb: Any, spec: BufferSpec):
        self.rb = rb
        self.spec = spec
        # Hide TorchRL's "index" column unless the caller writes one itself
        # (a buffer filled by ``load`` keeps hiding it).
        self._hide_index = True

    def __repr__(self) -> str:
        return f"TorchRLBuffer({self.rb.__class__.__name__}, {self.spec})"

    def _note_keys(self, data: TensorDictBase) -> None:
        if BOOKKEEPING_KEY in data.keys():
            self._hide_index = False

    def _visible(self, data: TensorDictBase) -> TensorDictBase:
        if self._hide_index and BOOKKEEPING_KEY in data.keys():
            return data.exclude(BOOKKEEPING_KEY)
        return data

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        self._note_keys(data)
        index = self.rb.extend(data.copy())
        return torch.as_tensor(index, dtype=torch.long)

    def add(self, row: TensorDictBase) -> int:
        self._note_keys(row)
        return int(self.rb.add(row.copy()))

    # reading
    def __len__(self) -> int:
        return len(self.rb)

    def sample(self, batch_size: int | None = None):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="include_info is going to be deprecated")
            data, info = self.rb.sample(batch_size, return_info=True, include_info=False)
        info = dict(info)
        index = info.get("index")
        if isinstance(index, tuple) and len(index) == 1:
            info["index"] = index[0]
        if "priority_weight" in info:
            info["weight"] = info["priority_weight"]
        return self._visible(data), info

    def contents(self) -> TensorDictBase:
        index = torch.arange(len(self.rb.storage), dtype=torch.long)
        return self._visible(self.rb.storage.get(index)).clone()

    @property
    def cursor(self) -> int:
        return int(self.rb.writer._cursor)  # TorchRL has no public cursor

    @property
    def write_count(self) -> int:
        return int(self.rb.write_count)

    # priorities
    def _sampler(self) -> Any:
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        sampler = self.rb.sampler
        if not isinstance(sampler, PrioritizedSampler):
            raise NotImplementedError(
                f"sampler={type(sampler).__name__}, but should be a PrioritizedSampler"
            )
        return sampler

    def update_priority(self, index, priority, generation=None) -> None:
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but TorchRL's update_priority(index, priority) "
                "takes no write generation (capability 'stale_updates' is not declared)"
            )
        self.rb.update_priority(index, priority)

    def stored_priority(self, index) -> torch.Tensor:
        tree = self._sampler()._sum_tree
        index = torch.as_tensor(index, dtype=torch.long)
        return torch.as_tensor(tree[index]).to(torch.float64)

    @property
    def max_priority(self) -> float:
        return float(self._sampler().default_priority)

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "TorchRL samplers draw their own randomness; there is no way to hand them "
            "uniforms (capability 'shared_rng' is not declared)"
        )

    # checkpoints
    def save(self, path: Path) -> None:
        self.rb.dumps(path)

    def load(self, path: Path) -> None:
        self.rb.loads(path)


def _make(spec: BufferSpec) -> TorchRLBuffer:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        RandomSampler,
        SliceSampler,
    )

    if spec.sampler == "random":
        sampler = RandomSampler()
    elif spec.sampler == "prioritized":
        sampler = PrioritizedSampler(spec.capacity, alpha=spec.alpha, beta=spec.beta, eps=spec.eps)
    elif spec.sampler == "slice":
        sampler = SliceSampler(
            num_slices=spec.num_slices,
            slice_len=spec.slice_len,
            traj_key=spec.episode_key,
            strict_length=spec.strict_length,
        )
    else:
        raise ValueError(
            f"spec.sampler={spec.sampler!r}, but should be 'random', 'prioritized' or 'slice'"
        )
    kwargs: dict[str, Any] = dict(
        storage=LazyTensorStorage(spec.capacity, device=spec.device),
        sampler=sampler,
        batch_size=spec.batch_size,
        pin_memory=spec.pin_memory,
        generator=torch.Generator().manual_seed(spec.seed),
    )
    if spec.transform is not None:
        kwargs["transform"] = spec.transform
    if spec.priority_key is not None:
        kwargs["priority_key"] = spec.priority_key
    return TorchRLBuffer(TensorDictReplayBuffer(**kwargs), spec)


def _patch_pin_step(recorder: Callable) -> Any:
    utils = importlib.import_module("torchrl.data.replay_buffers.utils")

    def pin_step(output: Any) -> Any:
        # TorchRL's own decision (utils._pin_memory), with the pinning call
        # replaced by the recorder.
        if hasattr(output, "pin_memory") and output.device == torch.device("cpu"):
            pinned, _ = recorder(output, {})
            return pinned
        return output

    @contextlib.contextmanager
    def patch() -> Iterator[Callable]:
        with mock.patch.object(utils, "_pin_memory", pin_step):
            yield recorder

    return patch()


def _place_policy(policy: Any, device: Any, allow_in_place: bool = True) -> Any:
    from torchrl.collectors import BaseCollector

    device = torch.device(device)
    fake_collector = SimpleNamespace(policy_device=device, trust_policy=True)
    placed, _ = BaseCollector._get_policy_and_device(
        fake_collector, policy=policy, policy_device=device
    )
    return placed


def torchrl_adapter() -> Adapter:
    """TorchRL, with what cannot run here marked unavailable (with the error)."""
    try:
        torchrl = importlib.import_module("torchrl")
    except ImportError as err:
        raise ImportError(
            f"torchrl is not installed ({_error_text(err)}), but should be: install the "
            f"'torchrl' dependency group"
        ) from err
    unavailable: dict[str, str] = {}
    why = probe_prioritized()
    if why:
        unavailable["prioritized"] = why
        unavailable["priority_key"] = f"needs a PrioritizedSampler: {why}"
    cuda = cuda_unavailable_reason()
    if cuda:
        unavailable["cuda"] = cuda
    version = f"{torchrl.__version__} (torch {torch.__version__})"
    return Adapter(
        name="torchrl",
        version=version,
        make=_make,
        capabilities=CAPABILITIES,
        unavailable=unavailable,
        place_policy=_place_policy,
        patch_pin_step=_patch_pin_step,
    )


__all__ = ["TorchRLBuffer", "probe_prioritized", "torchrl_adapter"]
