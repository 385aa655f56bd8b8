"""The native (C) CPU path of the variants' trees against the torch path and the reference.

Kinds (see docs/design.md, "Kinds of check"):
* exact: trees after the same updates (duplicates, masks, zero values,
  contiguous and random slots) are bit-identical across native, torch path and
  reference; gathered rows equal ``index_select``'s;
* exact given shared randomness: the same masses (random, 0, tiny, the total,
  prefix-sum boundaries and their float neighbours) descend to the same
  leaves; the same seed samples the same indices and bit-equal weights;
* fallback: with no compiler / a failing compiler / ``RBCHECK_NATIVE=0`` the
  reason is reported (``unavailable_reason()`` and a RuntimeWarning) and the
  results are the same.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import threading
import time
import warnings

import pytest
import torch
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import native, sample_fast
from rbcheck.variants.device_storage import TensorPool, check_index_fast, gather_columns
from rbcheck.variants.vector_tree import (
    apply_updates_torch,
    find_prefix_native,
    find_prefix_torch,
    update_pair,
)

CAPACITIES = [1, 2, 3, 5, 17, 64, 1000, 1025]

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native path unavailable: {native.unavailable_reason()}")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) if t.dtype == torch.float64 else t


def assert_bits(got, want, what):
    assert torch.equal(bits(got), bits(want)), f"{what}={got}, but should be {want} (bit for bit)"


def random_leaves(capacity: int, g: torch.Generator) -> torch.Tensor:
    value = torch.rand(capacity, generator=g, dtype=torch.float64) ** 3 * 10
    value[torch.rand(capacity, generator=g) < 0.3] = 0.0  # zero leaves: never sampled
    value[torch.rand(capacity, generator=g) < 0.05] = 1e-300  # tiny ones
    if capacity > 1:
        value[-1] = 0.0  # a zero at the right edge
    return value


def edge_masses(ref_tree: reference.SumTree, g: torch.Generator, n: int = 256) -> torch.Tensor:
    total = ref_tree.total()
    leaves = ref_tree.nodes[ref_tree.size:ref_tree.size + ref_tree.capacity]
    prefix = torch.cumsum(leaves, 0)
    pick = prefix[torch.randint(0, len(prefix), (n // 4,), generator=g)]
    inner = ref_tree.nodes[1:ref_tree.size]  # node sums: the boundaries the descent compares with
    inner = inner[torch.randint(0, len(inner), (n // 4,), generator=g)] if len(inner) else inner
    edges = torch.cat([pick, inner])
    return torch.cat([
        torch.rand(n, generator=g, dtype=torch.float64) * total,
        torch.tensor([0.0, 5e-324, 1e-300, total, math.nextafter(total, 0.0)], dtype=torch.float64),
        edges, torch.nextafter(edges, torch.zeros_like(edges)), torch.nextafter(edges, edges + 1),
    ])


# ----------------------------------------------------------------------------
# descent
# ----------------------------------------------------------------------------


@pytest.fixture(params=["vector", "scalar"])
def descent_code(request):
    """Runs a test with the descent's AVX2 line pass, then with its scalar code."""
    if request.param == "vector" and not native.vector_descent():
        pytest.skip("this CPU has no AVX2: only the scalar descent runs here")
    native.vector_descent(request.param == "vector")
    yield request.param
    native.vector_descent(True)


@needs_native
@pytest.mark.parametrize("capacity", CAPACITIES + [1 << 14])
@pytest.mark.parametrize("seed", [0, 1])
def test_descent_native_equals_torch_path_and_reference(capacity, seed, descent_code):
    g = torch.Generator().manual_seed(seed)
    ref = reference.SumTree(capacity)
    ref.update(torch.arange(capacity), random_leaves(capacity, g))
    if ref.total() == 0:
        ref.update(torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64))
    tree = variants.VectorSumTree(capacity)
    tree.load_state_dict(ref.state_dict())
    mass = edge_masses(ref, g)
    want = ref.find_prefix(mass)
    got_index, got_leaf = find_prefix_native(tree.nodes, mass, tree.size)
    torch_index, torch_leaf = find_prefix_torch(tree.nodes, mass, tree.size)
    assert_bits(got_index, want, f"native find_prefix [capacity={capacity}]")
    assert_bits(torch_index, want, f"torch find_prefix [capacity={capacity}]")
    assert_bits(got_leaf, ref.nodes[ref.size + want], "native leaf values")
    assert_bits(tree.find_prefix(mass), want, "VectorSumTree.find_prefix (dispatch)")
    total = ref.total()
    inside = mass < total
    assert bool((ref.leaf(want[inside]) > 0).all()), "a zero leaf was reached"


