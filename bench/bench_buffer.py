"""asv benchmarks: throughput (``time_*``), host memory (``peakmem_*``) and GPU
memory (``track_*``, CUDA only) of every implementation, tracked over commits.

Parameters are the implementation (every built-in adapter, plus env
``RBCHECK_IMPL=pkg.module:factory``; env ``RBCHECK_BENCH_IMPLS=a,b`` restricts)
and the size (capacity; batch size for sampling, 4096 rows for writes). ``setup`` builds and
fills the buffer, checks one result, and raises ``NotImplementedError`` -- which
asv reports as skipped -- when the implementation does not load, lacks the
capability, or (for ``track_*``) there is no CUDA device. The row width is
fixed here (8 features); the micro-benchmarks vary it.

Run: ``asv run --python=same --quick`` (see docs/benchmarks.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from bench import workload as wl

WIDTH = 8
CAPACITIES = [2**16, 2**20]
BATCHES = [256, 65536]  # sampling
WRITE_BATCH = [4096]  # extend, update_priority


def _impl_names() -> list[str]:
    try:
        from rbcheck.harness.adapters import builtin_names

        names = list(builtin_names())
    except ImportError:  # an old commit without the adapter registry
        names = ["reference"]
    extra = os.environ.get("RBCHECK_IMPL")
    if extra and extra not in names:
        names.append(extra)
    only = os.environ.get("RBCHECK_BENCH_IMPLS")
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
    return names


IMPLS = _impl_names()
wl.apply_thread_setting()  # env RBCHECK_BENCH_THREADS, as for the micro-benchmarks
_LOADED: dict = {}


def adapter_for(name: str, capability: str | None):
    """The adapter, or ``NotImplementedError`` (asv: skipped) with the reason."""
    if name not in _LOADED:
        try:  # an old commit may predate the adapter registry: skipped, not failed
            from rbcheck.harness.adapters import load_adapter

            _LOADED[name] = load_adapter(name)
        except Exception as exc:  # noqa: BLE001 - becomes the skip reason
            _LOADED[name] = f"{type(exc).__name__}: {exc}"
    adapter = _LOADED[name]
    if isinstance(adapter, str):
        raise NotImplementedError(f"unavailable: adapter {name!r} failed to load: {adapter}")
    if capability is not None and capability not in adapter.capabilities:
        raise NotImplementedError(f"not declared: {capability}")
    if capability is not None and capability in adapter.unavailable:
        raise NotImplementedError(f"unavailable: {capability}: {adapter.unavailable[capability]}")
    return adapter


def build_filled(bench, impl: str, operation: str, capacity: int) -> None:
    """``bench.adapter``, ``.device`` and ``.buf`` (built and filled) for an
    operation of ``wl.OPERATIONS``; NotImplementedError (asv: skipped) when
    the implementation cannot run it."""
    op = wl.OPERATIONS[operation]
    bench.adapter = adapter_for(impl, op.capability)
    bench.device = wl.bench_device(bench.adapter)
    bench.buf = wl.build(bench.adapter, op, capacity, WIDTH, bench.device)


def _check_sample(buf, rows, info, batch_size: int, capacity: int, sampler: str, where: str) -> None:
    index = wl.check_index(info["index"], batch_size, len(buf), where)
    wl.check_rows_match(rows, buf.contents().to("cpu"), index, where)
    if sampler == "prioritized":
        w = info["weight"].to("cpu").double()
        if not (torch.isfinite(w).all() and w.min() > 0 and w.max() <= 1 + 1e-6):
            wl.fail("info['weight']", (float(w.min()), float(w.max())), "finite, within (0, 1]", call=where)
    if sampler == "slice":
        wl.check_slices(index, rows, capacity, where)


class Extend:
    params = [IMPLS, CAPACITIES, WRITE_BATCH]
    param_names = ["impl", "capacity", "batch_size"]
    timeout = 600

    def setup(self, impl, capacity, batch_size):
        build_filled(self, impl, "extend", capacity)
        self.data = wl.make_rows(batch_size, WIDTH, start=capacity, device=self.device)

    def time_extend(self, impl, capacity, batch_size):
        self.buf.extend(self.data)
        wl.sync(self.device)


class Add:
    params = [IMPLS, CAPACITIES]
    param_names = ["impl", "capacity"]
    timeout = 600

    def setup(self, impl, capacity):
        build_filled(self, impl, "add", capacity)
        self.row = wl.make_rows(1, WIDTH, start=capacity, device=self.device)[0]

    def time_add(self, impl, capacity):
        self.buf.add(self.row)
        wl.sync(self.device)


class Sample:
    params = [IMPLS, ["random", "prioritized", "slice"], CAPACITIES, BATCHES]
    param_names = ["impl", "sampler", "capacity", "batch_size"]
    timeout = 600

    def setup(self, impl, sampler, capacity, batch_size):
        build_filled(self, impl, f"sample_{sampler}", capacity)
        rows, info = self.buf.sample(batch_size)
        _check_sample(self.buf, rows, info, batch_size, capacity, sampler, f"Sample({impl})")

    def time_sample(self, impl, sampler, capacity, batch_size):
        self.buf.sample(batch_size)
        wl.sync(self.device)


class UpdatePriority:
    params = [IMPLS, CAPACITIES, WRITE_BATCH]
    param_names = ["impl", "capacity", "batch_size"]
    timeout = 600

    def setup(self, impl, capacity, batch_size):
        build_filled(self, impl, "update_priority", capacity)
        g = torch.Generator().manual_seed(11)
        self.index = torch.randperm(capacity, generator=g)[:batch_size].to(self.device)
        priority = torch.rand(batch_size, generator=g) * 3.0 + 0.01
        self.priority = priority.to(self.device)
        self.buf.update_priority(self.index, self.priority)
        wl.check_priorities(self.buf.stored_priority(self.index), (priority.double() + wl.EPS) ** wl.ALPHA,
                            f"UpdatePriority({impl})", wl.priority_dtype(self.adapter))

    def time_update_priority(self, impl, capacity, batch_size):
        self.buf.update_priority(self.index, self.priority)
        wl.sync(self.device)


class Checkpoint:
    """Save and load of a full buffer (uniform sampler; storage dominates)."""

    params = [IMPLS, CAPACITIES]
    param_names = ["impl", "capacity"]
    timeout = 600

    def setup(self, impl, capacity):
        build_filled(self, impl, "save", capacity)
        self.dir = Path(tempfile.mkdtemp(prefix="rbcheck-asv-"))
        self.path = self.dir / "ckpt"
        self.buf.save(self.path)
        self.target = self.adapter.make(wl.make_spec(wl.OPERATIONS["save"], capacity, 256, self.device))
        self.target.load(self.path)
        wl.check_same_state(self.target, self.buf, f"Checkpoint({impl})", prioritized=False)

    def teardown(self, impl, capacity):
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_save(self, impl, capacity):
        self.buf.save(self.path)
        wl.sync(self.device)

    def time_load(self, impl, capacity):
        self.target.load(self.path)
        wl.sync(self.device)


class HostMemory:
    """Peak resident memory of building and filling a buffer (uniform sampler:
    the storage), as asv's peakmem measures it: max RSS of the process."""

    params = [IMPLS, CAPACITIES]
    param_names = ["impl", "capacity"]
    timeout = 600

    def setup(self, impl, capacity):
        self.adapter = adapter_for(impl, None)
        self.device = wl.bench_device(self.adapter)

    def peakmem_fill(self, impl, capacity):
        wl.build(self.adapter, wl.OPERATIONS["sample_random"], capacity, WIDTH, self.device)


