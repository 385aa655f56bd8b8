"""Differential tests: each variant against the reference on the same inputs.

Kinds (see docs/design.md, "Kinds of check"):
* exact: trees after the same writes/updates (same float64 arithmetic),
  contents, cursor, write count, max priority, checkpoints in both directions;
* exact given shared randomness: same masses -> same leaves; same seed ->
  same sampled indices (the variants consume the generator like the reference);
* weights: bit-equal on the CPU (same expressions on the same device); on
  CUDA within rtol 1e-6 (float64 ``pow`` may differ in the last bit there,
  far below the float32 output's resolution).

The variants here run on the CPU with the torch backend; Triton kernels are
compared in test_triton.py and the CUDA placement in test_cuda.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import sample_fast
from rbcheck.variants.last_writes import last_writes

# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def assert_state_equal(got, want, where="state"):
    """Nested state dicts equal: tensors bit for bit (dtype too), plain values with type."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where} keys={sorted(got)}, but should be {sorted(want)}"
        for k in want:
            assert_state_equal(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"len({where})={len(got)}, but should be {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_state_equal(g, w, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        got = got.cpu()
        assert got.dtype == want.dtype, f"{where}.dtype={got.dtype}, but should be {want.dtype}"
        same = torch.equal(got.view(torch.uint8) if got.is_floating_point() else got,
                           want.view(torch.uint8) if want.is_floating_point() else want)
        assert same, f"{where}={got}, but should be {want} (bit for bit)"
    else:
        assert type(got) is type(want) and got == want, f"{where}={got!r}, but should be {want!r}"


def rows(n, start, episode=None, priority=None):
    data = {"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1).repeat(1, 3),
            ("next", "reward"): torch.arange(start, start + n, dtype=torch.float64)}
    td = TensorDict({}, batch_size=[n])
    for k, v in data.items():
        td.set(k, v)
    if episode is not None:
        td.set("episode", torch.as_tensor(episode, dtype=torch.long))
    if priority is not None:
        td.set("priority", torch.as_tensor(priority, dtype=torch.float32))
    return td


def pair(capacity, sampler="random", seed=0, **kw):
    """(reference buffer, variant buffer on the CPU) built alike."""
    def make(mod, extra):
        if sampler == "prioritized":
            s = mod.PrioritizedSampler(capacity, kw.get("alpha", 0.6), kw.get("beta", 0.4),
                                       kw.get("eps", 1e-8), **extra)
        elif sampler == "slice":
            s = mod.SliceSampler(**{k: v for k, v in kw.items()
                                    if k in ("num_slices", "slice_len", "strict_length", "done_key")})
        else:
            s = mod.RandomSampler()
        return s
    ref = reference.ReplayBuffer(capacity, sampler=make(reference, {}), generator=seed)
    var = variants.ReplayBuffer(capacity, sampler=make(variants, {}), generator=seed, device="cpu")
    return ref, var


def assert_same_buffers(ref, var):
    assert (len(var), var.cursor, var.write_count) == (len(ref), ref.cursor, ref.write_count)
    assert_state_equal(var.state_dict(), ref.state_dict())


# ----------------------------------------------------------------------------
# trees
# ----------------------------------------------------------------------------

updates = st.lists(st.tuples(st.lists(st.integers(0, 10**6), min_size=1, max_size=12),
                             st.lists(st.sampled_from([0.0, 0.5, 1.0, 1e-300, 3.25, 1e6]) |
                                      st.floats(0, 100, allow_nan=False), min_size=12, max_size=12)),
                   min_size=1, max_size=6)


@given(capacity=st.integers(1, 40), batches=updates,
       fractions=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=16))
