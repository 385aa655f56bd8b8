"""The variants on a CUDA device against the reference on the CPU.

Skipped (with the reason) on machines without CUDA. On CUDA, torch's float64
``pow`` may round differently from the CPU's in the last bit, so:
* with ``alpha=1`` and ``eps=0`` (no pow) the trees must be bit-identical;
* otherwise stored priorities agree to 4 ulp (rtol 1e-15) and, with the
  reference's trees loaded, indices agree exactly for the same seed.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.reference.checkpoint_format import CheckpointError

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="torch.cuda.is_available() is False (no CUDA device on this machine)"),
]

BACKENDS = ["torch", "triton"]


def make(backend, capacity, alpha, eps, seed=0):
    ref = reference.ReplayBuffer(capacity, sampler=reference.PrioritizedSampler(capacity, alpha, 0.4, eps),
                                 generator=seed)
    var = variants.ReplayBuffer(capacity, generator=seed, device="cuda",
                                sampler=variants.PrioritizedSampler(capacity, alpha, 0.4, eps, backend=backend))
    return ref, var


def batch(n, start, priority):
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1).repeat(1, 4),
                       "priority": priority}, batch_size=[n])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_trees_bit_identical_without_pow(backend):
    """exact: alpha=1, eps=0 leaves no pow to round, so the CUDA trees
    (sums, minima, duplicates, stale entries) equal the reference's bits."""
    ref, var = make(backend, 1000, 1.0, 0.0)
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        prio = torch.rand(300, generator=g) * 10
        ref.extend(batch(300, 300 * step, prio))
        var.extend(batch(300, 300 * step, prio).to("cuda"))
        _, info = ref.sample(512)
        var.sample(512)  # keep the two generators in step
        index = torch.randint(0, len(ref), (700,), generator=g)
        new = torch.rand(700, generator=g, dtype=torch.float64) * 5
        ref.update_priority(index, new)
        var.update_priority(index.cuda(), new.cuda())
        ref.update_priority(info["index"], new[:512], generation=info["generation"])
        var.update_priority(info["index"].cuda(), new[:512].cuda(), generation=info["generation"].cuda())
        assert torch.equal(var.sampler.sum_tree.nodes.cpu(), ref.sampler.sum_tree.nodes)
        assert torch.equal(var.sampler.min_tree.nodes.cpu(), ref.sampler.min_tree.nodes)
        (_, want), (_, got) = ref.sample(4096), var.sample(4096)
        assert got["index"].is_cuda and torch.equal(got["index"].cpu(), want["index"])
        assert torch.allclose(got["weight"].cpu(), want["weight"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_agrees_with_reference(tmp_path, backend):
    """tolerance: stored priorities within rtol 1e-15 (pow rounding);
    exact given shared randomness once the reference's trees are loaded."""
    ref, var = make(backend, 5000, 0.6, 1e-8, seed=4)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        prio = torch.rand(2048, generator=g) * 3
        ref.extend(batch(2048, 2048 * step, prio))
        var.extend(batch(2048, 2048 * step, prio).to("cuda"))
    slots = torch.arange(len(ref))
    assert torch.allclose(var.sampler.sum_tree.leaf(slots).cpu(), ref.sampler.sum_tree.leaf(slots),
                          rtol=1e-15, atol=0)
    ref.dumps(tmp_path / "ckpt")
    var.loads(tmp_path / "ckpt")
    for _ in range(3):
        (rows_ref, want), (rows_var, got) = ref.sample(4096), var.sample(4096)
        assert torch.equal(got["index"].cpu(), want["index"])
        assert torch.equal(rows_var["obs"].cpu(), rows_ref["obs"])
        assert torch.allclose(got["weight"].cpu(), want["weight"], rtol=1e-6, atol=0)


def test_cuda_slice_and_random_samplers_match_reference():
    """exact given the same seed: slice and uniform samples on CUDA."""
    for name in ("slice", "random"):
        def sampler(mod, name=name):
            return mod.SliceSampler(slice_len=4) if name == "slice" else mod.RandomSampler()
        ref = reference.ReplayBuffer(100, sampler=sampler(reference), generator=2)
        var = variants.ReplayBuffer(100, sampler=sampler(variants), generator=2, device="cuda")
        for step in range(5):
            td = TensorDict({"episode": torch.arange(37) // 6 + 10 * step, "x": torch.rand(37)}, batch_size=[37])
            ref.extend(td)
            var.extend(td.to("cuda"))
            (_, want), (_, got) = ref.sample(16), var.sample(16)
            assert torch.equal(got["index"].cpu(), want["index"])


def cuda_generator(seed):
    return torch.Generator("cuda").manual_seed(seed)


@pytest.mark.parametrize("kind", ["torch", "triton", "random", "slice"])
def test_a_generator_on_the_gpu_gives_the_references_draws_without_a_host_draw(kind, monkeypatch):
    """exact given the same CUDA generator state: the reference draws on the generator's
    device (``draw_uniforms``); the uniform and prioritized variants draw into a workspace
    on the GPU and never call the host path (replaced here by one that fails); the slice
    variant reads its draws on the CPU, as the reference does. The buffer's device is
    the tensors' (``cuda`` read as ``cuda:0``)."""
    from rbcheck.variants import random_sampler as variant_random

    def sampler(mod):
        if kind == "slice":
            return mod.SliceSampler(slice_len=4)
        if kind == "random":
            return mod.RandomSampler()
        extra = {} if mod is reference else {"backend": kind}
        return mod.PrioritizedSampler(1000, 1.0, 0.4, 0.0, **extra)  # no pow: bit-identical trees

    ref = reference.ReplayBuffer(1000, sampler=sampler(reference), generator=cuda_generator(5))
    var = variants.ReplayBuffer(1000, sampler=sampler(variants), generator=cuda_generator(5), device="cuda")
    monkeypatch.setattr(variant_random, "draw_uniforms", lambda *args: pytest.fail("a host draw"))
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        td = TensorDict({"episode": torch.arange(300) // 7 + 100 * step, "x": torch.rand(300, generator=g),
                         "priority": torch.rand(300, generator=g) * 3}, batch_size=[300])
        ref.extend(td)
        var.extend(td.to("cuda"))
        (_, want), (_, got) = ref.sample(256), var.sample(256)
        assert got["index"].is_cuda and torch.equal(got["index"].cpu(), want["index"])
        if "weight" in want:
            assert torch.allclose(got["weight"].cpu(), want["weight"], rtol=1e-6, atol=0)
    assert torch.equal(var.generator.get_state(), ref.generator.get_state())  # the same draws consumed
    assert var.device == got["index"].device and var.storage.device == var.writer.generation.device


def test_a_checkpoint_keeps_a_gpu_generator_and_refuses_a_cpu_ones(tmp_path):
    """the state round-trips the CUDA generator (the next samples are the saved buffer's);
    a checkpoint saved with a CPU generator is refused by a buffer whose generator is on
    the GPU (CheckpointError naming the generator), which then samples as an untouched twin."""
    def make(generator):
        sampler = variants.PrioritizedSampler(500, 0.6, 0.4)
        return variants.ReplayBuffer(500, sampler=sampler, generator=generator, device="cuda")

    saved, loaded, twin = make(cuda_generator(3)), make(cuda_generator(99)), make(cuda_generator(99))
    td = TensorDict({"x": torch.arange(400.0)}, batch_size=[400]).to("cuda")
    for buffer in (saved, loaded, twin):
        buffer.extend(td)
    saved.sample(64)
    saved.dumps(tmp_path / "gpu")
    loaded.loads(tmp_path / "gpu")
    assert torch.equal(loaded.sample(128)[1]["index"], saved.sample(128)[1]["index"])
    on_cpu = variants.ReplayBuffer(500, sampler=variants.PrioritizedSampler(500, 0.6, 0.4), generator=3,
                                   device="cuda")
    on_cpu.extend(td)
    on_cpu.dumps(tmp_path / "cpu")
    refused = make(cuda_generator(99))
    refused.extend(td)
    with pytest.raises(CheckpointError, match="generator state=5056 bytes .*, but should be the state of a cuda"):
        refused.loads(tmp_path / "cpu")
    assert torch.equal(refused.sample(128)[1]["index"], twin.sample(128)[1]["index"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_priority_on_cuda_reads_its_checks_in_one_sync(backend, monkeypatch):
    """exact: on a full ring, ``update_priority`` on CUDA takes the one-synchronisation
    path (the full path's ``check_priority`` is replaced by one that fails) and leaves the
    reference's trees. It once never ran: the sampler's device ``cuda`` is not equal, as
    torch compares, to the tensors' ``cuda:0``."""
    from rbcheck.variants import prioritized

    ref, var = make(backend, 512, 1.0, 0.0)
    g = torch.Generator().manual_seed(2)
    prio = torch.rand(600, generator=g) * 3
    ref.extend(batch(600, 0, prio))
    var.extend(batch(600, 0, prio).to("cuda"))
    index = torch.randint(0, 512, (700,), generator=g)
    new = torch.rand(700, generator=g, dtype=torch.float64) * 5
    monkeypatch.setattr(prioritized, "check_priority", lambda *args: pytest.fail("the full path ran"))
    var.update_priority(index.cuda(), new.cuda())
    ref.update_priority(index, new)
    assert torch.equal(var.sampler.sum_tree.nodes.cpu(), ref.sampler.sum_tree.nodes)
    assert torch.equal(var.sampler.min_tree.nodes.cpu(), ref.sampler.min_tree.nodes)


def test_triton_update_on_cuda_replays_a_graph_and_keeps_the_reference_trees(tmp_path, monkeypatch):
    """exact (alpha=1, eps=0: no pow): the triton sampler's checked ``update_priority`` on
    CUDA runs a batch size eagerly the first time, captures a CUDA graph the second
    (``update_graph``) and replays it after, with new indices and priorities every call,
    and leaves the reference's trees and max priority each time: sizes captured and
    replayed, one evicted past ``LIMIT``, tree storage moved (a new graph, never the old
    memory), the trees replaced by a load (their graphs go with them), an update with
    generations (eager, no graph), and the switch off (nothing captured)."""
    from rbcheck.variants import update_graph

    ref, var = make("triton", 1000, 1.0, 0.0)
    g = torch.Generator().manual_seed(5)
    prio = torch.rand(1000, generator=g) * 3
    ref.extend(batch(1000, 0, prio))
    var.extend(batch(1000, 0, prio).to("cuda"))

    def same():
        assert torch.equal(var.sampler.sum_tree.nodes.cpu(), ref.sampler.sum_tree.nodes)
        assert torch.equal(var.sampler.min_tree.nodes.cpu(), ref.sampler.min_tree.nodes)
        assert var.sampler.max_priority == ref.sampler.max_priority

    def update(k, scale=5.0):
        index = torch.randint(0, 1000, (k,), generator=g)
        new = torch.rand(k, generator=g, dtype=torch.float64) * scale
        ref.update_priority(index, new)
        var.update_priority(index.cuda(), new.cuda())
        same()

    def sizes():
        return sorted(key[0] for key in var.sampler.sum_tree.__dict__.get("_update_graphs", {}))

    update(64)
    assert sizes() == []  # a first sighting runs eagerly
    for _ in range(3):  # the second captures, the next ones replay
        update(64)
        update(700, scale=9.0)
    assert sizes() == [64, 700]
    monkeypatch.setattr(update_graph, "LIMIT", 2)
    update(33)
    update(33)
    assert sizes() == [33, 700]  # 64 was the least recently used
    update(64, scale=0.5)  # a max priority that does not rise
    tree = var.sampler.sum_tree
    tree.nodes = tree.nodes.clone()  # the storage moved: 700's graph must not write the old one
    update(700)
    update(700)
    assert sizes() == [33, 700]  # the graph of the old storage evicted, one of the new made
    assert [key[1] for key in tree._update_graphs if key[0] == 700] == [tree.raw_nodes.data_ptr()]
    _, info = ref.sample(256)
    var.sample(256)
    new = torch.rand(256, generator=g, dtype=torch.float64) * 5
    ref.update_priority(info["index"], new, generation=info["generation"])
    var.update_priority(info["index"].cuda(), new.cuda(), generation=info["generation"].cuda())
    same()
    assert 256 not in sizes()
    ref.dumps(tmp_path / "ckpt")
    var.loads(tmp_path / "ckpt")
    assert sizes() == []  # new trees, no stale graph
    for _ in range(3):
        update(64)
    assert sizes() == [64]
    monkeypatch.setattr(update_graph, "GRAPHS", False)
    var.sampler.sum_tree._update_graphs.clear()
    for _ in range(3):
        update(64)
    assert sizes() == []  # off: eager, nothing captured


def test_triton_update_graph_gives_the_eager_bits_with_a_pow(monkeypatch):
    """exact: with a real transform (alpha=0.6, eps=1e-6: CUDA's pow, the same in both),
    updates replayed from CUDA graphs leave the same trees and max priority, bit for bit,
    as the same updates run eagerly (``update_graph.GRAPHS`` off) on a twin buffer."""
    from rbcheck.variants import update_graph

    _, graphed = make("triton", 2048, 0.6, 1e-6)
    _, eager = make("triton", 2048, 0.6, 1e-6)
    g = torch.Generator().manual_seed(6)
    prio = torch.rand(2048, generator=g) * 3
    for buf in (graphed, eager):
        buf.extend(batch(2048, 0, prio).to("cuda"))
    for step in range(8):
        k = (300, 1200)[step % 2]
        index = torch.randint(0, 2048, (k,), generator=g).cuda()
        new = (torch.rand(k, generator=g, dtype=torch.float64) * 7).cuda()
        graphed.update_priority(index, new)
        monkeypatch.setattr(update_graph, "GRAPHS", False)
        eager.update_priority(index, new)
        monkeypatch.setattr(update_graph, "GRAPHS", True)
        assert torch.equal(graphed.sampler.sum_tree.nodes, eager.sampler.sum_tree.nodes)
        assert torch.equal(graphed.sampler.min_tree.nodes, eager.sampler.min_tree.nodes)
        assert graphed.sampler.max_priority == eager.sampler.max_priority
    assert sorted(key[0] for key in graphed.sampler.sum_tree._update_graphs) == [300, 1200]
    assert not eager.sampler.sum_tree.__dict__.get("_update_graphs")