@needs_native
def test_descent_ignores_non_contiguous_outputs_and_inputs():
    g = torch.Generator().manual_seed(3)
    ref = reference.SumTree(100)
    ref.update(torch.arange(100), random_leaves(100, g) + 0.5)
    tree = variants.VectorSumTree(100)
    tree.load_state_dict(ref.state_dict())
    mass = (torch.rand(64, generator=g, dtype=torch.float64) * ref.total()).repeat_interleave(2)[::2]
    index = torch.empty(64, 2, dtype=torch.long)[:, 0]
    leaf = torch.empty(64, 2, dtype=torch.float64)[:, 1]
    from rbcheck.variants.vector_tree import find_prefix
    got, _ = find_prefix(tree, mass, index=index, leaf=leaf)
    assert_bits(index, ref.find_prefix(mass), "find_prefix into a strided output")
    assert got is index


@needs_native
def test_threaded_draw_equals_single_threaded_and_reference(descent_code):
    g = torch.Generator().manual_seed(4)
    ref = reference.SumTree(3000)
    ref.update(torch.arange(3000), random_leaves(3000, g) + 1e-3)
    tree = variants.VectorSumTree(3000)
    tree.load_state_dict(ref.state_dict())
    u = torch.rand(40000, generator=g, dtype=torch.float64)  # > 2 chunks of 16384: threads start
    total = ref.total()
    out = {}
    for threads in (1, 3):
        index, base = torch.empty(40000, dtype=torch.long), torch.empty(40000, dtype=torch.float64)
        native.sample_prefix(tree.nodes, tree.size, u, total, 2999, index, base, threads=threads)
        out[threads] = index, base
    want = ref.find_prefix(u * total)
    assert_bits(out[1][0], want, "single-threaded draw")
    assert_bits(out[3][0], want, "threaded draw")
    assert_bits(out[3][1], out[1][1], "threaded n * p")
    assert_bits(out[1][1], 2999 * (ref.leaf(want) / total), "n * p")


# ----------------------------------------------------------------------------
# update
# ----------------------------------------------------------------------------


def update_program(capacity: int, g: torch.Generator):
    """Batches of (index, raw value, mask or None): duplicates, contiguous runs, zeros."""
    out = []
    for k in range(6):
        n = int(torch.randint(1, 3 * capacity + 2, (1,), generator=g))
        if k % 3 == 0:  # a contiguous (wrapping) run, like a writer's
            start = int(torch.randint(0, capacity, (1,), generator=g))
            index = (start + torch.arange(n)) % capacity
        else:  # random, with many duplicates
            index = torch.randint(0, capacity, (n,), generator=g)
        value = torch.rand(n, generator=g, dtype=torch.float64) * 5
        value[torch.rand(n, generator=g) < 0.2] = 0.0
        mask = None if k % 2 == 0 else torch.rand(n, generator=g) < 0.6
        out.append((index, value, mask))
    return out


@needs_native
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_update_native_equals_torch_path_and_reference(capacity):
    g = torch.Generator().manual_seed(capacity)
    ref_sum, ref_min = reference.SumTree(capacity), reference.MinTree(capacity)
    nat_sum, nat_min = variants.VectorSumTree(capacity), variants.VectorMinTree(capacity)
    tor_sum, tor_min = variants.VectorSumTree(capacity), variants.VectorMinTree(capacity)
    one_sum = variants.VectorSumTree(capacity)  # single-tree updates (VectorSumTree.update)
    for index, value, mask in update_program(capacity, g):
        kept_index = index if mask is None else index[mask]
        kept_value = value if mask is None else value[mask]
        if len(kept_index):
            ref_sum.update(kept_index, kept_value)
            ref_min.update(kept_index, torch.where(kept_value > 0, kept_value, math.inf))
            one_sum.update(kept_index, kept_value)
        update_pair(nat_sum, nat_min, index, value, mask)
        apply_updates_torch([tor_sum, tor_min], index,
                            [value, torch.where(value > 0, value, math.inf)], mask)
        for name, got, want in [("native sum", nat_sum, ref_sum), ("native min", nat_min, ref_min),
                                ("torch sum", tor_sum, ref_sum), ("torch min", tor_min, ref_min),
                                ("native single sum", one_sum, ref_sum)]:
            assert_bits(got.nodes, want.nodes, f"{name} nodes [capacity={capacity}]")


