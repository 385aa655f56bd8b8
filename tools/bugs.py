"""The registry of judged third-party failures (docs/bugs.toml): load it, check
every entry, and generate docs/findings.md's tables from it.

    python -m tools.bugs              # check the registry; print what it holds
    python -m tools.bugs --check      # also exit 1 when docs/findings.md is not what the registry generates
    python -m tools.bugs --write      # rewrite docs/findings.md's generated part (between its markers)
    python -m tools.bugs --compliance FILE   # write the {column: {property: finding}} JSON that
                                             # python -m rbcheck.harness.compliance --bugs FILE reads

An entry is one judged FAIL of a third-party column (docs/bugs.toml's header
gives the fields): a real bug (kind "bug": the library's source line and an
executed repro in tests/thirdparty/, a strict xfail), a documented convention
(kind "convention": the adapter declares it, or a known-failure entry holds it)
or a harness bug found through a column and fixed in rbcheck (kind "harness").
The checks (:func:`problems`): the fields are there with their types; ids are
unique; ``invariant`` is an id of the catalogue (harness/invariants.py);
``properties`` are property ids (``rbcheck.runner.properties()``, a ``[case]``
allowed after one); ``columns`` are record names (harness/records.py); a bug's
``repro`` names a test function of tests/thirdparty/ marked
``xfail(strict=True)``, checked by reading the file (``ast``), so no library
has to be installed. ``nox -s thirdparty`` checks the other half: every repro
was collected there (tests/thirdparty/test_registered_repros.py).

Standard library only (Python 3.11's tomllib), beside rbcheck's own
catalogue, records and property list. tests/test_bugs.py runs the checks and
fails when docs/findings.md is not what the registry generates.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

import tomllib

from tools.generated import check_or_write

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "bugs.toml"
FINDINGS = ROOT / "docs" / "findings.md"
THIRDPARTY = "tests/thirdparty/"

KINDS = ("bug", "convention", "harness")
#: field -> (type, required non-empty)
FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "id": (str, True), "library": (str, True), "versions": (str, True), "columns": (list, False),
    "kind": (str, True), "invariant": (str, True), "properties": (list, False), "summary": (str, True),
    "source": (str, False), "repro": ((str, list), False), "upstream": (str, False), "status": (str, True),
}
STATUS = re.compile(r"open|reported|documented|fixed in \S.*")
BEGIN = "<!-- generated from docs/bugs.toml by python -m tools.bugs --write: begin -->"
END = "<!-- generated from docs/bugs.toml by python -m tools.bugs --write: end -->"
KIND_TITLES = {"bug": "Real bugs", "convention": "Documented conventions",
               "harness": "Harness bugs found through a column, and fixed"}


def load(path: Path = REGISTRY) -> list[dict]:
    """The registry's entries (``[[bug]]`` tables), in file order."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    extra = sorted(set(data) - {"bug"})
    if extra:
        raise ValueError(f"{path}: top-level keys {extra}, but should be only [[bug]] tables")
    return list(data.get("bug", []))


def repros(entry: dict) -> list[str]:
    """The entry's repro test ids (``repro`` is one id or a list of them; "" for none)."""
    value = entry.get("repro", "")
    return [value] if isinstance(value, str) and value else [v for v in value if v] if isinstance(value, list) else []


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def sort_key(entry: dict) -> tuple:
    return (entry.get("library", "").lower(), _natural(entry.get("id", "")))


# --- the static check of a repro: a test function marked xfail(strict=True) ----------------------


