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

import json
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the subprocess runner (and the property list) live in rbcheck.runner; their
# names stay importable from here
from rbcheck.runner import (  # noqa: F401 - re-exported
    SUITE,
    clean_env,
    isolation_args,
    node_path,
    properties,
    pytest_output,
    run_subprocess,
)


class ConformanceError(AssertionError):
    """An implementation failed properties it did not declare as expected
    failures (or, in strict mode, an expected failure passed). The message is
    the report."""


class RunAbortedError(ConformanceError):
    """The conformance run did not complete (a pytest usage, collection or
    internal error, an interrupt, a test not run, a crash), so it has no
    verdict; the message names the cause (``rbcheck.harness.verdict``). A
    :class:`ConformanceError`, so one ``except`` catches both."""


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


@dataclass(frozen=True)
class ExpectedFailure:
    """A conformance test expected to fail, keyed by cause: an entry of a
    known-failures file as an object (``rbcheck.ExpectedFailure``).

    ``id``: a property id (``rbcheck.properties()``), covering each of its
    parametrizations, or one parametrization (``<property id>[<params>]``).
    ``message``: a regex searched in ``"<ExceptionType>: <message>"`` of the
    failure (its repro snippet left out); one that matches an empty message
    is refused. ``reason``: why, with a link. A covered test that fails with
    a matching message is a known failure; with another message it stays a
    failure; one that passes is XPASS. Errors in a test's setup are never
    expected, and no entry may name a test of a seed invariant.
    """

    id: str
    message: str
    reason: str


#: What ``expected_failures`` should be, for error messages.
_EXPECTED_FORM = "a list of rbcheck.ExpectedFailure(id, message, reason)"


def _expected(expected_failures: Iterable[ExpectedFailure] | None) -> list | None:
    """``expected_failures`` as the plugin's known failures (checked, with
    the known-failures file's rules), or None: the adapter's own file."""
    if expected_failures is None:
        return None
    from rbcheck.harness.plugin.known_failures import (
        known_failure,
        property_to_file_id,
        seed_invariant_of,
    )

    if isinstance(expected_failures, Mapping):
        raise TypeError(
            f"expected_failures={dict(expected_failures)!r} (the old {{id: reason}} form), but should be "
            f"{_EXPECTED_FORM}: each with the pattern of its failure message"
        )
    if isinstance(expected_failures, str | bytes) or not isinstance(expected_failures, Iterable):
        raise TypeError(f"expected_failures={expected_failures!r}, but should be {_EXPECTED_FORM}")
    entries, seen = [], {}
    for i, item in enumerate(expected_failures):
        where = f"expected_failures[{i}]"
        if not isinstance(item, ExpectedFailure):
            raise TypeError(f"{where}={item!r}, but should be an rbcheck.ExpectedFailure(id, message, reason)")
        prop, bracket, params = str(item.id).partition("[")
        if prop not in properties() or (bracket and (not params.endswith("]") or len(params) < 2)):
            try:
                node_path(item.id)  # raises, naming the allowed form
            except ValueError as err:
                raise ValueError(f"{where}: {err}; a parametrization is <property id>[<params>]") from None
        seed = seed_invariant_of(f"rbcheck/conformance/{property_to_file_id(prop)}")
        if seed:
            raise ValueError(
                f"{where}.id={item.id!r} names a test of seed invariant {seed}, but no entry may hide a "
                f"seed bug: remove it (its failure is reported as FAIL)"
            )
        if item.id in seen:
            raise ValueError(f"{where}.id={item.id!r} repeats expected_failures[{seen[item.id]}], "
                             f"but should appear once")
        seen[item.id] = i
        entries.append(known_failure(property_to_file_id(item.id), item.message, item.reason, where))
    return entries


def _selected(expected: list | None, only: Iterable[str]) -> list | None:
    """The entries of the properties a run selects (all without ``only``)."""
    only = list(only)
    if expected is None or not only:
        return expected
    from rbcheck.harness.plugin.known_failures import property_to_file_id

    files = {property_to_file_id(p) for p in only}
    return [e for e in expected if e.test_id.split("[", 1)[0] in files]


