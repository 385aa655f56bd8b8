"""The report written for people (harness/report_layout.py, report_html.py,
svg_plot.py, compliance.py) from synthetic results: failures and the
verdict on the first screen, passes by behaviour, skips folded by reason,
the HTML page and the compliance page agreeing with the JSON; and the
distributional checks recording their frequencies (harness/frequencies.py)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import torch

from rbcheck.harness import frequencies, report
from rbcheck.harness.assertions import PropertyFailure, assert_binomial, assert_chi_square
from rbcheck.harness.compliance import cells as compliance_cells
from rbcheck.harness.compliance import render_compliance_html, render_compliance_markdown
from rbcheck.harness.plugin.results import failure_fields
from rbcheck.harness.report_html import render_html
from rbcheck.harness.report_layout import counts_text
from rbcheck.harness.svg_plot import frequency_plot
from rbcheck.harness.verdict import as_json, decide

UNIFORM = "test_sampling_distributions.py::test_uniform_sampling_matches_closed_form[7-5]"
RING = "test_ring_eviction.py::test_ring_keeps_the_last_capacity_rows_for_any_batch_size"
BAD = "test_bad_input.py::test_bad_input_is_refused_and_nothing_changes[{}]"
FREQ = {"what": "slot frequencies", "kind": "chi-square", "labels": ["0", "1", "2"], "observed": [60.0, 40.0, 0.0],
        "expected": [33.3, 33.3, 33.3], "low": [20.0, 20.0, 20.0], "high": [48.0, 48.0, 48.0], "n": 100, "cells": 3,
        "p_value": 1e-12, "false_alarm": 1e-6, "passed": False, "statistic": "chi-square 40.0, 2 dof"}
REPRO = "from rbcheck.harness.adapters import load_adapter\nbuf = load_adapter('mine:broken').make(spec)\nbuf.sample(5)"


def record(row: str, outcome: str, message: str = "", **extra) -> dict:
    file, _, name = row.partition("::")
    return {"nodeid": f"rbcheck/conformance/{row}", "property": f"{file[:-3]}::{name.split('[')[0]}", "doc": "",
            "outcome": outcome, "message": message, **extra}


def result(name: str, tests: list[dict]) -> report.ImplResult:
    return report.ImplResult.from_results(name, {
        "version": "0.1", "capabilities": ["random"], "unavailable": {}, "warnings": [], "tests": tests,
        "exitstatus": int(any(t["outcome"] == "fail" for t in tests)), "seconds": 3.0,
        "settings": {"profile": "ci", "device": "cpu"}})


def failing_run() -> list[report.ImplResult]:
    """A broken buffer (one chi-square failure) beside one that passes; 60
    bad-input rows each skipped as not declared."""
    skips = [record(BAD.format(i), "skip", "not declared: bad_input") for i in range(60)]
    broken = [record(UNIFORM, "fail", "AssertionError: slot frequencies: chi-square p-value=<1e-12>, but should be "
                   ">= 1e-06 [sample(5)]", failures=["AssertionError: slot frequencies ..."], repros=[REPRO],
                   what="slot frequencies: chi-square p-value", got="<1e-12>", expected=">= 1e-06",
                   call="sample(5)", distributions=[FREQ]),
              record(RING, "pass"), *skips]
    fine = [record(UNIFORM, "pass", distributions=[{**FREQ, "observed": [33.0, 34.0, 33.0], "passed": True}]),
            record(RING, "pass"), *skips]
    return [result("mine:broken", broken), result("example", fine)]


def built(results=None) -> dict:
    results = results or failing_run()
    data = report.build(results)
    data["verdict"] = as_json(decide(results))
    return data


def test_the_first_screen_shows_the_verdict_and_the_failures_and_no_skipped_row():
    data = built()
    for text in (report.render_text(data), report.render_markdown(data)):
        first = "\n".join(text.splitlines()[:40])
        assert "FAILED (exit 1)" in first and "1 failure in mine:broken" in first, first
        assert UNIFORM in first and "slot frequencies: chi-square p-value=<1e-12>, but should be >= 1e-06" in first
        assert "skipped (not declared" not in text and "test_bad_input" not in first, first
        # the 120 skips (60 per implementation) are one line each implementation
        assert text.count("60 skipped: not declared: bad_input") == 2, text
        assert BAD.format(3) not in text  # rows every implementation skipped are only counted
    text = report.render_text(data)
    assert text.index("Repro 1: mine:broken") < text.index("By behaviour")
    assert "    buf = load_adapter('mine:broken').make(spec)" in text
    assert "rerun: rbcheck validate mine:broken --only test_sampling_distributions::" in text


def test_passes_are_grouped_by_the_catalogues_behaviours():
    data = built()
    text, markdown = report.render_text(data), report.render_markdown(data)
    by_behaviour = text.split("By behaviour", 1)[1].split("Skipped, by reason", 1)[0]
    assert re.search(r"\n  ring +1 pass +1 pass", by_behaviour), by_behaviour
    assert re.search(r"\n  sampling_distribution +1 FAIL +1 pass", by_behaviour), by_behaviour
    assert "| ring | 1 pass | 1 pass |" in markdown
    assert "| **ring**: the ring keeps exactly the last `capacity` rows" in markdown
    assert f"| `{RING}` | pass | pass |" in markdown


def test_markdown_and_html_say_the_counts_and_the_verdict_of_the_json():
    data = built()
    markdown, page = report.render_markdown(data), render_html(data)
    assert f"**{data['verdict']['verdict'].upper()} (exit {data['verdict']['exit_status']})" in markdown
    assert f'<meta name="rbcheck-verdict" content="{data["verdict"]["verdict"]}">' in page
    for name, info in data["implementations"].items():
        counts = counts_text(info["counts"])
        assert re.search(rf"\| {re.escape(name)}[^|]* \| 0.1 \| {re.escape(counts)} \|", markdown), (name, counts)
        found = re.search(rf'data-impl="{re.escape(name)}" data-status="ran" data-counts="([^"]*)"', page)
        assert json.loads(found.group(1).replace("&quot;", '"')) == info["counts"]


class _Page(HTMLParser):
    """What a test reads off the page: tags with their attributes, in order."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_page_is_self_contained_with_failure_first_plot_and_copyable_repro():
    page = render_html(built())
    parsed = _Page()
    parsed.feed(page)
    assert not [t for t, a in parsed.tags if t in ("link", "img", "iframe") or (t == "script" and a.get("src"))]
    assert "http://" not in page and "https://" not in page and "url(" not in page and "@import" not in page
    results = [a for t, a in parsed.tags if "result" in (a.get("class") or "").split()]
    assert results[0]["class"] == "result failure" and results[0]["data-statuses"] == "fail"
    failure = page.split('id="failure-1"', 1)[1].split("</article>", 1)[0]
    assert 'class="freq-plot"' in failure and 'data-passed="false"' in failure
    assert "<th>expected</th><td><code>&gt;= 1e-06</code>" in failure
    assert 'class="copy" data-target="repro-1-0"' in failure and "load_adapter(&#x27;mine:broken&#x27;)" in failure
    assert page.count('class="freq-plot"') == 2  # the passing check is drawn too, under its behaviour
    assert '<input type="checkbox" data-status="skip">' in page  # skips hidden until asked for


