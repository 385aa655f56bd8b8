"""Driving one buffer from K writers, M samplers, an updater and a saver at once.

The conformance properties of ``rbcheck/conformance/test_concurrency.py``
run a :class:`Workload` through :func:`run_workload` and check what it
records (:class:`Record`) with the functions below. Nothing here knows a
concrete backend: writers run as threads of this process unless the buffer
under test offers ``spawn_writer(job) -> handle`` (a served buffer runs them
where its clients live, e.g. as Ray tasks in other processes; the handle has
``join_result(timeout) -> slots`` and, optionally, ``cancel()``); samplers, the
updater and the saver are threads of this process (the learner's side).

Rows are made and checked by :mod:`rbcheck.harness.concurrency_checks`.

What "correct" means (the spec of sharing)
------------------------------------------
A buffer that declares ``concurrent`` behaves as if its operations ran one at
a time in some order (each ``extend`` as one step): the reference behind one
lock (:func:`locked`) is that spec: ``--impl
rbcheck.harness.concurrency:locked_reference_adapter`` (named
``reference-locked``). The plain reference is not thread-safe and does not declare
``concurrent``; neither do the variants.

Bounds
------
Every run is bounded. A buffer may declare ``call_timeout_s``: the longest
one of its calls may take (a served buffer's round trip; TorchRL's Ray
adapter declares its 300 s). The run limit (:func:`run_limit`) is
``TIMEOUT_S + call_timeout_s`` (``TIMEOUT_S`` without a declaration), so it is
never shorter than one round trip the buffer may take; a call running longer
than the declared bound is a hang at once, without waiting for the run's
limit. Every thread is a daemon (one stuck in a call never holds up the
interpreter's exit) and notes the buffer call it is in. When the run ends
early (a thread raised, or a call went over its bound) or reaches its limit,
a stop signal goes out: threads stop before their next call, and a spawned
writer whose handle has ``cancel()`` is cancelled. A thread still running
at the limit or over its bound is reported in ``Record.errors`` by name,
with the call it is in; one that does not stop within ``STOP_GRACE_S`` of
the signal is also named in ``Record.hung`` (close the buffer to release
it: the conformance properties close every buffer they make, on every path).
The thread switch interval is lowered while a run is under way so threads
interleave inside operations, not only between them.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from rbcheck.harness.concurrency_checks import make_rows, update_priority_of
from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec

#: Wall-clock budget of one run's own work (all threads and writers together),
#: seconds; a buffer that declares a per-call bound gets that much more
#: (:func:`run_limit`).
TIMEOUT_S = 60.0
#: How long a thread still running when the run ends gets to stop after the
#: stop signal, seconds; one still running then is named in ``Record.hung``.
STOP_GRACE_S = 1.0
#: How often the run looks at its threads, seconds.
POLL_S = 0.005
#: Thread switch interval while a run is under way (seconds; Python's default is 0.005).
SWITCH_INTERVAL_S = 1e-5
#: The most saves one run makes (``Workload.saves``) and the most batches one
#: sampler draws (``Workload.keep_sampling``): a race shows only when a thread
#: switch lands in its window, so a run gives it many windows, as many as
#: the writers' work leaves room for.
MAX_SAVES = 16
MAX_SAMPLES = 64


# --------------------------------------------------------------------------
# workload
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterJob:
    """One writer: its id, the sizes of its extends in order, a delay before
    each (seconds, cycled) and the payload width."""

    writer: int
    batches: tuple[int, ...]
    delays: tuple[float, ...] = (0.0,)
    width: int = 2


def run_writer(buffer: Any, job: WriterJob, stop: threading.Event | None = None) -> list[list[int]]:
    """Write ``job``'s rows in order; return the slots each extend returned.
    Stops before the next extend once ``stop`` is set."""
    slots, start = [], 0
    for i, n in enumerate(job.batches):
        delay = job.delays[i % len(job.delays)]
        if stop is None:
            time.sleep(delay)
        elif stop.wait(delay) if delay > 0 else stop.is_set():
            break
        with calling(f"extend(<{n} rows>)"):
            index = buffer.extend(make_rows(job.writer, start, n, job.width))
        slots.append(torch.as_tensor(index).reshape(-1).tolist())
        start += n
    return slots


@dataclass(frozen=True)
class Workload:
    """What runs at once (every field is drawn by the properties; the repr is
    valid Python for a repro)."""

    writers: tuple[tuple[int, ...], ...]  # per writer: the sizes of its extends
    delays: tuple[float, ...] = (0.0,)  # jitter, seconds (cycled per thread and op)
    samplers: int = 1
    sample_batch: int = 4
    samples: int = 4  # batches per sampler
    width: int = 2
    updates: int = 0  # sample -> update_priority round trips of the updater
    checkpoint: bool = False  # a save while the writers run
    saves: int = 1  # with checkpoint: saves one after another while the writers run (at most)
    keep_sampling: bool = False  # samplers go on past `samples` batches while the writers run
    after_writers: bool = False  # samplers start once every writer is done

    def __post_init__(self) -> None:
        if not 1 <= self.saves <= MAX_SAVES:
            raise ValueError(f"saves={self.saves}, but should be in [1, {MAX_SAVES}]")

    @property
    def totals(self) -> tuple[int, ...]:
        return tuple(sum(b) for b in self.writers)

    def jobs(self) -> list[WriterJob]:
        return [
            WriterJob(w, batches, self.delays[w:] + self.delays[:w], self.width)
            for w, batches in enumerate(self.writers)
        ]


@dataclass
class Sample:
    sampler: int
    rows: TensorDictBase
    info: dict


@dataclass
class Update:
    index: torch.Tensor
    priority: torch.Tensor
    generation: torch.Tensor
    held: bool  # sampled early, applied after the writers finished


@dataclass
class Record:
    """What a run observed."""

    slots: dict[int, list[list[int]]] = field(default_factory=dict)  # writer -> slots per extend
    samples: list[Sample] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)  # every save that returned, in order
    errors: list[str] = field(default_factory=list)  # "<who>: <call> raised <error>"
    hung: list[str] = field(default_factory=list)  # threads that did not stop (daemons left running)
    limit_s: float = 0.0  # the run's wall-clock limit
    seconds: float = 0.0


class _Thread(threading.Thread):
    """One thread of a run, a daemon. ``doing`` is the buffer call under way
    (None between calls), ``since`` when it began, ``last`` the latest call;
    ``bounded``: whether its calls are held to the buffer's per-call bound
    (not so for the thread waiting on a spawned writer's whole task)."""

    def __init__(self, name: str, target: Callable[[], Any], bounded: bool = True):
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.bounded = bounded
        self.result: Any = None
        self.error: BaseException | None = None
        self.doing: str | None = None
        self.last = "start"
        self.since = 0.0

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            self.error = err

    def where(self, now: float) -> str:
        doing, since = self.doing, self.since  # one read: the thread goes on meanwhile
        if doing is not None:
            return f"inside {doing} for {max(0.0, now - since):.1f}s"
        return f"between calls (the last: {self.last})"


@contextmanager
def calling(call: str) -> Iterator[None]:
    """Note that the current thread of a run is inside ``call`` (for a hang
    report); a no-op in any other thread (e.g. a spawned writer's process)."""
    me = threading.current_thread()
    if not isinstance(me, _Thread):
        yield
        return
    # ``since`` before ``doing``: a reader that sees the call sees when it began
    me.since = time.monotonic()
    me.doing = me.last = call
    try:
        yield
    finally:
        me.doing = None


def call_timeout(buffer: Any) -> float | None:
    """The bound on one call that ``buffer`` declares (``call_timeout_s``,
    seconds, e.g. one round trip to a served buffer), or None."""
    value = getattr(buffer, "call_timeout_s", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(
            f"call_timeout_s={value!r}, but should be a finite number of seconds > 0 (the longest "
            f"one call of {type(buffer).__name__} may take, e.g. one round trip to a served buffer)"
        )
    return float(value)


def run_limit(buffer: Any) -> float:
    """The wall-clock limit of one run on ``buffer``: ``TIMEOUT_S`` plus the
    per-call bound it declares (:func:`call_timeout`), so never shorter than
    one round trip it may take."""
    return TIMEOUT_S + (call_timeout(buffer) or 0.0)


def _error(who: str, call: str, err: BaseException) -> str:
    return f"{who}: {call} raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def run_workload(buffer: Any, workload: Workload, save_to: Path | None = None,
                 timeout: float | None = None) -> Record:
    """Run ``workload`` on ``buffer``: the writers, ``samplers`` sampler
    threads, the updater (``updates > 0``) and the saver (``checkpoint``,
    into ``save_to``, or ``save_to/save-<i>`` for each of several saves) at once. Returns what was observed; errors raised
    inside a thread are collected in ``Record.errors`` (the first stops the
    run); a thread still running after ``timeout`` seconds (default
    :func:`run_limit`), or a call over the buffer's declared per-call bound,
    is reported there as a hang, naming the thread and its call. Threads
    are told to stop when the run ends; one that does not within
    ``STOP_GRACE_S`` is named in ``Record.hung``."""
    if workload.checkpoint and save_to is None:
        raise ValueError("save_to=None, but should be a path when workload.checkpoint is set")
    per_call = call_timeout(buffer)
    limit = run_limit(buffer) if timeout is None else float(timeout)
    record = Record(limit_s=limit)
    start = time.monotonic()
    deadline = start + limit
    writers_done = threading.Event()
    stop = threading.Event()
    delays = workload.delays or (0.0,)

    def nap(i: int) -> bool:
        """Sleep the jitter; False once the run is told to stop."""
        delay = delays[i % len(delays)]
        return not (stop.wait(delay) if delay > 0 else stop.is_set())

    def size() -> int:
        with calling("len()"):
            return len(buffer)

    def wait_for_rows(who: str) -> bool:
        while size() == 0 or (workload.after_writers and not writers_done.is_set()):
            if stop.is_set():
                return False
            if writers_done.is_set() and size() == 0 and not stop.is_set():
                record.errors.append(f"{who}: len(buffer)=0 after every writer finished, but should be > 0")
                return False
            time.sleep(0.0005)
        return True

    def sample() -> tuple[TensorDictBase, dict]:
        with calling(f"sample({workload.sample_batch})"):
            return buffer.sample(workload.sample_batch)

    def more_samples(i: int) -> bool:
        if i < workload.samples:
            return True
        return workload.keep_sampling and i < MAX_SAMPLES and not writers_done.is_set()

    def sampler(m: int) -> None:
        if not wait_for_rows(f"sampler {m}"):
            return
        i = 0
        while more_samples(i):
            if not nap(m + i):
                return
            rows, info = sample()
            record.samples.append(Sample(m, rows, dict(info)))
            i += 1

    def updater() -> None:
        if not wait_for_rows("updater"):
            return
        held = sample()  # applied once the writers are done
        for i in range(workload.updates):
            rows, info = sample()
            if not nap(i):
                return
            _update(buffer, record, rows, info, held=False)
        writers_done.wait(max(0.0, deadline - time.monotonic()))
        if not stop.is_set():
            _update(buffer, record, *held, held=True)

    def saver() -> None:
        if not wait_for_rows("saver"):
            return
        if workload.saves > 1:  # the folder holding the saves is the harness's own: a buffer makes only its checkpoint
            save_to.mkdir(parents=True, exist_ok=True)
        for i in range(workload.saves):
            if not nap(1 + i) or (i and writers_done.is_set()):
                return  # a save once the writes are over races nothing
            path = save_to if workload.saves == 1 else save_to / f"save-{i}"
            with calling(f"save(<path {i}>)"):
                buffer.save(path)
            record.checkpoints.append(path)

    threads = [_Thread(f"sampler {m}", lambda m=m: sampler(m)) for m in range(workload.samplers)]
    if workload.updates:
        threads.append(_Thread("updater", updater))
    if workload.checkpoint:
        threads.append(_Thread("saver", saver))
    spawn = getattr(buffer, "spawn_writer", None)
    writers: dict[int, _Thread] = {}
    handles: dict[int, Any] = {}  # spawned writers: objects with join_result(timeout) [and cancel()]
    hangs: dict[str, str] = {}
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        for thread in threads:
            thread.start()
        for job in workload.jobs():
            name = f"writer {job.writer}"
            if spawn is None:
                writers[job.writer] = _Thread(name, lambda job=job: run_writer(buffer, job, stop))
            else:
                try:
                    handles[job.writer] = handle = spawn(job)
                except Exception as err:  # noqa: BLE001
                    record.errors.append(_error(name, "start", err))
                    continue

                def join(handle: Any = handle) -> Any:
                    with calling("its spawned task (join_result)"):
                        return handle.join_result(max(0.0, deadline - time.monotonic()))

                writers[job.writer] = _Thread(name, join, bounded=False)
            writers[job.writer].start()
        every = threads + list(writers.values())
        while True:
            alive = [t for t in every if t.is_alive()]
            if not any(t.is_alive() for t in writers.values()):
                writers_done.set()
            if not alive or record.errors or any(t.error is not None for t in every):
                break
            now = time.monotonic()
            over = [t for t in alive if per_call is not None and t.bounded and t.doing is not None
                    and now - t.since > per_call]
            for t in over:
                hangs[t.name] = (f"{t.name}: {t.where(now)}, over the buffer's declared per-call bound "
                                 f"call_timeout_s={per_call:g} (a hang or deadlock)")
            if over:
                break
            if now >= deadline:
                for t in alive:
                    hangs[t.name] = (f"{t.name}: still running after the run's limit of {limit:.1f}s, "
                                     f"{t.where(now)} (a hang or deadlock)")
                break
            time.sleep(POLL_S)
        stop.set()
        writers_done.set()
        for w, handle in handles.items():
            cancel = getattr(handle, "cancel", None)
            if cancel is not None and writers[w].is_alive():
                try:
                    cancel()
                except Exception as err:  # noqa: BLE001
                    record.errors.append(_error(f"writer {w}", "cancel", err))
        grace = time.monotonic() + STOP_GRACE_S
        for t in every:
            t.join(max(0.0, grace - time.monotonic()))
        now = time.monotonic()
        for t in sorted(every, key=lambda t: t.name not in hangs):  # what ended the run first
            if t.is_alive():
                record.hung.append(t.name)
                said = hangs.get(t.name, f"{t.name}: {t.where(now)} when the run stopped")
                record.errors.append(f"{said}; it did not stop within {STOP_GRACE_S:g}s of the stop "
                                     f"signal (left running as a daemon thread)")
            elif t.name in hangs:
                record.errors.append(f"{hangs[t.name]}; it stopped on the stop signal")
            elif t.error is not None:
                record.errors.append(_error(t.name, t.last, t.error))
        for w, t in writers.items():
            if not t.is_alive() and t.error is None and t.name not in hangs:
                record.slots[w] = t.result
    finally:
        stop.set()
        sys.setswitchinterval(old_interval)
        record.seconds = time.monotonic() - start
    return record


def _update(buffer: Any, record: Record, rows: TensorDictBase, info: dict, held: bool) -> None:
    """``update_priority`` of the sampled slots with the generations seen then;
    each row's priority is a function of its tag (:func:`update_priority_of`)."""
    index = torch.as_tensor(info["index"]).reshape(-1)
    generation = torch.as_tensor(info["generation"]).reshape(-1)
    priority = update_priority_of(rows.get("writer").reshape(-1), rows.get("seq").reshape(-1))
    with calling(f"update_priority(<{index.numel()} slots>)"):
        buffer.update_priority(index, priority, generation=generation)
    record.updates.append(Update(index, priority, generation, held))


# --------------------------------------------------------------------------
# the reference behind one lock: the spec of a shared buffer
# --------------------------------------------------------------------------


class LockedBuffer:
    """A :class:`BufferUnderTest` whose every operation holds one lock: the
    operations of all threads run one at a time, each whole."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.lock = threading.RLock()

    def __repr__(self) -> str:
        return f"LockedBuffer({self.inner!r})"

    def __len__(self) -> int:
        with self.lock:
            return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return value(*args, **kwargs)

        return call

    # properties of the protocol are plain attributes of the inner buffer
    @property
    def cursor(self) -> int:
        with self.lock:
            return self.inner.cursor

    @property
    def write_count(self) -> int:
        with self.lock:
            return self.inner.write_count

    @property
    def max_priority(self) -> float:
        with self.lock:
            return self.inner.max_priority


def locked(adapter: Adapter, name: str | None = None, buffer_cls: type = LockedBuffer) -> Adapter:
    """``adapter`` with every buffer behind one lock, declaring ``concurrent``."""

    def make(spec: BufferSpec) -> LockedBuffer:
        return buffer_cls(adapter.make(spec))

    return replace(adapter, name=name or f"{adapter.name}-locked", make=make,
                   capabilities=frozenset(adapter.capabilities) | {"concurrent"})


def locked_reference_adapter() -> Adapter:
    """The reference behind one lock (``--impl rbcheck.harness.concurrency:locked_reference_adapter``)."""
    from rbcheck.harness.adapters.reference import reference_adapter

    return locked(reference_adapter(), "reference-locked")


assert "concurrent" in CAPABILITIES

__all__ = [
    "STOP_GRACE_S", "TIMEOUT_S", "LockedBuffer", "Record", "Sample", "Update", "Workload", "WriterJob",
    "call_timeout", "calling", "locked", "locked_reference_adapter", "run_limit", "run_workload", "run_writer",
]