def test_trees_identical_after_same_updates(capacity, batches, fractions):
    """exact: same updates (duplicates: last write wins) -> bit-identical sum
    and min trees; exact given shared randomness: same masses -> same leaves."""
    ref_sum, ref_min = reference.SumTree(capacity), reference.MinTree(capacity)
    var_sum, var_min = variants.VectorSumTree(capacity), variants.VectorMinTree(capacity)
    for raw_index, raw_value in batches:
        index = torch.tensor([i % capacity for i in raw_index])
        value = torch.tensor(raw_value[: len(index)], dtype=torch.float64)
        note(f"update({index.tolist()}, {value.tolist()})")
        for tree in (ref_sum, ref_min, var_sum, var_min):
            tree.update(index, value)
        assert_state_equal(var_sum.state_dict(), ref_sum.state_dict(), "sum_tree")
        assert_state_equal(var_min.state_dict(), ref_min.state_dict(), "min_tree")
    total = ref_sum.total()
    # masses at interval edges (exact prefix sums) are where arithmetic differences would show
    edges = torch.cumsum(ref_sum.nodes[ref_sum.size:ref_sum.size + capacity], 0)
    mass = torch.cat([torch.tensor(fractions, dtype=torch.float64) * total, edges, edges.nextafter(edges - 1)])
    assert torch.equal(var_sum.find_prefix(mass), ref_sum.find_prefix(mass))


@given(index=st.lists(st.integers(0, 6), min_size=1, max_size=20), data=st.data())
def test_last_writes_matches_reference_last_occurrence(index, data):
    """exact: the sort-based dedupe keeps exactly the reference's entries
    (last occurrence among the kept ones)."""
    index = torch.tensor(index)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=len(index), max_size=len(index))))
    order, is_last = last_writes(index, mask)
    got = sorted(order[is_last].tolist())
    kept = torch.nonzero(mask).flatten()
    want = sorted(kept[reference.storage.last_occurrence(index[kept], 7)].tolist()) if len(kept) else []
    assert got == want


# ----------------------------------------------------------------------------
# whole buffers
# ----------------------------------------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("extend"), st.integers(1, 9), st.booleans()),
    st.tuples(st.just("update"), st.integers(1, 9), st.booleans()),
    st.tuples(st.just("sample"), st.integers(1, 9), st.booleans()),
), min_size=1, max_size=14)


@given(capacity=st.integers(1, 12), program=ops, seed=st.integers(0, 2**16),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), eps=st.sampled_from([0.0, 1e-8]),
       carry_priority=st.booleans())
def test_prioritized_buffer_agrees_with_reference(capacity, program, seed, alpha, eps, carry_priority):
    """exact: contents, cursor, trees, max priority, sampled indices for the
    same seed, stale updates ignored alike; weights bit-equal on the CPU."""
    ref, var = pair(capacity, "prioritized", seed, alpha=alpha, eps=eps)
    g = torch.Generator().manual_seed(seed)
    written = 0
    infos = []
    for op, n, flag in program:
        note(f"{op}({n}, {flag})")
        if op == "extend":
            prio = torch.rand(n, generator=g) * 5 if carry_priority else None
            if prio is not None and flag:
                prio[0] = 0.0
            assert torch.equal(var.extend(rows(n, written, priority=prio)), ref.extend(rows(n, written, priority=prio)))
            written += n
        elif op == "update" and len(ref):
            if flag and infos:  # generations from an earlier sample: some may be stale now
                info = infos[-1]
                index, gen = info["index"], info["generation"]
            else:
                index, gen = torch.randint(0, len(ref), (n,), generator=g), None
            prio = torch.rand(len(index), generator=g, dtype=torch.float64) * 10
            ref.update_priority(index, prio, generation=gen)
            var.update_priority(index, prio, generation=gen)
        elif op == "sample" and len(ref) and ref.sampler.sum_tree.total() > 0:
            ref_rows, ref_info = ref.sample(n)
            var_rows, var_info = var.sample(n)
            for key in ("index", "generation", "weight"):
                assert torch.equal(var_info[key], ref_info[key]), key
            assert (var_rows == ref_rows).all()
            infos.append(ref_info)
        assert_same_buffers(ref, var)
        assert var.sampler.max_priority == ref.sampler.max_priority


@given(capacity=st.integers(1, 16), batches=st.lists(st.integers(1, 20), min_size=1, max_size=8),
       seed=st.integers(0, 2**16))