def test_the_plot_draws_band_expected_and_observed_and_marks_what_falls_outside():
    svg = frequency_plot(FREQ)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('class="band"') == 3 and svg.count('class="expected"') == 3
    assert svg.count('class="observed outside"') == 2  # 60 above its band, 0 below its band
    assert "p-value 1e-12 vs false-alarm rate 1e-06 (FAILED)" in svg


def test_distributional_checks_record_their_frequencies_small():
    frequencies.clear()
    assert_chi_square("slots", torch.tensor([50.0, 50.0, 0.0]), torch.tensor([0.5, 0.5, 0.0]), false_alarm=1e-6)
    (seen,) = frequencies.take()
    assert seen["observed"] == [50.0, 50.0, 0.0] and seen["expected"] == [50.0, 50.0, 0.0] and seen["passed"]
    assert seen["low"][0] < 50 < seen["high"][0] and seen["low"][2] == seen["high"][2] == 0
    counts = torch.zeros(65536)
    counts[:20000] = 1
    with pytest.raises(PropertyFailure) as failed:
        assert_chi_square("many slots", counts, torch.ones(65536), false_alarm=1e-6)
    big = failed.value.frequencies
    assert len(big["observed"]) <= frequencies.MAX_BINS and big["cells"] == 65536 and not big["passed"]
    assert sum(big["observed"]) == 20000
    with pytest.raises(PropertyFailure) as failed:
        assert_binomial("hits", 3, 100, 0.5, false_alarm=1e-6)
    fields = failure_fields(failed.value)
    assert fields["distributions"][0]["observed"] == [3.0, 97.0]
    assert (fields["what"], fields["got"]) == ("hits", "<3 of 100>") and fields["expected"].startswith("about 50.0")
    assert [d["passed"] for d in frequencies.take()] == [False, False]


