"""`nox -s validate` over several environments: each writes its
implementations' results as parts (``rbcheck validate --parts``), running
them in parallel worker processes (``--jobs``), and ``rbcheck report --merge``
builds one report and one verdict from the parts. A column that did not run
is never green: a missing part aborts (2), and under ``--must-load`` so does an
adapter that did not load, third party or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rbcheck import cli
from rbcheck.harness import report
from rbcheck.harness.adapters import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
UNIFORM = "test_sampling_distributions::test_uniform_sampling_matches_closed_form"
#: A property the README's example skips (it declares only "random"): a run with nothing to compute.
SKIPPED_BY_EXAMPLE = "test_priority_transform::test_updated_priority_is_transformed_once"


def result(name: str, outcome: str = "pass", status: str = "ran") -> report.ImplResult:
    if status != "ran":
        return report.ImplResult(name=name, status=status, why="ImportError: No module named 'lib'")
    test = {"nodeid": f"rbcheck/conformance/{UNIFORM.replace('::', '.py::')}[7-5]", "property": UNIFORM,
            "outcome": outcome, "message": "AssertionError: m" if outcome == "fail" else ""}
    return report.ImplResult(name=name, status="ran", version="1", tests=[test], seconds=1.5,
                             exitstatus=1 if outcome == "fail" else 0, conventions={"sampling": "stratified"})


def parts(tmp_path: Path, *results: report.ImplResult, env: str = "main") -> Path:
    for r in results:
        report.write_part(r, tmp_path / "parts" / env)
    return tmp_path / "parts"


def merged(tmp_path: Path, *args: str) -> int:
    return cli.main(["report", "--merge", str(tmp_path / "parts"), "--out", str(tmp_path / "out"), *args])


def test_a_part_round_trips_every_field(tmp_path):
    original = result("torchrl", "fail")
    original.output, original.errors, original.unavailable = "pytest said", ["e"], {"prioritized": "why"}
    path = report.write_part(original, tmp_path)
    assert report.read_parts(tmp_path) == {"torchrl": original}
    assert not list(tmp_path.glob("*.tmp")) and path.suffix == ".json"
    # names that differ only in characters a file name cannot hold get their own parts
    report.write_part(result("pkg.mod:f"), tmp_path)
    report.write_part(result("pkg.mod_f"), tmp_path)
    assert set(report.read_parts(tmp_path)) == {"torchrl", "pkg.mod:f", "pkg.mod_f"}


def test_merge_gives_the_verdict_of_every_environment(tmp_path, capsys):
    parts(tmp_path, result("reference"), result("example"), result("torchrl", "fail"))
    parts(tmp_path, result("cpprb", "fail"), env="other")
    names = ["--impl=reference", "--impl=example", "--impl=torchrl", "--impl=cpprb"]
    assert merged(tmp_path, *names, "--third-party-informational") == 0
    saved = json.loads((tmp_path / "out" / "conformance.json").read_text())
    assert saved["order"] == ["reference", "example", "torchrl", "cpprb"]
    assert saved["implementations"]["cpprb"]["counts"] == {"fail": 1}
    assert "| property | reference | example | torchrl | cpprb |" in (tmp_path / "out" / "conformance.md").read_text()
    assert merged(tmp_path, *names) == 1  # third parties gate unless informational
    parts(tmp_path, result("example", "fail"))  # a first-party failure always gates
    assert merged(tmp_path, *names, "--third-party-informational") == 1
    capsys.readouterr()


def test_a_column_that_did_not_run_is_never_green(tmp_path, capsys):
    parts(tmp_path, result("reference"), result("torchrl"))
    # an implementation asked for without a part: "not run", exit 2 even for a third party
    assert merged(tmp_path, "--impl=reference", "--impl=torchrl", "--impl=cpprb",
                  "--third-party-informational") == 2
    cells = {row["id"]: row["cells"] for row in json.loads((tmp_path / "out" / "conformance.json").read_text())["rows"]}
    (cell,) = [c["cpprb"] for c in cells.values()]
    assert cell["outcome"] == "not run" and cell["text"].startswith("not run (no results for it in ")
    assert "cpprb: the run did not complete" in capsys.readouterr().err
    # without --impl every built-in is expected
    assert merged(tmp_path, "--third-party-informational") == 2
    capsys.readouterr()


@pytest.mark.parametrize("must_load", [False, True])
def test_an_adapter_that_did_not_load_gates_under_must_load(tmp_path, capsys, must_load):
    parts(tmp_path, result("reference"), result("cpprb", status="unavailable"))
    args = ["--impl=reference", "--impl=cpprb", "--third-party-informational"] + ["--must-load"] * must_load
    assert merged(tmp_path, *args) == (2 if must_load else 0)
    err = capsys.readouterr().err
    assert "cpprb: the adapter did not load: ImportError: No module named 'lib'" in err


def test_bad_merges_are_refused_naming_the_files(tmp_path, capsys):
    with pytest.raises(SystemExit):
        merged(tmp_path)  # no such directory
    assert "--merge=" in capsys.readouterr().err
    (tmp_path / "parts" / "a").mkdir(parents=True)
    (tmp_path / "parts" / "a" / "x.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(SystemExit):
        merged(tmp_path)
    assert "x.json: part schema=99, but should be 1" in capsys.readouterr().err
    (tmp_path / "parts" / "a" / "x.json").unlink()
    parts(tmp_path, result("reference"), env="a")
    parts(tmp_path, result("reference"), env="b")
    with pytest.raises(SystemExit):
        merged(tmp_path)
    assert "both hold 'reference'" in capsys.readouterr().err


def test_run_many_runs_each_in_its_own_worker_directory_and_keeps_the_order(monkeypatch, tmp_path):
    import threading
    import time

    seen, lock, running, most = [], threading.Lock(), [0], [0]

    def fake_run_one(name, profile, extra, workdir, **kw):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05 if name != "a" else 0.2)  # "a" ends last
        with lock:
            running[0] -= 1
            seen.append((name, workdir, tuple(extra), os.environ.get("OMP_NUM_THREADS")))
        return report.ImplResult(name=name, status="ran")

    monkeypatch.setattr(report, "run_one", fake_run_one)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    done = []
    out = report.run_many(["a", "b", "c"], "ci", ["-x"], tmp_path, jobs=2, done=lambda r: done.append(r.name))
    assert [r.name for r in out] == ["a", "b", "c"] and done[-1] == "a" and most[0] == 2
    assert len({workdir for _, workdir, _, _ in seen}) == 3
    assert all(extra == ("-x", f"--basetemp={workdir / 'tmp'}") and threads for _, workdir, extra, threads in seen)
    assert "OMP_NUM_THREADS" not in os.environ  # put back
    with pytest.raises(ValueError, match=r"jobs=0, but should be an int >= 1"):
        report.run_many(["a"], "ci", [], tmp_path, jobs=0)


@pytest.mark.parametrize("args, said", [
    (["--jobs", "0"], "--jobs='0', but should be an integer >= 1 or 'auto'"),
    (["--all", "--exclude", "nope"], "--exclude='nope', but should be a built-in name"),
])
def test_bad_parallel_arguments_name_what_is_allowed(capsys, args, said):
    with pytest.raises(SystemExit) as exc:
        cli.main(["validate", *args])
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_two_workers_write_parts_that_merge(tmp_path, capsys):
    """End to end, kept fast: the README's example on a property it skips
    (nothing to compute) beside a user's module whose adapter does not load,
    at once; the merge gates on the user's module only when it is asked for."""
    (tmp_path / "mymod.py").write_text("def raising():\n    raise RuntimeError('cannot build the buffer here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RBCHECK_IMPL", "PYTEST_ADDOPTS")}
    proc = subprocess.run([sys.executable, "-m", "rbcheck.cli", "validate", "example", "mymod:raising", "--only",
                           SKIPPED_BY_EXAMPLE, "--jobs", "2", "--parts", "parts"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[rbcheck] example: done in " in proc.stderr, proc.stderr
    assert "[rbcheck] mymod:raising: the adapter did not load (RuntimeError: cannot build" in proc.stderr
    assert set(report.read_parts(tmp_path / "parts")) == {"example", "mymod:raising"}
    parts = str(tmp_path / "parts")
    assert cli.main(["report", "--merge", parts, "--impl=example", "--out", str(tmp_path / "out")]) == 0
    assert cli.main(["report", "--merge", parts, "--impl=example", "--impl=mymod:raising",
                     "--out", str(tmp_path / "out")]) == 2
    assert "mymod:raising: the adapter did not load" in capsys.readouterr().err


def test_every_validate_environment_installs_known_groups_and_lists_built_ins(tmp_path, monkeypatch):
    """Each built-in is validated in one environment ("main" takes every one no
    other lists), and every group an environment installs is declared."""
    tomllib = pytest.importorskip("tomllib")
    from tests.test_records import load_noxfile

    envs = load_noxfile(tmp_path, monkeypatch).VALIDATE_ENVS
    groups = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"])
    listed: list[str] = []
    for key, (env_groups, names) in envs.items():
        declared = set(env_groups)
        assert declared <= groups, f"{key}: groups {sorted(declared - groups)} are not in pyproject.toml"
        listed += names
    assert "main" in envs
    assert len(listed) == len(set(listed)) and set(listed) <= set(BUILTIN), listed
