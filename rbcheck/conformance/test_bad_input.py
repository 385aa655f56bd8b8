"""Bad input is refused and nothing is lost (exact).

Each case of :data:`CATALOGUE` (in ``rbcheck.harness.bad_input``) is one
test id: a named invalid call on a buffer in a known state. The case
*survives* when

1. the call raises (any ``Exception``; our own implementations must raise
   ``ValueError`` / ``TypeError`` / ``IndexError`` whose message names the
   argument: ``<arg>...=<got>, but should be <allowed>``), and
2. the observable state is exactly as before: length, cursor, write count,
   contents (bit for bit), stored priorities of every slot and the max
   priority (with ``priority_readback``), and the sampling -- compared with
   twin buffers that never saw the bad call (after one more row in each when
   the priorities cannot be read back: it takes the max priority). A
   seedable buffer whose twins draw alike: the next sample equals theirs,
   exactly, write generations included. Draws that cannot be replayed (not
   seedable, or twins that draw differently from one seed): every slot drawn
   carries the twin's importance weight (so a priority the refused call
   changed shows as soon as its slot is drawn), and the slot counts of 4096
   draws match the twin's (chi-square, false-alarm rate 1e-4 per case).

Constructor cases (``make(spec)`` with a bad spec) survive when ``make``
raises; a batch size that does not divide into slices may instead be refused
by the first ``sample()``, and so may a third-party buffer refuse a bad value
it takes as an argument of each ``sample`` call, not at construction (the
default batch size for cpprb, tianshou and SB3; beta for cpprb): nothing sees
it before the first one.

Priorities follow DeepMind Reverb: NaN, infinite and negative priorities are
refused, zero is allowed (such a row is never sampled; under the convention
``positive_priorities`` zero is refused too, cases ``priority_zero``); so is a finite
priority whose transform ``(p + eps) ** alpha`` overflows float64 (1e200 with
alpha = 2), on update and on write, even in an update entry that is stale. Every priority a case
hands over is in the dtype the adapter declares
(``conventions.priority_dtype``), so a bad value is refused for its value,
never for a dtype the buffer does not take (a float64 buffer refusing float32
would otherwise pass every priority, index and generation case unchecked).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from rbcheck.harness.assertions import (
    Trace,
    assert_close,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
    priority_tolerance,
    weight_tolerance,
)
from rbcheck.harness.bad_input import (
    CAPACITY,
    CATALOGUE,
    KEYED,
    PRIORITIZED,
    SPEC_CATALOGUE,
    WRITTEN,
    ZERO_CASES,
    P,
    fill,
    named_rows,
    rows,
)
from rbcheck.harness.oracle import reads_back, transform
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("bad_input")

#: Implementations held to the strict message rule (the argument is named).
OURS = ("reference", "device", "triton")



def outside(rng) -> list[float]:
    """Values just outside a declared :class:`ParamRange` (finite ends only):
    an open end itself, or a step beyond a closed one."""
    values = []
    for end, closed, step in ((rng.low, rng.low_closed, -1.0), (rng.high, rng.high_closed, 1.0)):
        if math.isfinite(end):
            values.append(end + step * max(1e-3, abs(end) * 1e-3) if closed else end)
    return values


@pytest.mark.conventions("param_ranges")
@pytest.mark.parametrize("name", ["alpha", "beta", "eps"])
def test_parameters_outside_the_declared_range_are_refused(impl, name):
    """exact: a prioritized buffer whose alpha, beta or eps lies just outside
    the range the adapter declares (``conventions.param_range``: the spec's
    alpha >= 0, 0 <= beta <= 1, eps >= 0 unless declared otherwise, e.g.
    tianshou's alpha > 0) cannot be built (beta: or cannot sample), and one
    at each closed end of the range can: a declared range is the range the
    buffer enforces, not a licence to skip the values it dislikes."""
    if not impl.has("prioritized"):
        pytest.skip(f"unavailable: prioritized: {impl.unavailable['prioritized']}"
                    if "prioritized" in impl.unavailable else "not declared: prioritized")
    if name == "eps" and impl.conventions.eps_rule != "add":
        pytest.skip(f"convention: eps_rule={impl.conventions.eps_rule} (the buffer takes no eps "
                    f"argument, so spec.eps never reaches it)")
    rng = impl.conventions.param_range(name)
    for value in outside(rng):
        spec = PRIORITIZED.but(**{name: value})
        trace = Trace(impl, spec)
        trace.note(f"(the line above is make(spec)) {name}={value!r} is outside the declared {rng.describe()}")
        error = None
        try:
            buf = trace.wrap(impl.make(spec))
            if name == "beta":  # a per-sample argument in some buffers
                fill(buf, spec, impl.conventions, trace)
                buf.sample(4)
        except Exception as err:  # noqa: BLE001 - any refusal counts; ours are checked below
            error = err
        check_refusal(impl, error, name, trace)
    for end, closed in ((rng.low, rng.low_closed), (rng.high, rng.high_closed)):
        if not (closed and math.isfinite(end)):
            continue
        spec = PRIORITIZED.but(**{name: end})
        trace = Trace(impl, spec)
        trace.note(f"(the line above is make(spec)): {name}={end!r}, a closed end of {rng.describe()}")
        try:
            buf = trace.wrap(impl.make(spec))
            fill(buf, spec, impl.conventions, trace)
            buf.sample(4)
        except Exception as err:  # noqa: BLE001
            fail(f"make/sample with {name}={end!r}", f"<raised {type(err).__name__}: {err}>",
                 f"accepted ({end!r} is in the declared range {rng.describe()})", trace)


def check_refusal(impl, error: BaseException | None, arg: str, trace: Trace) -> None:
    """The call must have raised; ours must name ``arg`` in the agreed form."""
    if error is None:
        fail("the bad call", "<returned normally>", "an exception", trace)
    if impl.name not in OURS:
        return
    if not isinstance(error, (ValueError, TypeError, IndexError)):
        fail("type(error)", type(error).__name__, "ValueError, TypeError or IndexError", trace, str(error))
    pattern = re.escape(arg) + r"[^=]{0,40}=.*, but should be "
    if not re.search(pattern, str(error), flags=re.S):
        fail("error message", repr(str(error)), f"'{arg}...=<got>, but should be <allowed>'", trace)


def snapshot(buf, spec: BufferSpec, impl) -> dict:
    state = {"len": len(buf), "cursor": buf.cursor, "write_count": buf.write_count}
    if len(buf):
        state["contents"] = buf.contents()
    if reads_back(spec, impl):  # capability "priority_readback"
        state["stored_priority"] = buf.stored_priority(torch.arange(spec.capacity))
        state["max_priority"] = buf.max_priority
    return state


def assert_unchanged(got: dict, want: dict, trace: Trace) -> None:
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert_tensor_equal(f"after the bad call: {key}", got[key], value, trace)
        elif key == "contents":
            assert_td_equal("after the bad call: contents()", got[key], value, trace)
        else:
            assert_same(f"after the bad call: {key}", got[key], value, trace)
    if set(got) != set(want):
        fail("after the bad call: observed", sorted(got), sorted(want), trace)


def next_sample(buf, k: int):
    try:
        rows_, info = buf.sample(k)
    except Exception as error:  # noqa: BLE001 - compared by type below
        return type(error).__name__
    return rows_, {key: value for key, value in info.items() if isinstance(value, torch.Tensor)}


def assert_same_next_sample(impl, spec: BufferSpec, buf, twins, k: int, trace: Trace, *,
                            empty: bool = False) -> None:
    """``buf`` samples as the twins that never saw the bad call do.

    * A prioritized buffer without ``priority_readback`` (the snapshot cannot
      see its priorities) first gets one more row in all three buffers: the
      row takes the max priority, so a max raised by the refused call shows
      in the draws below (not with ``priority_key``: a row without the column
      is another bad input; not when the case starts ``empty``).
    * Sampling that raises: ``buf`` raises what the twins raise; twins in the
      same state that do not raise alike fail.
    * A seedable buffer (``conventions.seedable``) whose two twins draw the
      same: exact, ``buf``'s next sample equals theirs.
    * Otherwise (not seedable, or the twins draw differently from the same
      seed): :func:`assert_same_sampling`, distributional and exact per slot.
    """
    if spec.sampler == "prioritized" and not spec.priority_key and not empty and not reads_back(spec, impl):
        trace.note("one more row, in the twins too: a new row takes the max priority")
        for b in (buf, *twins):
            b.extend(named_rows(trace, 1, WRITTEN))
    a, b = (next_sample(t, k) for t in twins)
    if isinstance(a, str) or isinstance(b, str):
        if a != b:
            fail(f"untouched twins: sample({k})", f"<{a if isinstance(a, str) else 'returned'} vs. "
                 f"{b if isinstance(b, str) else 'returned'}>", "the same outcome (same spec, same calls)", trace)
        trace.note(f"the twins' sample({k}) raises {a}")
        assert_same(f"after the bad call: sample({k}) raises", next_sample(buf, k), a, trace)
        return
    if not (impl.conventions.seedable and same_draw(a, b)):
        assert_same_sampling(impl, buf, twins[0], k, trace)
        return
    trace.note(f"sample({k}) vs. twins that never saw the bad call")
    got = next_sample(buf, k)
    if isinstance(got, str):
        fail(f"after the bad call: sample({k})", f"<raised {got}>", "the twin's sample", trace)
    assert_td_equal(f"after the bad call: sample({k}) rows", got[0], a[0], trace)
    for key, value in a[1].items():
        assert_tensor_equal(f"after the bad call: sample({k}) info[{key!r}]", got[1].get(key), value, trace)


def same_draw(a, b) -> bool:
    """Whether two ``next_sample`` results are identical (rows and info)."""
    try:
        assert_td_equal("twin", b[0], a[0])
        for key in a[1]:
            assert_tensor_equal(f"twin info[{key!r}]", b[1].get(key), a[1][key])
    except AssertionError:
        return False
    return set(a[1]) == set(b[1])


#: The distributional comparison: draws per buffer, and the probability that
#: it fails a correct implementation (per case; a seedable buffer whose twins
#: draw alike never gets here, so only draws that cannot be replayed do).
DRAWS = 4096
FALSE_ALARM = 1e-4


def draws(buf, batch: int, rounds: int):
    """``(count per slot, first weight seen per slot)`` over ``rounds`` samples
    of ``batch``, or the name of the error a sample raised."""
    counts: dict[int, int] = {}
    weights: dict[int, float] = {}
    for _ in range(rounds):
        got = next_sample(buf, batch)
        if isinstance(got, str):
            return got
        index = got[1]["index"].reshape(-1).cpu().tolist()
        weight = got[1].get("weight")
        weight = [None] * len(index) if weight is None else weight.reshape(-1).double().cpu().tolist()
        for slot, w in zip(index, weight, strict=True):
            counts[slot] = counts.get(slot, 0) + 1
            if w is not None:
                weights.setdefault(slot, w)
    return counts, weights


def assert_same_sampling(impl, buf, twin, k: int, trace: Trace) -> None:
    """Distributional + exact per slot, for draws that cannot be replayed from
    the seed: ``DRAWS`` draws from ``buf`` and from an untouched twin (samples
    of ``32 * k``, a multiple of the case's batch size).

    * every slot drawn by both carries the same importance weight in both
      (a weight is a function of the state and the slot under
      ``weight_normaliser`` ``buffer_min`` or ``none``, within
      ``weight_tolerance``): a priority changed by the refused call shows as
      soon as its slot is drawn;
    * the counts per slot are homogeneous: Pearson's chi-square on the 2 x
      slots table (cells of fewer than 10 draws pooled) at ``FALSE_ALARM``.
    """
    from scipy import stats

    batch = 32 * k
    rounds = -(-DRAWS // batch)
    trace.note(f"{rounds} x buf.sample({batch}) vs. an untouched twin's: the same weight per slot, "
               f"and slot counts alike (chi-square, false alarm {FALSE_ALARM:g})")
    got, want = draws(buf, batch, rounds), draws(twin, batch, rounds)
    if isinstance(got, str) or isinstance(want, str):
        assert_same(f"after the bad call: sample({batch}) raises",
                    got if isinstance(got, str) else "<returned>",
                    want if isinstance(want, str) else "<returned>", trace)
        return
    (got_counts, got_weights), (want_counts, want_weights) = got, want
    if impl.conventions.weight_normaliser != "batch_max":
        common = sorted(set(got_weights) & set(want_weights))
        if common:
            assert_close(f"after the bad call: importance weight of slots {common}",
                         torch.tensor([got_weights[s] for s in common], dtype=torch.float64),
                         torch.tensor([want_weights[s] for s in common], dtype=torch.float64), trace,
                         tol=weight_tolerance(impl.conventions.priority_dtype, CAPACITY))
    slots = sorted(set(got_counts) | set(want_counts), key=lambda s: got_counts.get(s, 0) + want_counts.get(s, 0))
    cells: list[list[int]] = []
    pending = [0, 0]
    for slot in slots:
        pending = [pending[0] + got_counts.get(slot, 0), pending[1] + want_counts.get(slot, 0)]
        if sum(pending) >= 10:
            cells.append(pending)
            pending = [0, 0]
    if cells and sum(pending):
        cells[-1] = [cells[-1][0] + pending[0], cells[-1][1] + pending[1]]
    if len(cells) < 2:  # every draw of both in one pooled cell: nothing to tell apart
        return
    table = [[c[0] for c in cells], [c[1] for c in cells]]
    p = stats.chi2_contingency(table, correction=False).pvalue
    if p < FALSE_ALARM:
        fail(f"after the bad call: draws per slot (chi-square p-value {p:.3g} vs. an untouched twin)",
             {s: got_counts.get(s, 0) for s in sorted(slots)},
             f"counts alike to the twin's {dict((s, want_counts.get(s, 0)) for s in sorted(slots))} "
             f"(false-alarm rate {FALSE_ALARM:g})", trace)


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.id for c in CATALOGUE])
def test_bad_input_is_refused_and_nothing_changes(impl, make_buffer, case):
    """exact: a bad call raises, and length, cursor, write count, contents,
    stored priorities, max priority, generations and the random stream are
    exactly as before."""
    for cap in case.needs:
        if not impl.has(cap):
            pytest.skip(f"unavailable: {cap}: {impl.unavailable[cap]}" if cap in impl.unavailable
                        else f"not declared: {cap}")
    if case.id == "sample_all_priorities_zero" and impl.conventions.eps_rule == "finfo_on_update":
        pytest.skip(f"convention: eps_rule={impl.conventions.eps_rule} (the buffer adds its own eps "
                    f"on update, so no stored priority is 0 and the total never is)")
    if case.id == "sample_all_priorities_zero" and impl.conventions.positive_priorities:
        pytest.skip("convention: positive_priorities (the buffer refuses a priority of 0, so the "
                    "total never is 0; the refusal is case priority_zero)")
    if case.id in ZERO_CASES and not impl.conventions.positive_priorities:
        pytest.skip("spec: a priority of 0 is allowed (a bad input only under the convention "
                    "positive_priorities)")
    for name in ("alpha", "beta"):  # a case built on a parameter the buffer declares it refuses
        declared = impl.conventions.param_range(name)
        if case.spec.sampler == "prioritized" and not declared.contains(getattr(case.spec, name)):
            pytest.skip(f"convention: the case needs {name}={getattr(case.spec, name):g}, outside the "
                        f"declared {declared.describe()} (test_parameters_outside_the_declared_range_are_refused "
                        f"checks the refusal)")
    trace = Trace(impl, case.spec)
    bufs = [trace.wrap(make_buffer(case.spec))] + [make_buffer(case.spec) for _ in range(2)]  # the twins
    for buf in bufs:
        if not case.empty:
            fill(buf, case.spec, impl.conventions, trace)
        if case.setup is not None:
            case.setup(buf, impl.conventions)
    trace.note(f"the bad call {case.id!r}")
    buf, twins = bufs[0], bufs[1:]
    before = snapshot(buf, case.spec, impl)
    error = None
    try:
        case.call(buf, impl.conventions)
    except Exception as err:  # noqa: BLE001 - any refusal counts; ours are checked below
        error = err
    check_refusal(impl, error, case.arg, trace)
    assert_unchanged(snapshot(buf, case.spec, impl), before, trace)
    assert_same_next_sample(impl, case.spec, buf, twins, case.probe, trace, empty=case.empty)


@pytest.mark.parametrize("case", SPEC_CATALOGUE, ids=[c.id for c in SPEC_CATALOGUE])
def test_bad_buffer_description_is_refused(impl, case):
    """exact: a buffer with an invalid capacity, batch size, alpha / beta / eps
    or slice shape cannot be built (or, for a batch size that does not divide,
    or a third party's default batch size, cannot sample)."""
    for cap in (*case.needs, case.spec.sampler):
        if not impl.has(cap):
            pytest.skip(f"unavailable: {cap}: {impl.unavailable[cap]}" if cap in impl.unavailable
                        else f"not declared: {cap}")
    if case.arg == "eps" and impl.conventions.eps_rule != "add":
        pytest.skip(f"convention: eps_rule={impl.conventions.eps_rule} (the buffer takes no eps "
                    f"argument, so spec.eps never reaches it)")
    trace = Trace(impl, case.spec)
    trace.note("(the line above is make(spec))")
    try:
        buf = trace.wrap(impl.make(case.spec))
    except Exception as err:  # noqa: BLE001
        check_refusal(impl, err, case.arg, trace)
        return
    if not (case.deferred or (case.sample_arg and impl.name not in OURS)):
        fail(f"make({case.id})", "<built a buffer>", "an exception naming " + case.arg, trace)
    fill(buf, case.spec, impl.conventions, trace)
    before = snapshot(buf, case.spec, impl)
    # the spec's default batch size when it has one (the bad value may be it),
    # else a valid size, so that only the bad value can be refused
    size = None if case.spec.batch_size is not None else 4
    error = None
    try:
        buf.sample(size)
    except Exception as err:  # noqa: BLE001
        error = err
    check_refusal(impl, error, case.arg, trace)
    assert_unchanged(snapshot(buf, case.spec, impl), before, trace)


# --- priorities in the other float dtype (a robustness property of its own) ---

#: The other float dtype: float64 for a float32 tree, float32 for a float64 one.
OTHER_FLOAT = {torch.float32: torch.float64, torch.float64: torch.float32}
DTYPE_RAW = [6.0, 0.5]  # 6.0 above fill()'s max 4.0: a raised max shows


def fill_in_own_dtype(buf, spec: BufferSpec, dtype: torch.dtype, trace: Trace | None = None) -> None:
    """:func:`fill` with every priority in the buffer's own dtype (a keyed
    spec stays empty: its rows carry the priority column, and a column of
    one dtype then another would be a wrong-dtype row, not this property)."""
    if spec.priority_key:
        return
    buf.extend(named_rows(trace, WRITTEN))
    buf.update_priority(torch.tensor([0, 2]), torch.tensor([4.0, 0.25], dtype=dtype))


DTYPE_CASES = {
    "update_priority": (PRIORITIZED, P, [0, 1], 4.0,
                        lambda buf, dt: buf.update_priority(torch.tensor([0, 1]), torch.tensor(DTYPE_RAW, dtype=dt))),
    "priority_key_on_extend": (KEYED, P + ("priority_key",), [0, 1], 1.0,
                               lambda buf, dt: buf.extend(rows(2).set("priority", torch.tensor(DTYPE_RAW, dtype=dt)))),
}


@pytest.mark.conventions("priority_dtype")
@pytest.mark.parametrize("path", list(DTYPE_CASES))
def test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly(impl, make_buffer, path):
    """exact / tolerance tied to the dtype: priorities handed over in the
    other float dtype than the buffer's own (``conventions.priority_dtype``;
    float64 to a float32 tree, float32 to a float64 one) are either taken --
    the call returns, the written slots store ``(p + eps) ** alpha`` of the
    priorities rounded to the buffer's dtype (``priority_tolerance``) and
    max_priority becomes 6.0 -- or refused like any bad input: an exception,
    and length, cursor, contents, stored priorities and max priority exactly
    as before (without read-back: the draws of twins that never saw the
    call, :func:`assert_same_next_sample`). A crash that leaves part of the
    state changed is neither.
    (update_priority on a filled buffer; a first extend carrying the
    priorities under ``priority_key`` on an empty one.)"""
    spec, needs, slots, max_before, call = DTYPE_CASES[path]
    for cap in needs:
        if not impl.has(cap):
            pytest.skip(f"unavailable: {cap}: {impl.unavailable[cap]}" if cap in impl.unavailable
                        else f"not declared: {cap}")
    own = impl.conventions.priority_dtype
    other = OTHER_FLOAT[own]
    trace = Trace(impl, spec)
    buf, *twins = (trace.wrap(make_buffer(spec)), make_buffer(spec), make_buffer(spec))  # then the twins
    for each in (buf, *twins):
        fill_in_own_dtype(each, spec, own, trace)
    before = snapshot(buf, spec, impl)
    trace.note(f"then {path} with priorities {DTYPE_RAW} as {other} (the buffer's dtype: {own})")
    try:
        call(buf, other)
    except Exception as err:  # noqa: BLE001 - a refusal; then nothing may have changed
        trace.note(f"raised {type(err).__name__}: {err}")
        assert_unchanged(snapshot(buf, spec, impl), before, trace)
        assert_same_next_sample(impl, spec, buf, twins, 4, trace, empty=bool(spec.priority_key))
        return
    if reads_back(spec, impl):
        want = transform(impl.conventions.priorities(DTYPE_RAW).double(),
                         impl.conventions.effective_eps(spec.eps), spec.alpha)
        assert_close(f"stored_priority({slots})", buf.stored_priority(torch.tensor(slots)), want, trace,
                     tol=priority_tolerance(own, spec.alpha))
        # exact, unless the buffer records its max with its own eps added (tianshou prio.py:89) or
        # only the transformed max in a float32 tree (flashbax sum_tree.py:383)
        transformed_max = impl.conventions.eps_rule == "none" and own != torch.float64
        if impl.conventions.eps_rule != "finfo_on_update" and not transformed_max:
            assert_same("max_priority", float(buf.max_priority), max(max_before, *DTYPE_RAW), trace)
        else:
            assert_close("max_priority", torch.tensor([float(buf.max_priority)], dtype=torch.float64),
                         torch.tensor([max(max_before, *DTYPE_RAW)], dtype=torch.float64), trace,
                         tol=priority_tolerance(own, 1.0))
