"""How sampling picks slots: frequencies against closed-form probabilities
(distributional), index mapping under shared uniforms (exact given shared
randomness), importance weights (tolerance) and stale priority updates
(exact).

Distributional checks are seeded (the buffer's generator) and use Pearson's
chi-square with a false-alarm rate of FALSE_ALARM = 1e-4 per case: a correct
implementation fails a given case with probability 1e-4 for a random seed,
and with a fixed seed a given implementation either always passes or always
fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_binomial,
    assert_chi_square,
    assert_close,
    assert_same,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.stateful import PRIORITY_RTOL, WEIGHT_RTOL, declared_samplers, model_weights, replay
from rbcheck.harness.strategies import (
    EpisodeLayout,
    Field,
    Layout,
    alphas,
    epsilons,
    layouts,
    operations,
    priorities,
    specs,
)

#: probability that one case fails on a correct implementation (stated per case)
FALSE_ALARM = 1e-4
DRAWS = 20_000
LAYOUT = Layout((Field(("obs",), (2,), "float32"), Field(("next", "obs"), (2,), "float32")))


def _draw_counts(
    buf, size: int, trace: Trace, draws: int = DRAWS, batch: int = 5_000
) -> torch.Tensor:
    counts = torch.zeros(size, dtype=torch.float64)
    for _ in range(draws // batch):
        trace.op(f"rows, info = buf.sample({batch})")
        _, info = buf.sample(batch)
        counts += torch.bincount(info["index"].cpu(), minlength=size)[:size].to(torch.float64)
    return counts


@pytest.mark.requires("random")
@pytest.mark.parametrize("capacity,written", [(1, 3), (7, 5), (10, 23), (33, 33)])
def test_uniform_sampling_matches_closed_form(impl, capacity, written):
    """distributional (chi-square, false-alarm rate 1e-4): each stored row is
    drawn with probability 1 / len(buf); slots never written are never drawn."""
    spec = BufferSpec(capacity=capacity, sampler="random", seed=12345 + capacity)
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    buf = impl.make(spec)
    trace.op(f"buf.extend(...)  # {written} rows, {min(capacity, written)} at a time")
    done = 0
    while done < written:
        n = min(capacity, written - done)
        buf.extend(LAYOUT.batch(done, n))
        done += n
    size = min(capacity, written)
    counts = _draw_counts(buf, capacity, trace)
    probs = torch.zeros(capacity, dtype=torch.float64)
    probs[:size] = 1.0 / size
    assert_chi_square("slot frequencies", counts, probs, trace, false_alarm=FALSE_ALARM)


PRIORITIZED_CASES = [
    # capacity, alpha, eps, raw priorities set by update (None: writer default)
    (8, 0.6, 1e-8, [0.0, 1.0, 2.0, 3.0, 0.5, 10.0, 0.0, 4.0]),
    (8, 1.0, 0.0, [0.0, 1.0, 0.0, 3.0, 0.0, 10.0, 0.0, 0.25]),  # eps=0: zeros never drawn
    (5, 0.0, 1e-6, [0.0, 100.0, 1.0, 2.0, 3.0]),  # alpha=0: uniform
    (16, 0.5, 1e-2, [float(i % 5) for i in range(16)]),
    (6, 0.7, 1e-8, None),
]


@pytest.mark.requires("prioritized")
@pytest.mark.parametrize("case", range(len(PRIORITIZED_CASES)))
def test_prioritized_sampling_matches_closed_form(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4): slot i is drawn with
    probability (p_i + eps)^alpha / sum_j (p_j + eps)^alpha; a slot whose
    stored priority is exactly 0 (p = 0, eps = 0) is never drawn (exact)."""
    capacity, alpha, eps, raw = PRIORITIZED_CASES[case]
    spec = BufferSpec(
        capacity=capacity, sampler="prioritized", alpha=alpha, beta=0.4, eps=eps, seed=99 + case
    )
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    buf = impl.make(spec)
    trace.op(f"buf.extend(layout.batch(0, {capacity}))")
    buf.extend(LAYOUT.batch(0, capacity))
    if raw is not None:
        trace.op(
            f"buf.update_priority(torch.arange({capacity}), torch.tensor({raw}, dtype=torch.float64))"
        )
        buf.update_priority(torch.arange(capacity), torch.tensor(raw, dtype=torch.float64))
    else:
        raw = [1.0] * capacity
    leaves = (torch.tensor(raw, dtype=torch.float64) + eps) ** alpha
    counts = _draw_counts(buf, capacity, trace)
    assert_chi_square(
        "slot frequencies", counts, leaves / leaves.sum(), trace, false_alarm=FALSE_ALARM
    )


