"""The CUDA-graph cache of the triton update (``variants/update_graph.py``), on the CPU.

A CPU has no CUDA graphs, so here ``capture`` is replaced by a stand-in whose
"graph" runs the captured function again on the same input tensors, as a replay
reruns its kernels on the same memory; ``applies`` is forced on. What these tests
check is the cache around it: a size runs eagerly first, is captured the second time
and replayed after with the caller's new inputs copied in; the least recently used
graph is dropped past ``LIMIT``, graphs stop after ``EVICTIONS`` drops, a failed
capture turns them off, and moved tree storage never reaches an old graph. Every
update is compared with the reference's, bit for bit. The real capture runs in
``tests/variants/test_cuda.py`` on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from rbcheck import reference, variants
from rbcheck.variants import update_graph


class FakeGraph:
    def __init__(self, fn):
        self.fn, self.replays = fn, 0

    def replay(self):
        self.replays += 1
        self.fn()


@pytest.fixture
def captures(monkeypatch):
    made = []

    def capture(fn, device):
        for _ in range(3):  # the warm-up runs, as the real capture does
            fn()
        made.append(FakeGraph(fn))
        return made[-1]

    monkeypatch.setattr(update_graph, "capture", capture)
    monkeypatch.setattr(update_graph, "applies",
                        lambda sampler, index, raw: not getattr(sampler.sum_tree, "_graphs_off", False))
    return made


def pair(capacity=200):
    return (reference.PrioritizedSampler(capacity, 0.6, 0.4, 1e-6),
            variants.PrioritizedSampler(capacity, 0.6, 0.4, 1e-6))


def update(ref, var, g, k):
    index = torch.randint(0, ref.capacity, (k,), generator=g)
    prio = torch.rand(k, generator=g, dtype=torch.float64) * 4
    ref.update_priority(index, prio)
    assert var._update_one_sync(index, prio, off_cpu_only=False)
    assert torch.equal(var.sum_tree.nodes, ref.sum_tree.nodes)
    assert torch.equal(var.min_tree.nodes, ref.min_tree.nodes)
    assert var.max_priority == ref.max_priority


def sizes(var):
    return sorted(key[0] for key in var.sum_tree.__dict__.get("_update_graphs", {}))


def test_a_size_runs_eagerly_then_is_captured_then_replayed_with_new_inputs(captures):
    ref, var = pair()
    g = torch.Generator().manual_seed(0)
    update(ref, var, g, 30)
    assert sizes(var) == [] and not captures  # a first sighting: eager
    update(ref, var, g, 30)
    assert sizes(var) == [30] and len(captures) == 1
    for _ in range(4):
        update(ref, var, g, 30)  # new indices and priorities each time: copied in, replayed
    assert captures[0].replays == 4


def test_the_least_recently_used_graph_goes_past_the_limit_and_graphs_stop_after_many(captures,
                                                                                      monkeypatch):
    monkeypatch.setattr(update_graph, "LIMIT", 2)
    monkeypatch.setattr(update_graph, "EVICTIONS", 3)
    ref, var = pair()
    g = torch.Generator().manual_seed(1)
    for k in (10, 10, 20, 20, 10):
        update(ref, var, g, k)
    update(ref, var, g, 30)
    update(ref, var, g, 30)
    assert sizes(var) == [10, 30]  # 20 was the least recently used
    for k in (40, 40, 50, 50, 60, 60):  # three more drops: more than EVICTIONS in all
        update(ref, var, g, k)
    assert var.sum_tree._graphs_off and sizes(var) == []
    made = len(captures)
    for k in (70, 70, 70):
        update(ref, var, g, k)  # eager from now on, still the reference's trees
    assert len(captures) == made


def test_moved_tree_storage_gets_a_new_graph_never_the_old_memory(captures):
    ref, var = pair()
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        update(ref, var, g, 25)
    var.sum_tree.nodes = var.sum_tree.nodes.clone()  # the old graph holds the old memory
    for _ in range(3):
        update(ref, var, g, 25)  # compared with the reference: the new storage is updated
    keys = [key for key in var.sum_tree._update_graphs if key[0] == 25]
    assert keys[-1][1] == var.sum_tree.raw_nodes.data_ptr() and len(captures) == 2


def test_a_failed_capture_turns_graphs_off_and_the_update_still_lands(monkeypatch):
    def broken(fn, device):
        fn()  # one warm-up ran, then the capture failed
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(update_graph, "capture", broken)
    monkeypatch.setattr(update_graph, "applies",
                        lambda sampler, index, raw: not getattr(sampler.sum_tree, "_graphs_off", False))
    ref, var = pair()
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        update(ref, var, g, 15)
    assert var.sum_tree._graphs_off and sizes(var) == []


def test_graphs_apply_only_to_the_triton_backend_on_cuda():
    """On the CPU (any backend) ``applies`` is False: the eager path runs, nothing is kept."""
    _, var = pair()
    index, raw = torch.arange(4), torch.ones(4, dtype=torch.float64)
    assert not update_graph.applies(var, index, raw)
    assert not update_graph.graphed_store(var, index, raw)
    assert "_update_graphs" not in var.sum_tree.__dict__
