"""What a run records: one record per test (outcome, one-line message, the
distinct failures, their repro snippets, seconds; a failure's what/got/
expected/call when its exception carries them, and the observed and expected
frequencies of its distributional checks), and the results file
(``--rbcheck-results``) that ``harness.report`` and ``harness.verdict`` read.

A failure's fields come from the exception itself (``call.excinfo`` in
``pytest_runtest_makereport``): a :class:`~rbcheck.harness.assertions.PropertyFailure`
carries what/got/expected/call/repro, Hypothesis adds its falsifying example
as a note, and an exception group (several distinct bugs) is read leaf by
leaf. Nothing is parsed back out of pytest's printed output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rbcheck.harness import frequencies
from rbcheck.harness.failure import PropertyFailure

RESULTS_SCHEMA = 1
#: Where ``pytest_runtest_makereport`` leaves a failure's fields on its report.
FIELDS_ATTR = "rbcheck_failure"


#: What separates a failure's observation from its expectation ("<what>=<got>, but should be <expected>").
EXPECTATION = ", but should be "


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters. A long failure message keeps
    its expectation: the observation before ``EXPECTATION`` is shortened first (a list
    of torn rows once pushed "but should be" out of the report), the expectation and
    the call after it keep at least a third of the line, and all the head leaves."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head, sep, tail = text.partition(EXPECTATION)
    if not sep or limit < 3 * (len(sep) + 6):
        return text[: limit - 3] + "..."
    room = limit - len(sep) - min(len(tail), limit // 3)  # the head's, leaving the tail its third
    if len(head) > room:
        head = head[: room - 3] + "..."
    room = limit - len(sep) - len(head)  # the tail's: whatever the head left
    if len(tail) > room:
        tail = tail[: room - 3] + "..."
    return head + sep + tail


def leaves(exc: BaseException) -> list[BaseException]:
    """The exception, or every leaf of an exception group (Hypothesis reports
    several distinct bugs as a group)."""
    subs = getattr(exc, "exceptions", None)  # BaseExceptionGroup (or its 3.10 backport)
    if isinstance(subs, tuple) and subs and all(isinstance(e, BaseException) for e in subs):
        return [leaf for sub in subs for leaf in leaves(sub)]
    return [exc]


def own_message(exc: BaseException) -> str:
    """The exception's message without the repro snippet a property failure
    carries: the code that replays a failure names calls, not its cause."""
    own = getattr(exc, "own_message", None)
    return own if isinstance(own, str) else str(exc)


def type_name(exc: BaseException) -> str:
    """The name a report gives the exception's type: rbcheck's own failure
    classes by their builtin base (``reported_as``), others by their own."""
    return getattr(type(exc), "reported_as", None) or type(exc).__name__


def exception_messages(exc: BaseException) -> list[str]:
    """``"<Type>: <message>"`` of the exception or of every leaf of a group,
    each without its repro snippet: what known failures are matched against."""
    return [f"{type_name(leaf)}: {own_message(leaf)}" for leaf in leaves(exc)]


def falsifying_example(exc: BaseException) -> str:
    """Hypothesis' ``Falsifying example: ...`` note on the exception, on one line."""
    for note in getattr(exc, "__notes__", None) or ():
        if isinstance(note, str) and note.startswith(("Falsifying example:", "Falsifying explicit example:")):
            return one_line(note, 300)
    return ""


