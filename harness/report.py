"""The conformance report: every property against every implementation.

    python -m rbcheck.harness.report [--impl NAME ...] [--out reports/] [--profile ci]

(``rbcheck validate`` is the command for users; this module holds the
table and is kept for ``--from-results``.)

For each implementation (default: every built-in name) the conformance suite
(``rbcheck.conformance``) runs in its own pytest subprocess with
``--rbcheck-results``; an implementation whose adapter does not load is a
column of "unavailable (why)". The table (property x implementation) is
printed and written to ``<out>/conformance.md`` and ``<out>/conformance.json``.
Each cell is one of::

    pass | FAIL (<one-line counterexample>) | skipped (<reason>)
    | unavailable (<capability>: <why>) | known failure (<reason>)
    | XPASS (<reason>)  -- a known failure that passed: update the list
    | not run | -- (the implementation's run did not collect it)

A cell of a property checked under a declared convention that differs from
the spec reads ``pass [convention: name=value; ...]`` (or ``FAIL [...] (...)``); each implementation's
declared conventions (with their notes) are listed under "Implementations".

Exit status: the verdict rule of ``rbcheck validate``
(``rbcheck.harness.verdict``), the same for the same results: 0 when every
implementation passed everything it ran, apart from declared known failures;
1 when one failed or passed a known failure (XPASS); 2 when a run did not
complete (a pytest usage, collection or internal error, an interrupt, a test
not run, a crash) or an adapter did not load. ``--third-party-informational``
reports the built-in third-party adapters' failures (``torchrl``, ...)
without letting them set the exit status, as ``rbcheck validate`` does.
``--from-results NAME=PATH`` builds the report from existing results files
instead of running pytest. ``--merge DIR`` builds it from the per-implementation
parts that ``rbcheck validate --parts DIR`` wrote (``nox -s validate``: one
environment per group of libraries that install together); every
implementation asked for (``--impl``, default every built-in name) must have a
part, and one without is a column of "not run" that aborts the verdict (exit 2).
``--must-load`` makes an adapter that did not load abort the verdict even under
``--third-party-informational`` (for runs whose environments install every
library, as ``nox -s validate`` does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rbcheck.harness.adapters import BUILTIN, builtin_names

# ImplResult and the cell text live in outcomes (shared with the verdict and
# the runners without an import cycle); imported here under their old names
from rbcheck.harness.outcomes import NOT_RUN, TRIED, ImplResult, cell_text
from rbcheck.harness.plugin.known_failures import suite_relative

#: Built-in names of third-party buffers (from the one table of built-ins).
THIRD_PARTY = frozenset(name for name, entry in BUILTIN.items() if not entry.first_party)
#: Catalogues of bad inputs and faults, summarised per implementation (file -> label).
ROBUSTNESS = {"test_bad_input.py": "bad input", "test_checkpoint_faults.py": "checkpoint faults"}
CELL_WIDTH_MD = 140
CELL_WIDTH_TEXT = 48


def is_third_party(name: str) -> bool:
    """A built-in adapter of another library's buffer (a user's own
    ``pkg.module:factory`` is neither rbcheck's nor a third party's)."""
    return name in THIRD_PARTY


def kind_of(name: str) -> str:
    """``"first party"`` (rbcheck's own built-ins), ``"third party"`` (the
    built-in adapters of other libraries) or ``"user"`` (``pkg.module:factory``)."""
    if name in BUILTIN:
        return "third party" if name in THIRD_PARTY else "first party"
    return "user"


def row_id(nodeid: str) -> str:
    """A test's row in the table: its node id relative to the suite."""
    return suite_relative(nodeid)


def robustness(result: ImplResult) -> dict[str, dict[str, int]]:
    """Per catalogue: cases ``tried`` (run, whatever the outcome), ``survived``
    (passed: refused with nothing lost) and ``not_run`` (skipped or unavailable)."""
    out = {label: {"tried": 0, "survived": 0, "not_run": 0} for label in ROBUSTNESS.values()}
    for test in result.tests:
        label = ROBUSTNESS.get(row_id(test["nodeid"]).split("::", 1)[0].rsplit("/", 1)[-1])
        if label is None:
            continue
        if test["outcome"] in TRIED:
            out[label]["tried"] += 1
            out[label]["survived"] += test["outcome"] in ("pass", "xpass")
        else:
            out[label]["not_run"] += 1
    return out


