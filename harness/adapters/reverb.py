"""DeepMind Reverb's served tables (dm-reverb 0.14.0, TensorFlow 2.15), built-in
names ``reverb`` (Uniform sampler, MinSize), ``reverb-prioritized``
(Prioritized sampler, SampleToInsertRatio) and ``reverb-queue`` (Fifo/Lifo/heap
selectors, Queue), each in the validate environment ``reverb`` of its own.

Each buffer is a real server: ``make(spec)`` starts ``reverb.Server(tables=
[reverb.Table("t", ...)], port=<a free port>)`` on localhost (nothing beyond
loopback) and the buffer talks to it through ``reverb.Client``; the server
stops when the buffer is collected or at exit. The spec maps to the table:

* ``max_size=spec.capacity``, ``max_times_sampled=spec.max_times_sampled``,
  ``remover`` from ``spec.remover`` and ``sampler`` from ``spec.sampler``
  ("fifo" -> ``selectors.Fifo``, "lifo" -> ``Lifo``, "min_heap"/"max_heap" ->
  ``MinHeap``/``MaxHeap``; "random" -> ``Uniform`` in ``reverb``,
  ``Prioritized(priority_exponent=spec.alpha)`` in ``reverb-prioritized``);
  ``rate_limiter`` from ``spec.rate_limiter``'s four numbers through
  ``reverb.rate_limiters.RateLimiter`` (MinSize(1), Reverb's default, when None).
* rows: each leaf of ``spec.layout`` (nested keys too) is one column of the
  table's signature, ``c0``, ``c1``, ... in sorted key order, plus a column
  ``rbcheck_write_number``: the row's write number (its *tag*). Without a
  layout the table and its server start at the first write, from its rows
  (a signature is fixed when the server starts).
* ``extend(data, timeout)``: one item a row, through one trajectory writer
  (``append`` then ``create_item(table, priority, one step)``), confirmed by
  ``flush(timeout_ms=...)`` every 32 rows and at the end (after each row when
  a timeout is given); a ``DeadlineExceededError`` becomes ``TimeoutError``.
* ``sample(batch, timeout)``: a ``TrajectoryDataset`` of ``max_samples=batch``
  with ``rate_limiter_timeout_ms``; fewer items than asked (the dataset ends
  when the rate limiter's timeout passes) becomes ``TimeoutError``. ``info``
  holds Reverb's ``key`` and ``times_sampled``.
* ``len``: ``client.server_info()["t"].current_size``.

Slots. A spec that is not served (``served.served_spec``: sampler "random",
remover "fifo", no ``max_times_sampled``, no ``rate_limiter``: the core
properties' specs) builds a table that IS a ring: a Fifo remover and
``max_size=capacity`` keep the last ``capacity`` items (an insert into a full
table deletes ``remover_->Sample()``, the oldest, reverb/cc/table.cc:531-533;
fifo.cc:32-34). Reverb's items have keys, not slots, so the adapter derives
them as rlox's adapter does: the row with tag ``t`` is at slot
``t % capacity``. ``extend``/``add`` return those slots, ``info["index"]`` is
``tag % capacity`` of each sampled item, ``cursor`` is ``write_count %
capacity`` and ``write_count`` counts the rows handed over. ``contents()``:
Reverb has no read of a table's items (``reverb.Table`` has ``info``,
``can_sample``, ``can_insert``; a checkpoint lists them only in its own
compressed chunk files), so the items are drawn (batches of 1024 through a
``TrajectoryDataset``) until ``len`` distinct tags are seen, then returned in
slot order; a held item never drawn within ``len * (ln len + 30)`` draws (a
chance below e**-30 for a uniform table) is an error naming the slots missing
(an item of priority 0 is never drawn by ``reverb-prioritized``). A draw only
raises the item's ``times_sampled``, which no ring property reads. On an
empty ring (``Table.can_sample(1)`` False, Reverb's own rule) ``sample()``
without a timeout raises instead of waiting for ever. A served spec's table
is no ring (items leave by ``max_times_sampled`` or another remover, the
limiter may hold calls back): ``cursor`` and ``contents()`` raise
``NotImplementedError`` saying so, ``extend`` returns -1 a row and a sample
has no ``index``; the served properties read rows by their ids.

Each server gets a checkpoint folder of its own (Reverb's default is a new
temporary folder a server, never removed), removed when the server stops.

Declared conventions. (docs/bugs.toml V1) ``Conventions.sampler_rules=
{"timed_out_insert": "lands_later"}`` (harness/sampler_laws.py). An insert
whose flush timed out is not withdrawn; the server inserts it once the
limiter admits it (``TrajectoryWriter.flush``'s docstring:
"although the block is interrupted, the insertion of the items will proceed
in the background", reverb/trajectory_writer.py:403-406). ``seedable=False``:
Reverb's selectors draw from an unseeded ``absl::BitGen`` (Uniform:
reverb/cc/selectors/uniform.cc:64, uniform.h:56) and ``reverb.Table`` takes
no seed, so exact-replay checks are skipped and the distributional ones run.
"""

