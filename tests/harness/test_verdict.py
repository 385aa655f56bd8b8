"""The verdict rule (``rbcheck.harness.verdict``), from synthetic results:
exit 0 only when every selected test ran and passed, was skipped with a
reason or failed as declared; 1 for a failure or an XPASS; 2 for a run that
did not complete (any other pytest exit status, a test not run, a crash, an
adapter that did not load), with the cause named."""

from __future__ import annotations

import pytest

from rbcheck.harness.report import ImplResult
from rbcheck.harness.verdict import ABORTED, FAILED, PASSED, decide, judge

GOOD = [("test_a.py::test_x[1]", "pass", ""), ("test_a.py::test_x[2]", "skip", "not declared: slice"),
        ("test_a.py::test_y", "unavailable", "unavailable: cuda: no GPU"),
        ("test_b.py::test_z", "xfail", "known failure: wraps wrongly (issue 1)")]


def ran(tests, exitstatus=0, errors=(), name="impl"):
    return ImplResult(name=name, status="ran", version="1", exitstatus=exitstatus, errors=list(errors),
                      tests=[{"nodeid": f"rbcheck/conformance/{t}", "property": t.split("[")[0], "outcome": o,
                              "message": m} for t, o, m in tests])


def test_passed_skipped_unavailable_and_known_failures_pass():
    verdict = judge(ran(GOOD))
    assert (verdict.code, verdict.reasons) == (PASSED, ())


def test_a_failure_fails_naming_the_test_and_its_message():
    verdict = judge(ran([*GOOD, ("test_c.py::test_f", "fail", "AssertionError: n=1, but should be 2")], 1))
    assert verdict.code == FAILED
    assert verdict.reasons == ("impl: test_c.py::test_f: FAIL (AssertionError: n=1, but should be 2)",)
    assert judge(ran([("test_c.py::test_f", "error", "in setup: RuntimeError: x")], 1)).code == FAILED


def test_xpass_fails_unless_not_strict():
    results = ran([*GOOD, ("test_b.py::test_w[3]", "xpass", "known failure: wraps wrongly (issue 1)")])
    verdict = judge(results)
    assert verdict.code == FAILED
    assert verdict.reasons == ("impl: test_b.py::test_w[3]: XPASS (known failure: wraps wrongly (issue 1)): "
                               "it passed: remove the entry, or name only the tests that fail",)
    assert judge(results, strict=False).code == PASSED


@pytest.mark.parametrize("exitstatus, errors, said", [
    (4, ["usage error: known failure id='t' names a test of seed invariant 2"],
     "pytest exit status 4 (usage error)"),
    (2, ["collection error in test_a.py: RuntimeError: boom"], "pytest exit status 2 (interrupted"),
    (2, ["interrupted: KeyboardInterrupt"], "pytest exit status 2 (interrupted"),
    (3, ["internal error: RuntimeError: plugin bug"], "pytest exit status 3 (internal error)"),
    (5, [], "pytest exit status 5 (no tests collected)"),
    (None, [], "no pytest exit status was recorded"),
    (1, [], "pytest exit status 1 (tests failed), but no test failed"),
])
def test_any_other_pytest_exit_status_aborts_naming_it(exitstatus, errors, said):
    verdict = judge(ran(GOOD, exitstatus, errors))
    assert verdict.code == ABORTED
    assert verdict.reasons[0].startswith(f"impl: the run did not complete: {said}"), verdict.reasons
    assert [f"impl: {e}" for e in errors] == list(verdict.reasons[1:])


def test_a_test_not_run_aborts_even_when_pytest_said_ok():
    verdict = judge(ran([*GOOD, ("test_c.py::test_g[1]", "not run", ""), ("test_c.py::test_g[2]", "not run", "")]))
    assert verdict.code == ABORTED
    assert verdict.reasons == ("impl: the run did not complete: 2 test(s) not run (test_c.py::test_g[1], "
                               "test_c.py::test_g[2])",)


def test_abort_wins_over_failures_and_both_are_named():
    verdict = judge(ran([("test_c.py::test_f", "fail", "m"), ("test_c.py::test_g", "not run", "")], 2,
                        ["interrupted: KeyboardInterrupt"]))
    assert verdict.code == ABORTED
    assert "impl: test_c.py::test_f: FAIL (m)" in verdict.reasons
    assert "impl: interrupted: KeyboardInterrupt" in verdict.reasons


def test_an_adapter_that_does_not_load_or_a_crashed_run_aborts():
    verdict = judge(ImplResult(name="mine:f", status="unavailable", why="RuntimeError: no GPU driver"))
    assert (verdict.code, verdict.reasons) == (
        ABORTED, ("mine:f: the adapter did not load: RuntimeError: no GPU driver",))
    verdict = judge(ImplResult(name="x", status="crashed", why="pytest exit 4: ERROR: unrecognized arguments",
                               exitstatus=4))
    assert (verdict.code, verdict.reasons) == (
        ABORTED, ("x: the run did not complete (no results): pytest exit 4: ERROR: unrecognized arguments",))


def test_informational_implementations_report_failures_but_an_aborted_run_still_gates():
    failing = ran([("test_c.py::test_f", "fail", "m")], 1, name="torchrl")
    absent = ImplResult(name="cpprb", status="unavailable", why="ModuleNotFoundError: No module named 'cpprb'")
    decision = decide([ran(GOOD, name="reference"), failing, absent], informational={"torchrl", "cpprb"})
    assert decision.code == PASSED and decision.problems == ()
    assert decision.notes == ("torchrl: test_c.py::test_f: FAIL (m)",
                              "cpprb: the adapter did not load: ModuleNotFoundError: No module named 'cpprb'")
    aborted = ran(GOOD, 4, ["usage error: bad known failures"], name="torchrl")
    decision = decide([ran(GOOD, name="reference"), aborted], informational={"torchrl"})
    assert decision.code == ABORTED
    assert decision.problems[0] == "torchrl: the run did not complete: pytest exit status 4 (usage error)"
    assert decide([failing], informational=set()).code == FAILED
    assert decide([ran(GOOD), failing, aborted], informational=set()).code == ABORTED


def test_a_pass_says_how_many_tests_were_unavailable():
    """Exit 0 with unavailable tests is honest only when the summary says how
    much did not run (a variant whose backend does not import passes on the
    few properties that need no capability)."""
    from rbcheck.harness.verdict import explain

    out, _ = explain(decide([ran(GOOD, name="triton"), ran(GOOD[:1], name="reference")]))
    assert out.strip() == ("no problems in triton (2 of 4 tests ran; 1 skipped (1 not declared: slice); "
                           "1 unavailable: see the reasons above), reference (1 of 1 tests ran)")
    out, _ = explain(decide([ran(GOOD[:1], name="reference")]))
    assert out.strip() == "no problems in reference (1 of 1 tests ran)"
