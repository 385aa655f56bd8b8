"""torchrl 0.14.1's storages and writers of issue 41 (docs/findings.md, "TorchRL storages,
writers and checkpointers"): strict xfails stating the spec's behaviour, and an executed
check of what a reused scratch directory does now (pytorch/rl #2437). Skipped where torchrl
is not installed (``nox -s thirdparty`` installs it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    CompressedListStorage,
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

VERSION = "torchrl 0.14.1"


@pytest.mark.xfail(strict=True, raises=TypeError, reason=(
    f"{VERSION}: CompressedListStorage's default compression reads a tensor's bytes through NumPy "
    "(CompressedListStorage.to_bytestream, data/replay_buffers/storages/list.py:578, "
    "data_to_bytestream.cpu().numpy()), and NumPy has no bfloat16: a bfloat16 row is refused"))
def test_compressed_storage_takes_a_bfloat16_row():
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    rows = TensorDict({"obs": torch.tensor([[1.5, -0.0]], dtype=torch.bfloat16)}, batch_size=[1])
    rb.extend(rows)
    assert torch.equal(rb.storage.get(torch.tensor([0]))["obs"].view(torch.int16), rows["obs"].view(torch.int16))


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: TensorDictMaxValueWriter counts only the rows it keeps (writers/max_value.py:246 and "
    ":266, _write_count += 1 inside `if storage_idx is not None`), while ReplayBuffer.stats() documents "
    "write_count as 'total number of items written through add and extend' "
    "(replay_buffers/base.py:1044-1045)"))
def test_max_value_writer_counts_every_row_written():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1), writer=TensorDictMaxValueWriter(rank_key="value"))
    rb.extend(TensorDict({"value": torch.tensor([0.0, 0.0]), "obs": torch.zeros(2, 3)}, batch_size=[2]))
    assert rb.write_count == 2


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: the write a reused scratch directory refuses still counts: RoundRobinWriter.extend moves "
    "the cursor and the length before the storage allocates its files (LazyMemmapStorage._init_standard, "
    "storages/tensor.py:1428, memmap_like(existsok=False) raises), so len == 1 over a storage holding nothing"))
def test_reused_scratch_dir_is_refused_not_read(tmp_path):
    """pytorch/rl #2437 (a reused scratch directory leaked the previous run's rows) is not in
    0.14.1: a new LazyMemmapStorage on a directory an earlier one wrote starts empty and refuses its
    first write (RuntimeError 'already exists' from tensordict's memmap.py; existsok=True is the
    documented way to reuse it) -- but the refused write is counted."""
    rows = TensorDict({"obs": torch.arange(6.0).reshape(3, 2)}, batch_size=[3])
    old = TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch"))
    old.extend(rows)
    new = TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch"))
    assert len(new) == 0  # no leak of the earlier run's rows (#2437)
    with pytest.raises(RuntimeError, match="already exists"):
        new.extend(rows[:1].clone())
    assert len(new) == 0, f"len(new)={len(new)} after a refused write, but should be 0"