def poison_shadow_levels(tree) -> None:
    """NaN into the shadow levels of ``tree.raw_nodes``: whatever reads them is caught."""
    for level in native.shadow_levels(tree.depth):
        tree.raw_nodes[1 << level:2 << level] = math.nan


@needs_native
@pytest.mark.parametrize("capacity", [64, 100, 1025, 5000])
def test_shadow_levels_are_never_read_and_materialize_to_the_reference(capacity, descent_code):
    """Native updates in a row leave only the shadow levels stale: with those
    poisoned (NaN) after every update, every other level is the reference's bit for
    bit, descents find the reference's leaves, and ``nodes`` (recomputed in C, or
    by torch with the native path suspended) is the reference's tree."""
    g = torch.Generator().manual_seed(capacity)
    ref_sum, ref_min = reference.SumTree(capacity), reference.MinTree(capacity)
    pairs = [(variants.VectorSumTree(capacity), variants.VectorMinTree(capacity)) for _ in range(2)]
    depth = pairs[0][0].depth
    shadow = native.shadow_levels(depth)
    assert len(shadow) == 4, f"shadow levels={shadow}, but should be 4 levels at depth {depth}"
    for step, (index, value, mask) in enumerate(update_program(capacity, g)):
        value = value + 1e-3  # a positive total to descend
        kept_index = index if mask is None else index[mask]
        kept_value = value if mask is None else value[mask]
        if len(kept_index):
            ref_sum.update(kept_index, kept_value)
            ref_min.update(kept_index, torch.where(kept_value > 0, kept_value, math.inf))
        for nat_sum, nat_min in pairs:
            update_pair(nat_sum, nat_min, index, value, mask)
            poison_shadow_levels(nat_sum)
            poison_shadow_levels(nat_min)
        nat_sum, nat_min = pairs[0]
        for level in set(range(depth + 1)) - set(shadow):
            part = slice(1 << level, 2 << level)
            assert_bits(nat_sum.raw_nodes[part], ref_sum.nodes[part], f"sum level {level} [step {step}]")
            assert_bits(nat_min.raw_nodes[part], ref_min.nodes[part], f"min level {level} [step {step}]")
        mass = edge_masses(ref_sum, g)
        got, _ = find_prefix_native(nat_sum.raw_nodes, mass, nat_sum.size)
        assert_bits(got, ref_sum.find_prefix(mass), f"descent on stale shadow levels [step {step}]")
    assert_bits(pairs[0][0].nodes, ref_sum.nodes, "sum nodes (shadow levels recomputed in C)")
    assert_bits(pairs[0][1].nodes, ref_min.nodes, "min nodes (shadow levels recomputed in C)")
    with native.suspended():
        assert_bits(pairs[1][0].nodes, ref_sum.nodes, "sum nodes (recomputed by torch)")
        assert_bits(pairs[1][1].nodes, ref_min.nodes, "min nodes (recomputed by torch)")
        index = torch.randint(0, capacity, (capacity // 3,), generator=g)
        value = torch.rand(len(index), generator=g, dtype=torch.float64) + 1e-3
        update_pair(*pairs[1], index, value)  # the torch path, on the recomputed tree
    ref_sum.update(index, value)
    ref_min.update(index, value)
    assert_bits(pairs[1][0].nodes, ref_sum.nodes, "sum nodes after a torch-path update")
    assert_bits(pairs[1][1].nodes, ref_min.nodes, "min nodes after a torch-path update")


@needs_native
def test_update_rejects_an_out_of_range_index_before_writing():
    tree = variants.VectorSumTree(10)
    before = tree.nodes.clone()
    with pytest.raises(ValueError, match=r"index=10, but should be in \[0, 10\)"):
        native.update(tree.nodes, False, None, False, tree.size, tree.capacity,
                      torch.tensor([1, 10]), torch.ones(2, dtype=torch.float64), None, None)
    assert_bits(tree.nodes, before, "nodes after a rejected update")


# ----------------------------------------------------------------------------
# sampler, storage, checks
# ----------------------------------------------------------------------------


def filled_pair(capacity: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ref = reference.ReplayBuffer(capacity, sampler=reference.PrioritizedSampler(capacity, 0.7, 0.5),
                                 generator=seed)
    var = variants.ReplayBuffer(capacity, sampler=variants.PrioritizedSampler(capacity, 0.7, 0.5),
                                generator=seed, device="cpu")
    prio = torch.rand(n, generator=g, dtype=torch.float64) * 3
    prio[::7] = 0.0
    td = TensorDict({"obs": torch.randn(n, 3, generator=g), "flag": torch.rand(n, generator=g) < 0.5,
                     "priority": prio}, batch_size=[n])
    ref.extend(td)
    var.extend(td)
    return ref, var, g


@pytest.mark.parametrize("capacity", [1, 37, 300])
def test_sampler_native_and_torch_path_equal_reference(capacity):
    ref, var, g = filled_pair(capacity, capacity + capacity // 3, seed=capacity)
    for step in range(4):
        batch = 1 + step * 50
        want_rows, want = ref.sample(batch)
        if step % 2:
            with native.suspended():
                got_rows, got = var.sample(batch)
        else:
            got_rows, got = var.sample(batch)
        assert_bits(got["index"], want["index"], f"index [step {step}]")
        assert torch.equal(got["weight"].view(torch.int32), want["weight"].view(torch.int32)), \
            f"weight={got['weight']}, but should be {want['weight']} (bit for bit) [step {step}]"
        assert_bits(got["generation"], want["generation"], "generation")
        for key in ("obs", "flag", "priority"):
            assert torch.equal(got_rows[key], want_rows[key]), f"rows[{key!r}] differ [step {step}]"
        slots = torch.randint(0, len(ref), (batch,), generator=g)
        prio = torch.rand(batch, generator=g, dtype=torch.float64)
        ref.update_priority(slots, prio)
        var.update_priority(slots, prio)
        assert_bits(var.sampler.sum_tree.nodes, ref.sampler.sum_tree.nodes, "sum tree")
        assert_bits(var.sampler.min_tree.nodes, ref.sampler.min_tree.nodes, "min tree")
        assert var.sampler.max_priority == ref.sampler.max_priority, \
            f"max_priority={var.sampler.max_priority}, but should be {ref.sampler.max_priority}"


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_priority_fast_path_equals_reference_and_keeps_its_errors(dtype):
    """The one-pass C path of update_priority (checks, widening, max) gives the
    reference's trees and max for float32 and float64 priorities; a bad index or
    priority raises the reference's error and changes nothing."""
    ref, var, g = filled_pair(300, 400, seed=9)
    for step in range(3):
        slots = torch.randint(0, 300, (200,), generator=g)
        prio = (torch.rand(200, generator=g, dtype=torch.float64) * (3 + 2 * step)).to(dtype)
        ref.update_priority(slots, prio)
        var.update_priority(slots, prio)
        assert_bits(var.sampler.sum_tree.nodes, ref.sampler.sum_tree.nodes, f"sum tree [step {step}]")
        assert_bits(var.sampler.min_tree.nodes, ref.sampler.min_tree.nodes, f"min tree [step {step}]")
        assert var.sampler.max_priority == ref.sampler.max_priority
    before = (var.sampler.sum_tree.nodes.clone(), var.sampler.max_priority)
    for bad_index, bad_prio, message in [
        (torch.tensor([0, 300]), torch.tensor([1.0, 2.0], dtype=dtype), r"index=\[300\], but should be in"),
        (torch.tensor([0, 1]), torch.tensor([100.0, float("nan")], dtype=dtype), r"but should be finite and >= 0"),
        (torch.tensor([0, 1]), torch.tensor([100.0, -1.0], dtype=dtype), r"but should be finite and >= 0"),
        (torch.tensor([0, 1]), torch.tensor([100.0, float("inf")], dtype=dtype), r"but should be finite and >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            ref.update_priority(bad_index, bad_prio)
        with pytest.raises(ValueError, match=message):
            var.update_priority(bad_index, bad_prio)
        assert_bits(var.sampler.sum_tree.nodes, before[0], "sum tree after a refused update")
        assert var.sampler.max_priority == before[1], "max_priority changed by a refused update"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000, 1 << 20, (1 << 40) + 3, (1 << 53) - 1])
def test_uniform_slots_are_the_references(size):
    """``uniform_slots`` maps uniforms to slots as the reference's expression does, bit for
    bit, on random draws and at the edges (0, the largest doubles below 1). (Its clamp
    never acts on a uniform below 1: in round-to-nearest ``u * size < size`` for every
    ``u < 1``; it stays as the reference's guard.)"""
    g = torch.Generator().manual_seed(size % 1000)
    u = torch.cat([torch.rand(4096, generator=g, dtype=torch.float64),
                   torch.tensor([0.0, 2.0**-53, 0.5, 1 - 2.0**-53, 1 - 2.0**-52, 1 - 1e-12, 1 - 1e-16],
                                dtype=torch.float64)])
    want = reference.RandomSampler().indices_from_uniforms(u, size)
    got = native.uniform_slots(u, size, torch.full_like(want, -7))
    assert torch.equal(got, want)
    assert 0 <= int(got.min()) and int(got.max()) <= size - 1


def test_the_uniform_sampler_takes_the_native_map_and_draws_the_references_indices(monkeypatch):
    """The variant's uniform sampler maps its uniforms by ``uniform_slots`` on the CPU, and
    with the same seed samples the reference's indices (with and without the native map).
    The buffer's fast path (``sample_fast``, which maps them in its own C call) is off."""
    monkeypatch.setattr(sample_fast, "ENABLED", False)
    calls = []
    real = native.uniform_slots
    monkeypatch.setattr(native, "uniform_slots", lambda *a: calls.append(1) or real(*a))
    bufs = [reference.ReplayBuffer(37, generator=9), variants.ReplayBuffer(37, generator=9, device="cpu")]
    for buf in bufs:
        buf.extend(TensorDict({"x": torch.arange(30.0)}, batch_size=[30]))
    want = [bufs[0].sample(64)[1]["index"] for _ in range(3)]
    got = [bufs[1].sample(64)[1]["index"] for _ in range(3)]
    assert calls == [1, 1, 1]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with native.suspended():
        slow = variants.ReplayBuffer(37, generator=9, device="cpu")
        slow.extend(TensorDict({"x": torch.arange(30.0)}, batch_size=[30]))
        assert all(torch.equal(slow.sample(64)[1]["index"], w) for w in want)
    assert calls == [1, 1, 1]


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (8,)), (torch.uint8, (3,)), (torch.bool, ()),
                                         (torch.float16, (1,)), (torch.float64, (2, 2)),
                                         (torch.int32, (5,))])
def test_gather_columns_equals_index_select(dtype, shape):
    g = torch.Generator().manual_seed(0)
    column = (torch.rand((300, *shape), generator=g) * 100).to(dtype)
    index = torch.randint(0, 300, (200,), generator=g)
    out = torch.empty((200, *shape), dtype=dtype)
    gather_columns([column], index, [out])
    assert torch.equal(out, torch.index_select(column, 0, index))
    with pytest.raises((ValueError, IndexError)):
        gather_columns([column], torch.tensor([0, 300]), [torch.empty((2, *shape), dtype=dtype)])


def test_gather_block_equals_index_select_and_refuses_a_bad_index():
    """``GatherBlock`` (the storage's prebuilt gather table) copies the rows of every column,
    of any dtype and width, and refuses an index outside the columns before copying."""
    g = torch.Generator().manual_seed(1)
    columns = [(torch.rand((300, *shape), generator=g) * 100).to(dtype)
               for dtype, shape in [(torch.float32, (8,)), (torch.uint8, (3,)), (torch.bool, ()),
                                    (torch.float16, (1,)), (torch.float64, (2, 2)), (torch.int32, (5,))]]
    block = native.GatherBlock(columns, columns, [native.row_layout(c) for c in columns])
    assert block.usable
    for n in (1, 7, 200):
        index = torch.randint(0, 300, (n,), generator=g)
        outs = [torch.empty((n, *c.shape[1:]), dtype=c.dtype) for c in columns]
        block.gather(index, outs)
        for column, out in zip(columns, outs, strict=True):
            assert torch.equal(out, torch.index_select(column, 0, index))
    outs = [torch.zeros((2, *c.shape[1:]), dtype=c.dtype) for c in columns]
    with pytest.raises(ValueError, match=r"index=300, but should be in \[0, 300\)"):
        block.gather(torch.tensor([0, 300]), outs)
    assert all(not out.any() for out in outs), "a refused gather copied rows"


def test_samples_read_the_columns_a_load_put_in_place():
    """After a load (the loaded rows moved into the storage's interleaved rows, its column
    list rebuilt, and with it the gather table), samples read the loaded rows, as the
    reference's do. (A load of another layout is refused, so the rows' memory, which the
    table addresses, stays the same; the table is rebuilt whenever the list is.)"""
    def rows(n, start):
        x = torch.arange(start, start + n, dtype=torch.float32)
        return TensorDict({"obs": torch.stack([x, -x, x / 2], 1), "reward": x.double()}, batch_size=[n])
    source = reference.ReplayBuffer(16, generator=4)
    source.extend(rows(16, 1000))
    ref, var = reference.ReplayBuffer(16, generator=4), variants.ReplayBuffer(16, generator=4, device="cpu")
    for buf in (ref, var):
        buf.extend(rows(16, 0))
        buf.sample(8)  # the table of the first columns is built here
        buf.load_state_dict(source.state_dict())
    for _ in range(5):
        (want, want_info), (got, got_info) = ref.sample(8), var.sample(8)
        assert torch.equal(got_info["index"], want_info["index"])
        assert (got == want).all(), "a sample read the columns held before the load"


def test_the_pool_never_hands_one_tensor_to_two_threads():
    """``TensorPool.take`` from threads at once: no tensor is handed out while another
    thread holds it (torch releases the GIL inside ``detach``: without the pool's lock two
    threads found the same tensor free, and two samples gathered into the same memory)."""
    pool = TensorPool()
    held, guard, clashes = {}, threading.Lock(), []

    def worker(me):
        for _ in range(3000):
            out = pool.take("rows", (4,), torch.float32, "cpu")
            with guard:
                if out.data_ptr() in held:
                    clashes.append((me, held[out.data_ptr()]))
                held[out.data_ptr()] = me
            time.sleep(0)  # the others run while this one holds it
            with guard:
                del held[out.data_ptr()]
            del out

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clashes, f"{len(clashes)} tensors were handed to a second thread while held"


def test_the_pool_keeps_a_bounded_number_of_sizes_and_never_reuses_a_held_tensor():
    """A caller cycling through 150 batch sizes: the pool keeps at most ``max_keys`` keys
    (it forgets them all past that), a tensor handed out before a forget keeps its values,
    and a held tensor is never handed out again, before or after."""
    pool = TensorPool(max_keys=16)
    first = pool.take("index", (1,), torch.long, "cpu").fill_(7)
    for n in range(2, 152):
        out = pool.take("index", (n,), torch.long, "cpu")
        assert out.data_ptr() != first.data_ptr()
        out.fill_(n)
        assert len(pool.slots) <= 16
    assert first.tolist() == [7]
    again = pool.take("index", (1,), torch.long, "cpu")
    assert again.data_ptr() != first.data_ptr()


def test_the_pool_never_reuses_memory_shared_with_another_process():
    """A handed-out tensor sent through a ``torch.multiprocessing`` queue has its memory moved
    into shared memory in place (the pooled tensor's too). Once the sender drops it the
    reference count looks free, but the receiver may still read it: the pool hands out
    other memory and forgets the shared one."""
    pool = TensorPool()
    out = pool.take("index", (4,), torch.long, "cpu").fill_(3)
    out.share_memory_()  # what the queue does to a tensor it sends
    shared = out.untyped_storage().data_ptr()
    del out
    again = pool.take("index", (4,), torch.long, "cpu").fill_(9)
    assert again.untyped_storage().data_ptr() != shared
    assert all(t.untyped_storage().data_ptr() != shared for ts in pool.slots.values() for t in ts)


@pytest.mark.parametrize("priority", [[1.0, float("nan")], [1.0, float("inf")], [-1.0, 2.0]])
def test_priority_and_index_checks_keep_the_reference_messages(priority):
    sampler = variants.PrioritizedSampler(4, 0.6, 0.4)
    with pytest.raises(ValueError, match=r"priority=.*, but should be finite and >= 0"):
        sampler.check_priority(torch.tensor(priority), 2)
    ok = sampler.check_priority(torch.tensor([0.0, 2.5], dtype=torch.float32), 2)
    assert ok.dtype == torch.float64 and ok.tolist() == [0.0, 2.5]
    with pytest.raises(ValueError, match=r"index=\[4\], but should be in \[0, 4\)"):
        check_index_fast(torch.tensor([0, 4]), 4)
    with pytest.raises(ValueError, match=r"index=\[-1\], but should be in \[0, 4\)"):
        check_index_fast(torch.tensor([-1, 3]), 4)


# ----------------------------------------------------------------------------
# build, cache and fallback
# ----------------------------------------------------------------------------


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """The native module with an empty cache in ``tmp_path``; state restored after."""
    monkeypatch.setenv("RBCHECK_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RBCHECK_NATIVE", raising=False)
    monkeypatch.delenv("CC", raising=False)
    native.reset()
    yield monkeypatch
    monkeypatch.undo()
    native.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native.lib()  # reload the real one (from its cache) for the tests that follow


def run_small_program():
    """(indices, weights, sum nodes) of a small prioritized variant buffer."""
    ref, var, g = filled_pair(50, 70, seed=5)
    want_rows, want = ref.sample(64)
    got_rows, got = var.sample(64)
    assert_bits(got["index"], want["index"], "index")
    assert torch.equal(got["weight"], want["weight"])
    slots = torch.randint(0, 50, (40,), generator=g)
    prio = torch.rand(40, generator=g, dtype=torch.float64)
    ref.update_priority(slots, prio)
    var.update_priority(slots, prio)
    assert_bits(var.sampler.sum_tree.nodes, ref.sampler.sum_tree.nodes, "sum tree")
    assert_bits(var.sampler.min_tree.nodes, ref.sampler.min_tree.nodes, "min tree")


@pytest.mark.parametrize("how,reason", [
    ("missing", "no C compiler found"),
    ("failing", "failed (exit"),
    ("disabled", "RBCHECK_NATIVE=0"),
])
def test_fallback_is_reported_and_gives_the_same_results(fresh_native, how, reason):
    if how == "missing":
        fresh_native.setenv("CC", "rbcheck-no-such-compiler")
    elif how == "failing":
        fresh_native.setenv("CC", "false")
    else:
        fresh_native.setenv("RBCHECK_NATIVE", "0")
    with pytest.warns(RuntimeWarning, match="native tree path unavailable"):
        assert native.lib() is None
    assert reason in native.unavailable_reason()
    assert not native.available()
    run_small_program()


def test_with_a_c_compiler_the_library_loads():
    """Where a compiler is found the native path must load: a source that stopped
    compiling would otherwise turn it off and skip its tests, and the suite would pass
    on the torch path alone."""
    if native._compiler() is None:
        pytest.skip("no C compiler here: the torch path is the one under test")
    if os.environ.get("RBCHECK_NATIVE", "1").strip() in ("0", "false", "no", "off"):
        pytest.skip("RBCHECK_NATIVE=0 in this environment")
    assert native.lib() is not None, native.unavailable_reason()


def test_a_failed_build_is_remembered_until_the_compiler_changes(tmp_path, monkeypatch):
    """A build that fails is recorded beside the cache's builds: the next process gets the
    same reason without compiling again (a failing ``calls.c`` build cost every process up
    to 120 s), and a changed compiler (another file at its path) is tried again."""
    monkeypatch.setenv("RBCHECK_NATIVE_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    compiler = tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'broken.c:1: error: no' >&2\nexit 1\n")
    compiler.chmod(0o755)
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=r"failed \(exit 1\): broken.c:1: error: no") as raised:
            native._compile([str(compiler)], native.SOURCE, (), ".so")
        assert runs.read_text().count("run") == 1, f"attempt {attempt}: the compiler ran again"
    assert "remembered" in str(raised.value) and ".failed" in str(raised.value)
    record = next((tmp_path / "cache").glob("*.failed"))
    day_ago = time.time() - native.compile.REMEMBER_S - 60
    os.utime(record, (day_ago, day_ago))  # a day on, the compiler runs again (and fails again)
    with pytest.raises(RuntimeError, match="failed"):
        native._compile([str(compiler)], native.SOURCE, (), ".so")
    assert runs.read_text().count("run") == 2
    compiler.write_text(f"#!/bin/sh\necho run >> {runs}\nexec cc \"$@\"\n")  # another compiler
    if shutil.which("cc") is None:
        pytest.skip("no cc here to stand for a repaired compiler")
    assert native._compile([str(compiler)], native.SOURCE, (), ".so").is_file()
    assert runs.read_text().count("run") == 3
    assert not list((tmp_path / "cache").glob("*.failed")), "a success leaves no failure recorded"


