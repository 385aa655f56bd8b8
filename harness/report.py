"""The conformance report: every property against every implementation.

    python -m rbcheck.harness.report [--impl NAME ...] [--out reports/] [--profile ci]

(``rbcheck validate`` is the command for users; this module holds the
table and is kept for ``--from-results``.)

For each implementation (default: every built-in name) the conformance suite
(``rbcheck.conformance``) runs in its own pytest subprocess with
``--rbcheck-results``; an implementation whose adapter does not load is a
column of "unavailable (why)". The table (property x implementation) is
printed and written to ``<out>/conformance.md``, ``.json`` and ``.html``
(``--html DIR``: the page alone); ``--merge`` also writes the compliance page
(``<out>/compliance.md`` and ``.html``: library x invariant, ``harness.compliance``).
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
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rbcheck.harness.adapters import BUILTIN, builtin_names

# ImplResult and the cell text live in outcomes (shared with the verdict and
# the runners without an import cycle); imported here under their old names
from rbcheck.harness.outcomes import TRIED, ImplResult, cell_text
from rbcheck.harness.parts import merge, part_path, read_parts, write_part  # noqa: F401 - re-exported
from rbcheck.harness.plugin.known_failures import suite_relative

# the report as people read it (text, markdown) lives in report_layout; its
# helpers are imported here under their old names
from rbcheck.harness.report_layout import (  # noqa: F401 - re-exported
    CELL_WIDTH_MD,
    CELL_WIDTH_TEXT,
    _clip,
    _md_escape,
    incomplete_text,
    render_markdown,
    render_text,
    robustness_text,
    run_time_text,
    settings_text,
)

#: Built-in names of third-party buffers (from the one table of built-ins).
THIRD_PARTY = frozenset(name for name, entry in BUILTIN.items() if not entry.first_party)
#: A test record's fields a cell keeps when present: the repro snippets, a failure's
#: what/got/expected/call/detail and the frequencies of its distributional checks.
CELL_EXTRAS = ("repros", "what", "got", "expected", "call", "detail", "distributions", "seconds")
#: Catalogues of bad inputs and faults, summarised per implementation (file -> label).
ROBUSTNESS = {"test_bad_input.py": "bad input", "test_checkpoint_faults.py": "checkpoint faults"}


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
                **{key: test[key] for key in CELL_EXTRAS if test.get(key)},
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
             report: dict[str, Any] | None = None, must_load: Iterable[str] = (), html: Path | None = None,
             compliance: bool = False, bugs: dict[str, Any] | None = None) -> int:
    """Print the report and the verdict (``rbcheck.harness.verdict``) of
    ``results``, write ``out/conformance.md``, ``.json`` and ``.html`` when
    ``out`` is given (``html/conformance.html`` when ``html`` is), the
    compliance page ``out/compliance.md`` and ``.html`` when ``compliance``
    (a merged report: ``harness.compliance``, ``bugs`` its optional registry
    of findings), and return the exit status: the end of ``rbcheck validate``
    and of this module's ``main``, so both give the same verdict."""
    from rbcheck.harness.report_html import render_html
    from rbcheck.harness.verdict import as_json, decide, explain

    report = build(results) if report is None else report
    decision = decide(results, informational, must_load=must_load)
    report["verdict"] = as_json(decision)
    report.setdefault("date", time.strftime("%Y-%m-%d", time.gmtime()))
    print(render_text(report))
    pages = {"conformance.md": lambda: render_markdown(report) + "\n",
             "conformance.json": lambda: json.dumps(report, indent=2) + "\n",
             "conformance.html": lambda: render_html(report)}
    wrote = []
    for folder, names in ((out, list(pages)), (html, ["conformance.html"])):
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for file in names:
            replace_file(folder / file, pages[file]())
            wrote.append(str(folder / file))
    if compliance and out is not None:
        from rbcheck.harness.compliance import render_compliance_html, render_compliance_markdown

        for file, render in (("compliance.md", render_compliance_markdown), ("compliance.html", render_compliance_html)):
            replace_file(out / file, render(report, bugs=bugs))
            wrote.append(str(out / file))
    if wrote:
        print(f"\nwrote {', '.join(wrote)}")
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
    parser.add_argument("--out", default="reports",
                        help="directory for conformance.md/.json/.html (and compliance.md/.html with --merge)")
    parser.add_argument("--html", metavar="DIR", default=None, help="also write DIR/conformance.html")
    parser.add_argument("--bugs", metavar="FILE", default=None,
                        help="with --merge: a JSON registry of findings ({impl: {property or test id: bug id or "
                        "{id, url}}}) that links the compliance page's FAIL cells (optional)")
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
    bugs = None
    if args.bugs is not None:
        if args.merge is None:
            parser.error("--bugs is read with --merge (the compliance page), but no --merge was given")
        try:
            bugs = json.loads(Path(args.bugs).read_text())
        except (OSError, ValueError) as err:
            parser.error(f"--bugs={args.bugs!r}: {err}, but should be a JSON file {{impl: {{id: bug}}}}")
    return conclude(results, informational=informational, out=Path(args.out), must_load=must_load,
                    html=Path(args.html) if args.html else None, compliance=args.merge is not None, bugs=bugs)


if __name__ == "__main__":
    sys.exit(main())