def robustness_text(counts: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{label}: {c['survived']}/{c['tried']} survived"
                     + (f" ({c['not_run']} not run)" if c["not_run"] else "")
                     for label, c in counts.items())


def build(results: list[ImplResult]) -> dict[str, Any]:
    """The report as plain data (what conformance.json holds)."""
    rows: dict[str, dict[str, Any]] = {}
    for result in results:
        for test in result.tests:
            rid = row_id(test["nodeid"])
            row = rows.setdefault(rid, {"id": rid, "property": test.get("property", rid),
                                        "doc": test.get("doc", ""), "cells": {}})
            conventions = dict(test.get("conventions") or {})
            row["cells"][result.name] = {
                "outcome": test["outcome"],
                "message": test.get("message", ""),
                "failures": list(test.get("failures") or []),
                "conventions": conventions,
                "text": cell_text(test["outcome"], test.get("message", ""), conventions)
                + (f" (+{len(test['failures']) - 1} more distinct failures)"
                   if len(test.get("failures") or []) > 1 else ""),
            }
    for row in rows.values():
        for result in results:
            if result.name in row["cells"]:
                continue
            if result.status == "ran":
                cell = {"outcome": "absent", "message": "", "text": "--"}
            else:
                cell = {"outcome": result.status, "message": result.why,
                        "text": f"{result.status} ({result.why})"}
            row["cells"][result.name] = cell
    implementations = {}
    for result in results:
        counts: dict[str, int] = {}
        for test in result.tests:
            counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
        under = sum(1 for t in result.tests if t.get("conventions") and t["outcome"] in TRIED)
        implementations[result.name] = {
            "status": result.status,
            "why": result.why,
            "version": result.version,
            "third_party": is_third_party(result.name),
            "kind": kind_of(result.name),
            "capabilities": result.capabilities,
            "unavailable": result.unavailable,
            "conventions": result.conventions,
            "under_convention": under,
            "exitstatus": result.exitstatus,
            "errors": result.errors,
            "seconds": result.seconds,
            "shrink_seconds": result.shrink_seconds,
            "settings": result.settings,
            "warnings": result.warnings,
            "counts": counts,
            "robustness": robustness(result),
        }
    return {
        "implementations": implementations,
        "order": [r.name for r in results],
        "rows": list(rows.values()),
    }


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


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


