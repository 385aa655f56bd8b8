"""``conformance.html``: the report as one static, self-contained page (its
style, script and plots inline; it fetches nothing), from the report's JSON
(``report.build`` with its verdict). The same layout as the markdown
(``harness.report_layout``): the verdict and the failures first, each with
its counterexample, a failure's what / got / expected / call, a plot of
every distributional check it ran (expected against observed frequencies,
with the acceptance band: ``harness.svg_plot``) and its repro ready to copy;
then the implementations, the results by behaviour (plots of the passing
distributional checks too) and the skips folded by reason. A filter by
status shows or hides the results (skips hidden at first).

The page carries the verdict and each implementation's counts as data
(``<meta name="rbcheck-verdict">``, ``data-counts``), so a test can check it
against the JSON.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from rbcheck.harness.report_layout import (
    counts_text,
    failures,
    group_counts,
    groups,
    incomplete_text,
    not_ran,
    one_liner,
    rerun_command,
    run_time_text,
    settings_text,
    skip_folds,
    verdict_line,
)
from rbcheck.harness.svg_plot import frequency_plot

__all__ = ["render_html", "STATUS_OF"]

#: The filter's status of each outcome.
STATUS_OF = {"pass": "pass", "fail": "fail", "error": "fail", "xpass": "fail", "xfail": "known",
             "skip": "skip", "unavailable": "unavailable"}
STATUSES = (("fail", "failures"), ("pass", "passes"), ("known", "known failures"),
            ("unavailable", "unavailable"), ("skip", "skipped"), ("other", "not run"))

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px;
color:#1b1b1b}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:0 0 6px}code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.verdict{font-size:16px;font-weight:600;padding:8px 12px;border-radius:6px;margin:6px 0}
.verdict-passed{background:#e3f4e1;color:#1d5b1a}.verdict-failed{background:#fde2e1;color:#8a1c17}
.verdict-other{background:#fff2cc;color:#6b4e00}
nav.filter{position:sticky;top:0;background:#fff;padding:6px 0;border-bottom:1px solid #eee;z-index:2}
nav.filter label{margin-right:14px;white-space:nowrap}
article.failure{border:1px solid #e7b7b4;border-left:5px solid #c62828;border-radius:6px;padding:10px 12px;
margin:10px 0;background:#fffafa}
.message{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-word}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 7px;vertical-align:top;
text-align:left}th{background:#f6f6f6}table.fields td{word-break:break-word;max-width:900px}
td.s-pass{background:#eef8ec}td.s-fail{background:#fde2e1;font-weight:600}td.s-known{background:#fff2cc}
td.s-skip{color:#777}td.s-unavailable{background:#f1eefa}
pre{background:#f6f8fa;border:1px solid #e2e2e2;border-radius:4px;padding:8px;overflow:auto;max-height:360px}
button.copy{float:right;font-size:12px;margin:2px}.group-id{color:#555;font-weight:400}
details.behaviour{margin:4px 0}details.behaviour>summary{cursor:pointer;padding:3px 0}
.hidden{display:none}.muted{color:#666}figure{margin:6px 0}
"""

SCRIPT = """
(function () {
  var boxes = document.querySelectorAll('nav.filter input[type=checkbox]');
  function apply() {
    var on = {};
    boxes.forEach(function (b) { on[b.dataset.status] = b.checked; });
    document.querySelectorAll('.result').forEach(function (el) {
      var shown = (el.dataset.statuses || '').split(' ').some(function (s) { return on[s]; });
      el.classList.toggle('hidden', !shown);
    });
  }
  boxes.forEach(function (b) { b.addEventListener('change', apply); });
  document.querySelectorAll('button.copy').forEach(function (button) {
    button.addEventListener('click', function () {
      var text = document.getElementById(button.dataset.target).textContent;
      function said(word) { button.textContent = word; setTimeout(function () { button.textContent = 'copy'; }, 1500); }
      function fallback() {
        var area = document.createElement('textarea');
        area.value = text; document.body.appendChild(area); area.select();
        try { said(document.execCommand('copy') ? 'copied' : 'select and copy'); } catch (e) { said('select and copy'); }
        area.remove();
      }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { said('copied'); }, fallback);
      } else { fallback(); }
    });
  });
  apply();
  document.body.dataset.ready = '1';
})();
"""


