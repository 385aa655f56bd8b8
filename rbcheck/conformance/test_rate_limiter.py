"""Rate limiters of served tables (issue 42): Reverb's admission rule, from
one thread and from several.

The declared rule (reference/rate_limiter.py, copied from Reverb's
``reverb/cc/rate_limiter.cc``): with ``size = inserts - deletes`` and
``diff = inserts * spi - samples``, a sample is admitted only while
``size >= min_size_to_sample`` and ``diff - 1 >= min_diff``; an insert
freely while the size after it is ``<= min_size_to_sample``, else only while
``diff + spi <= max_diff``. A call not admitted within its ``timeout`` raises
a ``TimeoutError`` and changes nothing; a waiting call is admitted as soon as
another call makes room. Nothing here sleeps: a call the rule refuses must
time out (after ``SHORT`` seconds), one it admits must succeed (within
``LONG``), and a call waiting in a thread is woken by the main thread's call.

Under ``Conventions.sampler_rules["timed_out_insert"] = "lands_later"`` (Reverb: a flush that
times out does not withdraw the insert) a timed-out insert is checked to
change nothing while the rule refuses it, and is then counted as possibly
admitted later: the checks use what the table holds (``len``), never a guess
of when it landed, so no verdict depends on timing.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, assert_same, fail
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.sampler_laws import sampler_rule
from rbcheck.reference.rate_limiter import RateLimiter, min_size, queue, sample_to_insert_ratio

pytestmark = pytest.mark.requires("rate_limiter")
SHORT, LONG = 0.05, 10.0  # seconds: a refused call's timeout, an admitted call's
LAYOUT = {"id": ((), torch.int64), "priority": ((), torch.float64)}


def row(i: int) -> TensorDict:
    return TensorDict({"id": torch.tensor([i]), "priority": torch.tensor([1.0], dtype=torch.float64)}, batch_size=[1])


@st.composite
def limited_specs(draw, impl):
    """A spec with one of Reverb's limiters: MinSize, SampleToInsertRatio, or
    Queue (fifo, max_times_sampled=1) where the adapter has those capabilities."""
    kinds = ["min_size", "ratio"]
    if impl.has("selector") and impl.has("max_times_sampled"):
        kinds.append("queue")
    kind = draw(st.sampled_from(kinds), label="limiter")
    size = draw(st.integers(1, 4), label="min_size_to_sample")
    if kind == "min_size":
        limiter, extra = min_size(size), {}
    elif kind == "ratio":
        spi = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]), label="samples_per_insert")
        buffer = max(1.0, spi) + draw(st.sampled_from([0.0, 0.5, 2.0]), label="error_buffer - max(1, spi)")
        limiter, extra = sample_to_insert_ratio(spi, size, buffer), {}
    else:
        limiter, extra = queue(size), {"sampler": "fifo", "max_times_sampled": 1}
    sampler = extra.pop("sampler", draw(st.sampled_from(["random"]), label="sampler"))
    return BufferSpec(capacity=1000, sampler=sampler, rate_limiter=limiter.as_tuple(), priority_key="priority",
                      seed=draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT, **extra)


class Counts:
    """The limiter's counts as the rule sees them (deletes: max_times_sampled=1 only here)."""

    def __init__(self, spec: BufferSpec):
        self.limiter = RateLimiter(*spec.rate_limiter)
        self.consumed = spec.max_times_sampled == 1
        self.inserts = self.samples = 0

    @property
    def deletes(self) -> int:
        return self.samples if self.consumed else 0

    def admits(self, call: str) -> bool:
        ask = self.limiter.can_insert if call == "insert" else self.limiter.can_sample
        return ask(self.inserts, self.samples, self.deletes)

    def __str__(self) -> str:
        return f"inserts={self.inserts}, samples={self.samples}, deletes={self.deletes}, {self.limiter}"


def call(buf, kind: str, row_id: int, timeout: float, trace: Trace | None = None) -> bool:
    """One insert or one sample with ``timeout``: True when done, False when it timed out
    (the row named ``row(<id>)`` on ``trace``, when given, for a recorded buffer's repro)."""
    try:
        if kind == "insert":
            rows = row(row_id) if trace is None else trace.name(row(row_id), f"row({row_id})")
            buf.extend(rows, timeout=timeout)
        else:
            buf.sample(1, timeout=timeout)
    except TimeoutError:
        return False
    return True


