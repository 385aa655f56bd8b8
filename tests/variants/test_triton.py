"""Triton kernels against the torch path and the reference.

Without CUDA the kernels run in Triton's interpreter (``rbcheck.variants.triton_tree``
turns it on before defining them), which is slow: sizes stay small here.
Skipped, with the import error, when Triton is not installed.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbcheck import reference

triton_tree = pytest.importorskip("rbcheck.variants.triton_tree")
if triton_tree.UNAVAILABLE is not None:  # pragma: no cover - depends on the install
    pytest.skip(f"unavailable: triton: {triton_tree.UNAVAILABLE}", allow_module_level=True)

from rbcheck import variants  # noqa: E402
from rbcheck.variants.vector_tree import find_prefix_torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
small = settings(max_examples=8)  # the interpreter runs a kernel in milliseconds, not microseconds


def random_updates(g, capacity, k, rounds=3):
    """``(index, value, mask, kept positions)`` per round: repeated indices,
    about 20% zero values, about 30% masked-out entries."""
    for _ in range(rounds):
        index = torch.randint(0, capacity, (k,), generator=g)
        value = torch.rand(k, generator=g, dtype=torch.float64) * (torch.rand(k, generator=g) > 0.2)
        mask = torch.rand(k, generator=g) > 0.3
        yield index, value, mask, torch.nonzero(mask).flatten()


@small
@given(capacity=st.integers(1, 33), seed=st.integers(0, 2**16), k=st.integers(1, 40))
def test_update_kernel_builds_the_reference_trees(capacity, seed, k):
    """exact: the fused update kernel (duplicates, zeros, masked-out entries)
    leaves both trees bit-identical to the reference's."""
    g = torch.Generator().manual_seed(seed)
    ref_sum, ref_min = reference.SumTree(capacity), reference.MinTree(capacity)
    sums = variants.VectorSumTree(capacity, DEVICE, backend="triton")
    mins = variants.VectorMinTree(capacity, DEVICE, backend="triton")
    for index, value, mask, kept in random_updates(g, capacity, k):
        if len(kept):
            ref_sum.update(index[kept], value[kept])
            ref_min.update(index[kept], value[kept])
        sums.update(index.to(DEVICE), value.to(DEVICE), mask.to(DEVICE))
        mins.update(index.to(DEVICE), value.to(DEVICE), mask.to(DEVICE))
        assert torch.equal(sums.nodes.cpu(), ref_sum.nodes)
        assert torch.equal(mins.nodes.cpu(), ref_min.nodes)


@small
@given(capacity=st.integers(1, 70), seed=st.integers(0, 2**16), k=st.integers(1, 40),
       top_log=st.sampled_from([1, 2, 3, triton_tree.TOP_LOG]), fused=st.booleans(),
       block=st.sampled_from([2, None]))
def test_paired_update_kernels_build_the_reference_trees(capacity, seed, k, top_log, fused, block):
    """exact: both trees updated together (the sampler's path), with the top
    of the tree recomputed whole from any cut (``TOP_LOG``), by the single
    launch (``fused``; block 2: subtrees whose positions run over several
    blocks) or by the per-level launches below the cut and the whole-level
    program above it: both trees bit-identical to the reference's."""
    g = torch.Generator().manual_seed(seed)
    ref_sum, ref_min = reference.SumTree(capacity), reference.MinTree(capacity)
    sums = variants.VectorSumTree(capacity, DEVICE, backend="triton")
    mins = variants.VectorMinTree(capacity, DEVICE, backend="triton")
    saved = triton_tree.TOP_LOG
    triton_tree.TOP_LOG = top_log
    try:
        for index, value, mask, kept in random_updates(g, capacity, k):
            if len(kept):
                ref_sum.update(index[kept], value[kept])
                ref_min.update(index[kept], torch.where(value[kept] > 0, value[kept], float("inf")))
            triton_tree.update_trees([sums, mins], index.to(DEVICE),
                                     [value.to(DEVICE), torch.where(value > 0, value, float("inf")).to(DEVICE)],
                                     mask.to(DEVICE), block=block, fused=fused)
            assert torch.equal(sums.nodes.cpu(), ref_sum.nodes), f"sum tree, top_log={top_log}"
            assert torch.equal(mins.nodes.cpu(), ref_min.nodes), f"min tree, top_log={top_log}"
    finally:
        triton_tree.TOP_LOG = saved


@small
@given(capacity=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_descent_kernel_gives_the_reference_leaves(capacity, seed):
    """exact given shared randomness: the descent kernel returns the
    reference's leaves for the same masses, including interval edges."""
    g = torch.Generator().manual_seed(seed)
    tree = reference.SumTree(capacity)
    tree.update(torch.arange(capacity), torch.rand(capacity, generator=g, dtype=torch.float64)
                * (torch.rand(capacity, generator=g) > 0.3))
    if tree.total() == 0:
        tree.update(torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64))
    edges = torch.cumsum(tree.nodes[tree.size:tree.size + capacity], 0)
    mass = torch.cat([torch.rand(300, generator=g, dtype=torch.float64) * tree.total(), edges])
    nodes = tree.nodes.to(DEVICE)
    index, leaf = triton_tree.find_prefix(nodes, mass.to(DEVICE), tree.size)
    want = tree.find_prefix(mass)
    assert torch.equal(index.cpu(), want)
    assert torch.equal(leaf.cpu(), tree.nodes[tree.size + want])
    assert torch.equal(find_prefix_torch(nodes, mass.to(DEVICE), tree.size)[0].cpu(), want)


