"""pytest-benchmark configuration for the micro-benchmarks.

Selection (all optional):

* implementations: every built-in adapter (``rbcheck.harness.adapters.builtin_names()``)
  (``--bench-impls a,b`` / env ``RBCHECK_BENCH_IMPLS`` restricts the list),
  plus ``--impl NAME`` / env ``RBCHECK_IMPL`` (a built-in name or
  ``pkg.module:factory``), always included.
* sizes: ``--bench-grid smoke|default|full`` / env ``RBCHECK_BENCH``. The
  default is ``smoke`` when timing is off (``--benchmark-disable``: each
  benchmark runs once at the smallest size, as CI does) and ``default``
  otherwise. See ``bench/workload.py`` for the grids.

An adapter that fails to load, or lacks (or has unavailable) the capability an
operation needs, is skipped with the reason; it never produces a number.
"""

from __future__ import annotations

import os

import pytest
import torch

from bench import workload as wl


def pytest_addoption(parser):
    group = parser.getgroup("rbcheck-bench", "rbcheck micro-benchmarks")
    group.addoption("--bench-grid", default=None, choices=sorted(wl.GRIDS),
                    help="size grid (env RBCHECK_BENCH); default: smoke with --benchmark-disable, else default")
    group.addoption("--bench-impls", default=None,
                    help="comma-separated implementations to run (env RBCHECK_BENCH_IMPLS); default: all")
    if not _has_option(parser, "--impl"):  # else the rbcheck plugin (entry point) defines it
        group.addoption("--impl", default=os.environ.get("RBCHECK_IMPL"),
                        help="an extra implementation: built-in name or pkg.module:factory (env RBCHECK_IMPL)")


def _has_option(parser, name: str) -> bool:
    groups = [*getattr(parser, "_groups", []), getattr(parser, "_anonymous", None)]
    return any(name in opt.names() for g in groups if g is not None for opt in g.options)


def _mode(config) -> str:
    mode = config.getoption("--bench-grid") or os.environ.get("RBCHECK_BENCH")
    if not mode:
        disabled = getattr(config.option, "benchmark_disable", False)
        mode = "smoke" if disabled else "default"
    return wl.grid_mode(mode)


def _impl_names(config) -> list[str]:
    from rbcheck.harness.adapters import builtin_names

    names = list(builtin_names())
    only = config.getoption("--bench-impls") or os.environ.get("RBCHECK_BENCH_IMPLS")
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        names = [n for n in names if n in wanted] + [n for n in wanted if n not in names]
    extra = config.getoption("--impl", default=None)
    if extra and extra not in names:
        names.append(extra)
    return names


def pytest_configure(config):
    config._rbcheck_bench_mode = _mode(config)
    wl.apply_thread_setting()


def pytest_report_header(config):
    mode = config._rbcheck_bench_mode
    budget = wl.budget_s(mode)
    limit = f", calls slower than {budget:g}s skipped" if budget else ""
    return (f"rbcheck bench: grid={mode}{limit}, torch threads={torch.get_num_threads()}, "
            f"implementations={_impl_names(config)}")


def pytest_benchmark_update_machine_info(config, machine_info):
    """Name the accelerator and torch in the JSON, so tables and plots say
    what a CUDA number was measured on."""
    machine_info["torch"] = torch.__version__
    if torch.cuda.is_available():
        machine_info["gpu"] = torch.cuda.get_device_name(0)


def pytest_generate_tests(metafunc):
    if "bench" not in metafunc.fixturenames:
        return
    op = wl.OPERATIONS[metafunc.function.__name__.removeprefix("test_")]
    mode = metafunc.config._rbcheck_bench_mode
    cases, ids = [], []
    for name in _impl_names(metafunc.config):
        for capacity, batch_size, width in wl.sizes(op, mode):
            cases.append((name, capacity, batch_size, width))
            ids.append(f"{name}-{wl.size_label(capacity, batch_size, width, op)}")
    metafunc.parametrize("impl_name,capacity,batch_size,width", cases, ids=ids)


