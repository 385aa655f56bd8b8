"""The conformance report's bad-input / fault summary: per implementation,
how many cases of each catalogue were tried and survived (exact counts)."""

from __future__ import annotations

from rbcheck.harness import report


def results(name: str, outcomes: dict[str, str]) -> report.ImplResult:
    return report.ImplResult.from_results(name, {
        "schema": 1, "implementation": name, "version": "1", "capabilities": [], "unavailable": {},
        "warnings": [], "exitstatus": 0,
        "tests": [{"nodeid": f"tests/conformance/{test}", "outcome": outcome, "message": "why"}
                  for test, outcome in outcomes.items()],
    })


OUTCOMES = {
    "test_bad_input.py::test_bad_input_is_refused_and_nothing_changes[priority_nan]": "pass",
    "test_bad_input.py::test_bad_input_is_refused_and_nothing_changes[index_2d]": "fail",
    "test_bad_input.py::test_bad_buffer_description_is_refused[capacity_zero]": "xpass",
    "test_bad_input.py::test_bad_input_is_refused_and_nothing_changes[generation_float_dtype]": "skip",
    "test_checkpoint_faults.py::test_damaged_checkpoint_is_refused_and_nothing_changes[file_emptied]": "xfail",
    "test_checkpoint_faults.py::test_interrupted_save_leaves_a_loadable_checkpoint[killed]": "pass",
    "test_checkpoint_faults.py::test_checkpoint_that_does_not_fit_is_refused[sampler_differs]": "unavailable",
    "test_ring_eviction.py::test_something": "fail",  # not a catalogue: not counted
}


def test_summary_counts_tried_and_survived_per_catalogue():
    data = report.build([results("torchrl", OUTCOMES), results("reference", {})])
    assert data["implementations"]["torchrl"]["robustness"] == {
        "bad input": {"tried": 3, "survived": 2, "not_run": 1},
        "checkpoint faults": {"tried": 2, "survived": 1, "not_run": 1},
    }
    assert data["implementations"]["reference"]["robustness"]["bad input"] == {
        "tried": 0, "survived": 0, "not_run": 0}
    markdown = report.render_markdown(data)
    assert "## Bad input and faults" in markdown
    assert "| torchrl | 2 / 3 | 1 / 2 | 2 |" in markdown
    assert "bad input: 2/3 survived (1 not run); checkpoint faults: 1/2 survived (1 not run)" in (
        report.render_text(data))
