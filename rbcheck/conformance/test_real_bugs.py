"""Invariants that real replay buffers have broken (the catalogue in
docs/coverage.md), where no other property of the suite already checks them.

* every sampled slot is a live slot and the weight returned belongs to it:
  at every fill level, right after the ring became exactly full, after many
  priority updates over a wide range, over large batches and (shared
  randomness) at the extreme uniforms; info tensors on the buffer's device;
* the ring keeps exactly the last ``capacity`` rows for any batch size,
  an empty batch and batches over twice the capacity included;
* save -> load -> save (at a new path) -> load is the identity, and carrying
  on after a load behaves like carrying on without one (slices too);
* a new buffer holds nothing it was not given, even after another buffer of
  the same description was filled, saved and dropped;
* an update with a repeated slot follows one rule (the last entry wins):
  the sampling frequencies follow it (distributional), not only the leaves.
"""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_chi_square,
    assert_close,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
    weight_tolerance,
)
from rbcheck.harness.oracle import start_prioritized
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import EpisodeLayout, Field, Layout, spec_layout

#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
#: uniforms at the ends of [0, 1): where a float32 prefix search runs past the filled part
EXTREME_UNIFORMS = [0.0, 2.0**-53, 0.5, 1 - 2.0**-24, 1 - 2.0**-30, 1 - 2.0**-53]
#: priorities over twelve orders of magnitude (float32 sums lose the small ones)
WIDE = [0.0, 1e-6, 1e-3, 0.5, 1.0, 3.0, 1e3, 1e6]


def _sample(buf, k: int, trace: Trace, when: str):
    trace.op(f"rows, info = buf.sample({k})")
    try:
        return buf.sample(k)
    except Exception as err:  # noqa: BLE001 - a raising sample is the failure reported
        fail(f"buf.sample({k}) {when}", f"<raised {type(err).__name__}: {err}>",
             "a batch of live slots", trace)


def _check_batch(buf, rows, info, k: int, oracle, trace: Trace, when: str, impl) -> None:
    index = info.get("index")
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or tuple(index.shape) != (k,):
        got = f"<{getattr(index, 'dtype', type(index).__name__)}{list(getattr(index, 'shape', []))}>"
        fail(f"info['index'] {when}", got, f"torch.int64[{k}]", trace)
    n = len(buf)
    idx = index.cpu()
    bad = (idx < 0) | (idx >= n)
    if bool(bad.any()):
        fail(f"info['index'] {when}", idx[bad][:8], f"live slots in [0, len(buf)={n})", trace)
    assert_td_equal(f"sample rows {when}", rows, buf.contents()[idx], trace, check_device=False)
    if oracle is None:
        return
    weight = info.get("weight")
    if not isinstance(weight, torch.Tensor):
        fail(f"sorted(info) {when}", sorted(info), "a dict with 'weight'", trace)
    if weight.device != index.device:
        fail(f"info['weight'].device {when}", str(weight.device), f"{index.device} (info['index']'s)", trace)
    conv = impl.conventions
    tol = weight_tolerance(conv.priority_dtype, n, weight.dtype)
    assert_close(f"info['weight'] of the returned slots {when}", weight, oracle.weights(idx), trace, tol=tol)


@st.composite
def live_setups(draw):
    capacity = draw(st.integers(2, 16), label="capacity")
    chunk = draw(st.integers(1, capacity), label="rows per extend")
    alpha = draw(st.sampled_from([0.6, 1.0]), label="alpha")
    return capacity, chunk, alpha, draw(st.integers(0, 2**16), label="seed")


