"""Compressed storages and checkpointers (issue 41): rows that come back from
compression or from a checkpoint not quite as they went in (a lossy cast, a
flattened shape, a dtype lost), and checkpoints that are not values (changed
by writes to the buffer loaded from them, or not rewritten by a save over
them). Each mutant is the reference with one planted bug.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.compressed_storage import CompressedStorage
from rbcheck.reference.storage import TensorStorage
from tests.mutants.base import adapter
from tests.mutants.registry import mutant

COMPRESSED = "test_compressed_storage::test_compressed_storage_round_trips_every_dtype_and_shape"
CHECKPOINT = "test_checkpointers::test_a_checkpoint_round_trips_every_dtype_and_stays_as_saved"


# -- compressed storage ---------------------------------------------------------------------------


class LossyCompressedStorage(CompressedStorage):
    """Compresses float64 leaves as float32 (half the bytes), read back as float64."""

    def set(self, index, data) -> None:
        data = data.apply(lambda t: t.to(torch.float32).to(torch.float64) if t.dtype is torch.float64 else t)
        super().set(index, data)


@mutant(bug="a compressed storage casts float64 rows through float32", catches=(COMPRESSED,))
def compressed_storage_lossy_cast():
    return adapter("compressed-storage-lossy-cast", CompressedStorage=LossyCompressedStorage)


class FlatteningCompressedStorage(CompressedStorage):
    """Gives a leaf of rank 2 or more back flattened (the bytes are right, the shape is lost)."""

    def _rows(self, slots):
        out = super()._rows(slots)
        for key, (shape, _) in self.layout.items():
            if len(shape) >= 2:
                out.set(key, out.get(key).reshape(len(slots), -1))
        return out


@mutant(bug="a compressed storage gives rows of rank 2 or more back flattened", catches=(COMPRESSED,))
def compressed_storage_flattens_shapes():
    return adapter("compressed-storage-flattens-shapes", CompressedStorage=FlatteningCompressedStorage)


class BoolAsByteCompressedStorage(CompressedStorage):
    """Gives bool leaves back as uint8 (their bytes, not their dtype)."""

    def _rows(self, slots):
        out = super()._rows(slots)
        for key, (_, dtype) in self.layout.items():
            if dtype is torch.bool:
                out.set(key, out.get(key).to(torch.uint8))
        return out


@mutant(bug="a compressed storage gives bool rows back as uint8", catches=(COMPRESSED,))
def compressed_storage_bool_as_uint8():
    return adapter("compressed-storage-bool-as-uint8", CompressedStorage=BoolAsByteCompressedStorage)


# -- checkpointers ------------------------------------------------------------------------------------


class LossyCheckpointStorage(TensorStorage):
    """Checkpoints float64 columns as float32 (a smaller file), loaded back as float64.
    Rows of small numbers (quarters, as harness.strategies.Layout writes) survive it."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["columns"] = [v.to(torch.float32).to(torch.float64) if v.dtype is torch.float64 else v
                            for v in state["columns"]]
        return state


@mutant(bug="a checkpoint casts float64 columns through float32", catches=(CHECKPOINT,))
def checkpoint_lossy_cast():
    return adapter("checkpoint-lossy-cast", TensorStorage=LossyCheckpointStorage)


class MappedCheckpointBuffer(ReplayBuffer):
    """A buffer loaded from a checkpoint keeps writing into it (as a storage whose rows
    stay memory-mapped onto the checkpoint's files): each write re-saves there."""

    def loads(self, path) -> None:
        super().loads(path)
        self.mapped_onto = Path(path)

    def extend(self, data):
        index = super().extend(data)
        if getattr(self, "mapped_onto", None) is not None:
            self.dumps(self.mapped_onto)
        return index


@mutant(bug="writes to a buffer loaded from a checkpoint change the checkpoint", catches=(CHECKPOINT,))
def checkpoint_changed_by_writes_after_a_load():
    return adapter("checkpoint-changed-by-writes-after-a-load", MappedCheckpointBuffer)


class StaleSaveBuffer(ReplayBuffer):
    """A save to the path the buffer was loaded from is skipped ("already there"), so the
    checkpoint keeps the state as loaded, not the state now."""

    def loads(self, path) -> None:
        super().loads(path)
        self.loaded_from = Path(path)

    def dumps(self, path) -> None:
        if Path(path) == getattr(self, "loaded_from", None):
            return
        super().dumps(path)


@mutant(bug="a save over the checkpoint a buffer was loaded from keeps the loaded state", catches=(CHECKPOINT,))
def checkpoint_save_over_the_loaded_one_skipped():
    return adapter("checkpoint-save-over-the-loaded-one-skipped", StaleSaveBuffer)