def render_markdown(report: dict[str, Any]) -> str:
    order = report["order"]
    lines = ["# Conformance report", ""]
    lines.append("| implementation | version | result | run time | settings |")
    lines.append("|---|---|---|---|---|")
    for name in order:
        info = report["implementations"][name]
        if info["status"] != "ran":
            summary = f"{info['status']} ({info['why']})"
        else:
            summary = ", ".join(f"{n} {k}" for k, n in sorted(info["counts"].items()))
        kind = {"third party": " (third party)", "user": " (yours)"}.get(info.get("kind", ""), "")
        lines.append(f"| {name}{kind} | {_md_escape(info['version'])} | {_md_escape(summary)} "
                     f"| {run_time_text(info)} | {_md_escape(settings_text(info))} |")
    lines += ["", "| property | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for row in report["rows"]:
        cells = [_md_escape(_clip(row["cells"][n]["text"], CELL_WIDTH_MD)) for n in order]
        lines.append(f"| `{row['id']}` | " + " | ".join(cells) + " |")
    lines += ["", "## Bad input and faults", "",
              "Cases tried (run) and survived (refused with nothing lost, or loaded exactly).", "",
              "| implementation | " + " | ".join(f"{label}: survived / tried" for label in ROBUSTNESS.values())
              + " | not run |", "|---" * (len(ROBUSTNESS) + 2) + "|"]
    for name in order:
        info = report["implementations"][name]
        counts = info.get("robustness") or {}
        if info["status"] != "ran" or not counts:
            lines.append(f"| {name} | " + " | ".join("--" for _ in ROBUSTNESS) + f" | {info['status']} |")
            continue
        cells = [f"{counts[label]['survived']} / {counts[label]['tried']}" for label in ROBUSTNESS.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {sum(c['not_run'] for c in counts.values())} |")
    lines += ["", "## Implementations", ""]
    for name in order:
        info = report["implementations"][name]
        lines.append(f"### {name}")
        lines.append("")
        if info["status"] != "ran":
            lines.append(f"- {info['status']}: {info['why']}")
        else:
            if incomplete_text(info):
                lines.append(f"- {_md_escape(incomplete_text(info))}")
            lines.append(f"- version: {info['version']}")
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
    details = [
        (row["id"], name, row["cells"][name])
        for row in report["rows"]
        for name in order
        if row["cells"][name]["outcome"] in ("fail", "error", "xpass")
    ]
    if details:
        lines += ["## Failures in full", "", "Every distinct failure of a property (Hypothesis may find several).", ""]
        for rid, name, cell in details:
            lines.append(f"- **{name}** `{rid}`: {_md_escape(cell['text'])}")
            for more in cell.get("failures", [])[1:]:
                lines.append(f"  - also: {_md_escape(more)}")
        lines.append("")
    return "\n".join(lines)


def render_text(report: dict[str, Any]) -> str:
    order = report["order"]
    width = max([len("property")] + [len(r["id"]) for r in report["rows"]])
    head = "property".ljust(width) + "  " + "  ".join(n[:CELL_WIDTH_TEXT].ljust(CELL_WIDTH_TEXT) for n in order)
    lines = [head, "-" * len(head)]
    for row in report["rows"]:
        cells = [_clip(row["cells"][n]["text"], CELL_WIDTH_TEXT).ljust(CELL_WIDTH_TEXT) for n in order]
        lines.append(row["id"].ljust(width) + "  " + "  ".join(cells).rstrip())
    lines.append("")
    for name in order:
        info = report["implementations"][name]
        if info["status"] != "ran":
            lines.append(f"{name}: {info['status']} ({info['why']})")
        else:
            counts = ", ".join(f"{n} {k}" for k, n in sorted(info["counts"].items()))
            lines.append(f"{name} {info['version']}: {counts} ({run_time_text(info)})")
            lines.append(f"  settings: {settings_text(info)}")
            if incomplete_text(info):
                lines.append(f"  {incomplete_text(info)}")
            if info.get("robustness"):
                lines.append(f"  {robustness_text(info['robustness'])}")
            for cap, why in sorted(info["unavailable"].items()):
                lines.append(f"  unavailable: {cap}: {_clip(why, 160)}")
            for key, value in sorted((info.get("conventions") or {}).items()):
                lines.append(f"  convention: {key} = {_clip(value, 160)}")
    return "\n".join(lines)


def run_one(name: str, profile: str, extra: list[str], workdir: Path, *, only: tuple[str, ...] | list[str] = (),
            known_failures: Path | None = None, progress: bool = False, device: str = "cpu") -> ImplResult:
    """Run the suite against ``name`` in an isolated subprocess
    (``rbcheck.runner``), with the working directory on the path; what
    ``rbcheck validate`` runs too. The adapter is loaded there, never here (so
    this process imports neither torch nor the library): a subprocess whose
    adapter did not load says why in its results file, and the result is
    "unavailable". A name that cannot be an adapter is answered here."""
    from rbcheck import runner
    from rbcheck.harness import adapters

    if name not in adapters.BUILTIN and ":" not in name:
        try:
            adapters.load_adapter(name)  # raises at once: neither a built-in nor pkg.module:factory
        except Exception as err:  # noqa: BLE001 - the verdict says the adapter did not load
            return ImplResult(name=name, status="unavailable", why=" ".join(f"{type(err).__name__}: {err}".split()))
    return runner.run_subprocess(name, profile=profile, workdir=workdir, only=only, known_failures=known_failures,
                          extra=extra, pythonpath=[os.getcwd()], progress=progress, device=device)


def run_many(names: list[str], profile: str, extra: list[str], workdir: Path, *, jobs: int = 1,
             only: tuple[str, ...] | list[str] = (), known_failures: Path | None = None, progress: bool = False,
             start: Callable[[str], None] | None = None,
             done: Callable[[ImplResult], None] | None = None, device: str = "cpu") -> list[ImplResult]:
    """:func:`run_one` for each name, ``jobs`` at a time: each run is its own
    pytest process (a worker), in a directory of its own under ``workdir``
    (its ini file, Hypothesis database and ``--basetemp``), so concurrent runs
    share no file. With ``jobs > 1`` each worker gets ``cores // jobs``
    intra-op threads (``OMP_NUM_THREADS``, unless the caller set it), so the
    workers do not oversubscribe the machine. The results come back in the
    order of ``names``; ``start(name)`` and ``done(result)`` are called as each
    run starts and ends (from the worker's thread)."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}, but should be an int >= 1")

    def one(i: int, name: str) -> ImplResult:
        own = workdir / f"{i:03d}"
        own.mkdir(parents=True, exist_ok=True)
        args = [*extra, f"--basetemp={own / 'tmp'}"] if jobs > 1 else list(extra)
        if start is not None:
            start(name)
        result = run_one(name, profile, args, own, only=only, known_failures=known_failures, progress=progress,
                         device=device)
        if done is not None:
            done(result)
        return result

    if jobs == 1 or len(names) <= 1:
        return [one(i, name) for i, name in enumerate(names)]
    workers = min(jobs, len(names))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is None:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rbcheck-run") as pool:
            futures = [pool.submit(one, i, name) for i, name in enumerate(names)]
            try:
                return [future.result() for future in futures]
            except BaseException:  # interrupted: no new run starts, the runs under way stop
                pool.shutdown(wait=False, cancel_futures=True)
                from rbcheck import runner

                runner.stop_all()
                raise
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def part_path(directory: Path, name: str) -> Path:
    """Where :func:`write_part` puts ``name``'s part: a file name that keeps
    the name readable and cannot collide (``pkg.mod:f`` and ``pkg.mod_f`` differ)."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in name)
    return directory / f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}.json"


def write_part(result: ImplResult, directory: Path) -> Path:
    """Write one implementation's result to ``directory`` (a part of a merged
    report); atomic, so a merge never reads half a part."""
    directory.mkdir(parents=True, exist_ok=True)
    path = part_path(directory, result.name)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_part(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_parts(directory: Path) -> dict[str, ImplResult]:
    """Every part under ``directory`` (searched recursively: one folder per
    environment is fine), by implementation name. A part that does not parse,
    or two parts of one name, is a ValueError naming the files."""
    found: dict[str, tuple[Path, ImplResult]] = {}
    for path in sorted(directory.rglob("*.json")):
        try:
            result = ImplResult.from_part(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"part {path}: {err}") from err
        if result.name in found:
            raise ValueError(f"parts {found[result.name][0]} and {path} both hold {result.name!r}, "
                             f"but each implementation should have one part")
        found[result.name] = (path, result)
    return {name: result for name, (_, result) in found.items()}


def merge(directory: Path, names: Iterable[str] | None = None) -> list[ImplResult]:
    """The results of ``names`` (default: every built-in name, then any other
    part found) from the parts under ``directory``. A name without a part is a
    result of status ``"not run"``: never a pass, and it aborts the verdict."""
    parts = read_parts(directory) if directory.is_dir() else {}
    wanted = list(dict.fromkeys(names)) if names is not None else builtin_names() + sorted(
        set(parts) - set(builtin_names()))
    return [parts.get(name) or ImplResult(name=name, status=NOT_RUN,
                                          why=f"no results for it in {directory}: its environment did not run "
                                              f"or did not finish")
            for name in wanted]


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file beside ``path`` and rename it over
    ``path``: a link at ``path`` is replaced, never followed, so nothing
    outside the report's directory is written; a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def conclude(results: list[ImplResult], *, informational: set[str] = frozenset(), out: Path | None = None,
             report: dict[str, Any] | None = None, must_load: Iterable[str] = ()) -> int:
    """Print the report and the verdict (``rbcheck.harness.verdict``) of
    ``results``, write ``out/conformance.md`` and ``.json`` when ``out`` is
    given, and return the exit status: the end of ``rbcheck validate`` and of
    this module's ``main``, so both give the same verdict."""
    from rbcheck.harness.verdict import decide, explain

    from rbcheck.harness.verdict import as_json

    report = build(results) if report is None else report
    decision = decide(results, informational, must_load=must_load)
    report["verdict"] = as_json(decision)
    print(render_text(report))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        replace_file(out / "conformance.md", render_markdown(report) + "\n")
        replace_file(out / "conformance.json", json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {out / 'conformance.md'} and {out / 'conformance.json'}")
    stdout, stderr = explain(decision, {r.name: r.output for r in results})
    if stderr:
        print(stderr, file=sys.stderr, flush=True)
    if stdout:
        print(stdout)
    return decision.code


def main(argv: list[str] | None = None, prog: str = "python -m rbcheck.harness.report") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", action="append", default=None,
                        help="implementation to include (repeatable; default: every built-in name)")
    parser.add_argument("--out", default="reports", help="directory for conformance.md/.json")
    parser.add_argument("--profile", default=os.environ.get("RBCHECK_PROFILE", "ci"),
                        help="Hypothesis profile for the runs (default ci)")
    parser.add_argument("--from-results", action="append", default=[], metavar="NAME=PATH",
                        help="use an existing --rbcheck-results file instead of running pytest")
    parser.add_argument("--pytest-arg", action="append", default=[],
                        help="extra argument passed to every pytest run (repeatable)")
    parser.add_argument("--third-party-informational", action="store_true",
                        help="failures of the built-in third-party adapters do not set the exit status")
    parser.add_argument("--merge", metavar="DIR", default=None,
                        help="build the report from the parts `rbcheck validate --parts` wrote under DIR; an "
                        "implementation asked for (--impl, default every built-in) without a part is 'not run' "
                        "(exit 2)")
    parser.add_argument("--must-load", action="store_true",
                        help="an adapter that did not load sets the exit status (2) even with "
                        "--third-party-informational: its library should have been installed")
    args = parser.parse_args(argv)

    results: list[ImplResult] = []
    if args.merge is not None:
        if args.from_results:
            parser.error("--merge and --from-results, but should be one of them")
        if not Path(args.merge).is_dir():
            parser.error(f"--merge={args.merge!r} is not a directory, but should hold the parts of "
                         f"`rbcheck validate --parts DIR`")
        try:
            results = merge(Path(args.merge), args.impl)
        except ValueError as err:
            parser.error(f"--merge: {err}")
    elif args.from_results:
        for entry in args.from_results:
            name, sep, path = entry.partition("=")
            if not sep:
                parser.error(f"--from-results={entry!r}, but should be NAME=PATH")
            try:
                payload = json.loads(Path(path).read_text())
            except (OSError, ValueError) as err:
                parser.error(f"--from-results {name}={path}: {err}, but should be a --rbcheck-results JSON file")
            results.append(ImplResult.from_results(name, payload))
    else:
        names = args.impl or builtin_names()
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                print(f"[rbcheck report] running the conformance suite --impl {name} ...", file=sys.stderr, flush=True)
                results.append(run_one(name, args.profile, args.pytest_arg, Path(tmp)))
    informational = {r.name for r in results if r.name in THIRD_PARTY} if args.third_party_informational else set()
    must_load = {r.name for r in results} if args.must_load else set()
    return conclude(results, informational=informational, out=Path(args.out), must_load=must_load)


if __name__ == "__main__":
    sys.exit(main())
