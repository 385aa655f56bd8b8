"""Unit tests of the benchmark tooling on synthetic data (exact checks):
bench/ratios.py (ratio tables), bench/plot.py (the PNG) and the result checks
in bench/workload.py that stop a wrong answer from producing a number."""

from __future__ import annotations

import json

import pytest
import torch

from bench import ratios
from bench import workload as wl

MACHINE = {"node": "box-1", "cpu": {"brand_raw": "Test CPU 3000", "count": 2}, "python_version": "3.11.7"}


def entry(op, impl, seconds, capacity=65536, batch_size=256, width=8, rows=None):
    info = {"op": op, "impl": impl, "capacity": capacity, "batch_size": batch_size, "width": width,
            "device": "cpu", "rows_per_call": rows if rows is not None else (batch_size or capacity)}
    return {"group": f"{op}[...]", "name": f"test_{op}[{impl}]", "extra_info": info,
            "stats": {"median": seconds, "min": seconds / 2, "mean": seconds * 1.5}}


def write(tmp_path, benchmarks, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"machine_info": MACHINE, "datetime": "2026-11-22T05:00:00",
                                "commit_info": {"id": "abcdef0123456789"}, "benchmarks": benchmarks}))
    return path


@pytest.fixture
def run(tmp_path):
    return write(tmp_path, [
        entry("sample_random", "device", 0.5),
        entry("sample_random", "torchrl", 1.0),
        entry("sample_random", "reference", 2.0),
        entry("sample_prioritized", "device", 0.25),
        entry("sample_prioritized", "reference", 1.0),
        entry("save", "reference", 0.1, batch_size=None),
        {"name": "test_unrelated", "stats": {"median": 1.0}},  # no extra_info: ignored
    ])


def test_load_reads_extra_info_and_ignores_foreign_benchmarks(run):
    records, machine = ratios.load(run)
    assert len(records) == 6
    assert {r.impl for r in records} == {"device", "torchrl", "reference"}
    save = next(r for r in records if r.op == "save")
    assert save.size == "cap=2^16,width=8" and save.rows_per_call == 65536
    assert "box-1" in machine and "Test CPU 3000" in machine and "abcdef01" in machine


def test_machine_label_names_the_gpu_when_the_run_had_one():
    data = {"machine_info": {**MACHINE, "gpu": "NVIDIA H100 80GB HBM3"}}
    assert "GPU NVIDIA H100 80GB HBM3" in ratios.machine_label(data)
    assert "GPU" not in ratios.machine_label({"machine_info": MACHINE})


def test_load_uses_the_requested_statistic(run):
    by_stat = {s: {r.impl: r.seconds for r in ratios.load(run, s)[0] if r.op == "sample_random"}
               for s in ("median", "min", "mean")}
    assert by_stat["median"]["torchrl"] == 1.0
    assert by_stat["min"]["torchrl"] == 0.5
    assert by_stat["mean"]["torchrl"] == 1.5
    with pytest.raises(ValueError, match="stat='max', but should be one of"):
        ratios.load(run, "max")


def test_ratios_are_baseline_time_over_impl_time(run):
    rows = ratios.ratio_rows(ratios.load(run)[0])
    got = {(r["op"], r["impl"]): r["ratio"] for r in rows}
    assert got[("sample_random", "device")] == {"reference": 4.0, "torchrl": 2.0}
    assert got[("sample_random", "reference")] == {"reference": 1.0, "torchrl": 0.5}
    # no torchrl number for prioritized sampling: no ratio, not a made-up one
    assert got[("sample_prioritized", "device")] == {"reference": 4.0, "torchrl": None}
    random_rows = [r["impl"] for r in rows if r["op"] == "sample_random"]
    assert random_rows == ["reference", "torchrl", "device"]
    assert rows[0]["rows_per_s"] == pytest.approx(256 / rows[0]["seconds"])


def test_text_and_markdown_tables(run):
    rows = ratios.ratio_rows(ratios.load(run)[0])
    text = ratios.format_table(rows, title="T")
    lines = text.splitlines()
    assert lines[0] == "T" and lines[1].split()[:3] == ["operation", "size", "impl"]
    device = next(line for line in lines if "sample_prioritized" in line and "device" in line)
    assert device.split()[-2:] == ["4.00x", "-"]
    md = ratios.format_table(rows, fmt="markdown").splitlines()
    assert md[0].startswith("| operation |") and md[1].startswith("|---|")
    assert len(md) == 2 + len(rows)
    with pytest.raises(ValueError, match="fmt='html', but should be"):
        ratios.format_table(rows, fmt="html")


