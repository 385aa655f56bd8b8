"""The verdict of a conformance run: one rule, used by every entry point
(``rbcheck validate``, ``python -m rbcheck.harness.report``,
``rbcheck.check_buffer`` and ``rbcheck.parametrize_with_checks``).

* **0** (``PASSED``): every selected test ran and passed, was skipped with a
  reason (``skip``, ``unavailable``), or failed as declared (a known
  failure, ``xfail``).
* **1** (``FAILED``): a test failed (in its call or its setup), or a test a
  known failure covers passed (``XPASS``: the entry is stale, or covers a
  parametrization that does not fail).
* **2** (``ABORTED``): the run did not complete, so it has no verdict:
  pytest ended with any other exit status (2: interrupted or a collection
  error, 3: internal error, 4: usage error, 5: no tests collected), a
  selected test was not run, the run crashed before writing its results, or
  the adapter did not load. The reasons name the cause: the pytest exit
  status and the errors the plugin recorded (a usage error's text, the
  collection error, the interrupt).

An abort wins over failures; both are listed. :func:`decide` combines
implementations: for the ``informational`` ones (``rbcheck validate
--third-party-informational``: the built-in third-party adapters) failures,
XPASS and an adapter that does not load (the library is not installed) are
reported as notes, not gating; a run of theirs that did not complete still
gates with 2: the report would show nothing for it, and the cause is in
rbcheck or its adapter, not in the library under test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rbcheck.harness.outcomes import TRIED, cell_text

PASSED, FAILED, ABORTED = 0, 1, 2

#: pytest's exit statuses (``pytest.ExitCode``), as the reasons name them.
PYTEST_EXIT = {
    0: "ok",
    1: "tests failed",
    2: "interrupted: a collection error or Ctrl-C",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}
#: Outcomes that count as run and judged (the rest: ``not run``).
JUDGED = ("pass", "fail", "error", "skip", "unavailable", "xfail", "xpass")


@dataclass(frozen=True)
class Verdict:
    """One implementation's verdict: ``code`` (0, 1, 2), one line per reason
    (``"<name>: ..."``), and ``unavailable`` when the adapter did not load."""

    name: str
    code: int
    reasons: tuple[str, ...] = ()
    unavailable: bool = False
    not_run: tuple[int, int] = (0, 0)  # (tests unavailable, tests selected): said in the summary line
    coverage: str = ""  # "6 of 152 tests ran; 146 skipped (...)": said in the closing line


@dataclass(frozen=True)
class Decision:
    """The exit status of several implementations, the reasons that set it
    (``problems``) and those reported without gating (``notes``)."""

    code: int
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    gated: tuple[str, ...] = ()  # the implementations whose results set the code


def _row(test: dict[str, Any]) -> str:
    from rbcheck.harness.plugin.known_failures import suite_relative

    return suite_relative(test["nodeid"])


def judge(result: Any, *, strict: bool = True) -> Verdict:
    """The verdict on one :class:`rbcheck.harness.outcomes.ImplResult`.
    ``strict=False`` (``check_buffer(strict=False)``) lets an XPASS pass."""
    name = result.name
    if result.status == "unavailable":
        return Verdict(name, ABORTED, (f"{name}: the adapter did not load: {result.why}",), unavailable=True)
    if result.status != "ran":
        return Verdict(name, ABORTED, (f"{name}: the run did not complete (no results): {result.why}",))
    aborted: list[str] = []
    status = result.exitstatus
    failed = [t for t in result.tests if t["outcome"] in ("fail", "error")]
    if status is None:
        aborted.append("no pytest exit status was recorded")
    elif status not in (0, 1):
        aborted.append(f"pytest exit status {status} ({PYTEST_EXIT.get(status, 'unknown')})")
    elif status == 1 and not failed:
        aborted.append("pytest exit status 1 (tests failed), but no test failed: an error outside the tests")
    not_run = [_row(t) for t in result.tests if t["outcome"] not in JUDGED]
    if not_run:
        shown = ", ".join(not_run[:3]) + (", ..." if len(not_run) > 3 else "")
        aborted.append(f"{len(not_run)} test(s) not run ({shown})")
    if result.errors and not aborted:
        aborted.append("pytest recorded errors outside the tests")
    reasons = [f"{name}: the run did not complete: {aborted[0]}"] if aborted else []
    reasons += [f"{name}: {a}" for a in aborted[1:]] + [f"{name}: {error}" for error in result.errors]
    for test in result.tests:
        if test["outcome"] in ("fail", "error"):
            reasons.append(f"{name}: {_row(test)}: {cell_text('fail', test.get('message', ''))}")
        elif test["outcome"] == "xpass" and strict:
            reasons.append(f"{name}: {_row(test)}: {cell_text('xpass', test.get('message', ''))}: it passed: "
                           f"remove the entry, or name only the tests that fail")
    code = ABORTED if aborted else FAILED if reasons else PASSED
    missing = sum(t["outcome"] == "unavailable" for t in result.tests)
    return Verdict(name, code, tuple(reasons), not_run=(missing, len(result.tests)),
                   coverage=coverage_text(result.tests))


def ran_count(tests: list[dict[str, Any]]) -> int:
    """How many tests ran and were judged on what the buffer did (pass,
    fail, error, a known failure, XPASS): not the skipped or unavailable."""
    return sum(t["outcome"] in TRIED for t in tests)


def coverage_text(tests: list[dict[str, Any]]) -> str:
    """``"6 of 152 tests ran; 146 skipped (140 not declared: prioritized,
    slice; 6 convention); 2 unavailable"``: a pass is only as wide as what ran."""
    text = f"{ran_count(tests)} of {len(tests)} tests ran"
    skips = [str(t.get("message", "")) for t in tests if t["outcome"] == "skip"]
    if skips:
        kinds: dict[str, int] = {}
        for message in skips:
            kind = message.split(":", 1)[0].strip() if ":" in message else "other"
            kinds[kind] = kinds.get(kind, 0) + 1
        undeclared = sorted({m.split(":", 1)[1].strip() for m in skips if m.startswith("not declared:")})
        said = [f"{n} {kind}" + (f": {', '.join(undeclared)}" if kind == "not declared" else "")
                for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))]
        text += f"; {len(skips)} skipped ({'; '.join(said)})"
    missing = sum(t["outcome"] == "unavailable" for t in tests)
    if missing:
        text += f"; {missing} unavailable: see the reasons above"
    return text