class HostMemoryPrioritized:
    """Peak resident memory of a filled prioritized buffer (storage + trees)
    and one prioritized sample of 65536 rows."""

    params = [IMPLS, CAPACITIES]
    param_names = ["impl", "capacity"]
    timeout = 600

    def setup(self, impl, capacity):
        self.adapter = adapter_for(impl, "prioritized")
        self.device = wl.bench_device(self.adapter)

    def peakmem_fill_and_sample_65536(self, impl, capacity):
        buf = wl.build(self.adapter, wl.OPERATIONS["sample_prioritized"], capacity, WIDTH, self.device)
        buf.sample(65536)


class GpuMemory:
    """Peak CUDA memory (bytes, torch's allocator) of fill + one sample of
    65536 rows. Skipped (NotImplementedError) without a CUDA device or when the
    implementation does not keep its buffer on one."""

    params = [IMPLS, CAPACITIES]
    param_names = ["impl", "capacity"]
    unit = "bytes"
    timeout = 600

    def setup(self, impl, capacity):
        self.adapter = adapter_for(impl, "cuda")
        if wl.bench_device(self.adapter) != "cuda":
            raise NotImplementedError("no CUDA device here: GPU memory is not tracked")

    def track_gpu_peak_bytes(self, impl, capacity):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        buf = wl.build(self.adapter, wl.OPERATIONS["sample_prioritized"], capacity, WIDTH, "cuda")
        buf.sample(65536)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    track_gpu_peak_bytes.unit = "bytes"