def lands_later(impl) -> bool:
    """Whether a timed-out insert of ``impl`` may land later (Conventions.sampler_rules["timed_out_insert"])."""
    return sampler_rule(impl.conventions, "timed_out_insert") == "lands_later"


def rate_trace(impl, spec: BufferSpec) -> Trace:
    """A trace whose snippet imports :func:`row` from this file."""
    trace = Trace(impl, spec)
    trace.need("from rbcheck.conformance.test_rate_limiter import row")
    return trace


def check_call(buf, counts: Counts, kind: str, row_id: int, trace: Trace, when: str) -> bool:
    """The call the rule admits succeeds (within LONG), the one it refuses times out
    (after SHORT); returns whether it was admitted."""
    admitted = counts.admits(kind)
    method = f"buf.extend(row({row_id}), timeout={LONG if admitted else SHORT})" if kind == "insert" \
        else f"buf.sample(1, timeout={LONG if admitted else SHORT})"
    done = call(buf, kind, row_id, LONG if admitted else SHORT, trace)
    if done != admitted:
        fail(f"{method} {when} ({counts})", "admitted" if done else "<TimeoutError>",
             "admitted" if admitted else "<TimeoutError> (the rule refuses it)", trace)
    if done:
        counts.inserts += kind == "insert"
        counts.samples += kind == "sample"
    return done


@given(data=st.data())
def test_calls_are_admitted_by_the_rule(impl, data):
    """exact: over drawn sequences of single inserts and samples (MinSize,
    SampleToInsertRatio with spi 0.5 to 3 and its error buffer, Queue), each
    call the rule admits succeeds and each it refuses times out, changing
    nothing: the length is inserts - deletes after every call. Under
    ``timed_out_insert="lands_later"`` the sequence ends at the first refused
    insert (it changed nothing; when it lands later is the server's)."""
    spec = data.draw(limited_specs(impl), label="spec")
    trace = rate_trace(impl, spec)
    buf, counts = trace.wrap(impl.make(spec)), Counts(spec)
    for step in range(data.draw(st.integers(1, 24), label="calls")):
        kind = data.draw(st.sampled_from(["insert", "sample"]), label=f"call {step}")
        done = check_call(buf, counts, kind, counts.inserts, trace, f"at call {step}")
        assert_same(f"len(buf) after call {step} ({counts})", len(buf), counts.inserts - counts.deletes, trace)
        if kind == "insert" and not done and lands_later(impl):
            trace.note("timed_out_insert='lands_later': the refused insert may land later; the sequence ends")
            return


