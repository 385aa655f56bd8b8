"""The mass ``sample()`` draws over (the catalogue of invariants: the
sampling mass): it is the sum of the held priorities after any sequence of
updates, and its boundaries map to the right slots.

* after long update sequences with a wide dynamic range (one priority
  raised to 1e8 and back, again and again; thousands of small updates) the
  sampling frequencies still follow the closed form. A running total or a
  root that drifts from its leaves (a float32 tree updated by deltas)
  shows here, through ``sample()``, whatever the tree's dtype and whatever
  the weight normaliser: no read-back and no shared randomness needed;
* a slot whose stored priority is exactly 0 is never drawn, the last held
  slot is drawn, slots never written are never drawn; with shared
  randomness, uniforms at 0, exactly on each prefix boundary, just below it
  and just below 1 map to the slot whose half-open interval holds them.

Checks: distributional (Pearson chi-square, false-alarm rate FALSE_ALARM =
1e-4 per case, seeded) and exact (zero-priority, never-written and last
slots; the shared-uniform mapping, on priorities whose prefix sums are exact
binary fractions so every boundary is exactly representable). Capacities are
not only powers of two (5, 12, 13), and one case is filled only in part.
"""

from __future__ import annotations

import math

import pytest
import torch

from rbcheck.harness.assertions import Trace, assert_chi_square, assert_tensor_equal, fail
from rbcheck.harness.oracle import start_prioritized
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout, scale_limit

#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4
DRAWS = 20_000
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))


def _skip_undeclared(impl, spec: BufferSpec) -> None:
    conv = impl.conventions
    for name in ("alpha", "beta", "eps"):
        rng = conv.param_range(name)
        if not rng.contains(getattr(spec, name)):
            pytest.skip(f"convention: param_ranges.{name}={rng.describe()} excludes {name}={getattr(spec, name)!r}")


