"""rbcheck's pytest plugin: the hooks, and nothing else. It is on only when a
session asks for it (``-p rbcheck``, ``--impl`` or ``RBCHECK_IMPL``; see
``rbcheck.plugin``, which adds the options). What the hooks do lives in
``rbcheck.harness.plugin``: the run context (``context``), the Hypothesis
profiles (``profiles``), known failures (``known_failures``), skips by
capability (``skips``) and the results file (``results``).

Fixtures: ``impl`` (the Adapter), ``make_buffer(spec=None, **fields)``,
``reference_impl`` (the reference Adapter, the model), ``rbcheck_run`` (the
run context). Marker ``@pytest.mark.requires("prioritized", ...)``: the test
is skipped with ``"not declared: <cap>"`` when the adapter does not declare a
capability and ``"unavailable: <cap>: <why>"`` when it declares it but it
cannot run here; the results file records the latter as ``unavailable``,
never as a pass. Marker ``@pytest.mark.conventions("priority_dtype", ...)``:
the declared conventions the test checks its invariant under, recorded with
the result. Marker ``@pytest.mark.exact_replay``: the test replays draws
exactly; skipped with ``"convention: not seedable"`` when the adapter
declares ``seedable=False``.

The hooks that pytest calls without the config (a report, an interrupt)
belong to a :class:`RunHooks` object registered for one session, so a pytest
run inside a pytest run keeps its own context.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.plugin import context, profiles, raised_outcomes, results
from rbcheck.harness.plugin.known_failures import (
    HID_SOMETHING_NEW,
    KnownFailure,
    KnownFailureError,
    known_failure_of,
    unmatched_entries,
)
from rbcheck.harness.plugin.skips import (
    capability_skip_reason,
    declared_conventions,
    skip_reason_of,
    spec_capabilities,
)
from rbcheck.harness.protocol import Adapter, BufferSpec

_RUN_KEY = pytest.StashKey[context.RunContext]()
_KNOWN_KEY = pytest.StashKey[KnownFailure]()


class KnownFailureWarning(pytest.PytestWarning):
    """A known-failures entry that matches no collected test."""


def _run(config: pytest.Config) -> context.RunContext:
    return config.stash[_RUN_KEY]


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "requires(*capabilities): skip unless the implementation under test declares "
        "the capabilities and they can run here",
        "conventions(*names): the declared conventions this test checks its invariant under "
        "(shown with its result in the report)",
        "exact_replay: the test needs seeded draws; skipped for an adapter declaring seedable=False",
    ):
        config.addinivalue_line("markers", line)
    run = context.build(config)
    profiles.register_profiles()
    from hypothesis import settings

    run.previous_profile = getattr(settings, "_current_profile", None)
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(run.profile)
    profiles.apply_shrink_budget(run.shrink_seconds)
    config.stash[_RUN_KEY] = run
    config.pluginmanager.register(RunHooks(run), f"rbcheck-run-{id(run)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_RUN_KEY, None)
    if run is not None and run.previous_profile is not None:  # an enclosing session's profile, back
        from hypothesis import settings

        settings.load_profile(run.previous_profile)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return context.header_lines(_run(config))


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection: ids of deselected tests still match
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    run = _run(config)
    for item in items:
        try:
            reason = skip_reason_of(run.adapter, item)
        except ValueError as err:
            raise run.usage_error(f"{item.nodeid}: {err}") from err
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        try:
            entry = known_failure_of(run.known_failures, item.nodeid)
        except KnownFailureError as err:
            raise run.usage_error(str(err)) from err
        if entry is not None:
            item.stash[_KNOWN_KEY] = entry
    for message in unmatched_entries(run.known_failures, items, Path(str(config.rootpath))):
        run.warnings.append(message)
        warnings.warn(KnownFailureWarning(message), stacklevel=1)


@pytest.fixture(scope="session")
def rbcheck_run(request: pytest.FixtureRequest) -> context.RunContext:
    """The run context: the implementation under test, its ``--impl`` name,
    device and profile."""
    return _run(request.config)


@pytest.fixture(scope="session")
def impl(rbcheck_run: context.RunContext) -> Adapter:
    """The Adapter under test (``--impl``)."""
    return rbcheck_run.adapter


@pytest.fixture(scope="session")
def reference_impl(rbcheck_run: context.RunContext) -> Adapter:
    """The reference Adapter: the model the implementation is compared with."""
    if rbcheck_run.adapter.name == "reference":
        return rbcheck_run.adapter
    return load_adapter("reference")


@pytest.fixture
def make_buffer(impl: Adapter):
    """``make_buffer(spec=None, **fields) -> BufferUnderTest`` for the adapter
    under test. A spec needing a capability the adapter lacks (or has
    unavailable) skips the test with the same reasons as ``requires``."""

    def make(spec: BufferSpec | None = None, **fields: Any):
        if spec is None:
            spec = BufferSpec(**fields)
        elif fields:
            spec = spec.but(**fields)
        reason = capability_skip_reason(impl, spec_capabilities(spec))
        if reason:
            pytest.skip(reason)
        return impl.make(spec)

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    raised = call.excinfo  # as raised: pytest's unittest support replaces a SkipTest with its own skip
    where = raised_outcomes.raised_elsewhere(item, raised) if raised is not None else None
    outcome = yield
    report = outcome.get_result()
    if where is not None:  # before known failures: no entry may hide it
        raised_outcomes.fail_raised_outcome(report, raised, where)
        return
    if report.failed and call.excinfo is not None:  # the failure's fields, from the exception itself
        setattr(report, results.FIELDS_ATTR, results.failure_fields(call.excinfo.value))
    entry = item.stash.get(_KNOWN_KEY, None)
    if entry is None or call.when != "call":
        return
    reason = f"known failure: {entry.reason}"
    if report.passed:
        report.wasxfail = reason  # XPASS: the known failure is gone
        return
    if not report.failed or call.excinfo is None:
        return
    messages = results.exception_messages(call.excinfo.value)
    if entry.explains(messages):
        report.outcome = "skipped"
        report.wasxfail = reason
        return
    unexplained = next(m for m in messages if not entry.pattern.search(m))
    report.rbcheck_hid_new = (
        f"{HID_SOMETHING_NEW}: entry {entry.test_id!r} expects a message matching "
        f"/{entry.pattern.pattern}/ ({entry.reason}), but this failure is "
        f"{results.one_line(unexplained, 200)!r}"
    )
    report.sections.append(("rbcheck known failure", report.rbcheck_hid_new))


def pytest_sessionstart(session: pytest.Session) -> None:
    run = session.config.stash.get(_RUN_KEY, None)
    if run is not None:
        run.started = time.monotonic()


def pytest_collection_finish(session: pytest.Session) -> None:
    run = _run(session.config)
    for item in session.items:
        doc = ((getattr(item, "obj", None) and item.obj.__doc__) or "").strip().split("\n\n")[0]
        run.records[item.nodeid] = {
            "nodeid": item.nodeid,
            "property": results.property_name(item),
            "doc": results.one_line(doc, 200),
            "outcome": "not run",
            "message": "",
            "conventions": declared_conventions(item, run.adapter),
        }


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """``FAILED <test> - <one-line reason>`` for every failed test, never cut
    to the terminal's width (pytest's own summary drops the reason when the
    test id fills an 80-column line, e.g. without a terminal)."""
    run = config.stash.get(_RUN_KEY, None)
    failed = [r for r in run.records.values() if r["outcome"] in ("fail", "error")] if run else []
    if not failed:
        return
    terminalreporter.section("rbcheck: why each test failed")
    for record in failed:
        word = "FAILED" if record["outcome"] == "fail" else "ERROR"
        reasons = record.get("failures") or [record["message"]]
        terminalreporter.line(f"{word} {record['nodeid']} - {reasons[0]}")
        for more in reasons[1:]:
            terminalreporter.line(f"    and: {more}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash.get(_RUN_KEY, None)
    if run is not None and run.results_path is not None:
        results.write_results(run.results_path, run, exitstatus)


class RunHooks:
    """The hooks pytest calls without the config, bound to one run's context."""

    def __init__(self, run: context.RunContext):
        self.run = run

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        """Run a property under this run's Hypothesis profile. A @given test
        keeps the default settings of the moment its module was imported, so
        in a process that imported the suite before (a second check_buffer
        call, a warm worker) it would run the earlier run's budget, say 20
        examples where "thorough" asks 1000. Tests with their own @settings
        keep them."""
        fn = getattr(item, "obj", None)
        captured = getattr(fn, "_hypothesis_internal_use_settings", None)
        if captured is None or getattr(fn, "_hypothesis_internal_settings_applied", False):
            return (yield)
        from hypothesis import settings

        fn._hypothesis_internal_use_settings = settings.default
        try:
            return (yield)
        finally:
            fn._hypothesis_internal_use_settings = captured

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        """The test now running, beside the results file: a process that ends
        without writing its results (``os._exit`` in a buffer, a signal) is
        reported with the test it was running (``rbcheck.runner``)."""
        if self.run.results_path is not None:
            results.running_path(self.run.results_path).write_text(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        hid = results.record_report(self.run.records, report)
        if hid:
            self.run.hid_new.append(f"{report.nodeid}: {hid}")

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """``--rbcheck-progress``: once a property's last test is done, one
        line to stderr: ``[rbcheck] <impl> <property>: <outcomes>``."""
        run = self.run
        if not run.progress or nodeid not in run.records:
            return
        name = run.records[nodeid]["property"]
        if not run.pending:
            for record in run.records.values():
                run.pending[record["property"]] = run.pending.get(record["property"], 0) + 1
        run.pending[name] -= 1
        if run.pending[name] == 0:
            counts: dict[str, int] = {}
            for record in run.records.values():
                if record["property"] == name:
                    counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
            summary = ", ".join(f"{n} {k}" if n > 1 or len(counts) > 1 else k for k, n in sorted(counts.items()))
            sys.stderr.write(f"[rbcheck] {run.impl_name} {name}: {summary}\n")
            sys.stderr.flush()

    # errors outside the tests: recorded, so a run that stopped says why
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            where = report.nodeid or "."
            self.run.errors.append(f"collection error in {where}: {results.last_line(report.longreprtext)}")

    def pytest_internalerror(self, excrepr, excinfo) -> None:
        what = f"{excinfo.typename}: {excinfo.value}" if excinfo is not None else results.last_line(str(excrepr))
        self.run.errors.append(f"internal error: {results.one_line(what, 300)}")

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        message = str(excinfo.value).strip()
        self.run.errors.append(f"interrupted: {excinfo.typename}"
                               + (f": {results.one_line(message, 300)}" if message else ""))
