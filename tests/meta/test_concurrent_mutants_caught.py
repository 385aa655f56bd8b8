"""Meta tests of the concurrency properties: every concurrency mutant
(``tests/mutants/concurrency.py``) is caught by the property aimed at its
bug, the reference behind one lock (``reference-locked``) passes them all
(the control), and the plain reference, which is not thread-safe, does not
declare "concurrent": its run shows them skipped with that reason.

Same machinery as test_mutants_caught.py (a subprocess per run, ci profile,
results file); the runs go in parallel, one per core.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.meta.test_mutants_caught import assert_caught, assert_outcomes, run_conformance
from tests.mutants.registry import of_kind

MUTANTS = of_kind("concurrency")

FILES = sorted({f for m in MUTANTS for f in m.files})
TARGETS = sorted({t for m in MUTANTS for t in m.targets})
LOCKED = "rbcheck.harness.concurrency:locked_reference_adapter"  # the reference behind one lock
CONTROLS = (LOCKED, "reference")


@pytest.fixture(autouse=True)
def _only_with_the_reference(impl):
    if impl.name != "reference":
        pytest.skip(
            f"meta tests check the suite itself; run them with --impl reference (not {impl.name!r})"
        )


@pytest.fixture(scope="module")
def runs(request):
    """``name -> (Future, results path)`` for the selected mutants and controls."""
    selected = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "mutant" in callspec.params:
            selected.add(callspec.params["mutant"].factory)
        elif callspec is not None and "control" in callspec.params:
            selected.add(callspec.params["control"])
    tmp = Path(tempfile.mkdtemp(prefix="rbcheck-meta-concurrent-"))
    jobs = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for name in CONTROLS:
            if name in selected:
                path = tmp / f"{name.replace(':', '-')}.json"
                jobs[name] = (pool.submit(run_conformance, name, FILES, TARGETS, path), path)
        for m in MUTANTS:
            if m.factory in selected:
                path = tmp / f"{m.factory}.json"
                jobs[m.factory] = (pool.submit(run_conformance, m.impl, m.files, m.targets, path), path)
        yield jobs
        for future, _ in jobs.values():
            future.cancel()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.factory for m in MUTANTS])
def test_concurrent_mutant_is_caught(mutant, runs):
    """The targeted property fails on the mutant with a self-explaining message."""
    assert_caught(mutant, *runs[mutant.factory])


@pytest.mark.parametrize("control", CONTROLS, ids=["reference-locked", "reference"])
def test_concurrent_controls(control, runs):
    """reference-locked passes every targeted property; the plain reference
    skips each with "not declared: concurrent" (it is not thread-safe)."""
    want = "pass" if control == LOCKED else "skip"
    seen = assert_outcomes(control, *runs[control], TARGETS, want)
    for target in TARGETS if want == "skip" else ():
        message = seen[target][1]
        assert "not declared: concurrent" in message, (
            f"skip reason of {target} on the reference={message!r}, but should be 'not declared: concurrent'"
        )