def _is_strict_xfail(node: ast.AST | None) -> bool:
    """Whether ``node`` is a call ``....xfail(..., strict=True, ...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "xfail" and any(k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is True
                                   for k in node.keywords)


def strict_xfails(path: Path) -> dict[str, bool]:
    """``{test function: marked xfail(strict=True)}`` for the module-level test
    functions of ``path``: by a decorator ``pytest.mark.xfail(strict=True, ...)``,
    by a call of a module-level helper that returns one (``@bug("...")``), or by
    the module's ``pytestmark``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    helpers = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
               and any(isinstance(n, ast.Return) and _is_strict_xfail(n.value) for n in ast.walk(node))}

    def strict(dec: ast.AST) -> bool:
        return _is_strict_xfail(dec) or (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name)
                                         and dec.func.id in helpers)

    module_marks = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            module_marks += node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
    whole_module = any(strict(mark) for mark in module_marks)
    return {node.name: whole_module or any(strict(dec) for dec in node.decorator_list) for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")}


def _repro_problem(repro: str, *, strict_needed: bool, root: Path) -> str | None:
    file, sep, func = repro.partition("::")
    func = func.split("[", 1)[0]
    if not sep or not file.startswith(THIRDPARTY) or not file.endswith(".py") or not func:
        return f"repro={repro!r}, but should be {THIRDPARTY}<file>.py::<test function>"
    path = root / file
    if not path.is_file():
        return f"repro={repro!r}: no file {file}"
    found = strict_xfails(path)
    if func not in found:
        return f"repro={repro!r}: {file} has no test function {func}"
    if strict_needed and not found[func]:
        return f"repro={repro!r} is not marked xfail(strict=True), but should be (a bug's repro fails while the bug is there)"
    return None


# --- the checks ------------------------------------------------------------------------------------


def _known() -> tuple[set[str], set[str], set[str]]:
    """(invariant ids, property ids, record names)."""
    from rbcheck import runner
    from rbcheck.harness import invariants, records

    return set(invariants.BY_ID), set(runner.properties()), set(records.RECORDS)


def problems(entries: list[dict], *, root: Path = ROOT) -> list[str]:
    """Every problem of the registry, one line each naming the entry and the
    field (empty when it is sound)."""
    invariant_ids, property_ids, record_names = _known()
    out: list[str] = []
    seen: dict[str, int] = {}
    for n, entry in enumerate(entries):
        where = f"entry {n + 1} (id={entry.get('id', '?')!r})"
        for key in sorted(set(entry) - set(FIELDS)):
            out.append(f"{where}: unknown field {key!r}, but should be one of {', '.join(FIELDS)}")
        for key, (kind, non_empty) in FIELDS.items():
            if key not in entry:
                out.append(f"{where}: no {key!r} field, but every entry has one")
            elif not isinstance(entry[key], kind):
                out.append(f"{where}: {key}={entry[key]!r}, but should be a {getattr(kind, '__name__', 'string or list')}")
            elif non_empty and not entry[key]:
                out.append(f"{where}: {key} is empty, but should be given")
            elif isinstance(entry[key], list) and not all(isinstance(v, str) for v in entry[key]):
                out.append(f"{where}: {key}={entry[key]!r}, but should be a list of strings")
        if not all(k in entry and isinstance(entry[k], kind) for k, (kind, _) in FIELDS.items()):
            continue  # the checks below read every field
        ident = entry["id"]
        if ident in seen:
            out.append(f"{where}: id {ident!r} is also entry {seen[ident] + 1}'s, but ids are unique")
        seen.setdefault(ident, n)
        if entry["kind"] not in KINDS:
            out.append(f"{where}: kind={entry['kind']!r}, but should be one of {', '.join(KINDS)}")
        if entry["invariant"] not in invariant_ids:
            out.append(f"{where}: invariant={entry['invariant']!r}, but should be an id of harness/invariants.py's "
                       f"catalogue (python -m rbcheck.harness.invariants)")
        for prop in entry["properties"]:
            if prop.split("[", 1)[0] not in property_ids:
                out.append(f"{where}: property {prop!r} is no property id, but should be <file stem>::<test> "
                           f"(rbcheck list)")
        for column in entry["columns"]:
            if column not in record_names:
                out.append(f"{where}: column {column!r} is no record name, but should be one of harness/records.py's")
        if not STATUS.fullmatch(entry["status"]):
            out.append(f"{where}: status={entry['status']!r}, but should be open, reported, documented or "
                       f"'fixed in <version>'")
        if entry["upstream"] and not entry["upstream"].startswith("https://"):
            out.append(f"{where}: upstream={entry['upstream']!r}, but should be a https:// link or \"\"")
        if entry["kind"] in ("bug", "convention") and not entry["source"]:
            out.append(f"{where}: source is empty, but a {entry['kind']} names the library's source (file:line)")
        tests = repros(entry)
        if entry["kind"] == "bug" and not tests:
            out.append(f"{where}: repro is empty, but a bug has an executed repro in {THIRDPARTY} (a strict xfail)")
        for test in tests:
            problem = _repro_problem(test, strict_needed=entry["kind"] == "bug", root=root)
            if problem:
                out.append(f"{where}: {problem}")
    return out


# --- docs/findings.md ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code_list(items: list[str], prefix: str = "") -> str:
    return "<br>".join(f"`{item.removeprefix(prefix)}`" for item in items) or "-"


def _upstream(url: str) -> str:
    if not url:
        return "-"
    m = re.match(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", url)
    return f"[{m.group(1)}#{m.group(2)}]({url})" if m else f"<{url}>"


def _library_title(entries: list[dict]) -> str:
    versions = sorted({e["versions"] for e in entries})
    return f"{entries[0]['library']} {', '.join(versions)}"


def _by_library(entries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for entry in sorted(entries, key=sort_key):
        groups.setdefault(entry["library"], []).append(entry)
    return groups


def _table(entries: list[dict], kind: str) -> list[str]:
    if kind == "bug":
        head = ["id", "summary", "invariant", "columns", "source", "repro (`tests/thirdparty/`)", "upstream", "status"]
    elif kind == "convention":
        head = ["id", "summary", "invariant", "columns", "source", "status"]
    else:
        head = ["id", "summary", "invariant", "columns"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        row = [f'<a id="{e["id"].lower()}"></a>{e["id"]}', _cell(e["summary"]), f"`{e['invariant']}`",
               _code_list(e["columns"])]
        if kind != "harness":
            row.append(f"`{_cell(e['source'])}`" if e["source"] else "-")
        if kind == "bug":
            row += [_code_list(repros(e), THIRDPARTY), _upstream(e["upstream"]), e["status"]]
        elif kind == "convention":
            row.append(e["status"])
        lines.append("| " + " | ".join(row) + " |")
    return lines


def generated(entries: list[dict]) -> str:
    """The generated part of docs/findings.md: counts, then one table per
    library and kind."""
    groups = _by_library(entries)
    lines = ["## Counts", "",
             "| library | versions | real bugs | open | conventions | harness bugs |", "|---|---|---|---|---|---|"]
    total = dict.fromkeys(("bug", "open", "convention", "harness"), 0)
    for library, items in groups.items():
        count = {k: sum(e["kind"] == k for e in items) for k in KINDS}
        count["open"] = sum(e["kind"] == "bug" and e["status"] in ("open", "reported") for e in items)
        for k in total:
            total[k] += count[k]
        lines.append(f"| {library} | {', '.join(sorted({e['versions'] for e in items}))} | {count['bug']} | "
                     f"{count['open']} | {count['convention']} | {count['harness']} |")
    lines.append(f"| **all** | | **{total['bug']}** | **{total['open']}** | **{total['convention']}** | "
                 f"**{total['harness']}** |")
    lines += ["", "\"open\" counts the real bugs still there in the versions named (status open or reported)."]
    for kind in KINDS:
        lines += ["", f"## {KIND_TITLES[kind]}"]
        for library, items in groups.items():
            chosen = [e for e in items if e["kind"] == kind]
            if chosen:
                lines += ["", f"### {_library_title(chosen)}" if kind != "harness" else f"### {library}", ""]
                lines += _table(chosen, kind)
    return "\n".join(lines) + "\n"


def findings_text(text: str, entries: list[dict]) -> str:
    """``text`` (docs/findings.md) with its generated part replaced."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"docs/findings.md has no generated part, but should hold the markers {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{generated(entries)}\n{END}{tail}"


def compliance_registry(entries: list[dict]) -> dict[str, dict[str, dict[str, str]]]:
    """``{column: {property id: {"id", "url"}}}`` for harness/compliance.py's
    ``--bugs`` (bugs first, then conventions; the first entry naming a cell wins)."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for kind in ("bug", "convention"):
        for e in sorted(entries, key=sort_key):
            if e["kind"] != kind:
                continue
            for column in e["columns"]:
                for prop in e["properties"] or [e["invariant"]]:
                    out.setdefault(column, {}).setdefault(prop, {"id": e["id"],
                                                                 "url": f"../findings.md#{e['id'].lower()}"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="exit 1 when docs/findings.md differs from the registry's")
    action.add_argument("--write", action="store_true", help="rewrite docs/findings.md's generated part")
    action.add_argument("--compliance", type=Path, default=None, help="write the compliance page's --bugs JSON here")
    parser.add_argument("--registry", type=Path, default=REGISTRY)
    parser.add_argument("--findings", type=Path, default=FINDINGS)
    args = parser.parse_args(argv)
    entries = load(args.registry)
    found = problems(entries)
    for line in found:
        print(f"{args.registry}: {line}", file=sys.stderr)
    if found:
        return 1
    if args.compliance:
        args.compliance.write_text(json.dumps(compliance_registry(entries), indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.compliance}")
        return 0
    if not (args.check or args.write):
        kinds = {k: sum(e["kind"] == k for e in entries) for k in KINDS}
        print(f"{args.registry}: {len(entries)} entries ({', '.join(f'{v} {k}' for k, v in kinds.items())}), all sound")
        return 0
    text = args.findings.read_text()
    wanted = findings_text(text, entries)
    return check_or_write(args.findings, text, wanted, args.check, "the generated part is the registry's",
                          "the generated part differs from the registry's (python -m tools.bugs --write)")


if __name__ == "__main__":
    sys.exit(main())
