"""The compliance page: which library passes which invariant, from a merged
validate report (``rbcheck report --merge DIR --out DIR`` writes
``DIR/compliance.md`` and ``.html``; ``nox -s validate`` writes
``reports/compliance.*``).

Rows are the implementations (each with its version), columns the
invariants of the catalogue (``harness/invariants.py``) that have tests.
A cell sums the tests of that invariant the implementation ran:

* **FAIL** -- one failed (or a known failure passed: its entry is stale);
  ``FAIL 2/9`` says how many of the tests run, and the finding's id links to
  it when the optional registry of findings names it;
* **convention** -- none failed, and some passed only under a declared
  convention or failed as a declared known failure (documented behaviour);
* **pass** -- every test run passed under the spec's own rules;
* **not declared** -- none ran: the implementation declares none of the
  capabilities they need; **skipped** / **unavailable** -- none ran for
  another reason; ``--`` -- the run did not hold these tests (or did not run).

The registry of findings is optional (``--bugs FILE``, JSON): ``{impl:
{key: bug}}`` with ``key`` a property id (``test_x::test_y``), a row id
(``test_x.py::test_y[case]``) or an invariant id, and ``bug`` an id
(``"C5"``) or ``{"id": "C5", "url": "../findings.md#real-bugs"}``; without
it a FAIL cell names no finding.

    python -m rbcheck.harness.compliance REPORT.json --out DIR [--bugs FILE]

renders the page from a report's JSON (``conformance.json``, or a recorded
run of ``docs/results/data/``).
"""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from pathlib import Path
from typing import Any

from rbcheck.harness.invariants import CATALOGUE
from rbcheck.harness.report_layout import invariants_of

__all__ = ["cells", "render_compliance_markdown", "render_compliance_html", "main"]

LEGEND = ("**pass**: every test of the invariant it ran passed under the spec's rules; **FAIL n/m**: n of the m "
          "tests it ran failed (the finding's id when the registry of findings names it); **convention**: passed "
          "under a declared convention, or failed as a declared known failure (documented behaviour); "
          "**not declared**: none ran, the capabilities they need are not declared; **skipped** / "
          "**unavailable**: none ran for another reason; **--**: the run held none of its tests.")


def _bug(bugs: dict[str, Any] | None, name: str, keys: list[str]) -> dict[str, str] | None:
    table = (bugs or {}).get(name) or {}
    for key in keys:
        found = table.get(key)
        if isinstance(found, str):
            return {"id": found, "url": ""}
        if isinstance(found, dict) and found.get("id"):
            return {"id": str(found["id"]), "url": str(found.get("url", ""))}
    return None


def _property_of(row_id: str) -> str:
    file, _, test = row_id.partition("::")
    return f"{file.removesuffix('.py')}::{test.split('[', 1)[0]}"


