"""``rbcheck validate``: run from a directory whose own pytest configuration
would break any run that picked it up (a conftest that raises, an ini with a
bogus option), with a user's module from that directory; the exit status
gates on the implementation's own failures, known failures excepted; one
progress line per property."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

UNIFORM = "test_sampling_distributions::test_uniform_sampling_matches_closed_form"

#: The README's example buffer with its sampler never drawing the last slot.
MYMOD = '''
import torch
from rbcheck.harness.examples.list_buffer import ListBuffer, adapter as example


class SkipsLastSlot(ListBuffer):
    def sample(self, batch_size):
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        index = (u * max(len(self.rows) - 1, 1)).long()
        return self.contents()[index], {"index": index}


def adapter():
    from dataclasses import replace
    return replace(example(), name="skips-last", make=lambda spec: SkipsLastSlot(spec.capacity, spec.seed))
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_project")
    (root / "conftest.py").write_text("raise RuntimeError('the user conftest must not be loaded')\n")
    (root / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    (root / "mymod.py").write_text(textwrap.dedent(MYMOD))
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
    assert "test_sampling_distributions.py::test_uniform_sampling_matches_closed_form" in proc.stdout
    report = json.loads((project / "out" / "conformance.json").read_text())
    assert report["order"] == ["example"]
    assert (project / "out" / "conformance.md").read_text().startswith("# Conformance report")


def test_a_users_failing_module_exits_non_zero_unless_declared(project):
    proc = validate(project, "mymod:adapter", "--only", UNIFORM)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "problem(s):" in proc.stderr, proc.stdout + proc.stderr
    # an entry covers each test it names: capacity 1 passes (one slot, none to
    # skip), so an entry for the whole property is XPASS there
    entry = "\n    message: ^AssertionError: \n    reason: skips the last slot (our issue 1)\n"
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
    assert proc.returncode == 1 and "no_such_name: unavailable" in proc.stderr, proc.stderr
