"""Run the conformance suite on an implementation: the machinery behind
``rbcheck validate`` (a subprocess per implementation) and
``rbcheck.check_buffer`` / ``rbcheck.parametrize_with_checks`` (pytest run
in-process, inside the user's own test session).

A *property* is one test function of the suite; its id is
``<file stem>::<function>`` (``test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form``),
stable across releases: a property that changes meaning gets a new name.
Either way the run is isolated from the caller's pytest configuration: its
own ini file, rootdir and conftest cut-off, so results do not depend on the
working directory.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import rbcheck.conformance

#: The conformance suite: a package inside the installed rbcheck.
SUITE = Path(rbcheck.conformance.__file__).resolve().parent
#: The ini file of a run: empty, so nothing of the caller's configuration applies.
_INI = "[pytest]\n"


class ConformanceError(AssertionError):
    """An implementation failed properties it did not declare as expected
    failures (or, in strict mode, an expected failure passed). The message is
    the report."""


def properties() -> list[str]:
    """Every property id of the suite, in file order (no import needed)."""
    ids = []
    for path in sorted(SUITE.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        ids += [f"{path.stem}::{node.name}" for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")]
    return ids


def node_path(property_id: str) -> str:
    """A property id as a pytest path into the installed suite; an id that
    names no property raises ``ValueError`` naming the allowed form."""
    known = properties()
    if property_id not in known:
        stem = property_id.split("::", 1)[0]
        close = [p for p in known if p.startswith(stem + "::")] or known[:3]
        raise ValueError(
            f"property={property_id!r}, but should be a property id <file>::<test> such as "
            f"{', '.join(repr(p) for p in close[:4])} (`rbcheck list` prints them all)"
        )
    stem, _, name = property_id.partition("::")
    return f"{SUITE / (stem + '.py')}::{name}"


def isolation_args(workdir: Path) -> list[str]:
    """pytest options that make a run independent of the caller's directory:
    an empty ini file of its own, the suite's parent as rootdir, no conftest
    from outside the suite, no cache, and rbcheck's plugin on."""
    ini = workdir / "pytest.ini"
    ini.write_text(_INI)
    return ["-c", str(ini), f"--rootdir={SUITE.parent}", f"--confcutdir={SUITE}",
            "-p", "no:cacheprovider", "-p", "rbcheck"]


def clean_env(pythonpath: Iterable[str] = ()) -> dict[str, str]:
    """The environment for a suite subprocess: the caller's, without options
    meant for its own pytest runs, with ``pythonpath`` first on the path."""
    env = dict(os.environ)
    for name in ("RBCHECK_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(name, None)
    parts = [*pythonpath, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_subprocess(name: str, *, profile: str, workdir: Path, only: Iterable[str] = (),
                   known_failures: Path | None = None, extra: Iterable[str] = (),
                   pythonpath: Iterable[str] = (), progress: bool = True):
    """Run the suite against ``name`` in a pytest subprocess; the
    :class:`rbcheck.harness.report.ImplResult` of the run. Progress lines
    (``--rbcheck-progress``) go to this process's stderr as they come."""
    from rbcheck.harness.report import ImplResult

    safe = "".join(c if c.isalnum() else "_" for c in name)
    results = workdir / f"results-{safe}.json"
    paths = [node_path(p) for p in only] or [str(SUITE)]
    command = [sys.executable, "-m", "pytest", *paths, "-q", *isolation_args(workdir),
               f"--impl={name}", f"--rbcheck-profile={profile}", f"--rbcheck-results={results}"]
    if known_failures is not None:
        command.append(f"--rbcheck-known-failures={known_failures}")
    if progress:
        command.append("--rbcheck-progress")
    command += list(extra)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=clean_env(pythonpath), stdout=out,
                                stderr=subprocess.PIPE, text=True)
        errors = []
        for line in proc.stderr:
            if line.startswith("[rbcheck] "):
                sys.stderr.write(line)
                sys.stderr.flush()
            else:
                errors.append(line)
        proc.wait()
        out.seek(0)
        output = out.read()
    if not results.exists():
        tail = " ".join((output + "".join(errors)).strip().splitlines()[-3:])
        return ImplResult(name=name, status="crashed", why=f"pytest exit {proc.returncode}: {tail}",
                          exitstatus=proc.returncode)
    return ImplResult.from_results(name, json.loads(results.read_text()))


# --------------------------------------------------------------------------
# In-process: check_buffer and parametrize_with_checks
# --------------------------------------------------------------------------


def _adapter(adapter: Any):
    from rbcheck.harness.adapters import load_adapter
    from rbcheck.harness.protocol import Adapter

    if isinstance(adapter, Adapter):
        return adapter
    if isinstance(adapter, str):
        return load_adapter(adapter)
    if callable(adapter):
        made = adapter()
        if isinstance(made, Adapter):
            return made
        raise TypeError(f"adapter() returned a {type(made).__name__}, but should return an rbcheck Adapter")
    raise TypeError(
        f"adapter={adapter!r}, but should be an Adapter, a factory returning one, "
        f"a built-in name or 'pkg.module:factory'"
    )


def _expected(expected_failures: Mapping[str, str] | None) -> dict[str, str]:
    expected = dict(expected_failures or {})
    known = set(properties())
    for key, reason in expected.items():
        if key not in known:
            node_path(key)  # raises, naming the allowed form
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"expected_failures[{key!r}]={reason!r}, but should be a non-empty reason")
    return expected