def cells(report: dict[str, Any], bugs: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{impl: {invariant id: {"status", "text", "tests", "failed", "bugs", "why"}}}`` (module doc)."""
    by_inv: dict[str, list[dict[str, Any]]] = {}
    for row in report["rows"]:
        for inv in invariants_of(row["id"]):
            by_inv.setdefault(inv, []).append(row)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in report["order"]:
        info = report["implementations"][name]
        out[name] = {}
        for inv in columns(report):
            rows = by_inv.get(inv.id, [])
            got = [(row, row["cells"].get(name, {})) for row in rows]
            ran = [(row, c) for row, c in got if c.get("outcome") in ("pass", "fail", "error", "xfail", "xpass")]
            failed = [(row, c) for row, c in ran if c["outcome"] in ("fail", "error", "xpass")]
            known = [(row, c) for row, c in ran if c["outcome"] == "xfail" or c.get("conventions")]
            skips = [c.get("message", "") for _, c in got if c.get("outcome") == "skip"]
            cell: dict[str, Any] = {"tests": len(ran), "failed": [row["id"] for row, _ in failed], "bugs": [], "why": ""}
            if info["status"] != "ran":
                cell.update(status="not run", text="--", why=f"{info['status']}: {info['why']}")
            elif failed:
                found = [_bug(bugs, name, [row["id"], _property_of(row["id"]), inv.id]) for row, _ in failed]
                cell["bugs"] = [b for i, b in enumerate(found) if b and b not in found[:i]]
                cell.update(status="FAIL", text=f"FAIL {len(failed)}/{len(ran)}",
                            why="; ".join(f"{row['id']}: {c.get('message', '')}" for row, c in failed[:3]))
            elif known:
                reasons = sorted({c.get("message", "") for _, c in known if c["outcome"] == "xfail"}
                                 | {f"{k}={v}" for _, c in known for k, v in (c.get("conventions") or {}).items()})
                cell.update(status="convention", text="convention", why="; ".join(reasons))
            elif ran:
                cell.update(status="pass", text="pass")
            elif skips and all(m.startswith("not declared:") for m in skips):
                needs = sorted({m.split(":", 1)[1].strip() for m in skips})
                cell.update(status="not declared", text="not declared", why="needs: " + ", ".join(needs))
            elif skips:
                cell.update(status="skipped", text="skipped", why="; ".join(sorted(set(skips))))
            elif any(c.get("outcome") == "unavailable" for _, c in got):
                cell.update(status="unavailable", text="unavailable",
                            why="; ".join(sorted({c.get("message", "") for _, c in got})))
            else:
                cell.update(status="none", text="--", why="the run held none of its tests")
            out[name][inv.id] = cell
    return out


def columns(report: dict[str, Any]) -> list[Any]:
    """The invariants with tests, in catalogue order."""
    return [inv for inv in CATALOGUE if inv.properties]


def _date(report: dict[str, Any], date: str | None) -> str:
    return date or str(report.get("date") or "an unrecorded date")


def _md_bug(bug: dict[str, str]) -> str:
    return f"[{bug['id']}]({bug['url']})" if bug.get("url") else bug["id"]


MERGE = "`rbcheck report --merge` (`harness/compliance.py`)"


def render_compliance_markdown(report: dict[str, Any], *, bugs: dict[str, Any] | None = None,
                               date: str | None = None, source: str = "a merged validate report",
                               how: str = MERGE) -> str:
    """``compliance.md`` (module doc)."""
    table = cells(report, bugs)
    invs = columns(report)
    lines = ["# Compliance: implementations against the invariants", "",
             f"From {source} of {_date(report, date)}; generated by {how}, do not edit by hand.", "", LEGEND, "",
             "| implementation | version | " + " | ".join(f"`{inv.id}`" for inv in invs) + " |",
             "|---|---" + "|---" * len(invs) + "|"]
    for name in report["order"]:
        info = report["implementations"][name]
        texts = []
        for inv in invs:
            cell = table[name][inv.id]
            text = f"**{cell['text']}**" if cell["status"] == "FAIL" else cell["text"]
            if cell["bugs"]:
                text += " (" + ", ".join(_md_bug(b) for b in cell["bugs"]) + ")"
            texts.append(text)
        kind = {"third party": "", "first party": " (rbcheck)", "user": " (yours)"}.get(info.get("kind", ""), "")
        lines.append(f"| {name}{kind} | {info.get('version') or '--'} | " + " | ".join(texts) + " |")
    lines += ["", "## The invariants", ""]
    lines += [f"- `{inv.id}`: {inv.statement}" for inv in invs]
    failing = [(name, inv.id, table[name][inv.id]) for name in report["order"] for inv in invs
               if table[name][inv.id]["status"] == "FAIL"]
    if failing:
        lines += ["", "## The failing tests", ""]
        for name, inv_id, cell in failing:
            lines.append(f"- {name}, `{inv_id}`: " + ", ".join(f"`{t}`" for t in cell["failed"][:6])
                         + (f" and {len(cell['failed']) - 6} more" if len(cell["failed"]) > 6 else ""))
    return "\n".join(lines) + "\n"


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#1b1b1b}
table{border-collapse:collapse}th,td{border:1px solid #ddd;padding:3px 6px;text-align:center;font-size:12px}
th.inv{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;font-weight:500}
td.name{text-align:left;white-space:nowrap}td.c-pass{background:#dff2dc}td.c-FAIL{background:#f8c9c6;font-weight:700}
td.c-convention{background:#fff0c2}td.c-not-declared{background:#f1f1f1;color:#777}
td.c-skipped,td.c-unavailable,td.c-none,td.c-not-run{color:#999}
"""


def render_compliance_html(report: dict[str, Any], *, bugs: dict[str, Any] | None = None,
                           date: str | None = None, source: str = "a merged validate report", how: str = MERGE) -> str:
    """``compliance.html``: the same table, static and self-contained (cell titles say why)."""
    table = cells(report, bugs)
    invs = columns(report)
    head = "".join(f'<th class="inv" title="{escape(inv.statement)}">{escape(inv.id)}</th>' for inv in invs)
    rows = []
    for name in report["order"]:
        info = report["implementations"][name]
        tds = []
        for inv in invs:
            cell = table[name][inv.id]
            links = ", ".join(f'<a href="{escape(b["url"])}">{escape(b["id"])}</a>' if b.get("url") else escape(b["id"])
                              for b in cell["bugs"])
            tds.append(f'<td class="c-{cell["status"].replace(" ", "-")}" data-status="{escape(cell["status"])}" '
                       f'title="{escape(cell["why"])}">{escape(cell["text"])}{" (" + links + ")" if links else ""}</td>')
        rows.append(f'<tr data-impl="{escape(name)}"><td class="name">{escape(name)}</td>'
                    f"<td>{escape(info.get('version') or '--')}</td>{''.join(tds)}</tr>")
    legend = escape(LEGEND.replace("**", ""))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Compliance: implementations against the invariants</title><style>{STYLE}</style></head><body>"
            "<h1>Compliance: implementations against the invariants</h1>"
            f"<p>From {escape(source.replace('`', ''))} of {escape(_date(report, date))}; generated by "
            f"{escape(how.replace('`', ''))}.</p><p>{legend}</p>"
            f"<table><tr><th>implementation</th><th>version</th>{head}</tr>{''.join(rows)}</table>"
            "<h2>The invariants</h2><ul>"
            + "".join(f"<li><code>{escape(inv.id)}</code>: {escape(inv.statement)}</li>" for inv in invs)
            + "</ul></body></html>\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rbcheck.harness.compliance",
                                     description="The compliance page of a report's JSON (module doc).")
    parser.add_argument("report", help="conformance.json, or a recorded run ({'data': <report>, 'measured': date})")
    parser.add_argument("--out", required=True, help="directory for compliance.md and compliance.html")
    parser.add_argument("--bugs", default=None, help="JSON registry of findings {impl: {id: bug}} (optional)")
    args = parser.parse_args(argv)
    try:
        payload = json.loads(Path(args.report).read_text())
        bugs = json.loads(Path(args.bugs).read_text()) if args.bugs else None
    except (OSError, ValueError) as err:
        parser.error(f"{err}, but should be a report's JSON (and a JSON registry of findings)")
    report, date, source = payload, None, "a validate report"
    if "data" in payload and "rows" in payload["data"]:  # a recorded run (bench.results)
        report, date = payload["data"], payload.get("measured")
        source = f"`{payload.get('command', 'a recorded run')}`"
    if not {"rows", "order", "implementations"} <= set(report):
        parser.error(f"{args.report}: keys {sorted(report)}, but should hold rows, order and implementations")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    how = f"`python -m rbcheck.harness.compliance {' '.join(argv if argv is not None else sys.argv[1:])}`"
    (out / "compliance.md").write_text(render_compliance_markdown(report, bugs=bugs, date=date, source=source,
                                                                  how=how))
    (out / "compliance.html").write_text(render_compliance_html(report, bugs=bugs, date=date, source=source, how=how))
    print(f"wrote {out / 'compliance.md'} and {out / 'compliance.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