def test_random_buffer_agrees_with_reference(capacity, batches, seed):
    """exact: ring writes (wrap, batches larger than the ring) and samples."""
    ref, var = pair(capacity, "random", seed)
    written = 0
    for n in batches:
        assert torch.equal(var.extend(rows(n, written)), ref.extend(rows(n, written)))
        written += n
        assert_same_buffers(ref, var)
        (rr, ri), (vr, vi) = ref.sample(5), var.sample(5)
        assert torch.equal(vi["index"], ri["index"]) and (vr == rr).all()


@given(capacity=st.integers(1, 30), runs=st.lists(st.integers(1, 9), min_size=1, max_size=12),
       chunk=st.integers(1, 12), fixed=st.sampled_from(["num_slices", "slice_len"]),
       strict=st.booleans(), done=st.booleans(), seed=st.integers(0, 2**16))
def test_slice_sampler_agrees_with_reference(capacity, runs, chunk, fixed, strict, done, seed):
    """exact given the same seed: same trajectories (incremental bookkeeping vs
    the reference's scan), including ring wrap and the oldest trajectory
    being overwritten, and batch sizes changing the slice length."""
    kw = {"num_slices": 2} if fixed == "num_slices" else {"slice_len": 2}
    kw.update(strict_length=strict, done_key="done" if done else None)
    ref, var = pair(capacity, "slice", seed, **kw)
    episode = torch.repeat_interleave(torch.arange(len(runs)) % 3, torch.tensor(runs))  # ids repeat
    is_done = torch.zeros(len(episode), dtype=torch.bool)
    is_done[torch.cumsum(torch.tensor(runs), 0) - 1] = True
    for start in range(0, len(episode), chunk):
        stop = min(start + chunk, len(episode))
        td = rows(stop - start, start, episode=episode[start:stop])
        td.set("done", is_done[start:stop].unsqueeze(1))
        ref.extend(td)
        var.extend(td.clone())
        for batch in (2, 4, 6):
            try:
                _, want = ref.sample(batch)
            except ValueError as error:
                with pytest.raises(ValueError, match=r"trajectories of length >= slice_len"):
                    var.sample(batch)
                note(f"both raise: {error}")
                continue
            _, got = var.sample(batch)
            assert torch.equal(got["index"], want["index"]) and torch.equal(got["traj"], want["traj"])


# ----------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["random", "prioritized", "slice"])
def test_checkpoints_cross_load_bit_for_bit(tmp_path, sampler):
    """exact: reference checkpoint -> variant -> checkpoint -> reference keeps
    every tensor's bits, plain values' types, and the next samples."""
    kw = {"slice_len": 2} if sampler == "slice" else {}
    ref, var = pair(7, sampler, seed=3, **kw)
    ref.extend(rows(10, 0, episode=torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3]),
                    priority=torch.arange(10.0) / 3))
    if sampler == "prioritized":
        ref.update_priority(torch.tensor([1, 1, 4]), torch.tensor([0.5, 2.5, 7.0]))
    ref.sample(4)  # advance the generator
    ref.dumps(tmp_path / "a")
    var.loads(tmp_path / "a")
    assert_same_buffers(ref, var)
    var.dumps(tmp_path / "b")
    back = pair(7, sampler, seed=99, **kw)[0]
    back.loads(tmp_path / "b")
    assert_state_equal(back.state_dict(), ref.state_dict())
    for _ in range(3):
        (_, want), (_, got) = ref.sample(4), var.sample(4)
        assert torch.equal(got["index"], want["index"])
        if sampler == "prioritized":
            assert torch.equal(got["weight"], want["weight"])
    # and both keep agreeing after more writes
    ref.extend(rows(3, 50, episode=torch.tensor([3, 3, 4]), priority=torch.ones(3)))
    var.extend(rows(3, 50, episode=torch.tensor([3, 3, 4]), priority=torch.ones(3)))
    assert_same_buffers(ref, var)
    assert torch.equal(var.sample(4)[1]["index"], ref.sample(4)[1]["index"])