@given(data=st.data())
def test_threads_are_admitted_within_the_rule(impl, data):
    """exact: 2 to 4 threads each make a drawn list of inserts and samples
    (timeout SHORT each) at once; afterwards the admitted counts obey the
    rule (every sample had ``min_size_to_sample`` items and left the diff
    ``>= min_diff``, every insert past the free ones left it ``<= max_diff``),
    every sampled id is one an admitted insert wrote, the length is
    inserts - deletes, and the next insert and sample are admitted or time
    out as the rule says from those counts.

    Under ``timed_out_insert="lands_later"`` a timed-out insert may have
    landed or still be waiting: the counts are those of the table (inserts
    ``= len(buf) + deletes``), between the confirmed inserts and those plus
    the timed-out ones; sampled ids are confirmed or timed-out inserts; the
    next calls are checked only when every timed-out insert has landed
    (nothing is left that could land during them)."""
    spec = data.draw(limited_specs(impl), label="spec")
    plans = data.draw(st.lists(st.lists(st.sampled_from(["insert", "sample"]), min_size=1, max_size=8),
                               min_size=2, max_size=4), label="calls of each thread")
    trace = rate_trace(impl, spec)
    trace.note(f"{len(plans)} threads at once, each call with timeout={SHORT}: {plans} (not recorded)")
    buf, counts = trace.wrap(impl.make(spec)), Counts(spec)
    shared = buf.inner  # the threads' calls are not recorded: a snippet could not replay their interleaving
    inserted, timed_out, sampled, errors = set(), set(), [], []
    start = threading.Barrier(len(plans))

    def worker(t: int, plan: list[str]) -> None:
        try:
            start.wait()
            for j, kind in enumerate(plan):
                row_id = 1000 * t + j
                if kind == "insert":
                    (inserted if call(shared, "insert", row_id, SHORT) else timed_out).add(row_id)
                elif kind == "sample":
                    try:
                        rows, _ = shared.sample(1, timeout=SHORT)
                        sampled.append(int(rows["id"].reshape(-1)[0]))
                    except TimeoutError:
                        pass
        except Exception as err:  # noqa: BLE001 - reported below with the thread
            errors.append(f"thread {t}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(t, plan)) for t, plan in enumerate(plans)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        fail("calls from threads", errors, "each insert and sample done or a TimeoutError", trace)
    counts.inserts, counts.samples = len(inserted), len(sampled)
    later = lands_later(impl) and timed_out
    if later:  # the table's own count: the confirmed inserts plus the timed-out ones that landed
        held = len(buf)
        counts.inserts = held + counts.deletes
        if not len(inserted) <= counts.inserts <= len(inserted) + len(timed_out):
            fail(f"len(buf) + deletes after the threads ({counts})", counts.inserts,
                 f"between the {len(inserted)} confirmed inserts and those plus the {len(timed_out)} timed out "
                 "(timed_out_insert='lands_later')", trace)
    lim, diff = counts.limiter, counts.inserts * counts.limiter.samples_per_insert - counts.samples
    strays = sorted(set(sampled) - inserted - (timed_out if later else set()))
    if strays:
        fail("ids sampled but never admitted as inserts", strays, "none", trace, f"admitted: {sorted(inserted)}")
    if counts.samples and (diff < lim.min_diff or counts.inserts < lim.min_size_to_sample):
        fail(f"admitted counts ({counts})", f"diff={diff}", f"diff >= min_diff and inserts >= min_size_to_sample "
             "once anything was sampled", trace)
    if counts.inserts - counts.deletes > lim.min_size_to_sample and diff > lim.max_diff:
        fail(f"admitted counts ({counts})", f"diff={diff}", f"<= max_diff={lim.max_diff}", trace)
    if later:
        if counts.inserts < len(inserted) + len(timed_out):
            trace.note("timed_out_insert='lands_later': a timed-out insert may still land; no next calls")
            return
    else:
        assert_same(f"len(buf) after the threads ({counts})", len(buf), counts.inserts - counts.deletes, trace)
    for kind in ("sample", "insert"):
        check_call(buf, counts, kind, 99_999, trace, "after the threads")


@given(data=st.data())
def test_a_waiting_call_is_admitted_when_room_is_made(impl, data):
    """exact: a sample waiting (timeout LONG) in a thread on a MinSize(m)
    table one item short is admitted once the main thread inserts that item;
    an insert waiting on a full Queue(m) is admitted once the main thread
    samples one item. The main thread first checks that the same call times
    out (the rule refuses it), which gives the thread time to start waiting;
    a call still waiting, unwoken, at its deadline fails (Reverb's rule).
    Under ``timed_out_insert="lands_later"`` the main thread's refused insert
    is left out (it would stay queued and take the room)."""
    m = data.draw(st.integers(1, 3), label="min_size_to_sample / queue size")
    queued = impl.has("selector") and impl.has("max_times_sampled") and data.draw(st.booleans(), label="queue")
    spec = BufferSpec(capacity=1000, sampler="fifo" if queued else "random", max_times_sampled=int(queued),
                      rate_limiter=(queue(m) if queued else min_size(m)).as_tuple(), priority_key="priority",
                      layout=LAYOUT)
    trace = rate_trace(impl, spec)
    buf = trace.wrap(impl.make(spec))
    # under timed_out_insert="lands_later" a refused insert would stay queued and take the room
    probe = not (queued and lands_later(impl))
    for i in range(m if queued else m - 1):
        buf.extend(trace.name(row(i), f"row({i})"), timeout=LONG)
    waiting = "insert" if queued else "sample"
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(call(buf.inner, waiting, 500, LONG)))
    trace.note(f"in a thread, not recorded: {'buf.extend(row(500)' if queued else 'buf.sample(1'}, timeout={LONG})")
    waiter.start()
    if probe:
        refused = call(buf, waiting, 501, SHORT, trace)  # the rule refuses it; meanwhile the thread waits
        assert_same(f"{'buf.extend(row(501)' if queued else 'buf.sample(1'}, timeout={SHORT}) before room is made",
                    refused, False, trace)
    making_room = "sample" if queued else "insert"
    main_done = call(buf, making_room, m, LONG, trace)
    waiter.join()
    assert_same(f"the main thread's {making_room} (admitted by the rule)", main_done, True, trace)
    assert_same(f"the waiting {waiting} once the main thread's {making_room} made room", outcome, [True], trace)
