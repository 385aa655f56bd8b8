"""The report as people read it, from its JSON (``report.build``): the
verdict and the failures first (each with its one-line counterexample and
its repro), then the implementations, the results grouped by behaviour (the
invariants of ``harness.invariants``), the skips folded into one line per
reason, and the details. :func:`render_text` is what ``rbcheck validate``
prints, :func:`render_markdown` is ``conformance.md``; both read only the
report's JSON, so a merged or recorded report renders the same. The JSON
keeps every cell; no "not declared" skip is listed row by row here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rbcheck.harness.invariants import CATALOGUE, base_id

__all__ = ["render_markdown", "render_text", "failures", "groups", "skip_folds", "verdict_line", "counts_text",
           "run_time_text", "settings_text", "incomplete_text", "robustness_text", "one_liner", "rerun_command"]

CELL_WIDTH_MD = 140
CELL_WIDTH_TEXT = 48
#: Outcomes listed as failures (a known failure that passed is one: its entry is stale).
FAILED = ("fail", "error", "xpass")
#: Outcomes of a test that ran and was judged on what the buffer did.
RAN = ("pass", "fail", "error", "xfail", "xpass")
#: The word a count of an outcome is said with.
WORD = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "xpass": "XPASS", "xfail": "known failure",
        "skip": "skip", "unavailable": "unavailable", "absent": "--"}
OTHER = "other"  # the group of a test no invariant names


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


# ---------------------------------------------------------------- pieces


def run_time_text(info: dict[str, Any]) -> str:
    """``"41.2 s (shrinking: at most 2 s per failing property)"`` or ``"--"``."""
    if info.get("seconds") is None:
        return "--"
    budget = info.get("shrink_seconds")
    bound = "unbounded (minimal counterexamples)" if budget is None else f"at most {budget:g} s per failing property"
    return f"{info['seconds']:.1f} s (shrinking: {bound})"


def settings_text(info: dict[str, Any]) -> str:
    """``"profile: ci; device: cpu"``, with where a setting came from when
    not from the arguments, the known-failures file and any ``RBCHECK_*``
    variable the run saw: everything that can change what was tested."""
    settings = info.get("settings") or {}
    if not settings:
        return "--"

    def said(key: str) -> str:
        where = settings.get(f"{key}_from", "")
        return f"{settings.get(key)}" + (f" (from {where})" if where.startswith("environment") else "")

    parts = [f"profile: {said('profile')}", f"device: {said('device')}"]
    if settings.get("known_failures"):
        parts.append(f"known failures: {Path(settings['known_failures']).name}")
    parts += [f"{k}={v}" for k, v in (settings.get("environment") or {}).items()]
    return "; ".join(parts)


def incomplete_text(info: dict[str, Any]) -> str:
    """``"the run did not complete: pytest exit status 4 (usage error): <error>"``
    for a run that stopped early, else ``""`` (the verdict: ``harness.verdict``)."""
    from rbcheck.harness.verdict import PYTEST_EXIT

    status = info.get("exitstatus")
    if status in (0, 1, None) and not info.get("errors"):
        return ""
    said = f"pytest exit status {status} ({PYTEST_EXIT.get(status, 'unknown')})" if status not in (0, 1) else ""
    return "the run did not complete: " + "; ".join([s for s in (said, *info.get("errors", [])) if s])


def robustness_text(counts: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{label}: {c['survived']}/{c['tried']} survived"
                     + (f" ({c['not_run']} not run)" if c["not_run"] else "")
                     for label, c in counts.items())


def counts_text(counts: dict[str, int]) -> str:
    """``"2 FAIL, 10 pass, 175 skip"``: failures first."""
    order = ["fail", "error", "xpass", "pass", "xfail", "unavailable", "skip"]
    keys = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ", ".join(f"{counts[k]} {WORD.get(k, k)}" for k in keys if counts[k]) or "--"


def one_liner(cell: dict[str, Any]) -> str:
    """A failure's counterexample on one line: ``<what>=<got>, but should be
    <expected>`` when the test recorded them (the call is in the repro),
    else its message."""
    if cell.get("what") and "expected" in cell:
        return f"{cell['what']}={cell.get('got', '')}, but should be {cell['expected']}"
    return " ".join(str(cell.get("message", "")).split())


def rerun_command(name: str, row_id: str) -> str:
    """``rbcheck validate NAME --only <file stem>::<test>``: the one property again."""
    file, _, test = row_id.partition("::")
    prop = f"{file.removesuffix('.py')}::{test.split('[', 1)[0]}"
    quoted = name if all(c.isalnum() or c in "-_.:" for c in name) else repr(name)
    return f"rbcheck validate {quoted} --only {prop}"


# ---------------------------------------------------------------- structure


def _invariants_by_property() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for inv in CATALOGUE:
        for prop in inv.properties:
            out.setdefault(prop, []).append(inv.id)
    return out


def invariants_of(row_id: str) -> list[str]:
    """The catalogue's invariants a row (``test_x.py::test_y[param]``) checks, in catalogue order."""
    file, _, test = row_id.partition("::")
    prop = f"{file.removesuffix('.py')}::{test}"
    table = _invariants_by_property()
    return list(dict.fromkeys(table.get(prop, []) + table.get(base_id(prop), [])))


