"""The concurrency driver's own guarantees (``rbcheck.harness.concurrency``
and ``rbcheck/conformance/test_concurrency.py``), checked with small buffers
built for each case:

* the buffer under test is closed on every path, the failing one included;
* a run never outlives its limit: a thread still running then is told to
  stop, and one that does not is reported by name with the call it is in;
* the run limit comes from the buffer: never shorter than the one call
  (round trip) the buffer declares it may take (``call_timeout_s``), and a
  call over that bound is reported as a hang without waiting for the run's
  limit.
"""

from __future__ import annotations

import threading
import time

import pytest

from rbcheck.conformance import test_concurrency as properties
from rbcheck.harness import concurrency
from rbcheck.harness.adapters.reference import reference_adapter
from rbcheck.harness.concurrency import LockedBuffer, Workload, locked, run_workload
from rbcheck.harness.protocol import BufferSpec


def _make(buffer_cls: type, **attrs):
    """A reference-locked buffer of ``buffer_cls`` (capacity 16)."""
    buf = buffer_cls(reference_adapter().make(BufferSpec(capacity=16)))
    for name, value in attrs.items():
        setattr(buf, name, value)
    return buf


def _run_threads() -> set[str]:
    """Names of the live threads a run starts (writers, samplers, updater, saver)."""
    return {t.name for t in threading.enumerate()
            if t.name.startswith(("writer ", "sampler ", "updater", "saver"))}


@pytest.fixture(autouse=True)
def _no_thread_left_behind():
    yield
    deadline = time.monotonic() + 10
    while _run_threads() and time.monotonic() < deadline:
        time.sleep(0.01)


# --------------------------------------------------------------------------
# the buffer under test is closed on the error path
# --------------------------------------------------------------------------


class ClosesCounted(LockedBuffer):
    """Counts the buffers made and closed (class-wide); ``sample`` raises."""

    made: list[ClosesCounted] = []
    closed: list[ClosesCounted] = []

    def __init__(self, inner):
        super().__init__(inner)
        type(self).made.append(self)

    def sample(self, batch_size=None):
        raise RuntimeError("sample failed inside the buffer")

    def close(self) -> None:
        type(self).closed.append(self)


@pytest.mark.parametrize("prop", [
    "test_concurrent_samples_never_see_a_torn_row",
    "test_concurrent_writes_lose_and_duplicate_nothing",
    "test_concurrent_sampling_matches_closed_form",
    "test_checkpoint_taken_during_writes_is_a_consistent_snapshot",
])
def test_the_buffer_is_closed_when_a_worker_raises(prop):
    """A run whose sampler raises fails the property, and every buffer the
    property made was closed (not left to the garbage collector: a served
    buffer holds a process)."""
    ClosesCounted.made, ClosesCounted.closed = [], []
    adapter = locked(reference_adapter(), "closes-counted", ClosesCounted)
    test = getattr(properties, prop)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the property's own failure
        test(impl=adapter)
    assert "sample" in str(info.value), str(info.value)
    assert ClosesCounted.made, "the property made no buffer"
    unclosed = [b for b in ClosesCounted.made if b not in ClosesCounted.closed]
    assert not unclosed, (
        f"buffers left open after the property failed={len(unclosed)} of {len(ClosesCounted.made)}, "
        f"but should be 0")


# --------------------------------------------------------------------------
# hung threads are stopped, or named
# --------------------------------------------------------------------------


class SlowSamples(LockedBuffer):
    """Every ``sample`` takes 0.2 s: a run of many is slow, never stuck."""

    def sample(self, batch_size=None):
        time.sleep(0.2)
        with self.lock:
            return self.inner.sample(batch_size)


def test_a_thread_still_running_at_the_limit_is_stopped():
    """The sampler of 100 slow samples is still going at the limit (1 s): it
    is reported by name, told to stop, and has stopped when the run returns."""
    buf = _make(SlowSamples)
    start = time.monotonic()
    record = run_workload(buf, Workload(writers=((4,),), samples=100, sample_batch=2), timeout=1.0)
    took = time.monotonic() - start
    left = _run_threads()
    assert not left, f"threads of the run still alive after it returned={sorted(left)}, but should be none"
    assert took < 5, f"run took {took:.1f}s, but should end soon after its 1 s limit"
    hang = [e for e in record.errors if e.startswith("sampler 0:")]
    assert hang and "still running" in hang[0] and "sample(2)" in hang[0], record.errors
    assert record.hung == [], f"record.hung={record.hung}, but should be [] (the sampler stopped)"


