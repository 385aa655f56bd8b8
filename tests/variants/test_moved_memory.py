"""Memory moved in place under the variants' native tables: never read or written stale.

The variants' fast paths keep addresses between calls: a sample's output block
(``sample_fast``), the storage's columns (``sample_fast``, ``extend_fast``,
``native.GatherBlock``), the trees and the writer's generations. torch can move
a tensor's memory without making a new tensor: ``share_memory_()``, a pickle
through torch.multiprocessing (what a ``Queue.put`` does: the storage moves to
shared memory), ``resize_``. After each, the buffer must go on giving the
reference's results, on the fast and the full paths, and the stale table must
be seen as such (the checks below fail if the detection is removed: a fast
path with a stale address would read freed memory, so it is not run).
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reductions with ForkingPickler
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import native, sample_fast
from tests.variants.test_sample_fast_path import assert_same_sample

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load: "
                                "its tables are what is tested")


def pair(sampler: str, capacity: int = 64):
    def make(mod):
        s = mod.PrioritizedSampler(capacity, 0.6, 0.4) if sampler == "prioritized" else mod.RandomSampler()
        kw = {"device": "cpu"} if mod is variants else {}
        return mod.ReplayBuffer(capacity, sampler=s, generator=3, **kw)
    ref, var = make(reference), make(variants)
    rows = TensorDict({"obs": torch.arange(capacity, dtype=torch.float32)[:, None].repeat(1, 3),
                       "priority": torch.rand(capacity, generator=torch.Generator().manual_seed(1)) + 0.1},
                      batch_size=[capacity])
    for buf in (ref, var):
        buf.extend(rows.clone())
    return ref, var


def same_samples(ref, var, n: int = 8, times: int = 3) -> None:
    for step in range(times):
        assert_same_sample(var.sample(n), ref.sample(n), f"sample {step}")


@pytest.mark.parametrize("move", ["pickled for another process", "share_memory_", "resize_"])
@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_a_sample_block_moved_in_place_is_never_reused(sampler, move):
    ref, var = pair(sampler)
    rows, info = var.sample(8)
    ref.sample(8)
    block = var.storage._sample_plan.blocks[(8, sampler == "prioritized")][0]
    pointer = rows["obs"].data_ptr()
    if move == "pickled for another process":
        ForkingPickler.dumps(info["index"])  # what torch.multiprocessing.Queue.put does
    elif move == "share_memory_":
        info["generation"].share_memory_()
    else:
        info["index"].resize_(1 << 16)  # grows the block's storage: reallocated
    assert rows["obs"].data_ptr() != pointer  # the block moved, under every view of it
    del rows, info
    assert block.state() == "moved"
    same_samples(ref, var)
    assert block not in var.storage._sample_plan.blocks[(8, sampler == "prioritized")]


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "full_path"])
def test_trees_moved_in_place_are_read_where_they_are(fast, monkeypatch):
    monkeypatch.setattr(sample_fast, "ENABLED", fast)
    ref, var = pair("prioritized")
    same_samples(ref, var, times=1)  # the tables are built
    for tree in (var.sampler.sum_tree, var.sampler.min_tree):
        tree.raw_nodes.share_memory_()
    if fast:
        trees = var.storage._sample_plan.trees
        assert trees[3] != var.sampler.sum_tree.raw_nodes.data_ptr()  # the kept address is stale
    for buf in (ref, var):
        buf.update_priority(torch.arange(32), torch.full((32,), 5.0))
    same_samples(ref, var)


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "full_path"])
@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_columns_and_generations_moved_in_place_are_written_and_read_where_they_are(sampler, fast,
                                                                                  monkeypatch):
    monkeypatch.setattr(sample_fast, "ENABLED", fast)
    ref, var = pair(sampler)
    more = TensorDict({"obs": torch.full((8, 3), 100.0), "priority": torch.full((8,), 2.0)}, batch_size=[8])
    var.extend(more.clone())  # the extend plan is built
    ref.extend(more.clone())
    same_samples(ref, var, times=1)  # the sample plan and the gather table are built
    var.storage.data.share_memory_()
    var.writer.generation.share_memory_()
    storage = var.storage
    assert storage._extend_plan.moved()
    assert (storage._sample_plan.moved() if fast else storage._gather_block.moved())
    for buf in (ref, var):
        buf.extend(more.apply(lambda t: t + 1).clone())  # into the moved rows, through the fast extend
    assert torch.equal(var.storage.data["obs"], ref.storage.data["obs"])
    assert torch.equal(var.writer.generation, ref.writer.generation)
    same_samples(ref, var)


def test_moved_sees_any_watched_memory_move():
    """``watch`` keeps one tensor per distinct memory (fields of one array of rows share it)
    and leaves out tensors of no bytes; ``moved`` is True once any of them moved."""
    rows = torch.zeros(6, 4)
    a, b, c, empty = rows[:, :2], rows[:, 2:], torch.zeros(3), torch.zeros(0)
    watched = native.watch([a, b, c, empty])
    assert [t for t, _ in watched] == [a, c]
    assert not native.moved(watched)
    c.share_memory_()
    assert native.moved(watched)
    watched = native.watch([a, b, c])
    b.share_memory_()  # moves the memory a and b share
    assert native.moved(watched)
