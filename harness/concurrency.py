"""Driving one buffer from K writers, M samplers, an updater and a saver at once.

The conformance properties of ``rbcheck/conformance/test_concurrency.py``
run a :class:`Workload` through :func:`run_workload` and check what it
records (:class:`Record`) with the functions below. Nothing here knows a
concrete backend: writers run as threads of this process unless the buffer
under test offers ``spawn_writer(job) -> handle`` (a served buffer runs them
where its clients live, e.g. as Ray tasks in other processes; the handle has
``join_result(timeout) -> slots`` and, optionally, ``cancel()``); samplers, the
updater and the saver are threads of this process (the learner's side).

Rows
----
Every row carries ``writer`` (int64), ``seq`` (int64, the writer's own row
number, 0, 1, 2, ...), ``payload`` (int64 ``[width]``, a function of the two)
and ``checksum`` (int64, a function of all three plus a salt, so a zero row
that was never written fails it too). A row assembled from two writes (one
column from each) or never written fails :func:`torn_rows`.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec

#: The tag columns every concurrency row carries.
TAG_KEYS = ("writer", "seq", "payload", "checksum")
#: Added to every checksum: an all-zero (never written) row does not pass.
SALT = 0x5DEECE66D
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


# --------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------


def payload_of(writer: torch.Tensor, seq: torch.Tensor, width: int) -> torch.Tensor:
    """int64 ``[n, width]``: distinct per (writer, seq, column), below 2**31."""
    base = writer.to(torch.int64) * 1_000_003 + seq.to(torch.int64) * 7_919 + 17
    k = torch.arange(width, dtype=torch.int64)
    return (base[:, None] * 2_654_435_761 + k * 40_503 + 12_345) % 2**31


def checksum_of(writer: torch.Tensor, seq: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` over the tags and the payload (no overflow for width <= 64)."""
    weights = torch.arange(1, payload.shape[-1] + 1, dtype=torch.int64) * 31
    return (payload * weights).sum(-1) + writer.to(torch.int64) * 3_000_017 + seq.to(torch.int64) * 101 + SALT


def make_rows(writer: int, start: int, n: int, width: int) -> TensorDictBase:
    """Rows ``start .. start+n-1`` of writer ``writer`` (batch ``[n]``)."""
    w = torch.full((n,), writer, dtype=torch.int64)
    s = torch.arange(start, start + n, dtype=torch.int64)
    p = payload_of(w, s, width)
    return TensorDict({"writer": w, "seq": s, "payload": p, "checksum": checksum_of(w, s, p)}, batch_size=[n])


def torn_rows(rows: TensorDictBase, totals: Sequence[int]) -> list[str]:
    """Descriptions of rows that are not whole or were never written: the
    checksum does not match, or ``(writer, seq)`` is not a row some writer
    wrote (``totals[w]`` rows by writer ``w``). Empty when all are whole."""
    missing = [k for k in TAG_KEYS if k not in rows.keys()]
    if missing:
        return [f"keys {missing} missing from the rows (keys: {sorted(rows.keys())})"]
    w, s, p, c = (rows.get(k).cpu() for k in TAG_KEYS)
    w, s, c = w.reshape(-1), s.reshape(-1), c.reshape(-1)
    p = p.reshape(len(w), -1)
    bad = []
    good_sum = checksum_of(w, s, p) == c
    good_payload = (payload_of(w, s, p.shape[-1]) == p).all(-1)
    limits = torch.as_tensor(list(totals) or [0], dtype=torch.int64)
    known = (w >= 0) & (w < len(totals)) & (s >= 0)
    known &= s < limits[w.clamp(0, max(len(totals) - 1, 0))]
    for i in torch.nonzero(~(good_sum & good_payload & known)).reshape(-1)[:5].tolist():
        why = "checksum mismatch" if not good_sum[i] else "payload of another row" if not good_payload[i] else "a tag no writer wrote"
        bad.append(f"row {i}: writer={int(w[i])} seq={int(s[i])} checksum={int(c[i])} ({why})")
    return bad


def tags(rows: TensorDictBase) -> list[tuple[int, int]]:
    return list(zip(rows.get("writer").reshape(-1).tolist(), rows.get("seq").reshape(-1).tolist(), strict=True))


def update_priority_of(writer: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """The raw priority the updater gives a row it sampled: distinct per tag,
    in (0, 0.5], so below the initial max priority 1.0 (new rows keep 1.0)."""
    return 1.0 / (2.0 + writer.to(torch.float64) * 100_003 + seq.to(torch.float64))


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
    after_writers: bool = False  # samplers start once every writer is done

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
    checkpoint: Path | None = None
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
    into ``save_to``) at once. Returns what was observed; errors raised
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

    def sampler(m: int) -> None:
        if not wait_for_rows(f"sampler {m}"):
            return
        for i in range(workload.samples):
            if not nap(m + i):
                return
            rows, info = sample()
            record.samples.append(Sample(m, rows, dict(info)))

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
        if not wait_for_rows("saver") or not nap(1):
            return
        with calling("save(path)"):
            buffer.save(save_to)
        record.checkpoint = save_to

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
# the state a run left
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """What a buffer holds, read after a run (or from a loaded snapshot)."""

    length: int
    write_count: int
    cursor: int
    capacity: int
    rows: TensorDictBase  # slots 0 .. length-1

    @classmethod
    def of(cls, buffer: Any, capacity: int) -> State:
        return cls(len(buffer), buffer.write_count, buffer.cursor, capacity, buffer.contents())

    def ring_order(self) -> list[int]:
        """Slots oldest to newest: 0 .. length-1, or from the cursor once full."""
        if self.length < self.capacity:
            return list(range(self.length))
        return [(self.cursor + i) % self.capacity for i in range(self.capacity)]