def test_weights_formula_matches_closed_form():
    """tolerance: float32 weights vs the float64 closed form over the stored rows."""
    ref, var = pair(9, "prioritized", seed=1, alpha=0.7, beta=0.5)
    prio = torch.tensor([0.1, 2.0, 3.0, 0.0, 9.0, 1.0, 4.0, 2.5, 6.0])
    var.extend(rows(9, 0, priority=prio))
    _, info = var.sample(64)
    leaf = (prio.double() + 1e-8) ** 0.7
    p = leaf / leaf.sum()
    want = (9 * p[info["index"]]) ** -0.5 / (9 * p.min()) ** -0.5
    assert torch.allclose(info["weight"].double(), want, rtol=2 ** -23, atol=0)
    assert not math.isnan(float(info["weight"].sum()))


def test_slice_sampler_keeps_bookkeeping_without_rescanning(monkeypatch):
    """exact, and the cost claim: once built, writes (ring wrap, the oldest
    trajectory overwritten) are absorbed incrementally; a sample neither
    rescans the storage nor rebuilds the eligible list, and still matches
    the reference."""
    ref, var = pair(20, "slice", seed=7, slice_len=3)
    episode = torch.repeat_interleave(torch.arange(40), torch.tensor([1, 4, 2, 5, 3] * 8))
    ref.extend(rows(6, 0, episode=episode[:6]))
    var.extend(rows(6, 0, episode=episode[:6]))
    assert torch.equal(var.sample(6)[1]["index"], ref.sample(6)[1]["index"])  # builds the bookkeeping

    def forbidden(*args, **kwargs):
        raise AssertionError("the storage was rescanned, but should be tracked incrementally")

    monkeypatch.setattr(var.sampler, "_rebuild", forbidden)
    monkeypatch.setattr(var.sampler, "_set_eligible", forbidden)
    for start in range(6, len(episode), 5):
        stop = min(start + 5, len(episode))
        ref.extend(rows(stop - start, start, episode=episode[start:stop]))
        var.extend(rows(stop - start, start, episode=episode[start:stop]))
        (_, want), (_, got) = ref.sample(6), var.sample(6)
        assert torch.equal(got["index"], want["index"]) and torch.equal(got["traj"], want["traj"])


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "full_path"])
@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_sample_never_aliases_a_sample_still_held(sampler, fast, monkeypatch):
    """exact: a sample (rows, index, weight, generation, or a view of them)
    kept by the user is never overwritten by later samples; memory is only
    recycled once nothing refers to it any more (the full path pools each
    tensor on its own; the fast path, ``sample_fast``, one block per sample)."""
    monkeypatch.setattr(sample_fast, "ENABLED", fast)
    ref, var = pair(64, sampler, seed=0)
    var.extend(rows(64, 0, priority=torch.rand(64)))
    rows_a, info_a = var.sample(32)
    keep = {"obs": rows_a["obs"].clone(), **{k: v.clone() for k, v in info_a.items()}}
    view = rows_a["obs"][:, 1]  # only a view survives of the first sample's obs
    del rows_a
    for _ in range(6):
        var.sample(32)
    assert torch.equal(view, keep["obs"][:, 1])
    for key, value in info_a.items():
        assert torch.equal(value, keep[key]), key
    if hasattr(torch._C, "_storage_Use_Count"):  # recycled once dropped: the point of the pool
        rows_b, info_b = var.sample(32)
        pointer = rows_b["obs"].data_ptr()
        del rows_b
        if fast:  # the rows share the sample's block with its info
            del info_b
        assert var.sample(32)[0]["obs"].data_ptr() == pointer


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_one_sync_update_is_the_reference_update_or_declines(alpha):
    """exact: ``update_priority``'s off-CPU happy path (``_update_one_sync``: its
    checks read back in one synchronisation; forced on the CPU here) leaves the
    reference's trees and max priority; on every bad input it declines and
    changes nothing (the full path then raises the reference's error)."""
    capacity = 50
    ref = reference.PrioritizedSampler(capacity, alpha, 0.4)
    var = variants.PrioritizedSampler(capacity, alpha, 0.4)
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, capacity, (80,), generator=g)  # with repeats
    prio = torch.rand(80, generator=g, dtype=torch.float64) * 5
    prio[::7] = 0.0
    ref.update_priority(index, prio)
    assert var._update_one_sync(index, prio, off_cpu_only=False)
    assert torch.equal(var.sum_tree.nodes, ref.sum_tree.nodes)
    assert torch.equal(var.min_tree.nodes, ref.min_tree.nodes)
    assert var.max_priority == ref.max_priority
    low = torch.full((3,), 0.5, dtype=torch.float64)  # below the max priority: it stays
    ref.update_priority(index[:3], low)
    assert var._update_one_sync(index[:3], low, off_cpu_only=False)
    assert var.max_priority == ref.max_priority == float(prio.max())
    big = 1e308 if alpha > 1 else 1.7976931348623157e308  # overflows (alpha > 1), or at the bound
    bad = [(torch.tensor([-1, 2]), torch.tensor([1.0, 2.0])),
           (torch.tensor([0, capacity]), torch.tensor([1.0, 2.0])),
           (torch.tensor([0, 2**62]), torch.tensor([1.0, 2.0])),
           (torch.tensor([0, 1]), torch.tensor([1.0, math.nan])),
           (torch.tensor([0, 1]), torch.tensor([math.inf, 1.0])),
           (torch.tensor([0, 1]), torch.tensor([1.0, -1e-300], dtype=torch.float64)),
           (torch.tensor([0, 1]), torch.tensor([big, 1.0], dtype=torch.float64)),
           (torch.tensor([0, 1]), torch.tensor([1, 2])),  # integer priorities: the full path
           (torch.tensor([[0, 1]]), torch.tensor([[1.0, 2.0]]))]
    sums, mins, high = var.sum_tree.nodes.clone(), var.min_tree.nodes.clone(), var.max_priority
    for i, p in bad:
        assert not var._update_one_sync(i, p, off_cpu_only=False), (i, p)
        assert torch.equal(var.sum_tree.nodes, sums) and torch.equal(var.min_tree.nodes, mins)
        assert var.max_priority == high
    assert not var._update_one_sync(index, prio)  # on the CPU it leaves the work to the C path