@pytest.mark.requires("prioritized")
@given(setup=live_setups(), data=st.data())
def test_sampled_slots_are_live_and_weights_belong_to_them(impl, setup, data):
    """exact (slots, rows) and tolerance tied to the declared dtype (weights):
    from one row to exactly full (cursor back at 0) to wrapped, after rounds
    of updates with priorities from 0 to 1e6, every sampled slot is in
    [0, len), its row is the stored row, its weight equals the closed form for
    THAT slot (over the declared normaliser; on the index's device), also in
    a batch of 2**16 draws; with shared randomness the extreme uniforms
    (0, 1 - 2**-53, ...) map to live slots too."""
    capacity, chunk, alpha, seed = setup
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=alpha, beta=0.6, eps=1e-6,
                      seed=seed, layout=LAYOUT.spec_layout())
    conv = impl.conventions
    trace, buf, oracle = start_prioritized(impl, spec, LAYOUT)
    written = 0
    for stage in range(data.draw(st.integers(2, 4), label="stages")):
        n = min(chunk, 2 * capacity - written) if written < 2 * capacity else chunk
        trace.op(f"buf.extend(layout.batch({written}, {n}))")
        buf.extend(LAYOUT.batch(written, n))
        oracle.write(n)
        written += n
        when = f"after {written} rows (capacity {capacity})"
        for _ in range(data.draw(st.integers(0, 3), label=f"update rounds {stage}")):
            if not bool((oracle.leaves() > 0).any()):
                break
            rows, info = _sample(buf, 8, trace, when)
            _check_batch(buf, rows, info, 8, oracle, trace, when, impl)
            raw = data.draw(st.lists(st.sampled_from(WIDE), min_size=8, max_size=8), label="priorities")
            index = info["index"].cpu()
            trace.op(f"buf.update_priority(torch.tensor({index.tolist()}), "
                     f"torch.tensor({raw}, dtype={conv.priority_dtype}))")
            buf.update_priority(index, conv.priorities(raw))
            oracle.update(index, raw)
        if not bool((oracle.leaves() > 0).any()):
            continue
        rows, info = _sample(buf, 8, trace, when)
        _check_batch(buf, rows, info, 8, oracle, trace, when, impl)
        if impl.has("shared_rng"):
            u = torch.tensor(EXTREME_UNIFORMS, dtype=torch.float64)
            trace.op(f"buf.indices_from_uniforms(torch.tensor({EXTREME_UNIFORMS}, dtype=torch.float64))")
            got = torch.as_tensor(buf.indices_from_uniforms(u)).cpu()
            bad = (got < 0) | (got >= len(buf))
            if bool(bad.any()):
                fail(f"indices_from_uniforms(extreme uniforms) {when}", got,
                     f"live slots in [0, len(buf)={len(buf)})", trace,
                     f"uniforms {[x for x, b in zip(EXTREME_UNIFORMS, bad.tolist(), strict=True) if b]}")
    if bool((oracle.leaves() > 0).any()):
        big = 1 << 16
        rows, info = _sample(buf, big, trace, "in a large batch")
        _check_batch(buf, rows, info, big, oracle, trace, "in a large batch", impl)


#: batch sizes as (multiple of capacity, offset): 1, cap - 1, cap, cap + 1, 2 cap, 2 cap + 1, 3 cap + 2
SIZES = {"1": (0, 1), "cap-1": (1, -1), "cap": (1, 0), "cap+1": (1, 1), "2cap": (2, 0),
         "2cap+1": (2, 1), "3cap+2": (3, 2)}
RING_SIZES = st.sampled_from(sorted(SIZES))


def _size(name: str, cap: int) -> int:
    times, offset = SIZES[name]
    return max(1, times * cap + offset)


@given(capacity=st.integers(1, 9),
       sizes=st.lists(RING_SIZES, min_size=1, max_size=5, unique=False),
       empty_first=st.booleans())
def test_ring_keeps_the_last_capacity_rows_for_any_batch_size(impl, capacity, sizes, empty_first):
    """exact: after extends of 1, capacity - 1, capacity, capacity + 1, 2 x
    capacity, more than 2 x capacity rows (in any order) the buffer holds
    exactly the last ``capacity`` rows written, slot s the newest row with
    id % capacity == s; len, cursor and write count follow; an empty batch
    is refused or ignored, and changes nothing."""
    spec = BufferSpec(capacity=capacity, sampler="random", seed=3, layout=LAYOUT.spec_layout())
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    buf = impl.make(spec)
    written = 0
    steps = (["empty"] if empty_first else []) + sizes + ["empty"]
    for step in steps:
        if step == "empty":
            before = (len(buf), buf.cursor, buf.write_count)
            trace.op(f"buf.extend(layout.batch({written}, 0))  # an empty batch")
            try:
                buf.extend(LAYOUT.batch(written, 0))
            except Exception:  # noqa: BLE001 - refusing an empty batch is allowed
                pass
            after = (len(buf), buf.cursor, buf.write_count)
            assert_same("(len, cursor, write_count) after an empty batch", after, before, trace)
        else:
            n = _size(step, capacity)
            trace.op(f"buf.extend(layout.batch({written}, {n}))  # {step} rows")
            try:
                buf.extend(LAYOUT.batch(written, n))
            except Exception as err:  # noqa: BLE001 - any batch size must be taken
                fail(f"buf.extend of {n} rows", f"{type(err).__name__}: {err}",
                     "the rows written (any batch size)", trace)
            written += n
        size = min(written, capacity)
        assert_same("buf.write_count", buf.write_count, written, trace)
        assert_same("len(buf)", len(buf), size, trace)
        assert_same("buf.cursor", buf.cursor, written % capacity, trace)
        if size:
            newest = torch.arange(written - size, written, dtype=torch.int64)
            want = torch.empty(size, dtype=torch.int64)
            want[newest % capacity] = newest
            assert_tensor_equal("buf.contents()['id'] (slot s: newest id with id % capacity == s)",
                                buf.contents()["id"].cpu(), want, trace)