def test_compliance_cells_say_pass_fail_convention_and_not_declared():
    data = built()
    conv = record(RING, "xfail", "known failure: by design (lib.py:3)")
    data = built([*failing_run(), result("lib", [record(UNIFORM, "pass", conventions={"replacement": "without"}), conv])])
    got = compliance_cells(data, bugs={"mine:broken": {"test_sampling_distributions::test_uniform_sampling_matches_"
                                                       "closed_form": {"id": "B1", "url": "findings.md#b1"}}})
    assert got["mine:broken"]["sampling_distribution"]["status"] == "FAIL"
    assert got["mine:broken"]["sampling_distribution"]["bugs"] == [{"id": "B1", "url": "findings.md#b1"}]
    assert got["example"]["sampling_distribution"]["status"] == "pass"
    assert got["lib"]["ring"]["status"] == got["lib"]["sampling_distribution"]["status"] == "convention"
    assert got["example"]["bad_input_refused"] == {**got["example"]["bad_input_refused"], "status": "not declared",
                                                   "why": "needs: bad_input"}
    data["date"] = "2026-11-28"
    markdown = render_compliance_markdown(data, bugs={"mine:broken": {"ring": "B2"}})
    assert "of 2026-11-28" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| mine:broken"))
    assert row.startswith("| mine:broken (yours) | 0.1 | ") and "**FAIL 1/1**" in row and "| not declared |" in row
    page = render_compliance_html(data)
    assert 'data-status="FAIL"' in page and "2026-11-28" in page and "http" not in page


def test_report_merge_writes_the_compliance_page_and_html(tmp_path, capsys):
    parts = tmp_path / "parts"
    for res in failing_run():
        report.write_part(res, parts)
    out, html = tmp_path / "out", tmp_path / "html"
    code = report.main(["--merge", str(parts), "--impl", "mine:broken", "--impl", "example", "--out", str(out),
                        "--html", str(html)])
    assert code == 1
    saved = json.loads((out / "conformance.json").read_text())
    assert saved["verdict"]["verdict"] == "failed" and re.fullmatch(r"\d{4}-\d\d-\d\d", saved["date"])
    cell = next(r for r in saved["rows"] if r["id"] == UNIFORM)["cells"]["mine:broken"]
    assert cell["distributions"] == [FREQ] and cell["repros"] == [REPRO] and cell["got"] == "<1e-12>"
    assert (html / "conformance.html").read_text() == (out / "conformance.html").read_text()
    assert "FAIL 1/1" in (out / "compliance.md").read_text()
    assert 'data-impl="example"' in (out / "compliance.html").read_text()
    assert "conformance.html" in capsys.readouterr().out