def run_in_process(adapter: Any, *, only: Iterable[str] = (), expected: Mapping[str, str] | None = None,
                   profile: str = "ci"):
    """Run the suite (or the ``only`` properties) on ``adapter`` with pytest
    in this process; the ``ImplResult``. Tests of the ``expected`` properties
    that fail become known failures (``xfail``), passing ones ``XPASS``."""
    import pytest

    from rbcheck.harness import adapters
    from rbcheck.harness.report import ImplResult

    adapter = _adapter(adapter)
    token = f"rbcheck.check_buffer:{adapter.name}-{id(adapter)}"
    adapters.INJECTED[token] = adapter
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            results = workdir / "results.json"
            args = [*([node_path(p) for p in only] or [str(SUITE)]), "-p", "no:terminal",
                    *isolation_args(workdir), f"--impl={token}", f"--rbcheck-profile={profile}",
                    f"--rbcheck-results={results}"]
            code = pytest.main(args)
            if not results.exists():
                raise RuntimeError(f"the conformance run on {adapter.name!r} stopped with pytest exit "
                                   f"code {int(code)}, but should have written its results")
            result = ImplResult.from_results(adapter.name, json.loads(results.read_text()))
    finally:
        adapters.INJECTED.pop(token, None)
    for test in result.tests:  # expected failures: known failure / XPASS, as the report shows them
        reason = (expected or {}).get(test["property"])
        if reason is not None and test["outcome"] in ("fail", "error", "pass"):
            failed = test["outcome"] != "pass"
            test.update(outcome="xfail" if failed else "xpass",
                        message=f"known failure: {reason}" + (f" | {test['message']}" if failed else ""))
    return result


def by_property(result) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for test in result.tests:
        grouped.setdefault(test["property"], []).append(test)
    return grouped


def problems(result, expected: Mapping[str, str], strict: bool) -> list[str]:
    """Unexpected failures, and (strict) expected failures that passed."""
    out = []
    for prop, tests in by_property(result).items():
        for test in tests:
            if test["outcome"] in ("fail", "error"):
                out.append(f"{test['nodeid'].rsplit('/', 1)[-1]}: FAIL ({test['message']})")
        if strict and prop in expected and tests and all(t["outcome"] in ("xpass", "pass") for t in tests):
            out.append(f"{prop}: expected to fail ({expected[prop]}), but passed (strict): "
                       f"remove it from expected_failures")
    return out


def check_buffer(adapter: Any, expected_failures: Mapping[str, str] | None = None, *,
                 strict: bool = False, only: Iterable[str] = (), profile: str = "ci") -> dict[str, Any]:
    """Run every conformance property on ``adapter`` (an ``Adapter``, a
    factory returning one, a built-in name or ``"pkg.module:factory"``).

    ``expected_failures`` maps property ids (``rbcheck.properties()``) to the
    reason each is expected to fail. Raises :class:`ConformanceError`, whose
    message is the report, when a property fails that is not expected to, or
    (``strict=True``) when an expected failure passes. Returns the report as
    data (``rbcheck.harness.report.build``) otherwise. ``profile``: the
    Hypothesis profile (``ci``: few examples, derandomized; ``dev``;
    ``thorough``).
    """
    from rbcheck.harness.report import build, render_text

    expected = _expected(expected_failures)
    result = run_in_process(adapter, only=only, expected=expected, profile=profile)
    report = build([result])
    found = problems(result, expected, strict)
    if found:
        raise ConformanceError(
            f"{len(found)} problem(s) in {result.name} {result.version}:\n  " + "\n  ".join(found)
            + "\n\n" + render_text(report)
        )
    return report


class Check:
    """One property on one adapter, as a callable test body
    (:func:`parametrize_with_checks`)."""

    def __init__(self, adapter: Any, property_id: str, profile: str):
        self.adapter, self.property_id, self.profile = adapter, property_id, profile

    def __repr__(self) -> str:
        return f"Check({self.property_id})"

    def __call__(self) -> None:
        import pytest

        result = run_in_process(self.adapter, only=[self.property_id], profile=self.profile)
        tests = result.tests
        failed = [t for t in tests if t["outcome"] in ("fail", "error")]
        if failed:
            raise ConformanceError("\n".join(f"{t['nodeid'].rsplit('/', 1)[-1]}: {t['message']}" for t in failed))
        if tests and all(t["outcome"] in ("skip", "unavailable") for t in tests):
            pytest.skip("; ".join(sorted({t["message"] for t in tests})))
        if not any(t["outcome"] == "pass" for t in tests):
            raise ConformanceError(f"{self.property_id}: no test ran ({[t['outcome'] for t in tests]})")


def parametrize_with_checks(adapter: Any, expected_failures: Mapping[str, str] | None = None, *,
                            strict: bool = False, profile: str = "ci"):
    """A ``pytest.mark.parametrize`` of one ``check`` per property, with the
    property id as the test id::

        @rbcheck.parametrize_with_checks(my_adapter)
        def test_rbcheck(check):
            check()

    Expected failures are marked ``xfail`` with their reason (``strict=True``:
    one that passes fails the test). A property that needs a capability the
    adapter does not declare is skipped with the reason."""
    import pytest

    expected = _expected(expected_failures)
    params = []
    for prop in properties():
        marks = [pytest.mark.xfail(reason=expected[prop], strict=strict)] if prop in expected else []
        params.append(pytest.param(Check(adapter, prop, profile), id=prop, marks=marks))
    return pytest.mark.parametrize("check", params)