def _observe(buf, spec, k: int, seedable: bool):
    """What must agree between a buffer and its reloaded copy."""
    state = {"len": len(buf), "cursor": buf.cursor, "write_count": buf.write_count}
    if len(buf):
        state["contents"] = buf.contents()
    if seedable:
        rows, info = buf.sample(k)
        state["sample rows"] = rows
        state["sample index"] = info["index"]
    return state


def _assert_same_state(what, got, want, trace) -> None:
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert_tensor_equal(f"{what}: {key}", got[key].cpu(), want[key].cpu(), trace)
        elif hasattr(want[key], "batch_size"):
            assert_td_equal(f"{what}: {key}", got[key], want[key], trace, check_device=False)
        else:
            assert_same(f"{what}: {key}", got[key], want[key], trace)


def _checkpoint_call(call, what: str, expected: str, trace: Trace) -> None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - a save or load that raises is the failure
        fail(what, f"<raised {type(err).__name__}: {err}>", expected, trace)


@pytest.mark.requires("save_load")
@pytest.mark.parametrize("sampler", ["random", "prioritized", "slice"])
def test_save_load_chain_and_carrying_on_match_no_checkpoint(impl, sampler, tmp_path):
    """exact: a buffer saved at path A and then at a NEW path B loads back
    from both with the same state, and so does the loaded buffer saved again
    (B, then over A); writing and sampling on from the reloaded buffer gives what
    the never-saved twin gives (same contents, and with a seedable generator
    the same samples), slices included (episode bookkeeping after a load)."""
    if not impl.has(sampler):
        pytest.skip(f"not declared: {sampler}")
    episodes = EpisodeLayout((3, 5, 2, 6, 4, 4, 3))
    data = episodes.batch()
    seedable = impl.conventions.seedable
    extra = {"slice_len": 2} if sampler == "slice" else {}
    spec = BufferSpec(capacity=12, sampler=sampler, seed=5, **extra, layout=spec_layout(data))
    trace = Trace(impl, spec)
    trace.let("episodes", episodes)
    trace.need("from pathlib import Path")
    trace.let("path", None, f"Path({str(tmp_path)!r})")
    twin, buf = impl.make(spec), impl.make(spec)
    for b in (twin, buf):
        b.extend(data[:9])
        b.extend(data[9:20])  # 20 rows into 12 slots: the ring has wrapped
    trace.op("buf.extend(episodes.batch()[:9]); buf.extend(episodes.batch()[9:20])")
    k = 4
    path = tmp_path
    for step, (first, second) in enumerate([("A", "B"), ("B", "A")]):
        for name in (first, second):  # a second checkpoint from the same buffer, at a new path
            trace.op(f"buf.save(path / {name!r})")
            _checkpoint_call(lambda name=name, buf=buf: buf.save(path / name), f"buf.save(path / {name!r})",
                             "a checkpoint written", trace)
        loaded = []
        for name in (second, first):
            fresh = impl.make(spec.but(seed=spec.seed + 1 + step))
            trace.op(f"buf = load_adapter({trace.adapter!r}).make({spec!r}); buf.load(path / {name!r})")
            _checkpoint_call(lambda fresh=fresh, name=name: fresh.load(path / name),
                             f"buf.load(path / {name!r}) (the buffer saved at {first!r} then {second!r})",
                             "the state just saved there", trace)
            loaded.append(fresh)
        _assert_same_state(f"loaded from {second!r} vs from {first!r}", _observe(loaded[0], spec, k, False),
                           _observe(loaded[1], spec, k, False), trace)
        buf = loaded[0]
    trace.op("buf.extend(episodes.batch()[20:])  # carry on; compare with a twin never saved")
    for b in (twin, buf):
        b.extend(data[20:])
    _assert_same_state("reloaded buffer vs never-saved twin", _observe(buf, spec, k, seedable),
                       _observe(twin, spec, k, seedable), trace)


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_new_buffer_holds_nothing_it_was_not_given(impl, sampler, tmp_path):
    """exact: after a buffer of the same description was filled (and saved,
    when save_load is declared) and dropped, or while it still lives, a new
    buffer has len 0, cursor 0, write count 0, refuses to sample, and after
    k rows holds exactly those k rows."""
    if not impl.has(sampler):
        pytest.skip(f"not declared: {sampler}")
    spec = BufferSpec(capacity=6, sampler=sampler, seed=9, layout=LAYOUT.spec_layout())
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    old = impl.make(spec)
    old.extend(LAYOUT.batch(1000, 6))
    trace.op("old = buf; old.extend(layout.batch(1000, 6))")
    if impl.has("save_load"):
        old.save(tmp_path / "old")
        trace.op(f"old.save({str(tmp_path / 'old')!r})")
    for alive in (True, False):
        if not alive:
            del old
            gc.collect()
        trace.op(f"buf = load_adapter({trace.adapter!r}).make({spec!r})  # the first buffer "
                 f"{'alive' if alive else 'dropped'}")
        buf = impl.make(spec)
        state = (len(buf), buf.cursor, buf.write_count)
        assert_same("(len, cursor, write_count) of a new buffer", state, (0, 0, 0), trace)
        try:
            buf.sample(2)
        except Exception:  # noqa: BLE001 - an empty buffer must refuse
            pass
        else:
            fail("buf.sample(2) on a new buffer", "<returned a batch>", "an error: the buffer is empty", trace)
        buf.extend(LAYOUT.batch(0, 2))
        trace.op("buf.extend(layout.batch(0, 2))")
        assert_same("len(buf)", len(buf), 2, trace)
        assert_td_equal("buf.contents()", buf.contents(), LAYOUT.batch(0, 2), trace, check_device=False)