def decide(results: Iterable[Any], informational: Iterable[str] = (), *, strict: bool = True,
           must_load: Iterable[str] = ()) -> Decision:
    """The exit status of several implementations' results (module doc).
    An adapter of ``must_load`` that did not load gates (2) even when
    informational: its library was meant to be installed (``nox -s validate``)."""
    informational, must_load = set(informational), set(must_load)
    verdicts = tuple(judge(r, strict=strict) for r in results)
    code, problems, notes = PASSED, [], []
    for verdict in verdicts:
        excused = verdict.code == FAILED or (verdict.unavailable and verdict.name not in must_load)
        if verdict.name in informational and excused:
            notes += verdict.reasons
            continue
        code = max(code, verdict.code)
        problems += verdict.reasons
    gated = tuple(v.name for v in verdicts if v.name not in informational)
    return Decision(code, tuple(problems), tuple(notes), verdicts, gated)


def explain(decision: Decision, outputs: dict[str, str] | None = None) -> tuple[str, str]:
    """``(stdout text, stderr text)`` that say the decision: the problems,
    the informational notes and, for each run that did not complete, the
    tail of pytest's own output (``outputs``: name -> text), never dropped."""
    err: list[str] = []
    for verdict in decision.verdicts:
        text = (outputs or {}).get(verdict.name, "").strip()
        if verdict.code == ABORTED and text and not verdict.unavailable:
            lines = text.splitlines()
            err.append(f"\n[rbcheck] {verdict.name}: the run did not complete; pytest's output"
                       + (f" (last 60 of {len(lines)} lines)" if len(lines) > 60 else "") + ":")
            err += ["    " + line for line in lines[-60:]]
    if decision.notes:
        err.append(f"\n{len(decision.notes)} informational (third party, not gating):")
        err += [f"  {note}" for note in decision.notes]
    if decision.problems:
        head = ("the run did not complete (exit 2)" if decision.code == ABORTED
                else "failed (exit 1)")
        err.append(f"\n{head}: {len(decision.problems)} problem(s):")
        err += [f"  {problem}" for problem in decision.problems]
    # a pass is only as wide as what ran: the closing line says how much did, and what did not
    gated = [f"{v.name} ({v.coverage})" for v in decision.verdicts if v.name in decision.gated]
    out = "" if decision.code else f"\nno problems in {', '.join(gated) or '(none gated)'}"
    return out, "\n".join(err)


#: The verdict's word for each exit status.
MEANING = {PASSED: "passed", FAILED: "failed", ABORTED: "did not complete"}


def as_json(decision: Decision) -> dict[str, Any]:
    """The decision as the report's JSON carries it: the verdict, the exit
    status, the problems and notes, and how many tests of each implementation ran."""
    return {
        "verdict": MEANING[decision.code],
        "exit_status": decision.code,
        "problems": list(decision.problems),
        "notes": list(decision.notes),
        "gated": list(decision.gated),
        "ran": {v.name: {"ran": int(v.coverage.split(" of ", 1)[0]) if v.coverage else 0, "tests": v.not_run[1]}
                for v in decision.verdicts},
        "coverage": {v.name: v.coverage for v in decision.verdicts},
    }
