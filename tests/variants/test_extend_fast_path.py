"""``extend``'s fast path (rbcheck.variants.extend_fast) against the reference, bit for bit.

Each program of extends runs on three buffers: the reference, the variant with
the fast path and the variant without it. After every extend the returned
slots, the whole state (rows, generations, write count, trees, max priority)
and, at the end, the next sample (indices and weights) are the reference's,
bit for bit; a refused batch raises the reference's error and changes
nothing. The fast path is checked to be the one taken, and the comparison to
be able to fail (a fast path that drops a generation is caught).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import extend_fast, native
from rbcheck.variants.native import torch_pow
from tests.variants.common import use_library
from tests.variants.test_differential import assert_state_equal

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load: "
                                "the prioritized fast path needs it")


def flat_rows(n: int, start: int, priority=None, dtype=torch.float32) -> TensorDict:
    """Top-level keys only (the fast path's layout): obs float32[3], action int64, reward float64."""
    x = torch.arange(start, start + n)
    data = {"obs": torch.stack([x.float(), x / 3, -x.float()], 1), "action": x % 5,
            "reward": x.double() / 7}
    if priority is not None:
        data["priority"] = torch.as_tensor(priority, dtype=dtype)
    return TensorDict(data, batch_size=[n])


def three(capacity: int, sampler: str, alpha=0.6, eps=1e-8, priority_key="priority"):
    """(reference, variant with the fast path, variant without it), built alike."""
    def make(mod):
        if sampler == "prioritized":
            return mod.PrioritizedSampler(capacity, alpha, 0.4, eps)
        return mod.RandomSampler()
    ref = reference.ReplayBuffer(capacity, sampler=make(reference), generator=3, priority_key=priority_key)
    fast = variants.ReplayBuffer(capacity, sampler=make(variants), generator=3, device="cpu",
                                 priority_key=priority_key)
    slow = variants.ReplayBuffer(capacity, sampler=make(variants), generator=3, device="cpu",
                                 priority_key=priority_key)
    return ref, fast, slow


def extend_all(ref, fast, slow, data, monkeypatch):
    """Extend the three alike (``slow`` with the fast path off); the slots each returned."""
    got = [ref.extend(data.clone()), fast.extend(data.clone())]
    with monkeypatch.context() as m:
        m.setattr(extend_fast, "ENABLED", False)
        got.append(slow.extend(data.clone()))
    return got


def assert_same(ref, *variant_buffers):
    want = ref.state_dict()
    for var in variant_buffers:
        assert (len(var), var.cursor, var.write_count) == (len(ref), ref.cursor, ref.write_count)
        assert_state_equal(var.state_dict(), want)
        # the writer's generation column (not in its state: derived from the write count on load)
        assert_state_equal(var.writer.generation, ref.writer.generation, "writer.generation")


batches = st.lists(st.tuples(st.integers(1, 24),  # rows
                             st.sampled_from(["none", "float32", "float64"]),  # the priority column
                             st.lists(st.sampled_from([0.0, 1e-300, 0.5, 3.25, 1e6]) | st.floats(0, 50),
                                      min_size=24, max_size=24)),
                   min_size=1, max_size=8)


@settings(deadline=None)
@given(capacity=st.integers(1, 20), program=batches, alpha=st.sampled_from([0.0, 0.6, 1.0]),
       eps=st.sampled_from([0.0, 1e-8, 1e-3]), key=st.sampled_from(["priority", None]))
def test_prioritized_extend_is_the_reference_bit_for_bit(capacity, program, alpha, eps, key):
    monkeypatch = pytest.MonkeyPatch()
    ref, fast, slow = three(capacity, "prioritized", alpha, eps, key)
    start = 0
    for n, kind, values in program:
        # every batch carries the priority column or none does: the layout is fixed by the first
        kind = program[0][1]
        priority = None if kind == "none" else values[:n]
        data = flat_rows(n, start, priority, torch.float32 if kind == "float32" else torch.float64)
        slots = extend_all(ref, fast, slow, data, monkeypatch)
        for got in slots[1:]:
            assert torch.equal(got, slots[0]), f"slots={got.tolist()}, but should be {slots[0].tolist()}"
        assert_same(ref, fast, slow)
        start += n
    try:
        want_rows, want_info = ref.sample(7)
    except ValueError as refused:  # every stored priority 0 (eps 0), or the smallest underflows
        for var in (fast, slow):
            with pytest.raises(ValueError) as got:
                var.sample(7)
            assert str(got.value) == str(refused)
        return
    for var in (fast, slow):
        rows, info = var.sample(7)
        assert torch.equal(info["index"], want_info["index"])
        assert torch.equal(info["weight"].view(torch.int32), want_info["weight"].view(torch.int32))
        assert (rows == want_rows).all()


@settings(deadline=None)
@given(capacity=st.integers(1, 20), sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8))
def test_uniform_extend_is_the_reference_bit_for_bit(capacity, sizes):
    monkeypatch = pytest.MonkeyPatch()
    ref, fast, slow = three(capacity, "random")
    start = 0
    for n in sizes:  # n > capacity too: the full path (the last rows win)
        slots = extend_all(ref, fast, slow, flat_rows(n, start), monkeypatch)
        assert all(torch.equal(s, slots[0]) for s in slots[1:])
        assert_same(ref, fast, slow)
        start += n