def run_in_process(adapter: Any, *, only: Iterable[str] = (), expected: list | None = None,
                   profile: str = "ci"):
    """Run the suite (or the ``only`` properties) on ``adapter`` with pytest
    in this process; the ``ImplResult`` (``status="crashed"`` when pytest
    stopped before writing results, with what it printed). ``expected``:
    known failures (:func:`_expected`) used instead of the adapter's own
    file: a covered test that fails with a matching message is ``xfail``,
    one that passes ``xpass``."""
    import contextlib
    import io

    import pytest

    from rbcheck.harness.outcomes import ImplResult
    from rbcheck.harness.plugin.context import InProcessRun

    adapter = _adapter(adapter)
    run = InProcessRun(adapter, _selected(expected, only), f"rbcheck.check_buffer:{adapter.name}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        results = workdir / "results.json"
        args = [*([node_path(p) for p in only] or [str(SUITE)]), "-p", "no:terminal",
                *isolation_args(workdir), f"--rbcheck-profile={profile}", f"--rbcheck-results={results}",
                "--rbcheck-device=cpu"]  # the arguments decide, never RBCHECK_DEVICE in the caller's shell
        said = io.StringIO()  # pytest writes a usage error to stderr
        with contextlib.redirect_stderr(said):
            code = int(pytest.main(args, plugins=[run]))
        output = pytest_output(said.getvalue(), "")
        if not results.exists():
            tail = " ".join(output.splitlines()[-3:])
            return ImplResult(name=adapter.name, status="crashed", why=f"pytest exit {code}: {tail}",
                              exitstatus=code, output=output)
        result = ImplResult.from_results(adapter.name, json.loads(results.read_text()))
        result.output = output
    return result


def _judged(result, strict: bool) -> None:
    """Raise as the verdict (``rbcheck.harness.verdict``) says: 2 ->
    :class:`RunAbortedError`, 1 -> :class:`ConformanceError`."""
    from rbcheck.harness.report import build, render_text
    from rbcheck.harness.verdict import ABORTED, PASSED, judge

    verdict = judge(result, strict=strict)
    if verdict.code == PASSED:
        return
    reasons = "\n  ".join(verdict.reasons)
    if verdict.code == ABORTED:
        said = f"\n\npytest's output:\n{result.output}" if result.output else ""
        raise RunAbortedError(f"the conformance run on {result.name} did not complete, so it has no verdict:"
                              f"\n  {reasons}{said}")
    raise ConformanceError(f"{len(verdict.reasons)} problem(s) in {result.name} {result.version}:\n  {reasons}"
                           f"\n\n{render_text(build([result]))}")


def check_buffer(adapter: Any, expected_failures: Iterable[ExpectedFailure] | None = None, *,
                 strict: bool = True, only: Iterable[str] = (), profile: str = "ci") -> dict[str, Any]:
    """Run every conformance property on ``adapter`` (an ``Adapter``, a
    factory returning one, a built-in name or ``"pkg.module:factory"``).

    ``expected_failures``: a list of :class:`ExpectedFailure` (id, message
    pattern, reason), the known-failures file's entries, used instead of the
    adapter's own file (None: the adapter's own). The verdict is
    ``rbcheck validate``'s (``rbcheck.harness.verdict``): raises
    :class:`ConformanceError`, whose message is the report, when a test fails
    that is not expected to (or with another message), or when a test an
    expected failure covers passes (XPASS; ``strict=False`` lets it pass);
    raises :class:`RunAbortedError`, naming the cause, when the run did not
    complete. Returns the report as data (``rbcheck.harness.report.build``)
    otherwise. ``profile``: the Hypothesis profile (``ci``: few examples,
    derandomized; ``dev``; ``thorough``).
    """
    from rbcheck.harness.report import build

    expected = _expected(expected_failures)
    result = run_in_process(adapter, only=only, expected=expected, profile=profile)
    _judged(result, strict)
    return build([result])


class Check:
    """One property on one adapter, as a callable test body
    (:func:`parametrize_with_checks`): raises as :func:`check_buffer` does
    (the same verdict), skips when every test was skipped, and marks the
    test ``xfail`` when its failures were all expected."""

    def __init__(self, adapter: Any, property_id: str, profile: str, expected: list | None = None,
                 strict: bool = True):
        self.adapter, self.property_id, self.profile = adapter, property_id, profile
        self.expected, self.strict = expected, strict

    def __repr__(self) -> str:
        return f"Check({self.property_id})"

    def __call__(self) -> None:
        import pytest

        result = run_in_process(self.adapter, only=[self.property_id], expected=self.expected,
                                profile=self.profile)
        tests = result.tests
        _judged(result, self.strict)
        if tests and all(t["outcome"] in ("skip", "unavailable") for t in tests):
            pytest.skip("; ".join(sorted({t["message"] for t in tests})))
        if any(t["outcome"] == "xfail" for t in tests):
            pytest.xfail("; ".join(sorted({t["message"] for t in tests if t["outcome"] == "xfail"})))
        if not any(t["outcome"] in ("pass", "xpass") for t in tests):
            raise ConformanceError(f"{self.property_id}: no test ran ({[t['outcome'] for t in tests]})")


def parametrize_with_checks(adapter: Any, expected_failures: Iterable[ExpectedFailure] | None = None, *,
                            strict: bool = True, profile: str = "ci"):
    """A ``pytest.mark.parametrize`` of one ``check`` per property, with the
    property id as the test id::

        @rbcheck.parametrize_with_checks(my_adapter)
        def test_rbcheck(check):
            check()

    ``expected_failures`` as for :func:`check_buffer`: a property whose
    failing tests all failed as declared is marked ``xfail`` with the reason;
    a failure with another message, an error in setup, or a covered test
    that passes (XPASS, unless ``strict=False``) fails the test, and a run
    that did not complete raises :class:`RunAbortedError`. A property that
    needs a capability the adapter does not declare is skipped with the
    reason."""
    import pytest

    expected = _expected(expected_failures)
    params = [pytest.param(Check(adapter, prop, profile, _selected(expected, [prop]), strict), id=prop)
              for prop in properties()]
    return pytest.mark.parametrize("check", params)