@small
@given(capacity=st.integers(1, 600), seed=st.integers(0, 2**16))
def test_sample_kernel_gives_the_reference_leaves_and_bases(capacity, seed):
    """exact given shared randomness: ``sample_prefix`` (u * total, the descent by line
    passes, n * (leaf / total), one launch) gives the reference's leaves and the reference's
    bases for the same uniforms, bit for bit, as the C path does; capacities up to 600
    reach trees of 10 levels (a top level, then three line passes)."""
    g = torch.Generator().manual_seed(seed)
    tree = reference.SumTree(capacity)
    tree.update(torch.arange(capacity), torch.rand(capacity, generator=g, dtype=torch.float64)
                * (torch.rand(capacity, generator=g) > 0.3))
    if tree.total() == 0:
        tree.update(torch.tensor([capacity - 1]), torch.tensor([1.0], dtype=torch.float64))
    u = torch.cat([torch.rand(300, generator=g, dtype=torch.float64),
                   torch.tensor([0.0, 2.0**-53, 1 - 2.0**-53], dtype=torch.float64)])
    total = tree.total()
    want = tree.find_prefix(u * total)
    n = max(1, capacity - seed % 3)
    index = torch.empty(len(u), dtype=torch.long, device=DEVICE)
    base = torch.empty(len(u), dtype=torch.float64, device=DEVICE)
    triton_tree.sample_prefix(tree.nodes.to(DEVICE), u.to(DEVICE), tree.size, n, index, base)
    assert torch.equal(index.cpu(), want)
    assert torch.equal(base.cpu().view(torch.int64), (n * (tree.leaf(want) / total)).view(torch.int64))


def test_triton_buffer_agrees_with_reference():
    """exact: a short prioritized program on the triton variant and the
    reference gives the same trees, indices and weights (same seed)."""
    ref = reference.ReplayBuffer(10, sampler=reference.PrioritizedSampler(10, 0.6, 0.4), generator=5)
    var = variants.ReplayBuffer(10, sampler=variants.PrioritizedSampler(10, 0.6, 0.4, backend="triton"),
                                generator=5, device=DEVICE)
    from tensordict import TensorDict

    for step in range(4):
        td = TensorDict({"x": torch.arange(7.0) + step, "priority": torch.rand(7) * 3}, batch_size=[7])
        ref.extend(td)
        var.extend(td.to(DEVICE))
        _, want = ref.sample(16)
        _, got = var.sample(16)
        index = torch.tensor([3, 3, 1, 6])
        ref.update_priority(index, torch.tensor([0.5, 4.0, 0.0, 2.0]), generation=want["generation"][:4]
                            if step % 2 else None)
        var.update_priority(index.to(DEVICE), torch.tensor([0.5, 4.0, 0.0, 2.0]).to(DEVICE),
                            generation=want["generation"][:4].to(DEVICE) if step % 2 else None)
        if DEVICE == "cpu":  # on CUDA, pow may round the last bit differently (see test_cuda.py)
            assert torch.equal(got["index"].cpu(), want["index"])
            assert torch.equal(got["weight"].cpu(), want["weight"])
            assert torch.equal(var.sampler.sum_tree.nodes.cpu(), ref.sampler.sum_tree.nodes)
            assert torch.equal(var.sampler.min_tree.nodes.cpu(), ref.sampler.min_tree.nodes)


def test_the_one_launch_sample_is_the_per_op_path_bit_for_bit(monkeypatch):
    """exact: the triton sampler's one-launch sample (``sample_prefix``, then torch's pow and
    one division into float32) gives the indices and weights of its per-op path, and is
    the one taken (the per-op path's descent made to fail does not stop it)."""
    sampler = variants.PrioritizedSampler(300, 0.6, 0.4, backend="triton").to(DEVICE)
    sampler.on_write(torch.arange(250, device=DEVICE),
                     torch.rand(250, generator=torch.Generator().manual_seed(7)).to(DEVICE))
    storage = variants.DeviceStorage(300, DEVICE)
    from tensordict import TensorDict

    storage.write(0, TensorDict({"x": torch.arange(250.0, device=DEVICE)}, batch_size=[250]))
    results = []
    for fused in (True, False):
        monkeypatch.setattr(triton_tree, "SAMPLE_FUSED", fused)
        with monkeypatch.context() as m:
            if fused:
                m.setattr(triton_tree, "find_prefix", None)  # the per-op path's descent: not called
            results.append(sampler.sample(storage, 77, torch.Generator().manual_seed(8)))
    fused, before = results
    assert torch.equal(fused["index"], before["index"])
    assert torch.equal(fused["weight"].view(torch.int32), before["weight"].view(torch.int32))
