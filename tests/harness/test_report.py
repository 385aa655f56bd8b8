"""The conformance report from small synthetic results files: the table's
cells, the JSON, the markdown and the exit status (the verdict rule itself:
test_verdict.py)."""

from __future__ import annotations

import json

import pytest

from rbcheck.harness import report
from rbcheck.harness.verdict import decide

UNAVAILABLE_WHY = "prioritized: RuntimeError: SumSegmentTreeFp32 is not available."


def property_of(test: str) -> str:
    """``test_a.py::test_x[1]`` -> ``test_a::test_x``, as the plugin records it."""
    file, _, name = test.partition("::")
    return f"{file.removesuffix('.py')}::{name.split('[', 1)[0]}"


def results(name: str, outcomes: dict[str, tuple[str, str]]) -> dict:
    return {
        "schema": 1,
        "implementation": name,
        "version": "1.2",
        "capabilities": ["random", "prioritized"],
        "unavailable": {"prioritized": "RuntimeError: SumSegmentTreeFp32 is not available."},
        "warnings": [],
        "exitstatus": int(any(o in ("fail", "error") for o, _ in outcomes.values())),
        "tests": [
            {"nodeid": f"tests/conformance/{test}", "property": property_of(test), "doc": "", "outcome": o,
             "message": m}
            for test, (o, m) in outcomes.items()
        ],
    }


REFERENCE = {
    "test_a.py::test_round_trip": ("pass", ""),
    "test_a.py::test_priority": ("pass", ""),
    "test_b.py::test_slices[4]": ("skip", "not declared: slice"),
}
THIRD = {
    "test_a.py::test_round_trip": ("fail", "AssertionError: x=1, but should be 2 | Falsifying example: f(n=3)"),
    "test_a.py::test_priority": ("unavailable", "unavailable: " + UNAVAILABLE_WHY),
    "test_b.py::test_slices[4]": ("xfail", "known failure: wraps wrongly (no upstream issue found)"),
}


def runs(**named):
    return [report.ImplResult.from_results(n, results(n, o)) for n, o in named.items()]


def build(**named):
    return report.build(runs(**named))


def problems(informational=(), **named):
    return list(decide(runs(**named), informational).problems)


def test_cells_say_pass_fail_skipped_unavailable_and_known_failure():
    data = build(reference=REFERENCE, torchrl=THIRD)
    rows = {row["id"]: row["cells"] for row in data["rows"]}
    assert list(rows) == ["test_a.py::test_round_trip", "test_a.py::test_priority", "test_b.py::test_slices[4]"]
    assert rows["test_a.py::test_round_trip"]["reference"]["text"] == "pass"
    assert rows["test_a.py::test_round_trip"]["torchrl"]["text"] == (
        "FAIL (AssertionError: x=1, but should be 2 | Falsifying example: f(n=3))"
    )
    assert rows["test_a.py::test_priority"]["torchrl"]["text"] == f"unavailable ({UNAVAILABLE_WHY})"
    assert rows["test_b.py::test_slices[4]"]["reference"]["text"] == "skipped (not declared: slice)"
    assert rows["test_b.py::test_slices[4]"]["torchrl"]["text"] == (
        "known failure (wraps wrongly (no upstream issue found))"
    )
    assert data["implementations"]["torchrl"]["counts"] == {"fail": 1, "unavailable": 1, "xfail": 1}


def test_third_party_failures_are_reported_not_errors_when_informational():
    assert problems({"torchrl"}, reference=REFERENCE, torchrl=THIRD) == []
    assert decide(runs(reference=REFERENCE, torchrl=THIRD), {"torchrl"}).notes == (
        "torchrl: test_a.py::test_round_trip: FAIL (AssertionError: x=1, but should be 2 | Falsifying example: "
        "f(n=3))",)


@pytest.mark.parametrize("name", ["reference", "device", "torchrl", "mine.adapter:factory"])
def test_any_implementation_failing_is_an_error(name):
    assert problems(**{name: THIRD}) == [
        f"{name}: test_a.py::test_round_trip: FAIL (AssertionError: x=1, but should be 2 | Falsifying example: f(n=3))"
    ]


def test_an_adapter_that_does_not_load_is_a_column_of_unavailable():
    data = report.build([
        report.ImplResult.from_results("reference", results("reference", REFERENCE)),
        report.ImplResult(name="triton", status="unavailable", why="ImportError: No module named 'triton'"),
    ])
    for row in data["rows"]:
        assert row["cells"]["triton"]["text"] == "unavailable (ImportError: No module named 'triton')"
    assert decide([report.ImplResult(name="triton", status="unavailable", why="ImportError: x")]).problems == (
        "triton: the adapter did not load: ImportError: x",)
    markdown = report.render_markdown(data)
    assert "| triton | " in markdown and "unavailable (ImportError: No module named 'triton')" in markdown


def test_main_writes_markdown_and_json_and_sets_the_exit_status(tmp_path, capsys):
    ref, third = tmp_path / "ref.json", tmp_path / "third.json"
    ref.write_text(json.dumps(results("reference", REFERENCE)))
    third.write_text(json.dumps(results("torchrl", THIRD)))
    out = tmp_path / "out"
    code = report.main(["--from-results", f"reference={ref}", "--from-results", f"torchrl={third}",
                        "--out", str(out), "--third-party-informational"])
    assert code == 0
    printed = capsys.readouterr().out
    # the failures first: the test and its one-line counterexample, marked as not gating
    head = "\n".join(printed.splitlines()[:10])
    assert "test_a.py::test_round_trip" in head and "AssertionError: x=1, but should be 2" in head, head
    assert "PASSED (exit 0): 1 failure in torchrl (informational)" in head, head
    markdown = (out / "conformance.md").read_text()
    assert "| property | reference | torchrl |" in markdown
    assert "| `test_a.py::test_priority` | pass | unavailable (prioritized: RuntimeError" in markdown
    saved = json.loads((out / "conformance.json").read_text())
    assert saved["order"] == ["reference", "torchrl"]
    # a third party's failures gate unless informational (as in rbcheck validate)
    assert report.main(["--from-results", f"torchrl={third}", "--out", str(out)]) == 1
    # the reference failing flips the exit status
    code = report.main(["--from-results", f"reference={third}", "--out", str(out), "--third-party-informational"])
    assert code == 1


def test_markdown_cells_escape_pipes_and_stay_on_one_line():
    outcomes = {"test_a.py::test_round_trip": ("fail", "a | b\nc")}
    markdown = report.render_markdown(build(torchrl=outcomes))
    line = next(ln for ln in markdown.splitlines() if ln.startswith("| `test_a.py::test_round_trip`"))
    assert "FAIL (a \\| b c)" in line


def test_each_passing_parametrization_of_a_known_failure_is_xpass():
    """An entry covers every test its id names, each on its own: a sibling
    parametrization that still fails as declared does not hide one that
    passes (a stale entry, or one that should name the failing cases only)."""
    outcomes = {
        "test_a.py::test_x[1]": ("xfail", "known failure: wraps wrongly"),
        "test_a.py::test_x[2]": ("xpass", "known failure: wraps wrongly"),
        "test_a.py::test_y[1]": ("xfail", "known failure: other"),
    }
    assert problems(reference=outcomes) == [
        "reference: test_a.py::test_x[2]: XPASS (known failure: wraps wrongly): it passed: remove the entry, or "
        "name only the tests that fail"]