def test_same_device_reads_cuda_as_the_current_cuda_device(monkeypatch):
    """exact: torch compares devices as written (``cuda`` != ``cuda:0``); the variants'
    device checks resolve the index first, so a sampler on ``cuda`` takes tensors on
    ``cuda:0`` for its own (the off-CPU update path once never ran for that)."""
    from rbcheck.variants.device_storage import same_device

    assert torch.device("cuda") != torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device("cuda", "cuda:1") and same_device(torch.device("cuda:1"), "cuda")
    assert not same_device("cuda", "cuda:0") and not same_device("cuda", "cpu")
    assert same_device("cpu", torch.device("cpu"))


def test_temporaries_stay_bounded_across_many_batch_sizes():
    """exact: a caller cycling through 150 batch sizes (updates on the one-call C path, and
    with generations, a third of them stale, on the full path) leaves the reference's trees,
    while the sampler keeps at most ``WORK_LIMIT`` temporaries, not a set per size for good."""
    from rbcheck.variants.vector_tree import WORK_LIMIT

    capacity = 300
    ref = reference.PrioritizedSampler(capacity, 0.6, 0.4)
    var = variants.PrioritizedSampler(capacity, 0.6, 0.4)
    g = torch.Generator().manual_seed(3)
    for n in range(1, 151):
        index = torch.randint(0, capacity, (n,), generator=g)
        prio = torch.rand(n, generator=g, dtype=torch.float64) * 4
        ref.update_priority(index, prio)
        var.update_priority(index, prio)
        generation = torch.randint(0, 3, (n,), generator=g)
        current = generation.clone()
        current[::3] += 1  # every third entry's slot was written again since: left out
        ref.update_priority(index, prio / 2, generation=generation, current_generation=current)
        var.update_priority(index, prio / 2, generation=generation, current_generation=current)
        assert len(var.work) <= WORK_LIMIT
    assert torch.equal(var.sum_tree.nodes, ref.sum_tree.nodes)
    assert torch.equal(var.min_tree.nodes, ref.min_tree.nodes)
    assert var.max_priority == ref.max_priority