def test_baseline_run_column(tmp_path, run, capsys):
    old = write(tmp_path, [entry("sample_random", "device", 1.0)], "old.json")
    table = tmp_path / "out" / "table.txt"
    assert ratios.main([str(run), "--baseline", str(old), "-o", str(table)]) == 0
    out = capsys.readouterr().out
    assert table.read_text() == out
    assert "vs baseline run" in out
    device = next(line for line in out.splitlines() if line.startswith("sample_random") and "device" in line)
    assert device.split()[-1] == "2.00x"  # 1.0 s before, 0.5 s now


def test_max_slowdown_exit_code(tmp_path, run, capsys):
    old = write(tmp_path, [entry("sample_random", "device", 0.4), entry("sample_random", "torchrl", 1.0)], "old.json")
    # device: 0.4 s -> 0.5 s is 1.25x slower
    assert ratios.main([str(run), "--baseline", str(old), "--max-slowdown", "1.3"]) == 0
    assert ratios.main([str(run), "--baseline", str(old), "--max-slowdown", "1.2"]) == 1
    err = capsys.readouterr().err
    assert "SLOWER: sample_random cap=2^16,batch=256,width=8 device: 1.25x" in err
    assert "torchrl" not in err
    assert ratios.main([str(run), "--max-slowdown", "1.2"]) == 2


def test_main_fails_on_a_run_without_numbers(tmp_path, capsys):
    empty = write(tmp_path, [{"name": "x", "extra_info": {}, "stats": {}}])
    assert ratios.main([str(empty)]) == 1
    assert "no rbcheck benchmarks with numbers" in capsys.readouterr().err


def test_plot_writes_a_png_labelled_with_the_machine(tmp_path):
    pytest.importorskip("matplotlib")
    from bench import plot

    benchmarks = [entry(op, impl, t * b / 256, batch_size=b, width=w)
                  for op in ("sample_random", "update_priority")
                  for impl, t in (("reference", 1e-3), ("device", 1e-4))
                  for b in (256, 4096, 65536) for w in (8, 64)]
    records, machine = ratios.load(write(tmp_path, benchmarks))
    data = plot.series(records)
    assert set(data) == {"sample_random", "update_priority"}
    # the smallest width only, one line per (impl, capacity), points by batch size
    assert [b for b, _ in data["sample_random"][("device", 65536)]] == [256, 4096, 65536]
    assert len(data["sample_random"]) == 2
    out = plot.plot(records, machine, tmp_path / "p.png")
    head = out.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_refuses_a_run_without_sample_benchmarks(tmp_path):
    pytest.importorskip("matplotlib")
    from bench import plot

    records, machine = ratios.load(write(tmp_path, [entry("save", "reference", 0.1, batch_size=None)]))
    with pytest.raises(ValueError, match="but should have some"):
        plot.plot(records, machine, tmp_path / "p.png")


# --- bench/workload.py: a wrong fast answer must fail, not produce a number ---


def test_grid_sizes_and_mode():
    smoke = wl.sizes(wl.OPERATIONS["sample_random"], "smoke")
    assert smoke == [(2**10, 256, 8)]
    default = wl.sizes(wl.OPERATIONS["sample_random"], "default")
    assert {c for c, _, _ in default} == {2**16, 2**20} and {b for _, b, _ in default} == {256, 4096, 65536}
    assert {b for _, b, _ in wl.sizes(wl.OPERATIONS["save"], "default")} == {256}  # no batch dimension
    assert wl.budget_s("full") is None and wl.budget_s("smoke") is None


