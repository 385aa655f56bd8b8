"""TorchRL 0.14.1's storages, writers, in-place edits and checkpointers (issue 41) as
BufferUnderTest columns, over :class:`rbcheck.harness.adapters.torchrl.TorchRLBuffer`.

Mapping (read from TorchRL 0.14.1's source, ``torchrl/data/replay_buffers/``):

* ``storage="memmap"``: ``LazyMemmapStorage(capacity, scratch_dir=spec.scratch_dir)``
  (``storages/tensor.py:1277``; files made by ``memmap_like(prefix=scratch_dir,
  existsok=False)`` at the first write, L1428). TorchRL has no close/reopen of its own; a
  storage saved *at its scratch directory* is loaded by mapping those files again
  (``checkpointers.py:450``, ``TensorDict.load_memmap(path)``), so ``close()`` is
  ``storage.dumps(scratch_dir)`` + ``writer.dumps(scratch_dir)`` (``metadata.json``) and
  ``spec.reopen`` is a new buffer on the same directory with ``storage.loads`` /
  ``writer.loads`` of it.
* ``storage="compressed"``: ``CompressedListStorage(capacity)`` (``storages/list.py``; zstd or
  zlib per tensor, its default checkpointer ``CompressedListStorageCheckpointer``).
* ``writer="max_value"``: ``TensorDictMaxValueWriter(rank_key=spec.value_key)``
  (``writers/max_value.py:162``); ``writer="immutable"``: ``ImmutableDatasetWriter()``
  (``writers/base.py:156``), filled by ``loads``.
* edits: ``set(index, rows)`` is ``rb[index] = rows`` (``ReplayBuffer.__setitem__``,
  ``replay_buffers/base.py:1632``).
* checkpointers: ``storage.checkpointer = FlatStorageCheckpointer()`` (or
  ``NestedStorageCheckpointer``, ``H5StorageCheckpointer``; ``checkpointers.py:486-630``) on a
  ``LazyTensorStorage``; ``save``/``load`` are ``rb.dumps``/``rb.loads``. One column per
  checkpointer, so every save_load property runs on each.
* ``contents()`` copies leaf by leaf: ``TensorDict.clone()`` of a TensorDict with a device
  turns -0.0 into 0.0 (tensordict 0.14.3 ``base.py:13187``, ``torch._foreach_add(vals, 0)``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from rbcheck.harness.adapters.torchrl import CONVENTIONS, TorchRLBuffer, torchrl_adapter
from rbcheck.harness.protocol import Adapter, BufferSpec

KNOWN_FAILURES_DIR = Path(__file__).resolve().parent.parent / "known_failures"
CHECKPOINTERS = {"flat": "FlatStorageCheckpointer", "nested": "NestedStorageCheckpointer",
                 "h5": "H5StorageCheckpointer"}


class TorchRLStorageBuffer(TorchRLBuffer):
    """TorchRLBuffer with edits, close/reopen of a memmap storage and an exact contents()."""

    def contents(self) -> TensorDictBase:
        index = torch.arange(len(self.rb.storage), dtype=torch.long)
        return self._visible(self.rb.storage.get(index)).apply(torch.clone)

    @property
    def cursor(self) -> int:
        if self.spec.writer == "immutable":  # ImmutableDatasetWriter keeps no cursor (writers/base.py:156-180)
            return 0
        return super().cursor

    @property
    def write_count(self) -> int:
        if self.spec.writer == "immutable":  # rb.write_count raises AttributeError there (base.py:1023, R41f);
            return int(self.rb.stats()["write_count"])  # stats() documents 0 for it (base.py:1044-1046)
        return super().write_count

    def set(self, index, rows: TensorDictBase) -> None:
        self.rb[torch.as_tensor(index, dtype=torch.long)] = rows

    def close(self) -> None:
        if self.spec.storage != "memmap":
            raise NotImplementedError("close() is for storage='memmap' (capability 'memmap')")
        self.rb.storage.dumps(self.spec.scratch_dir)
        self.rb.writer.dumps(self.spec.scratch_dir)


def _storage(spec: BufferSpec, checkpointer: str | None) -> Any:
    data = importlib.import_module("torchrl.data")
    if spec.storage == "memmap":
        return data.LazyMemmapStorage(spec.capacity, scratch_dir=spec.scratch_dir, device=spec.device)
    if spec.storage == "compressed":
        return data.CompressedListStorage(spec.capacity, device=spec.device)
    if spec.storage != "memory":
        raise ValueError(f"spec.storage={spec.storage!r}, but should be 'memory', 'memmap' or 'compressed'")
    storage = data.LazyTensorStorage(spec.capacity, device=spec.device)
    if checkpointer is not None:
        storage.checkpointer = getattr(data, CHECKPOINTERS[checkpointer])()
    return storage


def _writer(spec: BufferSpec) -> Any:
    data = importlib.import_module("torchrl.data")
    if spec.writer == "max_value":
        return data.TensorDictMaxValueWriter(rank_key=spec.value_key)
    if spec.writer == "immutable":
        return data.ImmutableDatasetWriter()
    if spec.writer == "round_robin":
        return None
    raise ValueError(f"spec.writer={spec.writer!r}, but should be 'round_robin', 'max_value' or 'immutable'")


def make(spec: BufferSpec, checkpointer: str | None = None) -> TorchRLStorageBuffer:
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

    if spec.sampler == "random":
        sampler = RandomSampler()
    elif spec.sampler == "prioritized":
        sampler = PrioritizedSampler(spec.capacity, alpha=spec.alpha, beta=spec.beta, eps=spec.eps)
    else:
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized'")
    kwargs: dict[str, Any] = dict(storage=_storage(spec, checkpointer), sampler=sampler, batch_size=spec.batch_size,
                                  generator=torch.Generator().manual_seed(spec.seed))
    writer = _writer(spec)
    if writer is not None:
        kwargs["writer"] = writer
    buf = TorchRLStorageBuffer(TensorDictReplayBuffer(**kwargs), spec)
    if spec.reopen:
        if spec.storage != "memmap":
            raise ValueError(f"spec.reopen=True with storage={spec.storage!r}, but should be storage='memmap'")
        buf.rb.storage.loads(Path(spec.scratch_dir))
        buf.rb.writer.loads(spec.scratch_dir)
    return buf


def _adapter(name: str, capabilities: set[str], checkpointer: str | None = None) -> Adapter:
    base = torchrl_adapter()  # the import check, the version, what cannot run here
    known = KNOWN_FAILURES_DIR / f"{name}.txt"
    return Adapter(name=name, version=base.version, make=lambda spec: make(spec, checkpointer),
                   capabilities=frozenset(capabilities),
                   unavailable={k: v for k, v in base.unavailable.items() if k in capabilities},
                   known_failures=known if known.exists() else None, conventions=CONVENTIONS)


def torchrl_memmap_adapter() -> Adapter:
    """``LazyMemmapStorage(scratch_dir=...)``: rows in files, edits, close/reopen."""
    return _adapter("torchrl-memmap", {"random", "memmap", "edit"})


def torchrl_compressed_adapter() -> Adapter:
    """``CompressedListStorage`` and its checkpointer (``CompressedListStorageCheckpointer``)."""
    return _adapter("torchrl-compressed", {"random", "compressed", "save_load"})


def torchrl_writers_adapter() -> Adapter:
    """``TensorDictMaxValueWriter``, ``ImmutableDatasetWriter`` and edits on ``LazyTensorStorage``."""
    return _adapter("torchrl-writers", {"random", "prioritized", "priority_readback", "max_value_writer",
                                        "immutable_writer", "edit", "save_load"})


def torchrl_flat_checkpointer_adapter() -> Adapter:
    return _adapter("torchrl-ckpt-flat", {"random", "save_load"}, "flat")


def torchrl_nested_checkpointer_adapter() -> Adapter:
    return _adapter("torchrl-ckpt-nested", {"random", "save_load"}, "nested")


def torchrl_h5_checkpointer_adapter() -> Adapter:
    return _adapter("torchrl-ckpt-h5", {"random", "save_load"}, "h5")


__all__ = ["TorchRLStorageBuffer", "make", "torchrl_compressed_adapter", "torchrl_flat_checkpointer_adapter",
           "torchrl_h5_checkpointer_adapter", "torchrl_memmap_adapter", "torchrl_nested_checkpointer_adapter",
           "torchrl_writers_adapter"]