#: Column layouts that reach each copy of ``rb_extend``'s row loop: 8-byte words (1, 2, 4, 8
#: and 32 of them, and 5: the generic count), 4-byte words (3, 8 and 64; 5: generic), and
#: sizes that are no multiple of 4 (bytes by memcpy).
LAYOUTS = [{"a": (torch.float64, ())}, {"a": (torch.float64, (2, 2)), "b": (torch.int64, (8,))},
           {"a": (torch.float64, (32,)), "b": (torch.float64, (5,))},
           {"obs": (torch.float32, (8,)), "action": (torch.float32, (2,)), "reward": (torch.float32, ())},
           {"obs": (torch.float32, (64,)), "reward": (torch.float32, (3,)), "n": (torch.int32, (5,))},
           {"x": (torch.uint8, (3,)), "y": (torch.bool, ()), "z": (torch.float16, (1,))}]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(
    f"{k}:{str(d).split('.')[1]}{list(s)}" for k, (d, s) in layout.items()))
def test_every_row_copy_writes_the_references_rows(layout):
    """Rows of many widths and dtypes, in batches that wrap the ring: the same rows in
    the same slots as the reference (and as the variant without the fast path)."""
    monkeypatch = pytest.MonkeyPatch()
    ref, fast, slow = three(7, "random")
    g = torch.Generator().manual_seed(5)
    for n in (3, 5, 1, 7, 6):
        data = TensorDict({k: (torch.rand((n, *shape), generator=g) * 200 - 50).to(dtype)
                           for k, (dtype, shape) in layout.items()}, batch_size=[n])
        slots = extend_all(ref, fast, slow, data, monkeypatch)
        assert all(torch.equal(s, slots[0]) for s in slots[1:])
        assert_same(ref, fast, slow)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(
    f"{k}:{str(d).split('.')[1]}{list(s)}" for k, (d, s) in layout.items()))
def test_rows_copied_block_by_block_are_the_references(layout):
    """Batches longer than one of rb_extend's blocks (128 rows), wrapping the ring inside
    a block: every row, generation and slot the reference's (blocks end mid-batch, at
    the ring's end and at the batch's end)."""
    monkeypatch = pytest.MonkeyPatch()
    ref, fast, slow = three(300, "random")
    g = torch.Generator().manual_seed(6)
    for n in (129, 257, 300, 1, 255, 128):
        data = TensorDict({k: (torch.rand((n, *shape), generator=g) * 200 - 50).to(dtype)
                           for k, (dtype, shape) in layout.items()}, batch_size=[n])
        slots = extend_all(ref, fast, slow, data, monkeypatch)
        assert all(torch.equal(s, slots[0]) for s in slots[1:])
        assert_same(ref, fast, slow)