class StuckUntilClosed(LockedBuffer):
    """``sample`` blocks until ``close()``: a thread no signal can stop."""

    def __init__(self, inner):
        super().__init__(inner)
        self.released = threading.Event()

    def sample(self, batch_size=None):
        self.released.wait()
        raise RuntimeError("closed while sampling")

    def close(self) -> None:
        self.released.set()


def test_a_thread_stuck_in_a_call_is_named_and_left_as_a_daemon():
    """A sampler stuck inside ``sample`` cannot be stopped: the run returns
    at its limit (plus the stop grace), names the thread and its call in
    ``errors`` and ``hung``; the thread is a daemon (it never holds up the
    interpreter's exit), and closing the buffer lets it end."""
    buf = _make(StuckUntilClosed)
    start = time.monotonic()
    record = run_workload(buf, Workload(writers=((4,),), samples=1, sample_batch=3), timeout=0.5)
    took = time.monotonic() - start
    assert took < 0.5 + concurrency.STOP_GRACE_S + 2, f"run took {took:.1f}s"
    assert record.hung == ["sampler 0"], record.hung
    message = next(e for e in record.errors if e.startswith("sampler 0:"))
    assert "inside sample(3)" in message and "did not stop" in message, message
    stuck = [t for t in threading.enumerate() if t.name == "sampler 0"]
    assert stuck and all(t.daemon for t in stuck)
    buf.close()
    for t in stuck:
        t.join(5)
    assert not _run_threads()


# --------------------------------------------------------------------------
# the run limit comes from the buffer's declared per-call bound
# --------------------------------------------------------------------------


def test_the_run_limit_is_never_shorter_than_a_declared_round_trip():
    from rbcheck.harness.adapters.torchrl_ray import CALL_TIMEOUT_S, TorchRLRayBuffer

    assert TorchRLRayBuffer.call_timeout_s == CALL_TIMEOUT_S
    served = _make(LockedBuffer, call_timeout_s=CALL_TIMEOUT_S)
    assert concurrency.run_limit(served) >= CALL_TIMEOUT_S + concurrency.TIMEOUT_S
    assert concurrency.run_limit(_make(LockedBuffer)) == concurrency.TIMEOUT_S
    for bad in (0, -1.0, float("inf"), float("nan"), "300"):
        with pytest.raises(ValueError, match=r"call_timeout_s=.*, but should be"):
            concurrency.run_limit(_make(LockedBuffer, call_timeout_s=bad))


class OneSlowRoundTrip(LockedBuffer):
    """The first ``sample`` takes 1.5 s (a slow round trip, within the 3 s
    the buffer declares); every other call is quick."""

    call_timeout_s = 3.0

    def __init__(self, inner):
        super().__init__(inner)
        self.first = True

    def sample(self, batch_size=None):
        if self.first:
            self.first = False
            time.sleep(1.5)
        with self.lock:
            return self.inner.sample(batch_size)


def test_a_slow_round_trip_within_the_declared_bound_is_no_hang(monkeypatch):
    """With the in-process budget cut to 0.5 s, one round trip of 1.5 s
    (declared bound 3 s) is no hang: the run limit covers it."""
    monkeypatch.setattr(concurrency, "TIMEOUT_S", 0.5)
    record = run_workload(_make(OneSlowRoundTrip), Workload(writers=((4,),), samples=2))
    assert record.limit_s == 0.5 + 3.0, f"record.limit_s={record.limit_s}, but should be 3.5"
    assert record.errors == [], record.errors
    assert len(record.samples) == 2


class HangsPastItsBound(StuckUntilClosed):
    call_timeout_s = 0.3


def test_a_call_over_the_declared_bound_is_a_hang_at_once():
    """A call over the buffer's declared per-call bound (0.3 s) is reported
    as a hang without waiting for the run's limit (60 s + 0.3 s)."""
    buf = _make(HangsPastItsBound)
    start = time.monotonic()
    record = run_workload(buf, Workload(writers=((4,),), samples=1, sample_batch=2))
    took = time.monotonic() - start
    buf.close()
    assert took < 0.3 + concurrency.STOP_GRACE_S + 3, f"run took {took:.1f}s"
    message = next(e for e in record.errors if e.startswith("sampler 0:"))
    assert "inside sample(2)" in message and "call_timeout_s=0.3" in message, message