def ring_problems(state: State, totals: Sequence[int], final: bool) -> list[tuple[str, Any, Any]]:
    """``(what, got, expected)`` for each way ``state`` is not the last
    ``capacity`` rows of one interleaving of the writers' rows that keeps each
    writer's order (``final``: every writer wrote all its rows; otherwise a
    snapshot taken part way, so each writer wrote some prefix of its rows)."""
    out = []
    cap, wc = state.capacity, state.write_count
    total = sum(totals)
    if final and wc != total:
        out.append(("write_count", wc, f"{total} (the rows written: {list(totals)} per writer)"))
    if not final and not 0 <= wc <= total:
        out.append(("write_count of the snapshot", wc, f"in [0, {total}]"))
    if state.length != min(wc, cap):
        out.append(("len", state.length, f"min(write_count={wc}, capacity={cap})"))
    if state.cursor != wc % cap:
        out.append(("cursor", state.cursor, f"write_count % capacity = {wc % cap}"))
    if out:
        return out
    order = [tags(state.rows[[i]])[0] for i in state.ring_order()]
    per_writer: dict[int, list[int]] = {}
    for w, s in order:
        per_writer.setdefault(w, []).append(s)
    for w, seqs in sorted(per_writer.items()):
        if not 0 <= w < len(totals):
            out.append(("a row's writer", w, f"one of 0..{len(totals) - 1}"))
            continue
        want_end = totals[w] if final else seqs[-1] + 1
        want = list(range(want_end - len(seqs), want_end))
        if seqs != want:
            out.append((f"writer {w}'s sequence numbers in ring order", _short(seqs),
                        f"{_short(want)}: its last rows, each once, in write order"))
    if out:
        return out
    if wc <= cap:  # nothing overwritten: every row written so far is here
        if final:
            for w in range(len(totals)):
                if totals[w] and w not in per_writer:
                    out.append((f"rows of writer {w}", 0, f"{totals[w]} (nothing was overwritten)"))
        for w, seqs in per_writer.items():
            if seqs and seqs[0] != 0:
                out.append((f"writer {w}'s first sequence number", seqs[0], "0 (nothing was overwritten)"))
    else:
        written = sum(seqs[-1] + 1 for seqs in per_writer.values())
        absent = sum(totals[w] for w in range(len(totals)) if w not in per_writer)
        if not written <= wc <= written + absent:
            out.append(("write_count", wc, f"between {written} and {written + absent} "
                        f"(the rows up to the last of each writer present, plus absent writers' rows)"))
    return out


def slot_problems(state: State, slots: dict[int, list[list[int]]]) -> list[tuple[str, Any, Any]]:
    """Each surviving row sits in the slot its ``extend`` returned for it."""
    where: dict[tuple[int, int], int] = {}
    for w, batches in slots.items():
        seq = 0
        for batch in batches:
            for slot in batch:
                where[(w, seq)] = slot
                seq += 1
    out = []
    for slot, tag in enumerate(tags(state.rows)):
        if tag in where and where[tag] != slot:
            out.append((f"slot of row writer={tag[0]} seq={tag[1]}", slot,
                        f"{where[tag]}, the slot its extend returned"))
            if len(out) >= 3:
                break
    return out


def _short(seqs: list[int], limit: int = 12) -> str:
    return str(seqs) if len(seqs) <= limit else f"{seqs[:limit // 2]}...{seqs[-limit // 2:]} ({len(seqs)} rows)"


def identical_batches(samples: Sequence[Sample]) -> list[tuple[int, int]]:
    """Pairs of sample numbers whose index batches are identical."""
    seen: dict[tuple[int, ...], int] = {}
    pairs = []
    for i, s in enumerate(samples):
        key = tuple(torch.as_tensor(s.info["index"]).reshape(-1).tolist())
        if key in seen:
            pairs.append((seen[key], i))
        else:
            seen[key] = i
    return pairs


def repeat_bound(batches: int, batch: int, size: int) -> float:
    """Probability that two of ``batches`` independent uniform batches of
    ``batch`` draws over ``size`` slots are identical (union bound)."""
    return math.comb(batches, 2) * float(size) ** -batch


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
    "SALT", "STOP_GRACE_S", "TAG_KEYS", "TIMEOUT_S", "LockedBuffer", "Record", "Sample", "State", "Update",
    "Workload", "WriterJob", "checksum_of", "identical_batches", "locked",
    "call_timeout", "calling", "locked_reference_adapter", "make_rows", "payload_of", "repeat_bound", "ring_problems",
    "run_limit", "run_workload", "run_writer", "slot_problems", "tags", "torn_rows", "update_priority_of",
]