@dataclass
class Group:
    """A behaviour (an invariant of the catalogue) and its rows."""

    id: str
    statement: str
    rows: list[dict[str, Any]] = field(default_factory=list)


def groups(report: dict[str, Any]) -> list[Group]:
    """The rows by behaviour: each row in the first invariant (catalogue
    order) that names it, then the rows no invariant names."""
    made = {inv.id: Group(inv.id, inv.statement) for inv in CATALOGUE}
    other = Group(OTHER, "tests the catalogue of invariants does not name")
    for row in report["rows"]:
        owners = invariants_of(row["id"])
        (made[owners[0]] if owners else other).rows.append(row)
    return [g for g in [*made.values(), other] if g.rows]


def group_of(row_id: str) -> str:
    owners = invariants_of(row_id)
    return owners[0] if owners else OTHER


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every failed cell (FAIL, ERROR, XPASS): ``{"n", "impl", "row",
    "cell", "group", "gating"}``, the gating implementations' first."""
    gated = set((report.get("verdict") or {}).get("gated", report["order"]))
    found = [{"impl": name, "row": row, "cell": row["cells"][name], "group": group_of(row["id"]),
              "gating": name in gated}
             for name in report["order"] for row in report["rows"]
             if row["cells"].get(name, {}).get("outcome") in FAILED]
    found.sort(key=lambda f: not f["gating"])
    for n, item in enumerate(found, 1):
        item["n"] = n
    return found