from __future__ import annotations

import importlib
import math
import shutil
import tempfile
import weakref

import numpy as np
import torch
from tensordict import TensorDict

from rbcheck.harness.adapters.numpy_rows import as_key, layout_from_rows, to_numpy
from rbcheck.harness.adapters.served import served_spec
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

TABLE = "t"
#: the column carrying each item's write number (its slot is ``tag % capacity``)
TAG = "rbcheck_write_number"
#: rows appended between two confirmations (flush) of a write of many rows
FLUSH_EVERY = 32
#: contents() gives up after len * (ln len + this) draws without seeing every held item
READ_SLACK = 30.0
#: items a contents() read draws per batch and keeps in flight
READ_BATCH = 1024
#: a contents() read waits at most this long for the limiter (MinSize(1) admits any non-empty table)
READ_TIMEOUT_MS = 60_000
#: Reverb R1 (docs/bugs.toml V1): a timed-out insert lands later, as documented. The Uniform selector
#: draws from its own unseeded absl::BitGen: not seedable.
CONVENTIONS = Conventions(sampler_rules={"timed_out_insert": "lands_later"}, seedable=False, notes={
    "sampler_rules": "a timed-out insert lands later: TrajectoryWriter.flush inserts in the background after "
                     "its timeout (reverb/trajectory_writer.py:403-406; reverb/cc/reverb_service_impl.cc:207)",
    "seedable": "Reverb's selectors draw from an unseeded absl::BitGen (reverb/cc/selectors/uniform.cc:64, "
                "uniform.h:56; prioritized.cc:112, prioritized.h:121); reverb.Table takes no seed"})


def _import():
    try:
        return importlib.import_module("reverb"), importlib.import_module("tensorflow")
    except ImportError as err:
        raise ImportError(f"dm-reverb is not installed or does not load ({type(err).__name__}: {err}), "
                          f"but should be: install the 'reverb' dependency group (its own environment)") from err