def pytest_collection_modifyitems(config, items):
    """Implementation-major order (stable, so file order within one): each
    implementation's filled buffers are built once and reused."""
    names = {name: i for i, name in enumerate(_impl_names(config))}

    def impl_rank(item):
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("impl_name") if callspec else None
        return names.get(name, -1)

    items.sort(key=impl_rank)


# --- fixtures ----------------------------------------------------------------


class _Adapters:
    """Adapters loaded once per session; a load failure is kept as its reason."""

    def __init__(self):
        self.loaded = {}

    def get(self, name):
        if name not in self.loaded:
            from rbcheck.harness.adapters import load_adapter

            try:
                self.loaded[name] = load_adapter(name)
            except Exception as exc:  # noqa: BLE001 - reported as the skip reason
                self.loaded[name] = f"{type(exc).__name__}: {exc}"
        return self.loaded[name]


@pytest.fixture(scope="session")
def _adapters():
    return _Adapters()


@pytest.fixture(scope="session")
def _caches():
    # impl buffers (a few full buffers, <= ~1.5 GiB), small reference data
    return wl.BufferCache(4), wl.BufferCache(8)


@pytest.fixture(scope="session")
def _ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture
def bench(request, _adapters, _caches, _ckpt_dir, impl_name, capacity, batch_size, width):
    op = wl.OPERATIONS[request.function.__name__.removeprefix("test_")]
    adapter = _adapters.get(impl_name)
    if isinstance(adapter, str):
        pytest.skip(f"unavailable: adapter {impl_name!r} failed to load: {adapter}")
    if op.capability is not None and op.capability not in adapter.capabilities:
        pytest.skip(f"not declared: {op.capability}")
    if op.capability is not None and op.capability in adapter.unavailable:
        pytest.skip(f"unavailable: {op.capability}: {adapter.unavailable[op.capability]}")
    reference = _adapters.get("reference")
    if isinstance(reference, str):
        pytest.fail(f"the reference adapter must load to check results, but: {reference}")
    mode = request.config._rbcheck_bench_mode
    return Bench(
        benchmark=request.getfixturevalue("benchmark"), adapter=adapter, reference=reference, op=op,
        capacity=capacity, batch_size=batch_size, width=width, mode=mode,
        caches=_caches, ckpt_dir=_ckpt_dir,
    )