def _counts(buf, size: int, trace: Trace, draws: int = DRAWS, batch: int = 5_000, strata: int = 0):
    """Counts per held slot (``strata``: a ``[strata, size]`` table of draw
    position x slot) over ``draws`` draws; each index checked held first."""
    shape = (strata, size) if strata else (size,)
    counts = torch.zeros(shape, dtype=torch.float64)
    batch = strata or batch
    for _ in range(draws // batch):
        _, info = buf.sample(batch)
        index = torch.as_tensor(info["index"]).cpu().reshape(-1)
        if index.dtype != torch.int64:
            fail("info['index'].dtype", str(index.dtype), "torch.int64", trace)
        dead = (index < 0) | (index >= size)
        if bool(dead.any()):
            fail("info['index']", index[dead][:8], f"held slots in [0, {size})", trace,
                 f"{int(dead.sum())} of {index.numel()} draws are not held slots")
        if strata:
            counts[torch.arange(strata), index] += 1.0
        else:
            counts += torch.bincount(index, minlength=size).to(torch.float64)
    return counts


def _check_frequencies(impl, buf, oracle, trace: Trace, what: str) -> torch.Tensor:
    """Chi-square of the draws against the oracle's closed form (its own
    per-draw form under a declared stratified scheme); returns the counts
    per slot."""
    size = oracle.size
    if impl.conventions.sampling == "stratified":
        strata = 8
        table = _counts(buf, size, trace, strata=strata)
        assert_chi_square(f"(draw position, slot) frequencies {what}", table,
                          oracle.draw_probabilities(strata) / strata, trace, false_alarm=FALSE_ALARM)
        return table.sum(0)
    counts = _counts(buf, size, trace)
    assert_chi_square(f"slot frequencies {what}", counts, oracle.probabilities(), trace, false_alarm=FALSE_ALARM)
    return counts


#: capacity, slot raised to 1e8 and back, rounds of it, small updates
DRIFT_CASES = [
    (13, 5, 6, 3000),
    (8, 0, 4, 2000),
    (5, 4, 8, 3000),
]


@pytest.mark.requires("prioritized")
@pytest.mark.conventions("priority_dtype", "eps_rule", "sampling", "param_ranges")
@pytest.mark.parametrize("case", range(len(DRIFT_CASES)))
def test_sampling_mass_survives_long_update_sequences(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4): alpha = 1, eps =
    1e-6; every slot gets a priority in [0.5, 4]; then, ``rounds`` times, one
    slot goes to 1e8 and back to its own value, between thousands of small
    updates (batches of 10, priorities 1 +- k/64, exact in float32). After
    the sequence, slot i is drawn with probability P_i = leaf_i / sum_j
    leaf_j over what the buffer was given last (the independent oracle): a
    total or a root kept by adding deltas, which drifts from its leaves by
    what 1e8 rounds away (8 in float32), fails by a wide margin."""
    capacity, hot, rounds, small = DRIFT_CASES[case]
    conv = impl.conventions
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=1.0, beta=0.4, eps=1e-6,
                      seed=4000 + case, layout=LAYOUT.spec_layout())
    _skip_undeclared(impl, spec)
    trace, buf, oracle, _ = start_prioritized(impl, spec, LAYOUT, fill=capacity, record=True)
    base = [0.5 + (7 * i % 8) / 2 for i in range(capacity)]
    buf.update_priority(torch.arange(capacity), conv.priorities(base))
    oracle.update(torch.arange(capacity), base)
    gen = torch.Generator().manual_seed(77 + case)
    per_round = small // rounds // 10
    trace.let("gen", None, f"torch.Generator().manual_seed({77 + case})")
    for _ in range(rounds):
        for raw in ([1e8], [base[hot]]):
            buf.update_priority(torch.tensor([hot]), conv.priorities(raw))
            oracle.update(torch.tensor([hot]), raw)
        for _ in range(per_round):
            index = torch.randint(0, capacity, (10,), generator=gen)
            raw = 1 + (torch.randint(-16, 17, (10,), generator=gen).double() / 64)
            # named by the calls that make them: the snippet draws the same from its own gen, in this order
            trace.name(index, f"torch.randint(0, {capacity}, (10,), generator=gen)")
            pri = trace.name(raw.to(conv.priority_dtype), "(1 + (torch.randint(-16, 17, (10,), generator=gen)"
                             f".double() / 64)).to({conv.priority_dtype})")
            buf.update_priority(index, pri)
            oracle.update(index, raw)
    _check_frequencies(impl, buf, oracle, trace, f"after {rounds} rounds of 1e8 and back and {small} small updates")


#: capacity, raw priorities of the rows written (alpha = 1, eps = 0): integers
#: summing to 16, so every prefix boundary u = c_k / 16 is an exact float64
BOUNDARY_CASES = [
    (12, [0.0, 3.0, 0.0, 0.0, 2.0, 1.0, 0.0, 4.0, 0.0, 2.0, 4.0, 0.0]),  # zeros first, inside, last
    (13, [2.0, 0.0, 1.0, 1.0, 0.0, 0.0, 3.0, 1.0, 0.0, 2.0, 0.0, 2.0, 4.0]),  # last slot 1/4 of the mass
    (7, [0.0, 1.0, 1.0, 2.0, 12.0]),  # filled in part: slots 5, 6 never written
    # the capacities of a real run (``_large_raw``: 0 but for ~14 odd slots
    # spread over the rows and the last one, summing to 64): a tree one level
    # deeper than 2**12 leaves, full; a ring of 2**16 slots early in a run; full
    (4097, 4097),
    (2**16, 300),
    (2**16, 2**16),
]


def _hot_slots(n: int) -> list[int]:
    """About 14 odd slots spread over ``[0, n)`` and the last one."""
    return sorted({min(n - 1, (k * n) // 13 | 1) for k in range(13)} | {n - 1})


def _large_raw(n: int) -> tuple[list[float], str]:
    """``n`` raw priorities, 0 but for :func:`_hot_slots` (1, 2, 3, 4, ...
    and the last one what makes the sum 64), and the Python that builds them."""
    hot = _hot_slots(n)
    values = [1.0 + k % 4 for k in range(len(hot) - 1)]
    values.append(64.0 - sum(values))
    raw = [0.0] * n
    for slot, value in zip(hot, values, strict=True):
        raw[slot] = value
    return raw, f"torch.zeros({n}, dtype=torch.float64); raw[{hot}] = torch.tensor({values}, dtype=torch.float64)"


def _expected_slots(leaves: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The slot whose half-open interval ``[c_{i-1}, c_i)`` of the cumulative
    mass holds ``u * total`` (zero-width intervals hold nothing)."""
    upper = torch.cumsum(leaves, 0)
    mass = u * upper[-1]
    return torch.searchsorted(upper, mass, right=True)


@pytest.mark.requires("prioritized")
@pytest.mark.conventions("priority_dtype", "eps_rule", "sampling", "param_ranges")
@pytest.mark.parametrize("case", range(len(BOUNDARY_CASES)))
def test_boundary_masses_map_to_the_right_slot(impl, case):
    """exact and distributional (chi-square, false-alarm rate 1e-4):
    alpha = 1, eps = 0, raw priorities that are small integers summing to 16.
    Through sample() (any prioritized buffer): a slot whose stored priority
    is 0 is never drawn, a slot never written is never drawn, and the last
    held slot, when its expected count is 50 or more, is drawn (a correct
    buffer misses it with probability below e**-50; here P >= 1/4); the frequencies
    follow the closed form. With shared randomness (exact):
    indices_from_uniforms maps u = 0, each prefix boundary c_k / 16, the
    float64 just below each, and 1 - 2**-53 to the slot whose half-open
    interval of the cumulative mass holds u * total. A buffer whose eps rule
    or declared eps range stores no exact zero (finfo eps; eps > 0, then
    eps = 1e-8) has no zero-priority slot to check; the rest runs. Capacities
    from 5 to 2**16: a tree of 8192 leaves, a ring of 2**16 slots holding 300
    rows and one full, each 0 but for ~14 odd slots spread over the rows (an
    adapter's cost hint ``prioritized_fill``, the rows a fixed case may
    write, skips a larger case with the hint's reason)."""
    capacity, raw = BOUNDARY_CASES[case]
    raw, text = _large_raw(raw) if isinstance(raw, int) else (raw, None)
    hint = scale_limit(impl, "prioritized_fill")
    if hint is not None and len(raw) > hint[0]:
        pytest.skip(f"cost hint prioritized_fill={hint[0]} < {len(raw)} rows: {hint[1]}")
    conv = impl.conventions
    if not all(conv.admits(r) for r in raw):
        pytest.skip("convention: positive_priorities (the case's integer priorities hold zeros, which the "
                    "buffer refuses; the bad-input case priority_zero checks the refusal)")
    eps = 0.0 if conv.param_range("eps").contains(0.0) else 1e-8  # a declared eps > 0: no zero to check
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=1.0, beta=0.4, eps=eps,
                      seed=900 + case, layout=LAYOUT.spec_layout())
    _skip_undeclared(impl, spec)
    n = len(raw)
    trace, buf, oracle, _ = start_prioritized(impl, spec, LAYOUT, fill=n, record=True)
    pri = conv.priorities(raw)
    if text is not None:  # thousands of rows: the Python that builds them
        trace.let("raw", None, text)
        trace.name(pri, f"raw.to({pri.dtype})")
    buf.update_priority(torch.arange(n), pri)
    oracle.update(torch.arange(n), raw)
    leaves = oracle.leaves()
    counts = _check_frequencies(impl, buf, oracle, trace, f"over priorities with zeros ({n} rows, capacity "
                                f"{capacity})")
    zero = torch.nonzero(leaves == 0).reshape(-1)
    if len(zero) and bool((counts[zero] > 0).any()):  # assert_chi_square fails first; kept for clarity
        fail(f"draws of the zero-priority slots {zero.tolist()}", int(counts[zero].sum()), 0, trace)
    last = n - 1
    if leaves[last] / leaves.sum() * DRAWS >= 50 and counts[last] == 0:  # missed with probability < e**-50
        fail(f"draws of the last held slot {last} (P = {float(leaves[last] / leaves.sum()):.3g})",
             0, f"> 0 in {DRAWS} draws", trace)
    if not impl.has("shared_rng") or not bool((leaves == leaves.round()).all()):
        return  # the boundaries are exact only for integer leaves (eps = 0)
    total = float(leaves.sum())
    bounds = [c / total for c in torch.cumsum(leaves, 0)[:-1].tolist() if c < total]
    below = [math.nextafter(b, 0.0) for b in bounds if b > 0]
    u_list = sorted({0.0, *bounds, *below, 1.0 - 2.0**-53})
    u = torch.tensor(u_list, dtype=torch.float64)
    got = torch.as_tensor(buf.indices_from_uniforms(u.clone())).cpu()
    assert_tensor_equal("indices_from_uniforms(u at 0, on and just below each prefix boundary, near 1)",
                        got, _expected_slots(leaves, u), trace)

