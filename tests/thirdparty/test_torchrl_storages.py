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


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    f"{VERSION}: LazyMemmapStorage's docstring says existsok 'Defaults to True' (storages/tensor.py:1195-1197), "
    "but its signature defaults to False (tensor.py:1284), so with the defaults a scratch directory an earlier "
    "storage wrote to refuses the first write (memmap_like(existsok=False), tensor.py:1428)"))
def test_default_memmap_storage_takes_a_reused_scratch_dir_as_documented(tmp_path):
    rows = TensorDict({"obs": torch.arange(6.0).reshape(3, 2)}, batch_size=[3])
    TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch")).extend(rows)
    new = TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch"))
    new.extend(rows[:1].clone())
    assert len(new) == 1


@pytest.mark.xfail(strict=True, raises=AttributeError, reason=(
    f"{VERSION}: ReplayBuffer.write_count reads self._writer._write_count (replay_buffers/base.py:1023), which "
    "ImmutableDatasetWriter never sets (writers/base.py:156-180): the public property raises AttributeError, "
    "while stats() documents write_count 0 for that writer (base.py:1044-1046)"))
def test_write_count_of_an_immutable_dataset_is_readable():
    from torchrl.data import ImmutableDatasetWriter

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2), writer=ImmutableDatasetWriter())
    assert rb.write_count == rb.stats()["write_count"] == 0


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: TensorDictRoundRobinWriter.extend writes a batch larger than the free room with "
    "index = arange(cursor, cursor + n) % capacity (writers/round_robin.py:510-515) in one "
    "storage.set(index, data) (:527): a batch of more than capacity rows hands the storage duplicate slots, and "
    "torch's index_put_ leaves which row lands undefined (a multi-threaded CPU write keeps an older row "
    "now and then: test_ring_eviction's capacity-40000 case)"))
def test_an_extend_larger_than_the_capacity_writes_each_slot_once():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    handed = []
    set_ = rb.storage.set
    rb.storage.set = lambda index, data, **kw: (handed.append(torch.as_tensor(index).clone()), set_(index, data, **kw))
    rb.extend(TensorDict({"id": torch.arange(3)}, batch_size=[3]))
    rb.extend(TensorDict({"id": torch.arange(3, 8)}, batch_size=[5]))  # 5 rows into a ring of 4
    index = handed[-1]
    assert index.unique().numel() == index.numel(), f"slots handed to storage.set={index.tolist()}, but should be distinct"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: ReplayBuffer.loads replaces the storage, sampler and writer (replay_buffers/base.py:2026-2028) "
    "before it reads buffer_metadata.json (:2037-2038): a damaged metadata file raises after the rows were "
    "replaced, so a refused load leaves the checkpoint's rows in the buffer"))
def test_a_refused_load_leaves_the_buffer_as_it_was(tmp_path):
    source = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    source.extend(TensorDict({"obs": torch.tensor([100.0, 101.0])}, batch_size=[2]))
    source.dumps(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "buffer_metadata.json").write_text("{")  # damaged
    target = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    target.extend(TensorDict({"obs": torch.tensor([0.0, 1.0, 2.0])}, batch_size=[3]))
    with pytest.raises(ValueError):  # json.JSONDecodeError
        target.loads(tmp_path / "ckpt")
    got = target.storage.get(torch.arange(len(target)))["obs"].tolist()
    assert got == [0.0, 1.0, 2.0], f"rows after a refused load={got}, but should be [0.0, 1.0, 2.0]"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: LazyMemmapStorage never checks its files: a file truncated under it (tensordict's "
    "MemoryMappedTensor keeps the old mapping) takes the next write past its end without an error -- the row "
    "never reaches the file, and past the last page of the file the process dies of SIGBUS"))
def test_a_memmap_file_truncated_under_the_storage_is_an_error(tmp_path):
    import os

    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch"))
    rb.extend(TensorDict({"obs": torch.zeros(1, 3)}, batch_size=[1]))
    victim = tmp_path / "scratch" / "obs.memmap"
    os.truncate(victim, 4)  # the mapping's page stays backed: no SIGBUS here
    try:
        rb.extend(TensorDict({"obs": torch.ones(2, 3)}, batch_size=[2]))
    except Exception:  # noqa: BLE001 - any clear error is the spec's
        return
    raise AssertionError(f"rb.extend after {victim.name} was truncated to 4 bytes returned, but should raise")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: ReplayBuffer.dumps writes prefetch.pkl with pickle (replay_buffers/base.py:1888-1890) and loads "
    "unpickles it: a checkpoint runs code from its files, whichever storage checkpointer is set"))
def test_a_checkpoint_holds_no_pickle(tmp_path):
    from torchrl.data import FlatStorageCheckpointer

    storage = LazyTensorStorage(4)
    storage.checkpointer = FlatStorageCheckpointer()
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(TensorDict({"obs": torch.arange(2.0)}, batch_size=[2]))
    rb.dumps(tmp_path / "ckpt")
    pickles = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80")
    assert not pickles, f"pickle files in the checkpoint={pickles}, but should be none"