@pytest.mark.parametrize("n", [1, 3, 100, 5000])
def test_each_extend_returns_slots_of_its_own(n):
    """Slot tensors are made ahead in batches (``_Plan.slots``): each extend's is its own
    memory, never written by a later extend, and holds exactly its slots."""
    _, fast, _ = three(8192, "random")
    fast.extend(flat_rows(1, 0))
    returned = [(fast.extend(flat_rows(n, 10)), 1 + i * n) for i in range(70)]
    for index, first in returned:
        assert index.dtype == torch.int64 and index.shape == (n,)
        assert torch.equal(index, torch.arange(first, first + n) % 8192)
    addresses = {index.data_ptr() for index, _ in returned}
    assert len(addresses) == len(returned)


def test_a_large_batchs_slots_shared_with_another_process_are_never_reused():
    """Slots sent through a ``torch.multiprocessing`` queue are moved into shared memory in
    place; once the sender drops them the reference count looks free, but the receiver may
    still read them: the next extend of that size must write elsewhere."""
    _, fast, _ = three(8192, "random")
    fast.extend(flat_rows(1, 0))
    sent = fast.extend(flat_rows(3000, 1))
    sent.share_memory_()  # what the queue does to a tensor it sends
    shared = sent.untyped_storage().data_ptr()
    del sent  # the sender is done with it; the receiver's mapping is not counted here
    later = fast.extend(flat_rows(3000, 5000))
    assert later.untyped_storage().data_ptr() != shared and not later.is_shared()


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_a_large_batchs_slots_reuse_memory_only_once_its_caller_dropped_it(sampler, monkeypatch):
    """A batch too large to make ahead (``_Plan.slots``) gets the memory an earlier extend of
    its size returned once nothing refers to it (no fresh pages from the OS), and other
    memory while a caller still holds it or a view of it: a caller's slots never change."""
    ref, fast, slow = three(8192, sampler)
    n = 3000

    def extend(i):
        data = flat_rows(n, i, [1.0 + k % 7 for k in range(n)])
        ref.extend(data.clone())
        return fast.extend(data)

    def pooled():
        return [t.untyped_storage().data_ptr() for ts in fast.storage._extend_plan.large.slots.values() for t in ts]

    def slots(i):
        return torch.arange(i * n, (i + 1) * n) % 8192

    extend_all(ref, fast, slow, flat_rows(n, 0, [1.0] * n), monkeypatch)  # allocates the rows (full path)
    held = extend(1)
    view = extend(2)[5:9]
    assert len(pooled()) == 2 and view.untyped_storage().data_ptr() in pooled()
    del view  # its memory is free again
    again = extend(3)
    assert again.untyped_storage().data_ptr() in pooled() and torch.equal(again, slots(3))
    view = again[1:3]
    del again  # the view still holds it
    other = extend(4)
    assert other.untyped_storage().data_ptr() not in pooled() and torch.equal(other, slots(4))
    assert torch.equal(held, slots(1)) and torch.equal(view, slots(3)[1:3])  # never written since
    assert_same(ref, fast)


def test_slots_made_ahead_outlive_other_batch_sizes():
    """Slot tensors made ahead for one batch size are still there after extends of other
    sizes, a large one included (from the plan's pool, not made ahead): interleaved sizes,
    as between an agent's single steps and its bulk loads, do not remake the batch every
    time."""
    _, fast, _ = three(8192, "random")
    fast.extend(flat_rows(1, 0))  # allocates the rows (the full path)
    fast.extend(flat_rows(1, 1))
    left = len(fast.storage._extend_plan.free[1])
    for n in (3000, 256, 4096, 7, 2):
        fast.extend(flat_rows(n, 10))
        fast.extend(flat_rows(1, 10))
        left -= 1
        assert len(fast.storage._extend_plan.free[1]) == left, n


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_the_fast_path_is_taken(sampler, monkeypatch):
    """After the first write (which allocates), a batch of the storage's layout never
    reaches the full path (whose first step is the storage's check)."""
    _, fast, _ = three(8, sampler)
    fast.extend(flat_rows(3, 0, [1.0, 2.0, 3.0]))
    taken = []
    real = extend_fast.try_extend
    monkeypatch.setattr("rbcheck.variants.buffer.try_extend",
                        lambda b, d: taken.append(real(b, d)) or taken[-1])
    monkeypatch.setattr(fast.storage, "check", lambda data: pytest.fail("the full path ran"))
    for n in (1, 5, 8):
        fast.extend(flat_rows(n, 10, [0.5] * n))
    assert len(taken) == 3 and all(t is not None for t in taken)