class Bench:
    """One benchmark case: the adapter under test, the reference that checks
    it, the size, and the ``benchmark`` fixture. Buffers are built and filled
    here, outside the timed region, and reused across batch sizes."""

    def __init__(self, benchmark, adapter, reference, op, capacity, batch_size, width, mode, caches, ckpt_dir):
        self.benchmark, self.adapter, self.reference, self.op = benchmark, adapter, reference, op
        self.capacity, self.batch_size, self.width, self.mode = capacity, batch_size, width, mode
        self.caches, self.ckpt_dir = caches, ckpt_dir
        self.device = wl.bench_device(adapter)
        label = wl.size_label(capacity, batch_size, width, op)
        self.where = f"{op.name}({adapter.name}, {label})"
        self.is_reference = adapter.name == reference.name
        self.first_call_s = 0.0
        rows = {"add": 1, "save": capacity, "load": capacity}.get(op.name, batch_size)
        benchmark.group = f"{op.name}[{label}]"
        benchmark.extra_info.update(
            impl=adapter.name, version=adapter.version, op=op.name, capacity=capacity,
            batch_size=batch_size if op.uses_batch else None, width=width,
            device=self.device, rows_per_call=rows, torch_threads=torch.get_num_threads(),
        )

    # --- buffers (untimed) --------------------------------------------------
    def entry(self, tag: str = "") -> dict:
        """A full buffer of the implementation under test (cached per
        implementation, buffer kind, capacity, width and ``tag``; an operation
        that rewrites rows uses its own tag)."""
        key = (self.adapter.name, self.op.sampler, self.capacity, self.width, tag)
        return self.caches[0].get(key, lambda: {
            "buf": wl.build(self.adapter, self.op, self.capacity, self.width, self.device)})

    def layout_sample(self):
        """A small sample from a small reference buffer of the same kind and
        width: the keys, per-row shapes and dtypes every implementation must return."""
        key = ("layout", self.op.sampler, self.width)

        def make():
            buf = wl.build(self.reference, self.op, 4096, self.width, "cpu")
            return buf.sample(2 * wl.SLICE_LEN)

        return self.caches[1].get(key, make)

    def model(self) -> dict:
        """The reference's view of a full prioritized buffer (leaves and a
        reference sampler holding them), cached per capacity."""
        def make():
            leaves = wl.model_leaves(self.capacity)
            return {"leaves": leaves, "sampler": wl.model_prioritized_sampler(self.capacity, leaves)}

        return self.caches[1].get(("model", self.capacity), make)

    @staticmethod
    def contents(entry: dict):
        if "contents" not in entry:
            entry["contents"] = entry["buf"].contents().to("cpu")
        return entry["contents"]

    def fresh(self):
        return self.adapter.make(wl.make_spec(self.op, self.capacity, 256, self.device))

    def ckpt_path(self, what: str):
        return self.ckpt_dir / f"{self.adapter.name.replace(':', '_')}-{self.capacity}-{self.width}-{what}"

    # --- running --------------------------------------------------------------
    def call_checked(self, fn):
        """One untimed call whose result the test checks (also the warm-up)."""
        out, self.first_call_s = wl.measure_once(fn, self.device)
        return out

    def time(self, fn):
        """Time ``fn`` (device sync inside the timed region on CUDA). In the
        default grid a case whose checked call exceeded the budget is skipped
        with the measured time as the reason."""
        budget = wl.budget_s(self.mode)
        if budget is not None and self.first_call_s > budget:
            pytest.skip(
                f"too slow for the default grid: one call took {self.first_call_s:.1f}s > "
                f"{budget:g}s (RBCHECK_BENCH=full times it)"
            )
        if self.device.startswith("cuda"):
            def timed():
                out = fn()
                torch.cuda.synchronize()
                return out
        else:
            timed = fn
        return self.benchmark(timed)

    # --- checks ---------------------------------------------------------------
    def check_sample(self, entry: dict, rows, info) -> None:
        buf, where, b = entry["buf"], self.where, self.batch_size
        ref_rows, ref_info = self.layout_sample()
        wl.check_layout(rows, ref_rows, b, where)
        required = {"index"} | ({"weight"} if self.op.sampler == "prioritized" else set())
        if self.adapter.has("stale_updates") and "generation" in ref_info:
            required.add("generation")
        missing = sorted(required - set(info))
        if missing:
            wl.fail("info keys missing", missing, f"present (reference has {sorted(ref_info)})", call=where)
        index = wl.check_index(info["index"], b, len(buf), where)
        wl.check_rows_match(rows, self.contents(entry), index, where)
        sampler = self.op.sampler
        shared = self.adapter.has("shared_rng") and self.reference.has("shared_rng")
        u = torch.rand(min(b, 4096), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        if sampler == "prioritized":
            model = self.model()
            leaves = model["leaves"]
            wl.check_priorities(buf.stored_priority(index.to(self.device)), leaves[index], where,
                                wl.priority_dtype(self.adapter))
            expected = (leaves[index] / leaves.min()) ** -wl.BETA
            wl.check_weights(info["weight"], expected, where)
            if info["weight"].dtype != ref_info["weight"].dtype:
                wl.fail("info['weight'].dtype", info["weight"].dtype, ref_info["weight"].dtype, call=where)
            want = model["sampler"].indices_from_uniforms(u) if shared else None
        elif sampler == "random":
            want = wl.reference_uniform_indices(u, len(buf)) if shared else None
        else:
            wl.check_slices(index, rows, self.capacity, where)
            want = None
        if want is not None:
            got = buf.indices_from_uniforms(u.to(self.device)).to("cpu")
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[:3].flatten().tolist()
                wl.fail(f"indices_from_uniforms(u) at {bad}", got[bad].tolist(), want[bad].tolist(), call=where)
