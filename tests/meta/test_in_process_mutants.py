"""Meta tests for the cheap mutants (``in_process=True`` in tests/mutants):
their targeted properties are called in this process, with a small,
derandomised example budget and no shrinking, instead of one pytest
subprocess per mutant (tests/meta/test_mutants_caught.py), so a whole family
of mutants costs seconds.

The same rules as for the other mutants: a targeted property fails with a
self-explaining message (``... but should be ...``), every control (and the
reference) passes every target of its mutants, and every repro snippet the
failures printed loads the mutant's adapter string and runs in a fresh
interpreter (all snippets in one interpreter, at the end).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.assertions import PropertyFailure
from tests.meta.test_mutants_caught import SNIPPET_RUNNER, TIMEOUT_S
from tests.mutants.registry import all_mutants

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = [m for m in all_mutants() if getattr(m, "in_process", False)]
#: Examples per property and run: enough that each mutant is caught
#: (derandomised, so the same examples every run), few enough to be cheap.
EXAMPLES = 25
SNIPPETS: list[tuple[str, str]] = []  # (adapter string, snippet)
PROFILE = "rbcheck-in-process-mutants"
#: The seed of torch's default generator in a fresh process.
TORCH_FRESH_SEED = torch.initial_seed()
settings.register_profile(PROFILE, max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
                          print_blob=False)


def _controls() -> list[str]:
    """The controls other than the reference (which passes these properties
    in the suite's own run on it, nox -s tests)."""
    return sorted({m.control for m in IN_PROCESS} - {"reference"})


def _targets(control: str) -> list[tuple[str, str]]:
    chosen = [m for m in IN_PROCESS if m.control == control]
    return sorted({(f[:-3], t) for m in chosen for f in m.files for t in m.targets
                   if hasattr(importlib.import_module(f"rbcheck.conformance.{f[:-3]}"), t)})


@pytest.fixture(autouse=True)
def _only_with_the_reference(impl):
    if impl.name != "reference":
        pytest.skip(f"meta tests check the suite itself; run them with --impl reference (not {impl.name!r})")


def run_property(stem: str, name: str, impl: str) -> tuple[str, BaseException | None]:
    """``("pass" | "skip" | "fail", exception)`` of one property on ``impl``."""
    fn = getattr(importlib.import_module(f"rbcheck.conformance.{stem}"), name)
    # the global generators as a fresh process has them: a property or an
    # adapter that draws from them then sees the same draws whatever ran before
    torch.manual_seed(TORCH_FRESH_SEED)
    random.seed(0)
    numpy.random.seed(0)
    # A @given test keeps the settings that were the default when its module
    # was imported (the suite's profile), so loading a profile here would not
    # reach it: the budget is put on the test for this call, then put back.
    captured = fn._hypothesis_internal_use_settings
    fn._hypothesis_internal_use_settings = settings.get_profile(PROFILE)
    try:
        fn(impl=load_adapter(impl))
    except pytest.skip.Exception as err:
        return "skip", err
    except BaseException as err:  # noqa: BLE001 - a verdict (or a crash) of the property
        return "fail", err
    finally:
        fn._hypothesis_internal_use_settings = captured
    return "pass", None


def test_the_in_process_budget_reaches_the_properties():
    """Each property runs with this file's profile (EXAMPLES derandomised
    examples, no shrinking), whatever profile the suite was imported under:
    a property that counts its calls is called EXAMPLES times."""
    from hypothesis import given
    from hypothesis import strategies as st

    calls = []

    @given(data=st.data())
    def counting(impl, data):
        calls.append(data.draw(st.integers(0, 10**6)))

    module = type(sys)("rbcheck_probe_module")
    module.counting = counting
    sys.modules["rbcheck.conformance.rbcheck_probe_module"] = module
    try:
        assert run_property("rbcheck_probe_module", "counting", "reference")[0] == "pass"
        first = list(calls)
        calls.clear()
        run_property("rbcheck_probe_module", "counting", "reference")
    finally:
        del sys.modules["rbcheck.conformance.rbcheck_probe_module"]
    assert len(first) == EXAMPLES, f"examples per in-process run={len(first)}, but should be {EXAMPLES}"
    assert calls == first, "the in-process runs should be derandomised (the same examples every run)"
    assert counting._hypothesis_internal_use_settings is not settings.get_profile(PROFILE)  # put back


def explained(err: BaseException) -> list[PropertyFailure]:
    """The property failures in ``err`` (an ExceptionGroup holds several)."""
    if isinstance(err, PropertyFailure):
        return [err]
    return [f for e in getattr(err, "exceptions", ()) for f in explained(e)]


@pytest.mark.parametrize("mutant", IN_PROCESS, ids=[m.factory for m in IN_PROCESS])
def test_in_process_mutant_is_caught(mutant):
    """One of the targets fails on the mutant with a self-explaining message."""
    seen = {}
    for t in mutant.targets:  # in declared order, up to the first that catches it
        stem = next(f[:-3] for f in mutant.files
                    if hasattr(importlib.import_module(f"rbcheck.conformance.{f[:-3]}"), t))
        seen[t] = run_property(stem, t, mutant.impl)
        if seen[t][0] == "fail":
            break
    caught = [(t, err) for t, (outcome, err) in seen.items() if outcome == "fail"]
    assert caught, (f"outcomes={ {t: o for t, (o, _) in seen.items()} }, but should include a failure of one of "
                    f"{list(mutant.targets)} (bug: {mutant.bug})")
    failures = explained(caught[0][1])
    assert failures, f"failure={caught[0][1]!r}, but should be a PropertyFailure ('<what>=<got>, but should be ...')"
    for f in failures:
        assert "but should be" in f.own_message, f"failure message={f.own_message!r}, but should explain itself"
        assert f"load_adapter({mutant.impl!r})" in f.repro, (
            f"repro snippet={f.repro!r}, but should load the adapter the run was given ({mutant.impl!r})")
    SNIPPETS.append((mutant.impl, failures[0].repro))
    print(f"{mutant.factory}: caught by {', '.join(t for t, _ in caught)}: {failures[0].own_message[:160]}")


@pytest.mark.parametrize("control", _controls())
def test_in_process_control_passes_the_targets_of_its_mutants(control):
    """The control (and the reference) passes every property its mutants are
    aimed at, with the same examples: each catch is the mutant's bug."""
    for stem, name in _targets(control):
        outcome, err = run_property(stem, name, control)
        assert outcome == "pass", f"outcome of {name} on the control {control!r}={outcome!r}, but should be 'pass'\n{err}"


def test_in_process_repro_snippets_run(tmp_path):
    """Every snippet printed above runs in one fresh interpreter, from an
    empty directory, without a missing name or import."""
    if not SNIPPETS:
        pytest.skip("no in-process mutant ran in this session (run the whole file)")
    source = tmp_path / "snippets.json"
    source.write_text(json.dumps([text for _, text in SNIPPETS]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RBCHECK_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT)  # the mutants live in the repository's tests package
    proc = subprocess.run([sys.executable, "-c", SNIPPET_RUNNER, str(source)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"snippet runner exit status={proc.returncode}, but should be 0\n{proc.stderr[-2000:]}"
    broken = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not broken, f"repro snippets that do not run={broken}, but should be none"