SLICE_CASES = [
    # episode lengths, capacity, slice_len
    ((5, 2, 7, 3, 4), 21, 3),  # the first episode is cut by eviction, the ring wraps
    ((4, 4, 4), 12, 2),
    ((9, 1, 6), 16, 4),
]


@pytest.mark.requires("slice")
@pytest.mark.parametrize("case", range(len(SLICE_CASES)))
def test_slice_sampling_matches_closed_form(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4): a slice starts at a
    given slot with probability sum over eligible episodes t containing a
    valid start there of 1/E * 1/(len_t - slice_len + 1) (episode uniform
    among the E eligible, start uniform within it)."""
    lengths, capacity, slice_len = SLICE_CASES[case]
    layout = EpisodeLayout(lengths)
    spec = BufferSpec(
        capacity=capacity, sampler="slice", slice_len=slice_len, strict_length=True, seed=7 + case
    )
    trace = Trace(impl, spec)
    trace.let("episodes", layout)
    buf = impl.make(spec)
    data = layout.batch()
    for start in range(0, layout.total, capacity):
        trace.op(f"buf.extend(episodes.batch()[{start}:{start + capacity}])")
        buf.extend(data[start : start + capacity])
    runs = [r for r in layout.surviving(capacity) if len(r) >= slice_len]
    probs = torch.zeros(capacity, dtype=torch.float64)
    for r in runs:
        starts = len(r) - slice_len + 1
        for o in range(starts):
            probs[r[o] % capacity] += 1.0 / len(runs) / starts
    counts = torch.zeros(capacity, dtype=torch.float64)
    batch = 1000 * slice_len
    for _ in range(DRAWS // 1000):
        trace.op(f"rows, info = buf.sample({batch})")
        _, info = buf.sample(batch)
        first = info["index"].cpu()[::slice_len]
        counts += torch.bincount(first, minlength=capacity)[:capacity].to(torch.float64)
    assert_chi_square("slice start frequencies", counts, probs, trace, false_alarm=FALSE_ALARM)


@pytest.mark.requires("slice")
@pytest.mark.parametrize("strict", [False, True])
def test_short_episodes_are_sliced_only_without_strict_length(impl, strict):
    """distributional (binomial, false-alarm rate 1e-4) and exact: with
    episodes of lengths 2, 6, 6 and slice_len 4, the short episode is picked
    for a slice with probability 1/3 when strict_length=False (as a slice of
    its 2 rows) and never (probability 0) when strict_length=True."""
    layout = EpisodeLayout((2, 6, 6))
    spec = BufferSpec(capacity=14, sampler="slice", slice_len=4, strict_length=strict, seed=21)
    trace = Trace(impl, spec)
    trace.let("episodes", layout)
    buf = impl.make(spec)
    trace.op("buf.extend(episodes.batch())")
    buf.extend(layout.batch())
    short = slices = 0
    for _ in range(20):
        trace.op("rows, info = buf.sample(400)")
        rows, _ = buf.sample(400)
        episode = rows["episode"].cpu().tolist()
        p = 0
        while p < len(episode):
            m = 2 if episode[p] == 0 else 4
            short += episode[p] == 0
            slices += 1
            p += m
    assert_binomial(
        "slices from the 2-row episode",
        short,
        slices,
        0.0 if strict else 1 / 3,
        trace,
        false_alarm=FALSE_ALARM,
    )


@pytest.mark.requires("prioritized")
@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_weights_are_normalised_over_the_buffer_not_the_batch(impl, beta):
    """tolerance (float32 result vs float64 closed form, rtol 2e-6): weight_i
    = (P_i / P_min) ** -beta with P_min the smallest positive probability
    over ALL stored rows -- here a rarely drawn slot -- not over the batch."""
    capacity = 64
    spec = BufferSpec(
        capacity=capacity, sampler="prioritized", alpha=1.0, beta=beta, eps=1e-3, seed=5
    )
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    buf = impl.make(spec)
    raw = torch.tensor(
        [0.0] + [1.0 + (i * 7 % 10) for i in range(1, capacity)], dtype=torch.float64
    )
    trace.op(
        f"buf.extend(layout.batch(0, {capacity})); buf.update_priority(torch.arange({capacity}), raw)"
    )
    buf.extend(LAYOUT.batch(0, capacity))
    buf.update_priority(torch.arange(capacity), raw.clone())
    leaves = (raw + spec.eps) ** spec.alpha
    for _ in range(5):
        trace.op("rows, info = buf.sample(8)")
        _, info = buf.sample(8)
        index = info["index"].cpu()
        want = model_weights(leaves, index, beta)
        assert_close("info['weight']", info["weight"], want, trace, rtol=WEIGHT_RTOL, atol=1e-7)


@pytest.mark.requires("shared_rng")
@given(data=st.data())
def test_same_uniforms_give_same_indices_as_reference(impl, reference_impl, data):
    """exact given shared randomness: after the same writes and priority
    updates, indices_from_uniforms(u) of the implementation equals the
    reference's for the same float64 uniforms u (random and prioritized)."""
    spec = data.draw(specs(declared_samplers(impl)), label="spec")
    layout = data.draw(layouts(max_fields=2), label="layout")
    ops = data.draw(
        operations(spec.capacity, prioritized=spec.sampler == "prioritized"), label="operations"
    )
    u = data.draw(
        st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=16), label="uniforms"
    )
    trace = Trace(impl, spec)
    trace.let("layout", layout)
    buf, ref = impl.make(spec), reference_impl.make(spec)
    replay(buf, layout, ops, trace)
    replay(ref, layout, ops, Trace(reference_impl, spec))
    if spec.sampler == "prioritized":
        # the two sampled different slots; give both the same priorities
        n = len(ref)
        raw = data.draw(st.lists(priorities(), min_size=n, max_size=n), label="priorities")
        if max(raw) == 0.0:
            raw[0] = 1.0
        pri = torch.tensor(raw, dtype=torch.float64)
        trace.op(
            f"buf.update_priority(torch.arange({n}), torch.tensor({raw}, dtype=torch.float64))"
        )
        buf.update_priority(torch.arange(n), pri.clone())
        ref.update_priority(torch.arange(n), pri.clone())
    uu = torch.tensor(u, dtype=torch.float64)
    trace.op(f"buf.indices_from_uniforms(torch.tensor({u}, dtype=torch.float64))")
    got = buf.indices_from_uniforms(uu.clone())
    assert_tensor_equal(
        "indices_from_uniforms(u)",
        torch.as_tensor(got).cpu(),
        ref.indices_from_uniforms(uu.clone()).cpu(),
        trace,
    )


