"""Outcomes raised by the buffer's code: only rbcheck decides what is skipped
or expected to fail. A ``pytest.skip``, ``pytest.xfail`` or
``unittest.SkipTest`` raised during a test of the suite by code that is
neither rbcheck's nor the test's own module (the adapter's, the library's)
becomes a failure that says so; no known failure can hide it."""

from __future__ import annotations

import os
import unittest
from pathlib import Path

import _pytest
import pluggy
import pytest

import rbcheck
import rbcheck.harness
from rbcheck.harness.plugin import results
from rbcheck.harness.plugin.known_failures import in_suite

#: Exceptions by which code decides a test's outcome (pytest.skip, pytest.xfail, unittest's skip).
_OUTCOME_EXCEPTIONS = (pytest.skip.Exception, pytest.xfail.Exception, unittest.SkipTest)
#: Where rbcheck's own code lives: the only code that may skip a test of the suite or call it a known failure.
_OWN_DIRS = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in (rbcheck, rbcheck.harness))
#: pytest's and pluggy's own frames, passed over when looking for who raised an outcome.
_RUNNER_DIRS = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in (_pytest, pluggy))


def raised_elsewhere(item: pytest.Item, excinfo: pytest.ExceptionInfo) -> str | None:
    """``"<file>:<line>"`` of the code that raised a skip or xfail during a
    test of the suite, when that code is neither rbcheck's nor the test's own
    module (the adapter's or the library's), else None."""
    if not in_suite(item.nodeid) or not excinfo.errisinstance(_OUTCOME_EXCEPTIONS):
        return None
    frames = [entry for entry in excinfo.traceback if not str(entry.path).startswith(_RUNNER_DIRS)]
    if not frames:
        return None
    raiser = str(frames[-1].path)
    if raiser.startswith(_OWN_DIRS) or raiser == str(getattr(item, "path", "")):
        return None
    return f"{raiser}:{frames[-1].lineno + 1}"


def fail_raised_outcome(report: pytest.TestReport, excinfo: pytest.ExceptionInfo, where: str) -> None:
    """Turn a skip or xfail raised from the buffer's code into a failure
    that says so (only rbcheck decides what is skipped or expected to fail)."""
    kind = "xfail" if excinfo.errisinstance(pytest.xfail.Exception) else "skip"
    message = (f"{results.type_name(excinfo.value)}: the test's outcome ({kind}: "
               f"{results.one_line(str(excinfo.value), 160)!r}) was raised from the buffer's code at {where}, "
               f"but only rbcheck decides what is skipped or expected to fail: a buffer that cannot do something "
               f"raises an error (declare the capability missing, or list a known failure)")
    report.outcome = "failed"
    report.longrepr = message
    if hasattr(report, "wasxfail"):
        del report.wasxfail
    setattr(report, results.FIELDS_ATTR, {"message": message, "failures": [message], "repros": []})