def _head(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def is_verdict(exc: BaseException) -> bool:
    """A property's verdict (:class:`PropertyFailure`, by its type), as
    opposed to any other exception (a crash of the buffer, a harness bug);
    the message text ("... but should be ...") is for people and decides nothing."""
    return isinstance(exc, PropertyFailure)


def failure_fields(exc: BaseException) -> dict[str, Any]:
    """The record fields of a failure: ``message`` (one line: the first
    explained failure, the group's summary, the falsifying example),
    ``failures`` (one line per distinct explained failure) and ``repros``
    (every distinct repro snippet)."""
    parts = leaves(exc)
    heads = [f"{type_name(leaf)}: {_head(own_message(leaf))}" for leaf in parts]
    verdicts = [leaf for leaf in parts if is_verdict(leaf)]
    explained = [heads[parts.index(leaf)] for leaf in verdicts]
    first = verdicts[0] if verdicts else parts[-1]
    group = f"{type(exc).__name__}: {_head(str(exc))}"
    if parts == [exc]:
        message = heads[0]
    else:  # the first explained failure with the group's summary, or the summary
        message = f"{explained[0]} ({group})" if explained else group
    example = falsifying_example(first) or falsifying_example(exc)
    failures: list[str] = []
    for head in explained:
        if one_line(head) not in failures:
            failures.append(one_line(head))
    repros: list[str] = []
    for leaf in parts:
        snippet = getattr(leaf, "repro", "")
        if isinstance(snippet, str) and snippet and snippet not in repros:
            repros.append(snippet)
    message = one_line(message + (f" | {example}" if example else ""))
    fields = {"message": message, "failures": failures or [message], "repros": repros}
    exact = next((leaf for leaf in ([first] + parts) if is_verdict(leaf)), None)
    if exact is not None:  # the structured failure: what / got / expected / call (and its detail)
        fields.update({key: one_line(str(getattr(exact, key, "") or ""), 600)
                       for key in ("what", "got", "expected", "call", "detail")})
    seen = [leaf.frequencies for leaf in parts if isinstance(getattr(leaf, "frequencies", None), dict)]
    if seen:  # the observed and expected frequencies of the distributional checks that failed
        fields["distributions"] = seen[:3]
    return fields


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def property_name(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    name = getattr(item, "originalname", None) or item.name
    return f"{module.removesuffix('.py')}::{name}"


def last_line(text: str) -> str:
    """The last non-empty line of a collection error, without pytest's gutter."""
    lines = [line.removeprefix("E").strip() for line in str(text).splitlines() if line.strip()]
    return one_line(lines[-1] if lines else text, 300)


def record_report(records: dict[str, dict[str, Any]], report: pytest.TestReport) -> str | None:
    """Fold one phase's report into the test's record; the "hid something
    new" note of a known failure when the report carries one. The call's
    distributional checks (``harness.frequencies``) go into ``distributions``."""
    record = records.setdefault(
        report.nodeid,
        {"nodeid": report.nodeid, "property": report.nodeid, "doc": "", "outcome": "not run", "message": ""},
    )
    if report.when in ("setup", "call"):
        _distributions(records, report)
    if record["outcome"] in ("fail", "error") and report.when == "teardown":
        return None
    if hasattr(report, "wasxfail"):
        if report.skipped:
            record.update(outcome="xfail", message=one_line(report.wasxfail))
        elif report.passed and report.when == "call":
            record.update(outcome="xpass", message=one_line(report.wasxfail))
        return None
    hid = None
    if report.skipped:
        reason = skip_reason(report)
        outcome = "unavailable" if reason.startswith("unavailable: ") else "skip"
        record.update(outcome=outcome, message=one_line(reason))
    elif report.failed:
        outcome = "fail" if report.when == "call" else "error"
        fields = getattr(report, FIELDS_ATTR, None) or {
            "message": one_line(_head(getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
                                      or str(report.longrepr))),
            "failures": [], "repros": []}
        message = fields["message"]
        if report.when != "call":
            message = f"in {report.when}: {message}"
        hid = getattr(report, "rbcheck_hid_new", None)
        if hid:
            message = f"{one_line(message)} [{one_line(hid, 196)}]"  # the note survives any cut
        record.update(outcome=outcome, message=message, failures=fields["failures"] or [message],
                      repros=fields["repros"])
        record.update({key: fields[key] for key in ("what", "got", "expected", "call", "detail") if key in fields})
        if fields.get("distributions"):  # the failing draws first, then the checks of the call that passed
            kept = [d for d in record.get("distributions", []) if d["passed"]]
            record["distributions"] = (list(fields["distributions"]) + kept)[:frequencies.KEEP]
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:  # pytest's own FAILED line: the one-line reason, not "ExceptionGroup: ..."
            crash.message = message
    elif report.when == "call" and record["outcome"] == "not run":
        record.update(outcome="pass", message="")
    if report.when == "call" or (report.when == "setup" and report.skipped):
        record["seconds"] = round(record.get("seconds", 0.0) + float(report.duration), 3)
    return hid


def _distributions(records: dict[str, dict[str, Any]], report: pytest.TestReport) -> None:
    """The frequencies the test's distributional checks saw (taken at the
    end of its call; dropped at its setup, so none leak from another test)."""
    seen = frequencies.take()
    if report.when == "call" and seen and report.nodeid in records:
        records[report.nodeid]["distributions"] = seen


def running_path(results: Path) -> Path:
    """Where a run notes the test it is running: beside its results file."""
    return results.with_name(results.name + ".running")


def write_load_error(path: Path, impl_arg: str, why: str) -> None:
    """The results file of a run whose adapter did not load: why, and
    nothing else (``rbcheck.runner`` turns it into an "unavailable" result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": RESULTS_SCHEMA, "impl_arg": impl_arg, "load_error": why}, indent=2) + "\n")


def write_results(path: Path, run: Any, exitstatus: int) -> None:
    """The results file of ``run`` (a :class:`~rbcheck.harness.plugin.context.RunContext`)."""
    adapter = run.adapter
    payload = {
        "schema": RESULTS_SCHEMA,
        "implementation": adapter.name,
        "impl_arg": run.impl_name,
        "version": adapter.version,
        "capabilities": sorted(adapter.capabilities),
        "unavailable": dict(sorted(adapter.unavailable.items())),
        "conventions": adapter.conventions.deviations(),
        "profile": run.profile,
        "settings": run.settings,
        "known_failures_file": str(run.known_failures_path) if run.known_failures_path else None,
        "warnings": run.warnings,
        "known_failures_hid_new": run.hid_new,
        "exitstatus": int(exitstatus),
        "errors": run.errors,
        "shrink_seconds": run.shrink_seconds,
        "seconds": round(time.monotonic() - run.started, 1) if run.started else None,
        "tests": list(run.records.values()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
