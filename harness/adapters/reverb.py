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
* ``extend(data, timeout)``: one item a row, through a trajectory writer
  (``append`` then ``create_item(table, priority, one step)``), confirmed by
  ``flush(timeout_ms=...)``; a ``DeadlineExceededError`` becomes ``TimeoutError``.
* ``sample(batch, timeout)``: a ``TrajectoryDataset`` of ``max_samples=batch``
  with ``rate_limiter_timeout_ms``; fewer items than asked (the dataset ends
  when the rate limiter's timeout passes) becomes ``TimeoutError``.
* ``len``: ``client.server_info()["t"].current_size``.

Declared convention (docs/bugs.toml, Reverb R1): ``Conventions.sampler_rules=
{"timed_out_insert": "lands_later"}`` (harness/sampler_laws.py). An insert
whose flush timed out is not withdrawn; the server inserts it once the
limiter admits it (``TrajectoryWriter.flush``'s docstring:
"although the block is interrupted, the insertion of the items will proceed
in the background", reverb/trajectory_writer.py:403-406).
"""

from __future__ import annotations

import importlib
import weakref

import numpy as np
import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

TABLE = "t"
#: Reverb R1 (docs/bugs.toml): a timed-out insert lands later, as documented.
CONVENTIONS = Conventions(sampler_rules={"timed_out_insert": "lands_later"}, notes={
    "sampler_rules": "a timed-out insert lands later: TrajectoryWriter.flush inserts in the background after "
                     "its timeout (reverb/trajectory_writer.py:403-406; reverb/cc/reverb_service_impl.cc:207)"})


def _import():
    try:
        return importlib.import_module("reverb"), importlib.import_module("tensorflow")
    except ImportError as err:
        raise ImportError(f"dm-reverb is not installed or does not load ({type(err).__name__}: {err}), "
                          f"but should be: install the 'reverb' dependency group (its own environment)") from err


class ReverbBuffer:
    """One Reverb server holding one table (module docstring)."""

    def __init__(self, spec: BufferSpec, flavour: str):
        import portpicker

        reverb, tf = _import()
        self.reverb, self.tf, self.spec = reverb, tf, spec
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
        self.keys = sorted(spec.layout) if spec.layout else ["id"]
        signature = {k: tf.TensorSpec([1, *spec.layout[k][0]] if spec.layout else [1],
                                      tf.as_dtype(str(spec.layout[k][1]).replace("torch.", "")) if spec.layout
                                      else tf.int64) for k in self.keys}
        table = reverb.Table(TABLE, sampler=sampler, remover=kinds[spec.remover](), max_size=spec.capacity,
                             rate_limiter=limiter, max_times_sampled=spec.max_times_sampled, signature=signature)
        self.port = portpicker.pick_unused_port()
        self.server = reverb.Server(tables=[table], port=self.port)
        self.address = f"localhost:{self.port}"
        self.client = reverb.Client(self.address)
        self._stop = weakref.finalize(self, self.server.stop)

    def extend(self, data, timeout: float | None = None) -> torch.Tensor:
        for i in range(len(data)):
            self.add(data[i], timeout)
        return torch.full((len(data),), -1, dtype=torch.int64)  # Reverb's keys are not slots

    def add(self, row, timeout: float | None = None) -> int:
        writer = self.client.trajectory_writer(num_keep_alive_refs=1)
        try:
            writer.append({k: np.asarray(row[k].numpy()) for k in self.keys})
            priority = float(row[self.spec.priority_key]) if self.spec.priority_key else 1.0
            writer.create_item(TABLE, priority, {k: writer.history[k][-1:] for k in self.keys})
            writer.flush(timeout_ms=None if timeout is None else max(0, int(timeout * 1000)))
        except self.reverb.errors.DeadlineExceededError as err:
            raise TimeoutError(f"Reverb insert not confirmed within timeout={timeout}s: {err}") from err
        finally:
            writer.close()
        return -1

    def __len__(self) -> int:
        return int(self.client.server_info()[TABLE].current_size)

    def sample(self, batch_size: int | None = None, timeout: float | None = None):
        batch = batch_size or self.spec.batch_size or 1
        ds = self.reverb.TrajectoryDataset.from_table_signature(
            self.address, TABLE, max_in_flight_samples_per_worker=1, num_workers_per_iterator=1,
            max_samples=batch, rate_limiter_timeout_ms=-1 if timeout is None else max(0, int(timeout * 1000)))
        got = list(ds.take(batch))
        if len(got) < batch:
            raise TimeoutError(f"Reverb sample gave {len(got)} of {batch} items within timeout={timeout}s "
                               f"(rate_limiter_timeout_ms: the dataset ended)")
        rows = TensorDict({k: torch.as_tensor(np.stack([s.data[k].numpy()[0] for s in got])) for k in self.keys},
                          batch_size=[batch])
        info = {"key": torch.tensor([int(np.uint64(s.info.key.numpy()).astype(np.int64)) for s in got]),
                "times_sampled": torch.tensor([int(s.info.times_sampled.numpy()) for s in got])}
        return rows, info

    def close(self) -> None:
        self._stop()


def _adapter(name: str, flavour: str, capabilities: set[str]) -> Adapter:
    reverb, _ = _import()
    from importlib.metadata import version

    return Adapter(name=name, version=f"dm-reverb {version('dm-reverb')} (tensorflow {version('tensorflow-cpu')})",
                   make=lambda spec: ReverbBuffer(spec, flavour), capabilities=frozenset(capabilities),
                   conventions=CONVENTIONS)


def reverb_adapter() -> Adapter:
    """Uniform sampler, MinSize(1) by default: the rate limiter and max_times_sampled properties."""
    return _adapter("reverb", "uniform", {"random", "max_times_sampled", "rate_limiter"})


def reverb_prioritized_adapter() -> Adapter:
    """Prioritized(priority_exponent=spec.alpha) for sampler "random" (priorities from spec.priority_key)."""
    return _adapter("reverb-prioritized", "prioritized", {"max_times_sampled", "rate_limiter"})


def reverb_queue_adapter() -> Adapter:
    """Fifo/Lifo/heap selectors and removers, Queue limiters: the selection and queue properties."""
    return _adapter("reverb-queue", "uniform", {"selector", "max_times_sampled", "rate_limiter"})


__all__ = ["ReverbBuffer", "reverb_adapter", "reverb_prioritized_adapter", "reverb_queue_adapter"]
