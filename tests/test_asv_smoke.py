"""Smoke run of the asv benchmarks (``bench/bench_buffer.py``): every
benchmark method of every class, for every implementation, once, at the
smallest parameters, the way asv calls it (``setup``, the method,
``teardown``). ``NotImplementedError`` from ``setup`` is asv's "skipped" and
is reported here as a skip with its reason; anything else that raises is a
failure, so the asv suite cannot rot between runs of ``nox -s asv``. No
timing, no thresholds."""

from __future__ import annotations

import inspect
import itertools

import pytest

from bench import bench_buffer

PREFIXES = ("time_", "peakmem_", "track_")
#: The capacity of every smoke case: the smoke run checks that each benchmark
#: runs, and at asv's smallest capacity (2^16) filling the example's and the
#: interpreted triton variant's buffers took most of its four minutes.
SMOKE_CAPACITY = 2**10


def cases():
    for cls_name, cls in inspect.getmembers(bench_buffer, inspect.isclass):
        if cls.__module__ != bench_buffer.__name__ or not hasattr(cls, "params"):
            continue
        # sizes at their smallest, every other parameter (impl, sampler) in full
        axes = [[SMOKE_CAPACITY] if name == "capacity" else
                [min(*values, SMOKE_CAPACITY)] if name == "batch_size" else
                [min(values)] if all(isinstance(v, int) for v in values) else list(values)
                for name, values in zip(cls.param_names, cls.params, strict=True)]
        for method in sorted(m for m in vars(cls) if m.startswith(PREFIXES)):
            for params in itertools.product(*axes):
                label = ",".join(str(p) for p in params if isinstance(p, str))
                yield pytest.param(cls, method, params, id=f"{cls_name}.{method}[{label}]")


@pytest.mark.parametrize("cls, method, params", list(cases()))
def test_asv_benchmark_runs_once(cls, method, params):
    bench = cls()
    try:
        bench.setup(*params)
    except NotImplementedError as skip:
        pytest.skip(f"asv would skip it: {skip}")
    try:
        getattr(bench, method)(*params)
    finally:
        if hasattr(bench, "teardown"):
            bench.teardown(*params)


def test_every_class_with_params_has_a_case():
    names = {c.id.split(".")[0] for c in cases()}
    assert {"Extend", "Add", "Sample", "UpdatePriority", "Checkpoint"} <= names, names