BAD = {
    "negative priority": lambda: flat_rows(2, 50, [1.0, -1.0]),
    "nan priority": lambda: flat_rows(2, 50, [float("nan"), 1.0]),
    "inf priority": lambda: flat_rows(2, 50, [float("inf"), 1.0]),
    "overflowing transform": lambda: flat_rows(1, 50, [1.7e308], torch.float64),
    "priority of the wrong length": lambda: TensorDict(
        {**flat_rows(2, 50).to_dict(), "priority": torch.ones(2, 2)}, batch_size=[2]),
    "missing key": lambda: flat_rows(2, 50, [1.0, 2.0]).exclude("action"),
    "extra key": lambda: flat_rows(2, 50, [1.0, 2.0]).set("extra", torch.zeros(2)),
    "wrong dtype": lambda: flat_rows(2, 50, [1.0, 2.0]).set("action", torch.zeros(2, dtype=torch.int32)),
    "wrong row shape": lambda: flat_rows(2, 50, [1.0, 2.0]).set("obs", torch.zeros(2, 4)),
    "nested batch": lambda: flat_rows(4, 50, [1.0] * 4).reshape(2, 2),
}


@pytest.mark.parametrize("alpha", [1.0, 1.3])  # torch's pow after rb_extend_prepare; the C pow, one call
@pytest.mark.parametrize("case", sorted(BAD))
def test_refused_batches_raise_the_reference_error_and_change_nothing(case, alpha, monkeypatch):
    ref, fast, slow = three(6, "prioritized", alpha=alpha)
    extend_all(ref, fast, slow, flat_rows(4, 0, [1.0, 2.0, 3.0, 4.0]), monkeypatch)
    before = ref.state_dict()
    errors = []
    for buf in (ref, fast):
        with pytest.raises(Exception) as info:  # noqa: B017 - compared below
            buf.extend(BAD[case]())
        errors.append((type(info.value), str(info.value)))
    assert errors[1] == errors[0]
    assert_state_equal(ref.state_dict(), before)
    assert_same(ref, fast)


def test_the_comparison_catches_a_fast_path_that_drops_a_generation(monkeypatch):
    """A control that the bit-for-bit comparison can fail: the torch copies of the fast
    path (taken without the native library) whose writer forgets the generation of the
    batch's last slot are caught."""
    ref, fast, slow = three(8, "random")
    extend_all(ref, fast, slow, flat_rows(3, 0), monkeypatch)
    real = extend_fast.ring_slices

    def short(first, n, capacity):
        return [(s0, s1 - 1 if s1 - s0 > 1 else s1, r0, r1 - 1 if r1 - r0 > 1 else r1)
                for s0, s1, r0, r1 in real(first, n, capacity)]

    monkeypatch.setattr(extend_fast, "ring_slices", short)
    ref.extend(flat_rows(4, 3))
    with native.suspended():
        fast.extend(flat_rows(4, 3))
    with pytest.raises(AssertionError, match="generation|rows|storage"):
        assert_same(ref, fast)


def _whole(lib, args):
    """``rb_extend_whole`` as its two calls, made through ``lib`` (a mutant of either runs)."""
    fields = native.EXTEND_ARGS.unpack(ctypes.string_at(args, native.EXTEND_ARGS.size))
    if fields[8] and not lib.rb_extend_prepare(args):  # trees (sum): the priorities first
        return 3
    return lib.rb_extend(args)