def test_thread_setting(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("RBCHECK_BENCH_THREADS", raising=False)
    assert wl.apply_thread_setting() is None
    monkeypatch.setenv("RBCHECK_BENCH_THREADS", "zero")
    with pytest.raises(ValueError, match="RBCHECK_BENCH_THREADS='zero', but should be a positive integer"):
        wl.apply_thread_setting()
    monkeypatch.setenv("RBCHECK_BENCH_THREADS", "1")
    try:
        assert wl.apply_thread_setting() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_load_reports_torch_threads(tmp_path):
    bench = entry("sample_random", "reference", 1.0)
    bench["extra_info"]["torch_threads"] = 1
    assert ratios.load(write(tmp_path, [bench]))[1].endswith("torch threads 1")


def test_grid_mode_rejects_unknown(monkeypatch):
    monkeypatch.setenv("RBCHECK_BENCH", "huge")
    with pytest.raises(ValueError, match="RBCHECK_BENCH='huge', but should be one of"):
        wl.grid_mode()


def test_rows_are_a_function_of_their_position():
    a = wl.make_rows(10, 4, start=100)
    b = wl.make_rows(20, 4, start=95)[5:15]
    assert all(torch.equal(a[k], b[k]) for k in a.keys())
    assert a["episode"].tolist() == [(100 + i) // wl.EPISODE_LEN for i in range(10)]


def test_checks_catch_wrong_rows_and_indices():
    contents = wl.make_rows(64, 4)
    index = torch.tensor([3, 5, 7])
    wl.check_rows_match(contents[index], contents, index, "t")
    with pytest.raises(AssertionError, match="but should be storage rows at info"):
        wl.check_rows_match(contents[index + 1], contents, index, "t")
    with pytest.raises(AssertionError, match=r"info\['index'\] range=\(3, 64\), but should be within \[0, 64\)"):
        wl.check_index(torch.tensor([3, 64]), 2, 64, "t")
    with pytest.raises(AssertionError, match="dtype=torch.int32, but should be torch.int64"):
        wl.check_index(torch.tensor([3], dtype=torch.int32), 1, 64, "t")


def test_checks_catch_wrong_weights_and_priorities():
    expected = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    wl.check_weights(expected.float(), expected, "t")
    with pytest.raises(AssertionError, match="non-finite"):
        wl.check_weights(torch.tensor([1.0, float("nan"), 0.25]), expected, "t")
    with pytest.raises(AssertionError, match="range"):
        wl.check_weights(torch.tensor([1.5, 0.5, 0.25]), expected, "t")
    with pytest.raises(AssertionError, match="relative error"):
        wl.check_weights(torch.tensor([1.0, 0.5, 0.3]), expected, "t")
    p = (torch.tensor([0.5, 2.0], dtype=torch.float64) + wl.EPS) ** wl.ALPHA
    wl.check_priorities(p, p, "t")
    wl.check_priorities(p.float(), p, "t")  # float32 storage: within 2^-23
    with pytest.raises(AssertionError, match="stored_priority"):
        wl.check_priorities(torch.tensor([0.5, 2.0]) ** wl.ALPHA, p * 1.001, "t")
    # a float32 tree computes the transform in float32: within its own error (4 ulps),
    # which a float64 tree is not allowed; transformed twice, it fails either way
    raw = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 3.0 + 0.01
    want = (raw.double() + wl.EPS) ** wl.ALPHA
    in_float32 = (raw + wl.EPS) ** wl.ALPHA
    wl.check_priorities(in_float32, want, "t", torch.float32)
    with pytest.raises(AssertionError, match=r"<= 2\^-23"):
        wl.check_priorities(in_float32 * (1 + 2.0**-22), want, "t")
    with pytest.raises(AssertionError, match=r"<= 2\^-21 \(float32 trees\)"):
        wl.check_priorities(((raw + wl.EPS) ** wl.ALPHA + wl.EPS) ** wl.ALPHA, want, "t", torch.float32)


def test_slice_check_needs_consecutive_slots_of_one_episode():
    rows = wl.make_rows(2 * wl.SLICE_LEN, 2, start=0)
    index = torch.arange(2 * wl.SLICE_LEN)
    wl.check_slices(index, rows, 2**16, "t")
    shuffled = index.flip(0)
    with pytest.raises(AssertionError, match="slice slots"):
        wl.check_slices(shuffled, rows, 2**16, "t")
    crossing = wl.make_rows(2 * wl.SLICE_LEN, 2, start=wl.EPISODE_LEN - 10)
    with pytest.raises(AssertionError, match="slice episodes"):
        wl.check_slices(index, crossing, 2**16, "t")


def test_results_pages_are_what_their_data_renders():
    """Every generated page of docs/results/ is exactly what
    ``python -m bench.results`` renders from its recorded JSON
    (docs/results/data/): a page is never edited by hand."""
    from bench import results

    assert results.records(), "docs/results/data/ holds no recorded run, but should hold at least one"
    assert results.stale_pages() == [], "run python -m bench.results"


def test_results_render_a_conformance_run_and_refuse_other_json(tmp_path):
    """The control: a recorded conformance run renders its provenance and
    table; JSON of another kind is refused naming what it should be."""
    from bench import results

    report = {"order": ["x"], "rows": [],
              "implementations": {"x": {"status": "ran", "why": "", "version": "1", "third_party": False,
                                        "counts": {"pass": 1}, "seconds": 1.0, "shrink_seconds": None,
                                        "capabilities": [], "unavailable": {}, "conventions": {},
                                        "under_convention": 0, "exitstatus": 0, "errors": [],
                                        "warnings": [], "robustness": {}}}}
    record = {"name": "n", "title": "T", "command": "c", "measured": "d", "machine": "m",
              "kind": results.kind_of(report), "data": report}
    page = results.render(record)
    assert page.startswith("# T\n") and "- command: `c`" in page and "| x |" in page
    with pytest.raises(ValueError, match="but should be a conformance report"):
        results.kind_of({"other": 1})


def test_gpu_page_is_what_its_recorded_runs_render():
    """docs/results/gpu.md is exactly what ``python -m bench.gpu_bench
    --render`` writes from docs/results/data/gpu/ (never edited by hand), and
    every recorded run passed its equality checks."""
    from bench import gpu_bench

    records = gpu_bench.recorded()
    assert records, "docs/results/data/gpu/ holds no recorded run, but should hold at least one"
    assert gpu_bench.PAGE.read_text() == gpu_bench.page(records), "run python -m bench.gpu_bench --render"
    failed = [c["check"] for r in records for c in r["data"]["checks"] if not c["ok"]]
    assert failed == [], f"recorded checks that failed={failed}, but should be none"


def test_gpu_scripts_run_dry_on_the_cpu(tmp_path):
    """``bench.gpu_bench`` and ``bench.gpu_profile`` run as written (``--device cpu``: tiny
    sizes in Triton's interpreter), so a lent GPU's few minutes are not spent on a broken
    script: every equality check of the bench holds, and the profile records its steps. On
    the CPU the graph and eager cases run the same code (graphs need CUDA): this checks the
    scripts, not ``update_graph``."""
    pytest.importorskip("triton")
    from bench import gpu_bench, gpu_profile

    try:
        assert gpu_bench.main(["--device", "cpu", "--log2-capacities", "6", "--reps", "1",
                               "--sample-batches", "16", "--update-batches", "32", "--out", str(tmp_path)]) == 0
        assert gpu_profile.main(["--device", "cpu", "--log2-capacity", "6", "--batch", "16",
                                 "--out", str(tmp_path)]) == 0
    finally:
        gpu_bench.DEVICE = "cuda"
    bench = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert bench["checks"] and all(c["ok"] for c in bench["checks"]) and not bench["errors"]
    assert any("eager (no CUDA graph)" in c["case"] for c in bench["cases"])
    profile = json.loads((tmp_path / "gpu_profile.json").read_text())
    assert profile["profile: update_priority"]["wall_median_us"] > 0
    assert profile["profile: sample, generator on the GPU"]["wall_median_us"] > 0


def test_pages_of_benchmarks_with_their_own_renderer_are_what_their_data_renders():
    """docs/results/data/ files that bench.results leaves to their own
    benchmark (OWN_RENDERERS) are rendered by it exactly as committed."""
    import importlib
    import json

    from bench import results

    for name, module in results.OWN_RENDERERS.items():
        data = results.DATA / name
        if not data.is_file():
            continue
        bench = importlib.import_module(module)
        page = results.RESULTS / bench.DOC.name if hasattr(bench, "DOC") else None
        assert page is not None and page.is_file(), f"{module} names no page (DOC), but should render one"
        assert page.read_text() == bench.render(json.loads(data.read_text())), f"run python -m {module} --render"
