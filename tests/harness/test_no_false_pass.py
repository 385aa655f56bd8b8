"""No false pass: ``rbcheck validate`` run as a user runs it, from a
directory of their own, against buffers that try every way a failure could
be turned into a pass or state could be lost outside the buffer: settings
taken from the shell, outcomes raised by the buffer, catch-all known-failure
patterns, a verdict that hides how little ran, interrupts and crashes, and
report files behind links."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness.planted import SKIPS_LAST, UNIFORM

MINE = SKIPS_LAST + '''
import os
import unittest

import pytest


def _sample_does(action, name):
    class Buffer(ListBuffer):
        def sample(self, batch_size):
            action()
            return super().sample(batch_size)

    return replace(example(), name=name, make=lambda spec: Buffer(spec.capacity, spec.seed))


def _unittest_skip():
    raise unittest.SkipTest("the buffer says so")


def xfails():
    return _sample_does(lambda: pytest.xfail("the buffer says so"), "xfails")


def skips():
    return _sample_does(lambda: pytest.skip("the buffer says so"), "skips")


def unittest_skips():
    return _sample_does(_unittest_skip, "unittest-skips")


def exits():
    return _sample_does(lambda: os._exit(0), "exits")


def bare():
    return replace(example(), name="bare", capabilities=frozenset())


def own_known_failures():
    return replace(example(), known_failures="own-known.txt")
'''

#: An entry for a property the example passes: read, it gives XPASS.
OWN_ENTRY = f"{UNIFORM}\n    message: slot frequencies: chi-square p-value\n    reason: ours\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_project")
    (root / "mine.py").write_text(textwrap.dedent(MINE))
    return root


def validate(project, *args, env=None, **kwargs):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RBCHECK_", "PYTEST_"))}
    return subprocess.run([sys.executable, "-m", "rbcheck.cli", "validate", *args], cwd=project,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=600, **kwargs)


# ------------------------------------------------------ 1. settings from the arguments


def test_the_shell_environment_cannot_turn_a_failure_into_a_pass(project):
    env = {"RBCHECK_DEVICE": "cuda", "RBCHECK_SHRINK_SECONDS": "0", "RBCHECK_IMPL": "reference",
           "PYTEST_ADDOPTS": "-k nothing_matches"}
    proc = validate(project, "mine:broken", "--only", UNIFORM, "--out", "env-out", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "skipped (not declared: cuda)" not in proc.stdout, proc.stdout
    report = json.loads((project / "env-out" / "conformance.json").read_text())
    settings = report["implementations"]["mine:broken"]["settings"]
    assert settings["device"] == "cpu" and settings["profile"] == "ci", settings
    header = (project / "env-out" / "conformance.md").read_text().split("| property |")[0]
    assert "device: cpu" in header and "profile: ci" in header, header


def test_a_device_the_adapter_does_not_declare_is_a_usage_error(project):
    proc = validate(project, "example", "--only", UNIFORM, "--device", "cuda")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "device='cuda'" in proc.stderr and "does not declare 'cuda'" in proc.stderr, proc.stderr
    assert "no problems" not in proc.stdout


# ------------------------------------------------------ 2. outcomes raised by the buffer


@pytest.mark.parametrize("factory", ["xfails", "skips", "unittest_skips"])
def test_a_skip_or_xfail_raised_by_the_buffer_is_a_failure(project, factory):
    proc = validate(project, f"mine:{factory}", "--only", UNIFORM)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "known failure" not in proc.stdout and "skipped (" not in proc.stdout, proc.stdout
    assert "raised from the buffer's code" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "only rbcheck decides what is skipped" in proc.stdout + proc.stderr


# ------------------------------------------------------ 3. catch-all patterns


@pytest.mark.parametrize("pattern", [".", "(?s).", "[\\s\\S]", "\\w", "e", "^AssertionError: ", "but should be",
                                     "Error"])
def test_a_catch_all_known_failure_pattern_is_refused(pattern):
    from rbcheck.harness.plugin.known_failures import KnownFailureError, known_failure

    with pytest.raises(KnownFailureError, match="would also hide unrelated failures") as err:
        known_failure(UNIFORM, pattern, "ours", where="here")
    assert "re.escape" in str(err.value), err.value


@pytest.mark.parametrize("pattern", ["slot frequencies: chi-square p-value", "load \\(capacity_differs\\)=<returned",
                                     "^TypeError: Object of type Tensor is not JSON serializable", "twice"])
def test_a_specific_known_failure_pattern_is_accepted(pattern):
    from rbcheck.harness.plugin.known_failures import known_failure

    assert known_failure(UNIFORM, pattern, "ours", where="here").pattern.pattern == pattern


def test_a_catch_all_pattern_in_a_file_stops_the_run(project):
    known = project / "catch-all.txt"
    known.write_text(f"{UNIFORM}\n    message: .\n    reason: hide it\n")
    proc = validate(project, "mine:broken", "--only", UNIFORM, "--known-failures", str(known))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "would also hide unrelated failures" in proc.stderr, proc.stderr


# ------------------------------------------------------ 4. how much ran


def test_the_verdict_says_how_little_ran_and_the_json_carries_it(project):
    proc = validate(project, "mine:bare", "--out", "bare-out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((project / "bare-out" / "conformance.json").read_text())
    info = report["implementations"]["mine:bare"]
    ran = sum(n for k, n in info["counts"].items() if k in ("pass", "fail", "error", "xfail", "xpass"))
    total = sum(info["counts"].values())
    assert 0 < ran < total
    closing = proc.stdout.strip().splitlines()[-1]
    assert f"{ran} of {total} tests ran" in closing, closing
    assert "not declared: " in closing and "prioritized" in closing and "save_load" in closing, closing
    assert report["verdict"]["exit_status"] == 0 and report["verdict"]["verdict"] == "passed", report["verdict"]
    assert report["verdict"]["ran"]["mine:bare"] == {"ran": ran, "tests": total}
    assert info["kind"] == "user" and info["third_party"] is False, info


# ------------------------------------------------------ 8. interrupts, crashes, paths


def _start(project, out):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RBCHECK_", "PYTEST_"))}
    proc = subprocess.Popen([sys.executable, "-m", "rbcheck.cli", "validate", "example", "--out", out],
                            cwd=project, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen = []
    for line in proc.stderr:  # wait for the first property to finish: the suite is under way
        seen.append(line)
        if line.startswith("[rbcheck] example test_"):
            break
    return proc, seen


def _group_gone(pgid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_exits_2_with_one_line_and_a_partial_report(project, how):
    proc, _ = _start(project, f"interrupted-{how}")
    pgid = os.getpgid(proc.pid)
    try:
        if how == "ctrl-c":
            os.killpg(pgid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        else:
            proc.terminate()  # SIGTERM to rbcheck alone: its workers must not outlive it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(pgid, signal.SIGKILL)
    assert proc.returncode == 2, out + err
    assert "Traceback" not in err, err
    assert "interrupted by SIG" in err and "partial" in err, err
    report = json.loads((project / f"interrupted-{how}" / "conformance.json").read_text())
    assert report["verdict"]["exit_status"] == 2, report["verdict"]
    assert _group_gone(pgid), "a process of the run outlived it"


def test_a_buffer_that_ends_the_process_is_named_with_the_test_that_ran(project):
    proc = validate(project, "mine:exits", "--only", UNIFORM)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "test_uniform_sampling_matches_closed_form" in proc.stderr, proc.stderr
    assert "while running" in proc.stderr, proc.stderr


def test_an_adapters_relative_known_failures_file_is_its_modules(project, tmp_path):
    (project / "own-known.txt").write_text(OWN_ENTRY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(project)}
    proc = validate(elsewhere, "mine:own_known_failures", "--only", UNIFORM, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # read: the example passes, so XPASS
    assert "XPASS" in proc.stdout and "known failure: ours" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ------------------------------------------------------ 9. the report's files


def test_out_never_writes_through_a_link(project, tmp_path):
    outside = tmp_path / "precious.json"
    outside.write_text("the user's own file\n")
    out = project / "linked-out"
    out.mkdir()
    (out / "conformance.json").symlink_to(outside)
    (out / "conformance.md").symlink_to(outside)
    proc = validate(project, "example", "--only", UNIFORM, "--out", "linked-out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outside.read_text() == "the user's own file\n"
    assert not (out / "conformance.json").is_symlink()
    assert json.loads((out / "conformance.json").read_text())["order"] == ["example"]


def test_list_into_a_closed_pipe_prints_no_traceback(project):
    """``rbcheck list | head -1``, made certain: the reading end is closed
    before rbcheck writes a line."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "rbcheck.cli", "list"], cwd=project, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