def _e(text: Any) -> str:
    return escape(str(text), quote=True)


def _statuses(row: dict[str, Any], order: list[str]) -> str:
    found = {STATUS_OF.get(row["cells"].get(n, {}).get("outcome", ""), "other") for n in order}
    return " ".join(sorted(found))


def _plots(cell: dict[str, Any], limit: int = 3) -> str:
    return "".join(f"<figure>{frequency_plot(freq)}<figcaption>{_e(freq.get('what', ''))} "
                   f"({_e(freq.get('statistic', ''))}; {freq.get('cells', '')} cells)</figcaption></figure>"
                   for freq in (cell.get("distributions") or [])[:limit])


def _failure(item: dict[str, Any]) -> str:
    cell, row, n = item["cell"], item["row"], item["n"]
    note = "" if item["gating"] else ' <span class="muted">(informational: not gating)</span>'
    out = [f'<article class="result failure" id="failure-{n}" data-statuses="fail" data-impl="{_e(item["impl"])}">',
           f'<h3>{n}. {_e(item["impl"])} <code>{_e(row["id"])}</code> '
           f'<span class="group-id">[{_e(item["group"])}]</span>{note}</h3>',
           f'<p class="message">{_e(one_liner(cell))}</p>']
    fields = [(key, cell[key]) for key in ("what", "got", "expected", "call", "detail") if cell.get(key)]
    if fields:
        out.append('<table class="fields">' + "".join(f"<tr><th>{k}</th><td><code>{_e(v)}</code></td></tr>"
                                                      for k, v in fields) + "</table>")
    elif cell.get("message"):
        out.append(f'<p class="message muted">{_e(cell["message"])}</p>')
    for more in cell.get("failures", [])[1:]:
        out.append(f'<p class="message">also: {_e(more)}</p>')
    out.append(_plots(cell))
    out.append(f'<p>rerun: <code>{_e(rerun_command(item["impl"], row["id"]))}</code></p>')
    for i, snippet in enumerate(cell.get("repros", [])[:2]):
        target = f"repro-{n}-{i}"
        out.append(f'<div class="repro"><button type="button" class="copy" data-target="{target}">copy</button>'
                   f'<p class="muted">repro (runs as pasted in a fresh interpreter):</p>'
                   f'<pre id="{target}"><code>{_e(snippet)}</code></pre></div>')
    out.append("</article>")
    return "".join(out)