@st.composite
def stale_setups(draw):
    capacity = draw(st.integers(2, 10), label="capacity")
    spec = BufferSpec(
        capacity=capacity,
        sampler="prioritized",
        alpha=draw(alphas(), label="alpha"),
        beta=0.5,
        eps=draw(epsilons(), label="eps"),
        seed=draw(st.integers(0, 2**16), label="seed"),
    )
    k = draw(st.integers(1, 8), label="batch size")
    overwrite = draw(st.integers(1, capacity), label="rows written after sampling")
    raw = draw(st.lists(priorities(), min_size=k, max_size=k), label="raw priorities")
    return spec, k, overwrite, raw


@pytest.mark.requires("prioritized", "priority_readback", "stale_updates")
@given(setup=stale_setups())
def test_stale_priority_updates_are_ignored(impl, setup):
    """exact (float64 pow, up to last-ulp rounding): update_priority(index,
    p, generation) from a sample taken BEFORE some slots were overwritten
    leaves the overwritten slots at the priority their new row got, updates
    the others ((p + eps) ** alpha, last write wins), and the ignored raw
    priorities do not raise max_priority."""
    spec, k, overwrite, raw = setup
    cap = spec.capacity
    trace = Trace(impl, spec)
    trace.let("layout", LAYOUT)
    buf = impl.make(spec)
    trace.op(f"buf.extend(layout.batch(0, {cap})); rows, info = buf.sample({k})")
    buf.extend(LAYOUT.batch(0, cap))
    _, info = buf.sample(k)
    if "generation" not in info:
        fail(
            "sorted(info)",
            sorted(info),
            "a dict with 'generation' (capability stale_updates)",
            trace,
        )
    index, generation = info["index"].cpu(), info["generation"]
    trace.op(f"buf.extend(layout.batch({cap}, {overwrite}))  # overwrites slots 0..{overwrite - 1}")
    buf.extend(LAYOUT.batch(cap, overwrite))
    trace.op(
        f"buf.update_priority(torch.tensor({index.tolist()}), torch.tensor({raw}, dtype=torch.float64), "
        f"generation=torch.tensor({generation.cpu().tolist()}))"
    )
    buf.update_priority(index.clone(), torch.tensor(raw, dtype=torch.float64), generation.clone())
    expected = (torch.ones(cap, dtype=torch.float64) + spec.eps) ** spec.alpha
    max_raw = 1.0
    for slot, p in zip(index.tolist(), raw, strict=False):
        if slot >= overwrite:
            expected[slot] = (
                (torch.tensor(p, dtype=torch.float64) + spec.eps) ** spec.alpha
            ).item()
            max_raw = max(max_raw, p)
    assert_close(
        "stored_priority(all slots)",
        buf.stored_priority(torch.arange(cap)),
        expected,
        trace,
        rtol=PRIORITY_RTOL,
    )
    assert_same("max_priority", float(buf.max_priority), max_raw, trace)