@pytest.mark.requires("prioritized")
@pytest.mark.parametrize("case", range(3))
def test_update_with_repeated_slots_samples_by_the_last_entry(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4): after
    update_priority with a slot repeated (the last entry wins, the rule of
    the spec), slots are drawn with probability (p_last + eps)^alpha / sum:
    the tree's inner sums must follow the leaves, not the sum of every entry."""
    capacity = 6
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=1.0, beta=0.4, eps=1e-3,
                      seed=31 + case, layout=LAYOUT.spec_layout())
    conv = impl.conventions
    trace, buf, oracle = start_prioritized(impl, spec, LAYOUT, fill=capacity)
    updates = [
        ([0, 0, 1, 2, 0], [50.0, 40.0, 1.0, 2.0, 0.5]),
        ([3, 3, 3, 4, 5], [0.1, 20.0, 8.0, 1.0, 1.0]),
        ([5, 1, 5, 1, 2, 2], [30.0, 30.0, 1.0, 2.0, 9.0, 0.25]),
    ][case]
    index, raw = updates
    trace.op(f"buf.update_priority(torch.tensor({index}), torch.tensor({raw}, dtype={conv.priority_dtype}))")
    buf.update_priority(torch.tensor(index), conv.priorities(raw))
    oracle.update(torch.tensor(index), raw)
    counts = torch.zeros(capacity, dtype=torch.float64)
    for _ in range(4):
        trace.op("rows, info = buf.sample(5000)")
        _, info = buf.sample(5000)
        idx = info["index"].cpu()
        bad = (idx < 0) | (idx >= capacity)
        if bool(bad.any()):
            fail("info['index']", idx[bad][:8], f"live slots in [0, {capacity})", trace)
        counts += torch.bincount(idx, minlength=capacity).to(torch.float64)
    probs = oracle.draw_probabilities(1)[0]
    assert_chi_square("slot frequencies after an update with repeated slots", counts, probs, trace,
                      false_alarm=FALSE_ALARM)

