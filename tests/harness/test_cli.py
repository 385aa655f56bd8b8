"""``rbcheck validate``: run from a directory whose own pytest configuration
would break any run that picked it up (a conftest that raises, an ini with a
bogus option), with a user's module from that directory; the exit status
gates on the implementation's own failures, known failures excepted; one
progress line per property."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.harness.planted import SKIPS_LAST, UNIFORM

#: The README's example buffer with its sampler never drawing the last slot.
MYMOD = SKIPS_LAST + '''
adapter = broken


def raising():
    raise RuntimeError("cannot build the buffer here")
'''

#: pytest plugins (``--pytest-arg=-pNAME``) that break a run the ways a run can break.
FAULT_PLUGINS = {
    "interrupts": "def pytest_runtest_call(item):\n    raise KeyboardInterrupt\n",
    "internal_error": "def pytest_runtest_logstart(nodeid, location):\n    raise RuntimeError('a plugin bug')\n",
    "collect_error": "def pytest_pycollect_makeitem(collector, name, obj):\n"
                     "    if name.startswith('test_uniform'):\n        raise RuntimeError('cannot collect')\n",
}
SEED = "test_priority_transform::test_updated_priority_is_transformed_once"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_project")
    (root / "conftest.py").write_text("raise RuntimeError('the user conftest must not be loaded')\n")
    (root / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    (root / "mymod.py").write_text(textwrap.dedent(MYMOD))
    for name, source in FAULT_PLUGINS.items():
        (root / f"{name}.py").write_text(source)
    (root / "kf.txt").write_text(f"{SEED}\n    message: twice\n    reason: upstream knows\n")
    return root


def validate(project, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("RBCHECK_IMPL", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "rbcheck.cli", "validate", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_passing_builtin_exits_zero_with_progress_and_report_files(project):
    proc = validate(project, "example", "--only", UNIFORM, "--out", "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"[rbcheck] example {UNIFORM}: ")]
    assert line.endswith(" pass"), proc.stderr  # "<n> pass": every parametrization passed
    # the passes, by behaviour (the catalogue's invariant of the property), and each row in the markdown
    assert re.search(r"\n  sampling_distribution +4 pass\n", proc.stdout), proc.stdout
    report = json.loads((project / "out" / "conformance.json").read_text())
    assert report["order"] == ["example"]
    markdown = (project / "out" / "conformance.md").read_text()
    assert markdown.startswith("# Conformance report")
    assert "`test_sampling_distributions.py::test_uniform_sampling_matches_closed_form[7-5]` | pass |" in markdown
    assert (project / "out" / "conformance.html").read_text().startswith("<!doctype html>")


def test_a_users_failing_module_exits_non_zero_unless_declared(project):
    proc = validate(project, "mymod:adapter", "--only", UNIFORM)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "problem(s):" in proc.stderr, proc.stdout + proc.stderr
    # an entry covers each test it names: capacity 1 passes (one slot, none to
    # skip), so an entry for the whole property is XPASS there
    entry = "\n    message: slot frequencies: chi-square p-value\n    reason: skips the last slot (our issue 1)\n"
    known = project / "known.txt"
    known.write_text(UNIFORM + entry)
    proc = validate(project, "mymod:adapter", "--only", UNIFORM, "--known-failures", str(known))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (xpass,) = [ln for ln in proc.stderr.splitlines() if "XPASS" in ln]
    assert "test_uniform_sampling_matches_closed_form[1-3]: XPASS" in xpass, proc.stderr
    known.write_text("".join(f"{UNIFORM}[{case}]{entry}" for case in ("7-5", "10-23", "33-33")))
    proc = validate(project, "mymod:adapter", "--only", UNIFORM, "--known-failures", str(known))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "known failure (skips the last slot" in proc.stdout, proc.stdout


def test_bad_arguments_name_what_is_allowed(project):
    proc = validate(project, "example", "--only", "test_sampling_distributions::test_nope")
    assert proc.returncode == 2
    assert "property='test_sampling_distributions::test_nope', but should be a property id" in proc.stderr
    proc = validate(project)
    assert proc.returncode == 2 and "no IMPL given" in proc.stderr
    proc = validate(project, "no_such_name")
    assert proc.returncode == 2 and "no_such_name: the adapter did not load" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, said", [
    # the reproduction: the whole suite, a known failure on a seed invariant
    (["reference", "--known-failures", "kf.txt"],
     ["pytest exit status 4 (usage error)", "a test of seed invariant 2", "no entry may hide a seed bug"]),
    (["example", "--only", UNIFORM, "--pytest-arg=--no-such-flag"],
     ["the run did not complete (no results): pytest exit 4", "unrecognized arguments: --no-such-flag"]),
    (["mymod:raising"], ["mymod:raising: the adapter did not load", "RuntimeError: cannot build the buffer here"]),
    (["example", "--only", UNIFORM, "--pytest-arg=-pinterrupts"],
     ["pytest exit status 2 (interrupted", "interrupted: KeyboardInterrupt", "test(s) not run"]),
    (["example", "--only", UNIFORM, "--pytest-arg=-pinternal_error"],
     ["pytest exit status 3 (internal error)", "internal error: RuntimeError: a plugin bug"]),
    (["example", "--pytest-arg=-pcollect_error"],  # the whole suite: a module that does not collect
     ["pytest exit status 2 (interrupted", "collection error in conformance/test_sampling_distributions.py: "
      "RuntimeError: cannot collect", "test(s) not run"]),
], ids=["seed-known-failure", "bad-pytest-arg", "factory-raises", "interrupt", "internal-error",
        "collection-error"])
def test_a_run_that_did_not_complete_exits_2_and_says_why(project, args, said):
    proc = validate(project, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no problems" not in proc.stdout, proc.stdout
    assert "did not complete" in proc.stderr or "did not load" in proc.stderr, proc.stderr
    for text in said:
        assert text in proc.stderr, proc.stderr


# ------------------------------------------- one verdict: validate and report


def synthetic(name, outcome, exitstatus=None, errors=()):
    from rbcheck.harness.report import ImplResult

    test = {"nodeid": f"rbcheck/conformance/{UNIFORM.replace('::', '.py::')}[7-5]", "property": UNIFORM,
            "outcome": outcome, "message": "AssertionError: m" if outcome == "fail" else ""}
    return ImplResult(name=name, status="ran", version="1", tests=[test], errors=list(errors),
                      exitstatus=(1 if outcome == "fail" else 0) if exitstatus is None else exitstatus)


CASES = {  # case -> (its result, the exit status)
    "pass": (lambda n: synthetic(n, "pass"), 0),
    "fail": (lambda n: synthetic(n, "fail"), 1),
    "xpass": (lambda n: synthetic(n, "xpass"), 1),
    "not-run": (lambda n: synthetic(n, "not run"), 2),
    "usage-error": (lambda n: synthetic(n, "not run", 4, ["usage error: bad entry"]), 2),
}


@pytest.mark.parametrize("name", ["reference", "mine.buffers:adapter", "torchrl"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("informational", [False, True])
def test_validate_and_the_report_give_the_same_verdict(monkeypatch, tmp_path, capsys, name, case, informational):
    """``rbcheck validate`` and ``python -m rbcheck.harness.report`` judge the
    same results alike; only the built-in third parties are informational
    (their failures, not an aborted run), and only when asked."""
    import json

    from rbcheck import cli, runner
    from rbcheck.harness import adapters, report

    make, expected = CASES[case]
    result = make(name)
    if informational and name == "torchrl" and case in ("fail", "xpass"):
        expected = 0  # reported, not gating
    monkeypatch.setattr(adapters, "load_adapter", lambda n: None)
    monkeypatch.setattr(runner, "run_subprocess", lambda n, **kw: make(n))
    flag = ["--third-party-informational"] if informational else []
    assert cli.main(["validate", name, *flag]) == expected
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"version": "1", "exitstatus": result.exitstatus, "errors": result.errors,
                                "tests": result.tests}))
    assert report.main(["--from-results", f"{name}={path}", "--out", str(tmp_path / "out"), *flag]) == expected
    assert report.main(["--impl", name, "--out", str(tmp_path / "out"), *flag]) == expected
    capsys.readouterr()


def test_validate_itself_imports_neither_torch_nor_an_adapter():
    """``rbcheck validate`` only orchestrates: each implementation's adapter
    is loaded in its own pytest subprocess (which says why when it cannot),
    so the parent process pays for no torch, tensordict or library import."""
    code = ("import sys\nfrom rbcheck import cli\nfrom rbcheck.harness import report, verdict\n"
            "from rbcheck.harness.adapters import BUILTIN\n"
            "loaded = sorted(m for m in ('torch', 'tensordict', 'hypothesis') if m in sys.modules)\n"
            "assert not loaded, f'modules imported by validate itself={loaded}, but should be none'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