def _impl_table(report: dict[str, Any]) -> str:
    coverage = (report.get("verdict") or {}).get("coverage") or {}
    rows = ["<table id=\"implementations\"><tr><th>implementation</th><th>kind</th><th>version</th><th>result</th>"
            "<th>coverage</th><th>run time</th><th>settings</th></tr>"]
    for name in report["order"]:
        info = report["implementations"][name]
        result = f"{info['status']} ({info['why']})" if info["status"] != "ran" else counts_text(info["counts"])
        rows.append(f'<tr data-impl="{_e(name)}" data-status="{_e(info["status"])}" '
                    f'data-counts="{_e(json.dumps(info.get("counts") or {}, sort_keys=True))}">'
                    f"<td>{_e(name)}</td><td>{_e(info.get('kind', ''))}</td><td>{_e(info.get('version', ''))}</td>"
                    f"<td>{_e(result)}</td><td>{_e(coverage.get(name, ''))}</td><td>{_e(run_time_text(info))}</td>"
                    f"<td>{_e(settings_text(info))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _behaviours(report: dict[str, Any]) -> str:
    order = report["order"]
    out = []
    for group in groups(report):
        summary = "; ".join(f"{n}: {counts_text(group_counts(group, n))}" for n in order)
        ran = any(row["cells"].get(n, {}).get("outcome") not in ("skip", "absent", None)
                  for row in group.rows for n in order)
        statuses = " ".join(sorted({s for row in group.rows for s in _statuses(row, order).split()}))
        out.append(f'<details class="behaviour result" data-statuses="{statuses}"{" open" if ran else ""}>'
                   f'<summary><b>{_e(group.id)}</b>: {_e(group.statement)} '
                   f'<span class="muted">({_e(summary)})</span></summary>')
        out.append("<table><tr><th>property</th>" + "".join(f"<th>{_e(n)}</th>" for n in order) + "</tr>")
        for row in group.rows:
            cells = []
            for name in order:
                cell = row["cells"].get(name, {})
                status = STATUS_OF.get(cell.get("outcome", ""), "other")
                plots = _plots(cell, 1) if cell.get("distributions") and status != "fail" else ""  # failures: above
                plot = f"<details><summary>frequencies</summary>{plots}</details>" if plots else ""
                cells.append(f'<td class="s-{status}">{_e(cell.get("text", "--"))}{plot}</td>')
            out.append(f'<tr class="result" data-statuses="{_statuses(row, order)}"><td><code>{_e(row["id"])}</code>'
                       f"</td>{''.join(cells)}</tr>")
        out.append("</table></details>")
    return "".join(out)


def render_html(report: dict[str, Any], title: str = "Conformance report") -> str:
    """The page (module doc)."""
    verdict = report.get("verdict") or {}
    word = verdict.get("verdict", "")
    tone = {"passed": "passed", "failed": "failed"}.get(word, "other" if word else
                                                         ("failed" if failures(report) else "passed"))
    found = failures(report)
    counts: dict[str, int] = {}
    for row in report["rows"]:
        for name in report["order"]:
            status = STATUS_OF.get(row["cells"].get(name, {}).get("outcome", ""), "other")
            counts[status] = counts.get(status, 0) + 1
    boxes = "".join(f'<label><input type="checkbox" data-status="{s}"{"" if s == "skip" else " checked"}> '
                    f"{label} ({counts.get(s, 0)})</label>" for s, label in STATUSES)
    body = [f'<header><h1>{_e(title)}</h1><p class="verdict verdict-{tone}" id="verdict">{_e(verdict_line(report))}</p>',
            f'<nav class="filter">show: {boxes}</nav></header>']
    if found:
        body.append(f'<section id="failures"><h2>Failures ({len(found)})</h2>'
                    + "".join(_failure(item) for item in found) + "</section>")
    if not_ran(report):
        body.append('<section id="not-run"><h2>Did not run or did not complete</h2><ul>'
                    + "".join(f"<li><b>{_e(n)}</b>: {_e(why)}</li>" for n, why in not_ran(report)) + "</ul></section>")
    body.append(f'<section><h2>Implementations</h2>{_impl_table(report)}</section>')
    body.append('<section id="behaviours"><h2>By behaviour</h2><p class="muted">The invariants of the catalogue '
                "(harness/invariants.py), each with its tests; skipped rows are hidden until \"skipped\" is ticked."
                f"</p>{_behaviours(report)}</section>")
    folds = skip_folds(report)
    if folds:
        items = "".join(f"<li>{_e(name)}: {n} skipped: {_e(reason)}</li>"
                        for name, reasons in folds.items() for reason, n in reasons)
        body.append(f'<section id="skips"><h2>Skipped, by reason</h2><ul>{items}</ul></section>')
    details = []
    for name in report["order"]:
        info = report["implementations"][name]
        facts = [f"capabilities: {', '.join(info.get('capabilities') or []) or '(none)'}"]
        facts += [f"unavailable: {cap}: {why}" for cap, why in sorted((info.get("unavailable") or {}).items())]
        facts += [f"convention: {k} = {v}" for k, v in sorted((info.get("conventions") or {}).items())]
        facts += [f"warning: {w}" for w in info.get("warnings") or []]
        if incomplete_text(info):
            facts.append(incomplete_text(info))
        details.append(f"<h3>{_e(name)}</h3><ul>" + "".join(f"<li>{_e(f)}</li>" for f in facts) + "</ul>")
    body.append('<section id="details"><h2>Implementations in detail</h2>' + "".join(details) + "</section>")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="rbcheck-verdict" content="{_e(word)}">'
            f'<meta name="rbcheck-exit-status" content="{_e(verdict.get("exit_status", ""))}">'
            f"<title>{_e(title)}: {_e(verdict_line(report).split(':', 1)[0])}</title><style>{STYLE}</style></head>\n"
            f"<body>{''.join(body)}<script>{SCRIPT}</script></body></html>\n")
