"""How sampling picks slots: frequencies against closed-form probabilities
(distributional), index mapping under shared uniforms (exact given shared
randomness), importance weights (tolerance) and stale priority updates
(exact).

Distributional checks are seeded (the buffer's generator) and use Pearson's
chi-square with a false-alarm rate of FALSE_ALARM = 1e-4 per case: a correct
implementation fails a given case with probability 1e-4 for a random seed,
and with a fixed seed a given implementation either always passes or always
fails (an adapter declaring ``seedable=False`` gets the stated rate per run).

Every sampled index is checked to be a held slot BEFORE it is counted (an
out-of-range index fails, exactly), and every chi-square has at least two
cells; a case with a single possible slot checks, exactly, that every draw is
that slot.

Prioritized expectations come from the independent oracle
(:class:`rbcheck.harness.oracle.PriorityOracle`) under the adapter's declared
conventions: priorities are handed over in ``priority_dtype``; the eps rule,
the weight normaliser and the sampling scheme are honoured in their own terms
(a stratified scheme is tested against its own per-draw closed form, an
independent one for independence within a batch).
"""

from __future__ import annotations

import warnings

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
    priority_tolerance,
)
from rbcheck.harness.oracle import PriorityOracle, model_spec, start_prioritized
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.stateful import declared_samplers, replay
from rbcheck.harness.strategies import (
    EpisodeLayout,
    Field,
    Layout,
    batch_schedule,
    layouts,
    operations,
    param_values,
    priorities,
    scale_limit,
    specs,
)

#: probability that one case fails on a correct implementation (stated per case)
FALSE_ALARM = 1e-4
DRAWS = 20_000
LAYOUT = Layout((Field(("obs",), (2,), "float32"), Field(("next", "obs"), (2,), "float32")))


def live_index(index, size: int, trace: Trace, what: str = "info['index']") -> torch.Tensor:
    """``index`` (int64, on the CPU) after checking, exactly, that every entry
    is a held slot in ``[0, size)``: done BEFORE counting, so an out-of-range
    index can never vanish from the counts."""
    index = torch.as_tensor(index)
    if index.dtype != torch.int64:
        fail(f"{what}.dtype", str(index.dtype), "torch.int64", trace)
    index = index.cpu().reshape(-1)
    dead = (index < 0) | (index >= size)
    if bool(dead.any()):
        fail(what, index[dead][:8], f"held slots in [0, {size})", trace,
             f"{int(dead.sum())} of {index.numel()} draws are not held slots")
    return index