def known(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(impl, test, reason)`` of every known failure: declared, so not
    gating, but never out of sight."""
    return [(name, row["id"], cell_text_reason(row["cells"][name]))
            for name in report["order"] for row in report["rows"]
            if row["cells"].get(name, {}).get("outcome") == "xfail"]


def cell_text_reason(cell: dict[str, Any]) -> str:
    message = str(cell.get("message", ""))
    return message[len("known failure: "):] if message.startswith("known failure: ") else message


def not_ran(report: dict[str, Any]) -> list[tuple[str, str]]:
    """``(name, why)`` of each implementation that did not run or did not complete."""
    out = []
    for name in report["order"]:
        info = report["implementations"][name]
        if info["status"] != "ran":
            out.append((name, f"{info['status']}: {info['why']}"))
        elif incomplete_text(info):
            out.append((name, incomplete_text(info)))
    return out


def skip_folds(report: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """Per implementation, ``(reason, count)`` of its skips, most first."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name in report["order"]:
        reasons: dict[str, int] = {}
        for row in report["rows"]:
            cell = row["cells"].get(name, {})
            if cell.get("outcome") == "skip":
                reason = " ".join(str(cell.get("message", "")).split()) or "no reason given"
                reasons[reason] = reasons.get(reason, 0) + 1
        if reasons:
            out[name] = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return out


def group_counts(group: Group, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in group.rows:
        outcome = row["cells"].get(name, {}).get("outcome", "absent")
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def verdict_line(report: dict[str, Any]) -> str:
    """``"FAILED (exit 1): 6 failures in mine:broken; example: no failure"``."""
    verdict = report.get("verdict")
    found = failures(report)
    by_impl: dict[str, int] = {}
    for item in found:
        by_impl[item["impl"]] = by_impl.get(item["impl"], 0) + 1
    gating = {item["impl"] for item in found if item["gating"]}
    parts = [f"{n} failure{'s' if n > 1 else ''} in {name}" + ("" if name in gating else " (informational)")
             for name, n in by_impl.items()]
    parts += [f"{name} {why}" for name, why in not_ran(report)]
    clean = [n for n in report["order"] if n not in by_impl and n not in dict(not_ran(report))]
    if clean:
        parts.append(f"no failure in {', '.join(clean)}")
    head = (f"{verdict['verdict'].upper()} (exit {verdict['exit_status']})" if verdict
            else "FAILURES" if found or not_ran(report) else "NO FAILURES")
    return f"{head}: {'; '.join(parts)}"


def _coverage(report: dict[str, Any], name: str) -> str:
    return ((report.get("verdict") or {}).get("coverage") or {}).get(name, "")


def _kind(info: dict[str, Any]) -> str:
    return {"third party": " (third party)", "user": " (yours)"}.get(info.get("kind", ""), "")


def _result_text(info: dict[str, Any]) -> str:
    return f"{info['status']} ({info['why']})" if info["status"] != "ran" else counts_text(info["counts"])


# ---------------------------------------------------------------- text


def render_text(report: dict[str, Any]) -> str:
    """What ``rbcheck validate`` prints: the verdict and the failures first."""
    order, found = report["order"], failures(report)
    lines = [f"rbcheck conformance: {verdict_line(report)}", ""]
    if found:
        lines.append(f"Failures ({len(found)}; each one's repro is below):")
        for item in found:
            note = "" if item["gating"] else "  (informational: not gating)"
            lines.append(f"  {item['n']}. {item['impl']}  {item['row']['id']}  [{item['group']}]{note}")
            lines.append(f"     {_clip(one_liner(item['cell']), 300)}")
        lines.append("")
    listed = known(report)
    if listed:
        lines.append(f"Known failures ({len(listed)}; declared, not gating):")
        lines += [f"  {name}  {test}: known failure ({_clip(reason, 200)})" for name, test, reason in listed]
        lines.append("")
    for name, why in not_ran(report):
        lines.append(f"  {name}: {_clip(why, 300)}")
    lines.append("Implementations:")
    for name in order:
        info = report["implementations"][name]
        version = f" {info['version']}" if info.get("version") else ""
        lines.append(f"  {name}{version}{_kind(info)}: {_result_text(info)}"
                     + (f"; {_coverage(report, name).split(';', 1)[0]}" if _coverage(report, name) else "")
                     + (f"; {info['seconds']:.1f} s" if info.get("seconds") is not None else ""))
    for item in found:
        cell = item["cell"]
        lines += ["", f"Repro {item['n']}: {item['impl']} {item['row']['id']}"]
        for more in cell.get("failures", [])[1:]:
            lines.append(f"  also: {_clip(more, 300)}")
        if cell.get("detail"):
            lines.append(f"  {_clip(cell['detail'], 300)}")
        lines.append(f"  rerun: {rerun_command(item['impl'], item['row']['id'])}")
        for snippet in cell.get("repros", [])[:1]:
            lines += ["    " + line for line in snippet.splitlines()]
    lines += ["", "By behaviour (tests run; the invariants of harness/invariants.py):"]
    width = max([len("behaviour")] + [len(g.id) for g in groups(report)])
    lines.append("  " + "behaviour".ljust(width) + "  " + "  ".join(n[:CELL_WIDTH_TEXT].ljust(28) for n in order))
    for group in groups(report):
        cells = [counts_text({k: v for k, v in group_counts(group, n).items() if k != "skip"}) for n in order]
        if all(c == "--" for c in cells):
            continue
        lines.append(("  " + group.id.ljust(width) + "  " + "  ".join(c.ljust(28) for c in cells)).rstrip())
    folds = skip_folds(report)
    if folds:
        lines += ["", "Skipped, by reason:"]
        for name, reasons in folds.items():
            lines += [f"  {name}: {n} skipped: {reason}" for reason, n in reasons]
    lines.append("")
    for name in order:
        info = report["implementations"][name]
        if info["status"] != "ran":
            lines.append(f"{name}: {info['status']} ({info['why']})")
            continue
        lines.append(f"{name} {info['version']}: {counts_text(info['counts'])} ({run_time_text(info)})")
        lines.append(f"  settings: {settings_text(info)}")
        if incomplete_text(info):
            lines.append(f"  {incomplete_text(info)}")
        if info.get("robustness"):
            lines.append(f"  {robustness_text(info['robustness'])}")
        for cap, why in sorted(info["unavailable"].items()):
            lines.append(f"  unavailable: {cap}: {_clip(why, 160)}")
        for key, value in sorted((info.get("conventions") or {}).items()):
            lines.append(f"  convention: {key} = {_clip(value, 160)}")
        for row in report["rows"]:
            if row["cells"].get(name, {}).get("outcome") == "unavailable":
                lines.append(f"  unavailable: {row['id']}: {_clip(row['cells'][name]['text'], 160)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- markdown


def _short_cell(cell: dict[str, Any]) -> str:
    """A cell of the table by property: a skip says only "skipped" (its
    reason is folded below), the rest as ``report.build`` wrote it."""
    return "skipped" if cell.get("outcome") == "skip" else cell.get("text", "--")


def render_markdown(report: dict[str, Any]) -> str:
    """``conformance.md``: the verdict and the failures on the first screen."""
    order, found = report["order"], failures(report)
    lines = ["# Conformance report", "", f"**{verdict_line(report)}**", ""]
    if found:
        lines += [f"## Failures ({len(found)})", "",
                  "| # | implementation | test | behaviour | counterexample |", "|---|---|---|---|---|"]
        for item in found:
            note = " (informational)" if not item["gating"] else ""
            lines.append(f"| [{item['n']}](#failure-{item['n']}) | {item['impl']}{note} | `{item['row']['id']}` "
                         f"| {item['group']} | {_md_escape(_clip(one_liner(item['cell']), 300))} |")
        lines.append("")
    listed = known(report)
    if listed:
        lines += [f"## Known failures ({len(listed)}; declared, not gating)", ""]
        lines += [f"- {name} `{test}`: known failure ({_md_escape(reason)})" for name, test, reason in listed]
        lines.append("")
    for name, why in not_ran(report):
        lines.append(f"- **{name}**: {_md_escape(why)}")
    if not_ran(report):
        lines.append("")
    lines += ["## Implementations", "",
              "| implementation | version | result | ran | run time | settings |", "|---|---|---|---|---|---|"]
    for name in order:
        info = report["implementations"][name]
        ran = _coverage(report, name).split(";", 1)[0] or "--"
        lines.append(f"| {name}{_kind(info)} | {_md_escape(info['version'])} | {_md_escape(_result_text(info))} "
                     f"| {ran} | {run_time_text(info)} | {_md_escape(settings_text(info))} |")
    lines.append("")
    for item in found:
        cell = item["cell"]
        said = one_liner(cell) + (f" ({cell['detail']})" if cell.get("detail") else "")
        lines += [f'<a id="failure-{item["n"]}"></a>', "",
                  f"### Failure {item['n']}: {item['impl']} `{item['row']['id']}`", "",
                  _md_escape(" ".join(said.split())), ""]
        for more in cell.get("failures", [])[1:]:
            lines.append(f"- also: {_md_escape(more)}")
        lines += [f"- rerun: `{rerun_command(item['impl'], item['row']['id'])}`", ""]
        for snippet in cell.get("repros", [])[:1]:
            lines += ["```python", snippet.rstrip(), "```", ""]
    lines += ["## By behaviour", "",
              "Tests run per invariant of the catalogue (`harness/invariants.py`); skips are folded below.", "",
              "| behaviour | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for group in groups(report):
        cells = [counts_text({k: v for k, v in group_counts(group, n).items() if k != "skip"}) for n in order]
        if any(c != "--" for c in cells):
            lines.append(f"| {group.id} | " + " | ".join(cells) + " |")
    lines += ["", "## Results by property", "",
              "The tests some implementation ran, by behaviour; rows every implementation skipped are only counted "
              "under \"Skipped, by reason\" (the JSON holds every cell).", "",
              "| property | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for group in groups(report):
        shown = [row for row in group.rows
                 if any(row["cells"].get(n, {}).get("outcome") not in ("skip", "absent") for n in order)]
        if not shown:
            continue
        lines.append(f"| **{group.id}**: {_md_escape(_clip(group.statement, 200))} |" + " |" * len(order))
        for row in shown:
            cells = [_md_escape(_clip(_short_cell(row["cells"][n]), CELL_WIDTH_MD)) for n in order]
            lines.append(f"| `{row['id']}` | " + " | ".join(cells) + " |")
    folds = skip_folds(report)
    if folds:
        lines += ["", "## Skipped, by reason", ""]
        for name, reasons in folds.items():
            lines += [f"- {name}: {n} skipped: {_md_escape(reason)}" for reason, n in reasons]
    labels = list(next((info["robustness"] for info in report["implementations"].values()
                        if info.get("robustness")), {}))
    if labels:
        lines += ["", "## Bad input and faults", "",
                  "Cases tried (run) and survived (refused with nothing lost, or loaded exactly).", "",
                  "| implementation | " + " | ".join(f"{label}: survived / tried" for label in labels)
                  + " | not run |", "|---" * (len(labels) + 2) + "|"]
        for name in order:
            info = report["implementations"][name]
            counts = info.get("robustness") or {}
            if info["status"] != "ran" or not counts:
                lines.append(f"| {name} | " + " | ".join("--" for _ in labels) + f" | {info['status']} |")
                continue
            cells = [f"{counts[label]['survived']} / {counts[label]['tried']}" for label in labels]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {sum(c['not_run'] for c in counts.values())} |")
    lines += ["", "## Implementations in detail", ""]
    for name in order:
        info = report["implementations"][name]
        lines += [f"### {name}", ""]
        if info["status"] != "ran":
            lines.append(f"- {info['status']}: {info['why']}")
        else:
            if incomplete_text(info):
                lines.append(f"- {_md_escape(incomplete_text(info))}")
            lines.append(f"- version: {info['version']}")
            if _coverage(report, name):
                lines.append(f"- coverage: {_md_escape(_coverage(report, name))}")
            lines.append(f"- capabilities: {', '.join(info['capabilities']) or '(none)'}")
            for cap, why in sorted(info["unavailable"].items()):
                lines.append(f"- unavailable: {cap}: {why}")
            conventions = info.get("conventions") or {}
            if conventions:
                lines.append(f"- declared conventions ({info.get('under_convention', 0)} results "
                             "checked under them, marked [convention: ...]):")
                lines += [f"  - {k} = {_md_escape(v)}" for k, v in sorted(conventions.items())]
            else:
                lines.append("- declared conventions: none (the spec's rules)")
            for warning in info["warnings"]:
                lines.append(f"- warning: {warning}")
        lines.append("")
    return "\n".join(lines)