class ReverbBuffer:
    """One Reverb server holding one table (module docstring)."""

    def __init__(self, spec: BufferSpec, flavour: str):
        reverb, tf = _import()
        self.reverb, self.tf, self.spec = reverb, tf, spec
        self.ring = not served_spec(spec)
        sel = reverb.selectors
        kinds = {"fifo": sel.Fifo, "lifo": sel.Lifo, "min_heap": sel.MinHeap, "max_heap": sel.MaxHeap}
        if spec.sampler == "random":
            sampler = sel.Prioritized(spec.alpha) if flavour == "prioritized" else sel.Uniform()
        elif spec.sampler in kinds:
            sampler = kinds[spec.sampler]()
        else:
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or one of {sorted(kinds)}")
        if spec.remover not in kinds:
            raise ValueError(f"spec.remover={spec.remover!r}, but should be one of {sorted(kinds)}")
        limiter = reverb.rate_limiters.MinSize(1) if spec.rate_limiter is None else \
            reverb.rate_limiters.RateLimiter(*(float(spec.rate_limiter[0]), int(spec.rate_limiter[1]),
                                               float(spec.rate_limiter[2]), float(spec.rate_limiter[3])))
        self.sampler, self.remover, self.limiter = sampler, kinds[spec.remover](), limiter
        self.written = 0
        self.fields: list = []  # (key as a tuple, per-row shape, torch dtype), one column each
        self.server = self.table = None
        self._stop = None
        if spec.layout is not None:
            self._start(sorted((as_key(k), tuple(shape), dtype) for k, (shape, dtype) in spec.layout.items()))

    def _start(self, fields: list) -> None:
        """The table for rows of ``fields`` (its signature) and its server: in ``make`` when the spec has a
        layout, else at the first write (a table's signature is fixed when its server starts)."""
        import portpicker

        reverb, tf, spec = self.reverb, self.tf, self.spec
        self.fields = list(fields)
        self.columns = [f"c{i}" for i in range(len(self.fields))]
        signature = {c: tf.TensorSpec([1, *shape], tf.as_dtype(str(dtype).replace("torch.", "")))
                     for c, (_key, shape, dtype) in zip(self.columns, self.fields, strict=True)}
        signature[TAG] = tf.TensorSpec([1], tf.int64)
        self.table = reverb.Table(TABLE, sampler=self.sampler, remover=self.remover, max_size=spec.capacity,
                                  rate_limiter=self.limiter, max_times_sampled=spec.max_times_sampled,
                                  signature=signature)
        self.port = portpicker.pick_unused_port()
        directory = tempfile.mkdtemp(prefix="rbcheck-reverb-")  # the server's checkpoint folder, removed at stop
        checkpointer = importlib.import_module("reverb.platform.checkpointers_lib").DefaultCheckpointer(path=directory)
        self.server = reverb.Server(tables=[self.table], port=self.port, checkpointer=checkpointer)
        self.address = f"localhost:{self.port}"
        self.client = reverb.Client(self.address)
        self._stop = weakref.finalize(self, _stop, self.server, directory)

    def __repr__(self) -> str:
        return f"ReverbBuffer({self.spec})"

    # -- writing ---------------------------------------------------------------
    def _arrays(self, data, batched: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Each column's NumPy view of the caller's rows, and the rows' priorities (float64)."""
        n = data.batch_size[0] if batched else 1
        arrays = {c: to_numpy(data[key]) for c, (key, _s, _d) in zip(self.columns, self.fields, strict=True)}
        if not batched:
            arrays = {c: a[None] for c, a in arrays.items()}
        key = self.spec.priority_key
        pri = np.ones(n) if not key else np.asarray(to_numpy(data[key]), dtype=np.float64).reshape(n)
        return arrays, pri

    def _write(self, arrays: dict[str, np.ndarray], pri: np.ndarray, timeout: float | None) -> torch.Tensor:
        """One item a row, each tagged with its write number, through one trajectory writer; confirmed
        (flush) every FLUSH_EVERY rows and at the end (after each row when a timeout is given)."""
        n, first = len(pri), self.written
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        every = 1 if timeout is not None else FLUSH_EVERY
        writer = self.client.trajectory_writer(num_keep_alive_refs=1)
        try:
            for i in range(n):
                writer.append({**{c: a[i] for c, a in arrays.items()}, TAG: np.asarray(self.written)})
                writer.create_item(TABLE, float(pri[i]), {c: writer.history[c][-1:] for c in [*self.columns, TAG]})
                self.written += 1  # handed over: even a timed-out insert lands later (V1)
                if (i + 1) % every == 0 or i + 1 == n:
                    writer.flush(timeout_ms=None if timeout is None else max(0, int(timeout * 1000)))
        except self.reverb.errors.DeadlineExceededError as err:
            raise TimeoutError(f"Reverb insert not confirmed within timeout={timeout}s: {err}") from err
        finally:
            writer.close()
        if not self.ring:
            return torch.full((n,), -1, dtype=torch.int64)  # a served table's items have keys, not slots
        return torch.arange(first, first + n, dtype=torch.int64) % self.spec.capacity

    def extend(self, data, timeout: float | None = None) -> torch.Tensor:
        if self.server is None:
            self._start(layout_from_rows(data))
        return self._write(*self._arrays(data, batched=True), timeout)

    def add(self, row, timeout: float | None = None) -> int:
        if self.server is None:
            self._start(layout_from_rows(row, batched=False))
        return int(self._write(*self._arrays(row, batched=False), timeout)[0])

    # -- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        if self.server is None:
            return 0
        return int(self.client.server_info()[TABLE].current_size)

    def _no_slots(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what}: a served table (sampler={self.spec.sampler!r}, remover={self.spec.remover!r}, "
            f"max_times_sampled={self.spec.max_times_sampled}, rate_limiter={self.spec.rate_limiter}) is no ring, "
            f"so its items have keys but no slots")

    @property
    def cursor(self) -> int:
        if not self.ring:
            raise self._no_slots("cursor")
        return self.written % self.spec.capacity

    @property
    def write_count(self) -> int:
        return self.written

    def _dataset(self, draws: int, in_flight: int, timeout_ms: int):
        return self.reverb.TrajectoryDataset.from_table_signature(
            self.address, TABLE, max_in_flight_samples_per_worker=in_flight, num_workers_per_iterator=1,
            max_samples=draws, rate_limiter_timeout_ms=timeout_ms)

    def _rows(self, data, pick=slice(None)) -> TensorDict:
        """The rows of a batched sample's columns (their own memory), the tag column left out."""
        cols = {c: np.asarray(data[c].numpy())[:, 0][pick] for c in self.columns}
        n = len(next(iter(cols.values())))
        out = TensorDict({}, batch_size=[n])
        for c, (key, _shape, _dtype) in zip(self.columns, self.fields, strict=True):
            out.set(key if len(key) > 1 else key[0], torch.from_numpy(np.array(cols[c], copy=True)))
        return out

    def sample(self, batch_size: int | None = None, timeout: float | None = None):
        batch = batch_size or self.spec.batch_size or 1
        if self.server is None:
            raise RuntimeError(f"Reverb sample of {batch} refused: nothing was written (no table yet)")
        if self.ring and timeout is None and not self.table.can_sample(1):
            # Reverb's own answer (Table.can_sample): its MinSize(1) limiter would block this call for ever
            raise RuntimeError(f"Reverb sample of {batch} refused: the table is empty (Table.can_sample(1) is "
                               f"False; without a timeout the call would wait for ever)")
        ds = self._dataset(batch, min(batch, READ_BATCH) if self.ring else 1,
                           -1 if timeout is None else max(0, int(timeout * 1000)))
        got = next(iter(ds.batch(batch).take(1)), None)
        size = 0 if got is None else int(got.info.key.shape[0])
        if size < batch:
            raise TimeoutError(f"Reverb sample gave {size} of {batch} items within timeout={timeout}s "
                               f"(rate_limiter_timeout_ms: the dataset ended)")
        info = {"key": torch.from_numpy(got.info.key.numpy().astype(np.uint64).view(np.int64).copy()),
                "times_sampled": torch.from_numpy(got.info.times_sampled.numpy().astype(np.int64))}
        if self.ring:
            info["index"] = torch.from_numpy(got.data[TAG].numpy()[:, 0].astype(np.int64) % self.spec.capacity)
        return self._rows(got.data), info

    def contents(self) -> TensorDict:
        """Every held item once, in slot order: Reverb has no read of a table's items (the only listing
        is a checkpoint, in its own compressed chunk format), so the items are drawn until every one of
        the ``len`` held has been seen (module docstring)."""
        if not self.ring:
            raise self._no_slots("contents()")
        n = len(self)
        if n == 0:
            return TensorDict({key if len(key) > 1 else key[0]: torch.empty((0, *shape), dtype=dtype)
                               for key, shape, dtype in self.fields}, batch_size=[0])
        budget = int(n * (math.log(n) + READ_SLACK)) + 1
        tags, parts, draws = np.empty(0, np.int64), [], 0
        for got in self._dataset(budget, min(n, READ_BATCH), READ_TIMEOUT_MS).batch(min(budget, READ_BATCH)):
            drawn = got.data[TAG].numpy()[:, 0].astype(np.int64)
            draws += len(drawn)
            uniq, first = np.unique(drawn, return_index=True)
            new = ~np.isin(uniq, tags)
            if new.any():
                tags = np.concatenate([tags, uniq[new]])
                parts.append(self._rows(got.data, first[new]))
            if len(tags) >= n:
                break
        if len(tags) < n:
            held = np.sort(tags % self.spec.capacity)
            missing = sorted(set(range(min(self.written, self.spec.capacity))) - set(held.tolist()))[:10]
            why = " (an item of priority 0 is never drawn)" if self.spec.priority_key else ""
            raise RuntimeError(
                f"contents(): Reverb has no read of a table's items and sampling returned {len(tags)} distinct "
                f"items in {draws} draws, but should return all {n} held{why}; slots never drawn include {missing}")
        order = np.lexsort((tags, tags % self.spec.capacity))
        return torch.cat(parts)[torch.from_numpy(order)]

    def close(self) -> None:
        if self._stop is not None:
            self._stop()


def _stop(server, directory: str) -> None:
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def _adapter(name: str, flavour: str, capabilities: set[str]) -> Adapter:
    reverb, _ = _import()
    from importlib.metadata import version

    return Adapter(name=name, version=f"dm-reverb {version('dm-reverb')} (tensorflow {version('tensorflow-cpu')})",
                   make=lambda spec: ReverbBuffer(spec, flavour), capabilities=frozenset(capabilities),
                   conventions=CONVENTIONS)


def reverb_adapter() -> Adapter:
    """Uniform sampler, MinSize(1) by default: the ring, the rate limiter and max_times_sampled properties."""
    return _adapter("reverb", "uniform", {"random", "max_times_sampled", "rate_limiter"})


def reverb_prioritized_adapter() -> Adapter:
    """Prioritized(priority_exponent=spec.alpha) for sampler "random" (priorities from spec.priority_key)."""
    return _adapter("reverb-prioritized", "prioritized", {"max_times_sampled", "rate_limiter"})


def reverb_queue_adapter() -> Adapter:
    """Fifo/Lifo/heap selectors and removers, Queue limiters: the selection and queue properties."""
    return _adapter("reverb-queue", "uniform", {"selector", "max_times_sampled", "rate_limiter"})


__all__ = ["ReverbBuffer", "reverb_adapter", "reverb_prioritized_adapter", "reverb_queue_adapter"]