#: How the DRAWS draws of a distributional case are taken: a few calls of
#: thousands, as a check usually does, and as a training loop takes them:
#: many calls of 32..256 rows (seeded), and calls of 32 (a bias of one draw
#: per call, lost in a call of thousands, is ~1/32 of every call there).
SCHEDULES = {
    "calls-of-5000": (5_000,) * (DRAWS // 5_000),
    "calls-of-32-to-256": batch_schedule(DRAWS, 32, 256, seed=1),
    "calls-of-32": batch_schedule(DRAWS, 32, 32),
}


#: The order the schedules are taken in, and the prioritized tests' two.
SCHEDULE_ORDER = ("calls-of-5000", "calls-of-32-to-256", "calls-of-32")
PRIORITIZED_SCHEDULES = ("calls-of-5000", "calls-of-32-to-256")


def limited_schedule(impl, schedule: str, scale: str = "prioritized_sample_calls") -> tuple[int, ...]:
    """The calls of ``SCHEDULES[schedule]``, cut to the adapter's cost hint
    for ``scale`` (if it gives one) with a warning that says so: fewer draws,
    the same false-alarm rate."""
    sizes = SCHEDULES[schedule]
    hint = scale_limit(impl, scale)
    if hint is not None and hint[0] < len(sizes):
        limit, why = hint
        warnings.warn(f"{schedule}: {limit} of {len(sizes)} calls ({sum(sizes[:limit])} of {sum(sizes)} "
                      f"draws), by {impl.name}'s cost hint {scale}={limit}: {why}", stacklevel=2)
        sizes = sizes[:limit]
    return sizes


def _draw_counts(
    buf, size: int, trace: Trace, draws: int = DRAWS, batch: int = 5_000,
    schedule: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Counts per held slot of ``draws`` draws in calls of ``batch`` (or in
    calls of the sizes of ``schedule``); every index checked live first."""
    counts = torch.zeros(size, dtype=torch.float64)
    sizes = schedule if schedule is not None else (batch,) * (draws // batch)
    for b in sizes:
        _, info = buf.sample(b)
        index = live_index(info["index"], size, trace)
        if index.numel() != b:
            fail(f"len(info['index']) of buf.sample({b})", index.numel(), b, trace)
        counts += torch.bincount(index, minlength=size).to(torch.float64)
    return counts


def _draw_table(buf, size: int, batch: int, trace: Trace, draws: int = DRAWS) -> torch.Tensor:
    """``[batch, size]``: how often draw ``k`` of a batch picked slot ``i``."""
    table = torch.zeros(batch, size, dtype=torch.float64)
    rounds = draws // batch
    position = torch.arange(batch)
    for _ in range(rounds):
        _, info = buf.sample(batch)
        index = live_index(info["index"], size, trace)
        if index.numel() != batch:
            fail("len(info['index'])", index.numel(), batch, trace)
        table[position, index] += 1.0
    return table


@pytest.mark.requires("random")
@pytest.mark.parametrize("capacity,written", [(1, 3), (7, 5), (10, 23), (33, 33)])
def test_uniform_sampling_matches_closed_form(impl, capacity, written):
    """distributional (chi-square, false-alarm rate 1e-4 over the three
    schedules): each stored row is drawn with probability 1 / len(buf); slots
    never written are never drawn (exact: every index is checked to be a held
    slot before counting). 20000 draws are taken in calls of 5000, then 20000
    as a training loop takes them: in calls of 32..256 rows, and 20000 in
    calls of 32; each schedule is tested on its own. With
    one held slot (capacity 1) there is nothing to compare frequencies of:
    the case checks, exactly, that every draw is that slot."""
    spec = BufferSpec(capacity=capacity, sampler="random", seed=12345 + capacity)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    done = 0
    while done < written:
        n = min(capacity, written - done)
        buf.extend(layout.batch(done, n))
        done += n
    size = min(capacity, written)
    # one test id per case, and the message of old ("slot frequencies: chi-square ..."): known-failure
    # entries stay as they were; the schedule is in the message's call (buf.sample(<its size>))
    for schedule in SCHEDULE_ORDER:
        counts = _draw_counts(buf, size, trace, schedule=limited_schedule(impl, schedule, "sample_calls"))
        if size == 1:  # one cell: the live-slot check above was the whole test
            assert_same("draws of slot 0", int(counts[0]), int(counts.sum()), trace)
            continue
        probs = torch.full((size,), 1.0 / size, dtype=torch.float64)
        assert_chi_square("slot frequencies", counts, probs, trace,
                          false_alarm=FALSE_ALARM / len(SCHEDULE_ORDER))


PRIORITIZED_CASES = [
    # capacity, alpha, eps, raw priorities set by update (None: writer default)
    (8, 0.6, 1e-8, [0.0, 1.0, 2.0, 3.0, 0.5, 10.0, 0.0, 4.0]),
    (8, 1.0, 0.0, [0.0, 1.0, 0.0, 3.0, 0.0, 10.0, 0.0, 0.25]),  # eps=0: zeros never drawn
    (5, 0.0, 1e-6, [0.0, 100.0, 1.0, 2.0, 3.0]),  # alpha=0: uniform
    (16, 0.5, 1e-2, [float(i % 5) for i in range(16)]),
    (6, 0.7, 1e-8, None),
]


def _declared(impl, spec: BufferSpec) -> str | None:
    """Why ``spec``'s alpha, beta or eps is outside the adapter's declared
    ranges (the case is then not one the buffer promises to handle), or None."""
    conv = impl.conventions
    for name in ("alpha", "beta", "eps"):
        rng = conv.param_range(name)
        if not rng.contains(getattr(spec, name)):
            return f"convention: param_ranges.{name}={rng.describe()} excludes {name}={getattr(spec, name)!r}"
    return None


def _prioritized_buffer(impl, capacity, alpha, eps, raw, seed, beta=0.4):
    """A full prioritized buffer with ``raw`` priorities set by update (None:
    the new-row priority), its trace and the oracle."""
    conv = impl.conventions
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=alpha, beta=beta, eps=eps,
                      seed=seed, layout=LAYOUT.spec_layout())
    why = _declared(impl, spec)
    if why:
        pytest.skip(why)
    trace, buf, oracle, _ = start_prioritized(impl, spec, LAYOUT, fill=capacity, record=True)
    if raw is not None:
        # a buffer that refuses 0 (conventions.positive_priorities) gets 1e-3
        # there: the closed form still holds; the refusal is a bad-input case
        raw = [r if conv.admits(r) else 1e-3 for r in raw]
        pri = conv.priorities(raw)
        buf.update_priority(torch.arange(capacity), pri)
        oracle.update(torch.arange(capacity), raw)
    return buf, trace, oracle


#: batch size of the per-draw table of a stratified buffer
STRATA = 8


@pytest.mark.requires("prioritized")
@pytest.mark.conventions("priority_dtype", "eps_rule", "sampling", "param_ranges")
@pytest.mark.parametrize("case", range(len(PRIORITIZED_CASES)))
def test_prioritized_sampling_matches_closed_form(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4 over both schedules): slot i is drawn with
    probability P_i = (p_i + eps)^alpha / sum_j (p_j + eps)^alpha; a slot whose
    stored priority is exactly 0 (p = 0, eps = 0) is never drawn (exact).
    The 20000 draws are taken in calls of 5000 and, as a training loop takes
    them, in calls of 32..256 rows (an adapter's cost hint
    ``prioritized_sample_calls`` may cut the calls, with a warning).
    Under sampling="stratified" draw k of a batch of 8 must follow its own
    closed form (the mass of slot i inside the k-th of 8 equal segments of
    the cumulative mass, times 8): the table of (draw position, slot) counts
    is tested, and a slot outside draw k's segment is never drawn there (exact)."""
    capacity, alpha, eps, raw = PRIORITIZED_CASES[case]
    buf, trace, oracle = _prioritized_buffer(impl, capacity, alpha, eps, raw, 99 + case)
    if impl.conventions.sampling == "stratified":
        table = _draw_table(buf, capacity, STRATA, trace)
        want = oracle.draw_probabilities(STRATA)
        assert_chi_square("(draw position, slot) frequencies", table, want / STRATA, trace,
                          false_alarm=FALSE_ALARM)
        return
    for schedule in PRIORITIZED_SCHEDULES:  # one test id per case: known-failure ids stay as they were
        counts = _draw_counts(buf, capacity, trace, schedule=limited_schedule(impl, schedule))
        assert_chi_square("slot frequencies", counts, oracle.probabilities(), trace,
                          false_alarm=FALSE_ALARM / len(PRIORITIZED_SCHEDULES))


@pytest.mark.requires("prioritized")
@pytest.mark.conventions("priority_dtype", "sampling")
def test_draws_within_a_batch_are_independent(impl):
    """distributional (chi-square, false-alarm rate 1e-4 per table): under
    sampling="independent", the B draws of a batch are iid: in batches of 8,
    (a) draw k picks slot i with probability P_i whatever k (the (position,
    slot) table), and (b) the pair of draws (2m, 2m+1) picks (i, j) with
    probability P_i * P_j (a sampler drawing without replacement, sorting,
    or stratifying fails). A stratified buffer's draws are dependent by
    design: it is checked against its own closed form instead."""
    if impl.conventions.sampling != "independent":
        pytest.skip(f"convention: sampling={impl.conventions.sampling} (draws are dependent by design; "
                    "test_prioritized_sampling_matches_closed_form checks its closed form)")
    raw = [0.5, 1.0, 2.0, 3.0, 1.5, 0.25]
    buf, trace, oracle = _prioritized_buffer(impl, len(raw), 1.0, 1e-3, raw, 4242)
    size, batch, rounds = len(raw), 8, DRAWS // 8
    p = oracle.probabilities()
    table = torch.zeros(batch, size, dtype=torch.float64)
    pairs = torch.zeros(size, size, dtype=torch.float64)
    for _ in range(rounds):
        _, info = buf.sample(batch)
        index = live_index(info["index"], size, trace)
        if index.numel() != batch:
            fail("len(info['index'])", index.numel(), batch, trace)
        table[torch.arange(batch), index] += 1.0  # one cell per position: no repeats
        pairs.index_put_((index[0::2], index[1::2]), torch.ones(batch // 2, dtype=torch.float64),
                         accumulate=True)  # a pair may repeat within a batch: accumulate
    assert_chi_square("(draw position, slot) frequencies", table,
                      p.unsqueeze(0).expand(batch, -1) / batch, trace, false_alarm=FALSE_ALARM)
    assert_chi_square("(draw 2m, draw 2m+1) pair frequencies", pairs, torch.outer(p, p), trace,
                      false_alarm=FALSE_ALARM)


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
    episodes = trace.source("episodes", layout)
    buf = trace.wrap(impl.make(spec))
    data = episodes.batch()
    for start in range(0, layout.total, capacity):
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
        _, info = buf.sample(batch)
        index = live_index(info["index"], min(capacity, layout.total), trace)
        counts += torch.bincount(index[::slice_len], minlength=capacity).to(torch.float64)
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
    episodes = trace.source("episodes", layout)
    buf = trace.wrap(impl.make(spec))
    buf.extend(episodes.batch())
    short = slices = 0
    for _ in range(20):
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
@pytest.mark.conventions("priority_dtype", "eps_rule", "weight_normaliser")
@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_weights_are_normalised_as_declared(impl, beta):
    """tolerance tied to the declared dtype (``weight_tolerance``: for a
    float64 tree of 64 slots and float32 weights rtol = 4.8e-07, for a
    float32 tree 4.1e-06): with N held slots and P_i their probabilities,
    weight_i = (N P_i) ** -beta divided by, under the spec's "buffer_min",
    the largest such weight over ALL held slots -- here a rarely drawn slot's,
    so a batch-wise normaliser fails --; under a declared "batch_max", the
    batch's largest weight; under "none", nothing."""
    capacity = 64
    rare = 0.0 if impl.conventions.admits(0.0) else 1e-3  # a buffer refusing 0: as rare as 0 + eps
    raw = [rare] + [1.0 + (i * 7 % 10) for i in range(1, capacity)]
    buf, trace, oracle = _prioritized_buffer(impl, capacity, 1.0, 1e-3, raw, 5, beta=beta)
    for _ in range(5):
        _, info = buf.sample(8)
        index = live_index(info["index"], capacity, trace)
        if "weight" not in info:
            fail("sorted(info)", sorted(info), "a dict with 'weight'", trace)
        weight = torch.as_tensor(info["weight"])
        tol = oracle.weight_tolerance(index, weight.dtype)
        assert_close("info['weight']", weight, oracle.weights(index), trace, tol=tol)


@pytest.mark.requires("shared_rng")
@pytest.mark.exact_replay
@given(data=st.data())
def test_same_uniforms_give_same_indices_as_reference(impl, reference_impl, data):
    """exact given shared randomness: after the same writes and priority
    updates, indices_from_uniforms(u) of the implementation equals the
    reference's for the same float64 uniforms u (random and prioritized)."""
    spec = data.draw(specs(declared_samplers(impl), conventions=impl.conventions), label="spec")
    layout = data.draw(layouts(max_fields=2), label="layout")
    spec = spec.but(layout=layout.spec_layout())
    ops = data.draw(
        operations(spec.capacity, prioritized=spec.sampler == "prioritized", conventions=impl.conventions),
        label="operations",
    )
    u = data.draw(
        st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=16), label="uniforms"
    )
    trace = Trace(impl, spec)
    source = trace.source("layout", layout)
    buf, ref = trace.wrap(impl.make(spec)), reference_impl.make(model_spec(spec, impl.conventions))
    conv = impl.conventions
    oracle = PriorityOracle(spec, conv) if spec.sampler == "prioritized" else None
    replay(buf, source, ops, trace, conventions=conv, oracle=oracle)
    ref_oracle = PriorityOracle(spec, conv) if spec.sampler == "prioritized" else None
    replay(ref, layout, ops, Trace(reference_impl, spec), conventions=conv, oracle=ref_oracle)
    if spec.sampler == "prioritized":
        # the two sampled different slots; give both the same priorities
        n = len(ref)
        raw = data.draw(st.lists(priorities(conventions=conv), min_size=n, max_size=n), label="priorities")
        if max(raw) == 0.0:
            raw[0] = 1.0
        pri = conv.priorities(raw)
        buf.update_priority(torch.arange(n), pri.clone())
        ref.update_priority(torch.arange(n), pri.clone())
    uu = torch.tensor(u, dtype=torch.float64)
    got = buf.indices_from_uniforms(uu.clone())
    assert_tensor_equal(
        "indices_from_uniforms(u)",
        torch.as_tensor(got).cpu(),
        ref.indices_from_uniforms(uu.clone()).cpu(),
        trace,
    )


@st.composite
def stale_setups(draw, conventions):
    capacity = draw(st.integers(2, 10), label="capacity")
    spec = BufferSpec(
        capacity=capacity,
        sampler="prioritized",
        alpha=draw(param_values("alpha", conventions), label="alpha"),
        beta=draw(param_values("beta", conventions), label="beta"),
        eps=draw(param_values("eps", conventions), label="eps"),
        seed=draw(st.integers(0, 2**16), label="seed"),
        layout=LAYOUT.spec_layout(),
    )
    k = draw(st.integers(1, 8), label="batch size")
    overwrite = draw(st.integers(1, capacity), label="rows written after sampling")
    raw = draw(st.lists(priorities(conventions=conventions), min_size=k, max_size=k), label="raw priorities")
    return spec, k, overwrite, raw


@pytest.mark.requires("prioritized", "priority_readback", "stale_updates")
@pytest.mark.conventions("priority_dtype", "eps_rule", "new_priority", "param_ranges")
@given(data=st.data())
def test_stale_priority_updates_are_ignored(impl, data):
    """tolerance tied to the declared dtype (``priority_tolerance``, e.g.
    rtol = 8 * eps(float64) = 1.8e-15): update_priority(index, p, generation)
    from a sample taken BEFORE some slots were overwritten leaves the
    overwritten slots at the priority their new row got, updates the others
    ((p + eps) ** alpha, last write wins), and the ignored raw priorities do
    not raise max_priority. Expected values from the independent oracle."""
    conv = impl.conventions
    spec, k, overwrite, raw = data.draw(stale_setups(conv), label="setup")
    cap = spec.capacity
    trace, buf, oracle, layout = start_prioritized(impl, spec, LAYOUT, fill=cap, record=True)
    _, info = buf.sample(k)
    if "generation" not in info:
        fail(
            "sorted(info)",
            sorted(info),
            "a dict with 'generation' (capability stale_updates)",
            trace,
        )
    index, generation = live_index(info["index"], cap, trace), info["generation"]
    serials = oracle.serials(index)
    trace.note(f"overwrites slots 0..{overwrite - 1}")
    buf.extend(layout.batch(cap, overwrite))
    oracle.write(overwrite)
    pri = conv.priorities(raw)
    buf.update_priority(index.clone(), pri, generation.clone())
    oracle.update(index, raw, serials)
    tol = priority_tolerance(conv.priority_dtype, spec.alpha)
    assert_close("stored_priority(all slots)", buf.stored_priority(torch.arange(cap)), oracle.leaves(),
                 trace, tol=tol)
    want_max = oracle.max_priority()
    if want_max is not None:
        assert_close("max_priority", torch.tensor([float(buf.max_priority)]), torch.tensor([want_max]),
                     trace, tol=tol)