class _BrokenExtend:
    """The native library with an ``rb_extend`` that writes everything but the last
    row's generation (which keeps its old value): a broken C version."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rb_extend(self, args):
        _, _, capacity, first, n, _, generation, *_ = native.EXTEND_ARGS.unpack(
            ctypes.string_at(args, native.EXTEND_ARGS.size))
        slot = ctypes.c_int64.from_address(generation + 8 * ((first + n - 1) % capacity))
        old = slot.value
        code = self._lib.rb_extend(args)
        slot.value = old
        return code

    def rb_extend_whole(self, args):
        return _whole(self, args)


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_the_comparison_catches_a_native_extend_that_drops_a_generation(sampler, monkeypatch):
    """The same control for the one native call (``rb_extend``): a C version that forgets
    the generation of the batch's last slot is caught, and only it (the real one passes)."""
    ref, fast, slow = three(8, sampler)
    extend_all(ref, fast, slow, flat_rows(3, 0, [1.0, 2.0, 3.0]), monkeypatch)
    ref.extend(flat_rows(4, 3, [1.0] * 4))
    use_library(monkeypatch, _BrokenExtend(native.lib()))
    calls = []
    real = native._state["lib"].rb_extend
    monkeypatch.setattr(native._state["lib"], "rb_extend", lambda *a: calls.append(a) or real(*a),
                        raising=False)
    fast.extend(flat_rows(4, 3, [1.0] * 4))
    assert calls, "the native extend did not run"
    with pytest.raises(AssertionError, match=r"writer\.generation="):
        assert_same(ref, fast)
    monkeypatch.undo()
    slow.extend(flat_rows(4, 3, [1.0] * 4))
    assert_same(ref, slow)


@settings(deadline=None, max_examples=30)
@given(capacity=st.sampled_from([64, 65, 100, 257, 600]),
       program=st.lists(st.tuples(st.sampled_from(["extend", "update"]), st.integers(1, 700),
                                  st.integers(0, 2**16)), min_size=1, max_size=8))
def test_trees_deep_enough_for_shadow_levels_stay_the_references(capacity, program):
    """Trees of depth >= 6 have shadow levels (left stale by the native updates): extends
    (``rb_update_range``: each ancestor of the range once) mixed with ``update_priority``
    (``rb_update``) leave every node, once read, the reference's bit for bit."""
    monkeypatch = pytest.MonkeyPatch()
    ref, fast, slow = three(capacity, "prioritized")
    extend_all(ref, fast, slow, flat_rows(capacity, 0, [1.0] * capacity), monkeypatch)
    start = capacity
    for op, n, seed in program:
        g = torch.Generator().manual_seed(seed)
        if op == "extend":
            n = min(n, capacity)
            extend_all(ref, fast, slow, flat_rows(n, start, torch.rand(n, generator=g) * 5), monkeypatch)
            start += n
        else:
            index = torch.randint(0, capacity, (n,), generator=g)
            priority = torch.rand(n, generator=g, dtype=torch.float64) * 5
            for buf in (ref, fast, slow):
                buf.update_priority(index, priority)
        for var in (fast, slow):
            for tree in ("sum_tree", "min_tree"):
                got, want = getattr(var.sampler, tree).nodes, getattr(ref.sampler, tree).nodes
                assert torch.equal(got.view(torch.int64), want.view(torch.int64)), f"{tree} after {op}"
        assert_same(ref, fast, slow)