def test_a_killed_or_silent_compiler_is_not_remembered(tmp_path, monkeypatch):
    """A compiler killed by a signal, or one that fails without diagnosing an error, may
    pass next time: nothing is recorded, the next build runs it again."""
    monkeypatch.setenv("RBCHECK_NATIVE_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    for body in ("kill -9 $$", "echo 'cc1: Killed signal terminated program' >&2; exit 1", "exit 1"):
        compiler = tmp_path / "cc"
        compiler.write_text(f"#!/bin/sh\necho run >> {runs}\n{body}\n")
        compiler.chmod(0o755)
        before = runs.read_text().count("run") if runs.exists() else 0
        for _ in range(2):
            with pytest.raises(RuntimeError, match="failed"):
                native._compile([str(compiler)], native.SOURCE, (), ".so")
        assert runs.read_text().count("run") == before + 2, body
        assert not list((tmp_path / "cache").glob("*.failed")), body


@needs_native
def test_builds_into_an_empty_cache_and_reuses_it(fresh_native, tmp_path):
    assert native.lib() is not None and native.unavailable_reason() is None
    built = list((tmp_path / "cache").glob("rbcheck_tree_*.so"))
    assert len(built) == 1, f"cache={built}, but should hold one library"
    stamp = built[0].stat().st_mtime_ns
    native.reset()
    assert native.lib() is not None
    assert built[0].stat().st_mtime_ns == stamp, "the cached library was rebuilt"
    run_small_program()


def test_a_build_whose_argument_block_differs_is_refused_by_name(monkeypatch):
    """A library whose C block (``sizeof``) is not the one Python packs is refused when it
    loads, before any call could read a field from the wrong place: with a sample block one
    field short on the Python side, ``lib()`` is None and says why; the loaded library
    matches both blocks."""
    lib = native.lib()
    assert lib.rb_sample_args_size() == ctypes.sizeof(native.SampleArgs) == 19 * 8
    assert lib.rb_extend_args_size() == native.EXTEND_ARGS.size

    class Short(ctypes.Structure):
        _fields_ = native.SampleArgs._fields_[:-1]
    saved = dict(native._state)
    monkeypatch.setattr(native, "SampleArgs", Short)
    native.reset()
    try:
        with pytest.warns(RuntimeWarning, match=r"sample's argument block=152 bytes, but should be 144"):
            assert native.lib() is None
        assert "sample's argument block=152 bytes, but should be 144" in native.unavailable_reason()
    finally:
        native._state.clear()
        native._state.update(saved)


def test_forgetting_a_cache_waits_for_the_device_only_when_it_holds_cuda_tensors(monkeypatch):
    """``forget_all`` (the bounded caches' reset) synchronises the device before dropping a
    CUDA tensor that a kernel on another stream may still use, and never for CPU tensors
    (on a machine without CUDA the synchronisation would raise)."""
    from rbcheck.variants import vector_tree

    calls = []
    monkeypatch.setattr(vector_tree.torch.cuda, "synchronize", lambda: calls.append(1))
    cpu = {"a": torch.zeros(2), "b": (torch.zeros(1), torch.zeros(1)), "c": [torch.zeros(1)]}
    vector_tree.forget_all(cpu)
    assert cpu == {} and calls == []

    class OnCuda(torch.Tensor):  # a CPU tensor that says it is on CUDA
        @property
        def is_cuda(self):
            return True

    gpu = {"a": torch.zeros(2), "b": [torch.zeros(1).as_subclass(OnCuda)]}
    vector_tree.forget_all(gpu)
    assert gpu == {} and calls == [1]