def c_transform(raw: torch.Tensor, alpha: float, eps: float) -> torch.Tensor:
    """``rb_extend_prepare``'s transform of float64 raw priorities with the C pow
    (``rb_pow_like_torch`` and torch's vector pow)."""
    n = len(raw)
    out, high = torch.empty(n, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    block = native.EXTEND_ARGS.pack(0, 0, 1, 0, n, 0, 0, 0, 0, 0, 0, out.data_ptr(), 0, high.data_ptr(),
                                    high.data_ptr(), raw.data_ptr(), 0, eps, 1, alpha,
                                    torch_pow.vector_pow() or 0)
    args = ctypes.create_string_buffer(block, len(block))
    assert native.lib().rb_extend_prepare(ctypes.addressof(args))
    return out


def test_the_transform_in_c_is_torchs_bit_for_bit():
    """Extends transform their priorities in C, as torch's pow computes them (its vector pow
    for the pairs of vectors, libm's for the rest): the same bits as torch's
    ``(p + eps) ** alpha`` for many lengths, magnitudes and exponents; exponents torch
    special-cases never take that path; and extends take it and keep the reference's trees."""
    if not torch_pow.agrees(0.6):
        pytest.skip("torch's pow is not done in C here (capability "
                    f"{torch.backends.cpu.get_cpu_capability()}, or no native library)")
    for special in torch_pow.SPECIAL:
        assert not torch_pow.agrees(special)
    g = torch.Generator().manual_seed(7)
    raw = torch.cat([torch.rand(300, generator=g, dtype=torch.float64) * 5,
                     torch.exp(torch.randn(300, generator=g, dtype=torch.float64) * 40), torch.zeros(1)])
    for alpha, eps in [(0.6, 1e-8), (0.4, 1e-8), (1.3, 0.0), (0.77, 1e-3)]:
        assert torch_pow.agrees(alpha)
        for n in (1, 7, 8, 9, 17, 256, 601):
            x = raw.roll(n)[:n].contiguous()
            want, got = (x + eps) ** alpha, c_transform(x, alpha, eps)
            assert torch.equal(got.view(torch.int64), want.view(torch.int64)), f"n={n}, alpha={alpha}"
    ref, fast, _ = three(64, "prioritized", alpha=0.6)
    for n in (1, 9, 40, 3):
        data = flat_rows(n, 0, raw[:n].tolist(), torch.float64)
        ref.extend(data)
        fast.extend(data)
        raw = raw.roll(n)
    assert fast.storage._extend_plan.c_pow
    want = ref.sampler.sum_tree.nodes
    assert torch.equal(fast.sampler.sum_tree.nodes.view(torch.int64), want.view(torch.int64))
    assert_same(ref, fast)


def test_update_priority_transforms_in_c_bit_for_bit(monkeypatch):
    """``update_priority`` transforms its priorities in C too (``update_whole``: checks, pow,
    trees and max priority in one call):
    the C path taken, the trees the reference's bit for bit; and with libm's pow for every
    element (as if torch's kernel had no vector pow) the trees differ: the comparison sees a
    pow that assigns elements to the wrong function."""
    if not torch_pow.agrees(0.6) or not torch_pow.vector_pow():
        pytest.skip("torch's pow is not done in C with a vector pow here (capability "
                    f"{torch.backends.cpu.get_cpu_capability()}, or no native library)")
    g = torch.Generator().manual_seed(8)
    index = torch.randperm(4096, generator=g)[:2003]  # distinct slots, an odd count (a vector tail)
    priority = torch.exp(torch.randn(len(index), generator=g, dtype=torch.float64) * 3)

    def run(vector):
        ref, fast, _ = three(4096, "prioritized", alpha=0.6)
        for buf in (ref, fast):
            buf.extend(flat_rows(4096, 0, [1.0] * 4096))
        calls = []
        real = native._state["calls"].update_whole  # what every path's update calls (update_fast's too)
        monkeypatch.setattr(native._state["calls"], "update_whole", lambda *a: calls.append(a[10]) or real(*a))
        monkeypatch.setattr(torch_pow, "_state", {**torch_pow._state, "vector": vector})
        for buf in (ref, fast):
            buf.update_priority(index, priority)
        monkeypatch.undo()
        got, want = fast.sampler.sum_tree.nodes, ref.sampler.sum_tree.nodes
        return calls, torch.equal(got.view(torch.int64), want.view(torch.int64))

    calls, same = run(torch_pow.vector_pow())
    assert calls == [torch_pow.vector_pow()] and same  # one call, the pow in C with torch's vector pow
    calls, same = run(0)
    assert calls == [0] and not same


def test_a_capability_without_a_known_vector_pow_keeps_torchs_pow(monkeypatch):
    """Where rbcheck does not know which vector pow torch's kernel calls (another CPU),
    the C pow is never used: ``vector_pow()`` is None, no exponent agrees, and extends
    still give the reference's bits through torch's ``pow``. DEFAULT (no vector unit)
    means libm throughout (0), still subject to the probe; AVX2 and AVX512 name SLEEF's
    functions of 4 and 8 doubles, which torch's library holds."""
    for capability, want in (("SVE256", None), ("DEFAULT", 0), ("AVX2", int), ("AVX512", int)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        got = torch_pow._find_vector_pow()
        assert (type(got) is int and got > 0) if want is int else got == want, capability
    monkeypatch.undo()
    monkeypatch.setattr(torch_pow, "_state", {"vector": None})
    assert not torch_pow.agrees(0.6) and not torch_pow.in_c(9, 0.6)
    ref, fast, _ = three(16, "prioritized", alpha=0.6)
    for n in (1, 9, 1, 9):
        data = flat_rows(n, 0, [0.25 * (i + 1) for i in range(n)])
        for buf in (ref, fast):
            buf.extend(data)
    assert not fast.storage._extend_plan.c_pow
    assert_same(ref, fast)


def test_the_probe_refuses_a_pow_whose_elements_take_the_wrong_function():
    """``torch_pow.agrees`` can fail: libm's pow for every element (no vector pow) differs from
    torch's on the probe wherever torch's kernel has a vector pow to call, and a probe
    given that pow refuses it."""
    if not torch_pow.vector_pow():
        pytest.skip("torch's kernel calls no vector pow here: libm's throughout is its pow")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(torch_pow, "_state", {"vector": 0})
    try:
        assert not torch_pow.agrees(0.6)
    finally:
        monkeypatch.undo()
    assert torch_pow.agrees(0.6)


def test_a_vector_pow_pair_outlives_the_state_that_made_it(monkeypatch):
    """An extend plan keeps the pair's address for its buffer's life: a pair is made once per
    (function, lanes) and never freed, so replacing ``torch_pow``'s state (as tests do)
    leaves every address handed out valid, and a second lookup hands out the same one."""
    if not torch_pow.vector_pow():
        pytest.skip("torch's kernel calls no vector pow here")
    before = torch_pow.vector_pow()
    monkeypatch.setattr(torch_pow, "_state", {})
    again = torch_pow.vector_pow()
    monkeypatch.undo()
    import gc
    gc.collect()
    assert again == before
    held = torch_pow.VectorPow.from_address(before)
    assert held.fn == torch_pow._find_vector_pow() and held.lanes in (4, 8)


def test_the_probe_refuses_a_vector_pow_of_the_wrong_width(monkeypatch):
    """With AVX512, torch's kernel calls SLEEF's 8-double pow for the first ``n - n % 16``
    elements and libm's for the rest. The 4-double pow over ``n - n % 8`` elements (what
    an AVX2 kernel does) takes some of them through the wrong function: the probe refuses
    it, and the 8-double pair it agrees with is the one in use."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not torch_pow.vector_pow():
        pytest.skip("torch's kernels here are not AVX512's (capability "
                    f"{torch.backends.cpu.get_cpu_capability()})")
    assert torch_pow.VectorPow.from_address(torch_pow.vector_pow()).lanes == 8 and torch_pow.agrees(0.6)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    narrow = torch_pow.pair(torch_pow._find_vector_pow(), 4)
    monkeypatch.undo()
    monkeypatch.setattr(torch_pow, "_state", {"vector": ctypes.addressof(narrow)})
    assert not torch_pow.agrees(0.6)


class _OneUlpOff:
    """The native library with an ``rb_extend_prepare`` whose C transform is one ulp off."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rb_extend_prepare(self, args):
        fields = native.EXTEND_ARGS.unpack(ctypes.string_at(args, native.EXTEND_ARGS.size))
        ok = self._lib.rb_extend_prepare(args)
        if fields[18]:  # do_pow
            value = ctypes.c_int64.from_address(fields[11])
            value.value += 1
        return ok

    def rb_extend_whole(self, args):
        return _whole(self, args)


def test_a_c_transform_that_differs_from_torchs_is_caught(monkeypatch):
    """Control: were the C transform one ulp off torch's, the comparison with the
    reference fails (and with torch's pow kept, it passes)."""
    use_library(monkeypatch, _OneUlpOff(native.lib()))
    ref, fast, _ = three(4, "prioritized")
    monkeypatch.setattr(torch_pow, "agrees", lambda exponent: False)
    for buf in (ref, fast):
        buf.extend(flat_rows(2, 0, [1.0, 2.0]))
    assert_same(ref, fast)  # torch's pow
    monkeypatch.setattr(torch_pow, "agrees", lambda exponent: True)
    fast.storage._extend_plan = None
    ref.extend(flat_rows(1, 3, [0.9]))
    fast.extend(flat_rows(1, 3, [0.9]))
    with pytest.raises(AssertionError, match="sampler"):
        assert_same(ref, fast)


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_concurrent_extends_keep_the_native_block_consistent(sampler):
    """The native calls release the GIL and read one argument block per storage: extends
    from several threads take turns (the storage's ``extend_lock``), so each writes its own
    rows and slots and the count adds up (no torn block: no stray write, no crash)."""
    _, fast, _ = three(64, sampler)
    fast.extend(flat_rows(1, 0, [1.0]))
    slots: list = []

    def work(t):
        for i in range(100):
            slots.append(fast.extend(flat_rows(1, 1000 * t + i, [0.5])).tolist())

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fast.write_count == 401
    assert sorted(s for (s,) in slots) == sorted((1 + i) % 64 for i in range(400))
    written = {0} | {1000 * t + i for t in range(4) for i in range(100)}
    assert set(fast.storage.data["obs"][:, 0].long().tolist()) <= written


class _MeetingExtend:
    """The native library with an ``rb_extend`` that first waits for the other thread (``meet``)."""

    def __init__(self, lib, meet):
        self._lib, self._meet = lib, meet

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rb_extend(self, args):
        self._meet()
        return self._lib.rb_extend(args)


@pytest.mark.parametrize("path,sampler", [("native", "prioritized"), ("torch", "random"),
                                          ("full", "prioritized")])
def test_two_extends_that_would_interleave_take_turns(path, sampler, monkeypatch):
    """Every extend path (the native one, whose first call builds the storage's plan; the
    torch copies; the full path) holds one lock per storage from before it reads the
    write count and cursor until it has moved them. Forced: at each point where another
    extend could slip in, a thread waits for the other (a ``Barrier``); while the lock is
    held the other never comes, the wait times out and the extend goes on. Unlocked (or
    with two plans, each with its own lock) both read the same count: a lost extend."""
    _, fast, _ = three(8, sampler)
    fast.extend(flat_rows(1, 0, [1.0]))  # allocates (the full path): no plan yet
    barrier = threading.Barrier(2, timeout=0.5)

    def meet():
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()

    def meeting(real):
        return lambda *args: (meet(), real(*args))[1]

    monkeypatch.setattr(extend_fast._Plan, "__init__", meeting(extend_fast._Plan.__init__))
    use_library(monkeypatch, _MeetingExtend(native.lib(), meet))
    monkeypatch.setattr(extend_fast, "ring_slices", meeting(extend_fast.ring_slices))
    monkeypatch.setattr(fast.writer, "next_indices", meeting(fast.writer.next_indices))
    monkeypatch.setattr(extend_fast, "ENABLED", path != "full")
    slots, errors = {}, []

    def work(t):
        try:
            slots[t] = fast.extend(flat_rows(1, 10 * t, [0.5])).tolist()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    with native.suspended() if path == "torch" else contextlib.nullcontext():
        threads = [threading.Thread(target=work, args=(t,)) for t in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors
    assert fast.write_count == 3
    assert sorted(slots.values()) == [[1], [2]]
    for t, (slot,) in slots.items():
        assert fast.storage.data["obs"][slot, 0] == 10 * t, f"slot {slot} lost thread {t}'s row"
