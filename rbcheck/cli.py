"""The ``rbcheck`` command.

    rbcheck validate IMPL [IMPL ...] [--profile ci] [--out DIR] [--html DIR]
                     [--only PROPERTY ...] [--known-failures FILE]
    rbcheck validate --all [--third-party-informational] [--jobs N] ...
    rbcheck validate NAME ... --parts DIR     (then: rbcheck report --merge DIR)
    rbcheck report --merge DIR [--impl NAME ...] [--out DIR] ...   (+ compliance.md/.html)
    rbcheck list

``IMPL`` is a built-in name (``rbcheck list`` prints them) or
``pkg.module:factory`` importable from the working directory. Each runs
the conformance suite in its own pytest subprocess, isolated from the
working directory's pytest configuration; one line per property is printed
as it finishes, then the report: the verdict and the failures first (each
with its repro), the results by behaviour, the skips folded by reason.
``--out DIR`` also writes ``DIR/conformance.md``, ``.json`` and ``.html`` (a
self-contained page: a filter by status, each failure's repro ready to copy,
a plot of every distributional check); ``--html DIR`` writes the page alone.
``--jobs N`` runs N implementations at once, each in its own pytest worker
process. ``--parts DIR`` writes each implementation's result to DIR (one
JSON file each) for ``rbcheck report --merge DIR``, which builds one report
from runs made in several environments (``nox -s validate``: libraries that
do not install together).

Exit status 0 when every implementation ran everything selected and
passed it, apart from skips with a reason and declared known failures; 1
when a test failed or a test a known failure covers passed (XPASS: update
the list); 2 when a run did not complete (a pytest usage, collection or
internal error, an interrupt, a test not run, a crash), an adapter did not
load, or the arguments are bad; the cause is printed, with pytest's own
output. ``--third-party-informational`` (``nox -s validate``) reports the
built-in third-party adapters' (``torchrl``, ...) failures, XPASSes and
failures to load without letting them set the exit status; a run of theirs
that did not complete still exits 2, and so does one whose adapter did not
load under ``--must-load``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rbcheck", description="Conformance checks for RL replay buffers.")
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help="run the conformance suite on implementations",
                                   description=__doc__.split("\n\n", 2)[2].split("\n\nExit")[0],
                                   epilog="Exit" + __doc__.split("\n\nExit", 1)[1].rstrip())
    validate.add_argument("impl", nargs="*", metavar="IMPL",
                          help="a built-in name or pkg.module:factory (from the working directory)")
    validate.add_argument("--all", action="store_true", help="every built-in implementation")
    validate.add_argument("--profile", default=os.environ.get("RBCHECK_PROFILE", "ci"),
                          choices=("ci", "dev", "thorough"),
                          help="Hypothesis profile: ci (few examples, derandomized; default), dev, thorough")
    validate.add_argument("--device", default="cpu", metavar="DEVICE",
                          help="device of the buffers under test: cpu (default) or cuda[:N]; a device the "
                          "adapter does not declare, or that this machine lacks, is a usage error (exit 2)")
    validate.add_argument("--out", metavar="DIR", default=None,
                          help="write the report to DIR/conformance.md, .json and .html")
    validate.add_argument("--html", metavar="DIR", default=None,
                          help="write the report's page to DIR/conformance.html (static, self-contained)")
    validate.add_argument("--only", action="append", default=[], metavar="PROPERTY",
                          help="run only this property (id <file>::<test>, see `rbcheck list`; repeatable)")
    validate.add_argument("--known-failures", metavar="FILE", default=None,
                          help="known-failures file (a property or test id per entry, with indented "
                          "'message: <regex>' and 'reason: <text>' lines), instead of each implementation's own")
    validate.add_argument("--third-party-informational", action="store_true",
                          help="failures of the built-in third-party adapters do not set the exit status "
                          "(a run of theirs that did not complete still does)")
    validate.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                          help="extra argument for every pytest run (repeatable)")
    validate.add_argument("--jobs", "-j", type=_jobs, default=1, metavar="N",
                          help="run N implementations at once, each in its own pytest worker process "
                          "(default 1; 'auto': one per CPU core)")
    validate.add_argument("--parts", metavar="DIR", default=None,
                          help="also write each implementation's result to DIR, for `rbcheck report --merge DIR`")
    validate.add_argument("--exclude", action="append", default=[], metavar="NAME",
                          help="leave this built-in out of --all (repeatable; it runs in another environment)")
    validate.add_argument("--must-load", action="store_true",
                          help="an adapter that does not load sets the exit status (2) even with "
                          "--third-party-informational: every library was meant to be installed")
    commands.add_parser("report", add_help=False,
                        help="the report from results files or parts (python -m rbcheck.harness.report; "
                        "`rbcheck report --help`)")
    commands.add_parser("list", help="print the built-in implementations and the property ids")
    return parser


def _jobs(text: str) -> int:
    if text == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"--jobs={text!r}, but should be an integer >= 1 or 'auto'")
    return jobs


def _list() -> int:
    from rbcheck.checks import properties
    from rbcheck.harness.adapters import builtin_table

    print("built-in implementations:")
    for name, path in builtin_table().items():
        print(f"  {name:12} {path}")
    print("properties:")
    for prop in properties():
        print(f"  {prop}")
    return 0


def validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from rbcheck import runner
    from rbcheck.checks import node_path
    from rbcheck.harness.adapters import BUILTIN, builtin_names
    from rbcheck.harness.outcomes import ImplResult
    from rbcheck.harness.plugin.known_failures import suite_relative
    from rbcheck.harness.report import THIRD_PARTY, conclude, run_many, write_part

    for name in args.exclude:
        if name not in BUILTIN:
            parser.error(f"--exclude={name!r}, but should be a built-in name ({', '.join(BUILTIN)})")
    names = list(dict.fromkeys([n for n in (builtin_names() if args.all else []) if n not in args.exclude]
                               + args.impl))
    if not names:
        parser.error("no IMPL given, but should be a built-in name, pkg.module:factory, or --all")
    for prop in args.only:
        try:
            node_path(prop)
        except ValueError as err:
            parser.error(f"--only: {err}")
    known = None
    if args.known_failures is not None:
        known = Path(args.known_failures).resolve()
        if not known.is_file():
            parser.error(f"--known-failures={args.known_failures!r} does not exist, "
                         f"but should be a text file of property ids")
    informational = {n for n in names if args.third_party_informational and n in THIRD_PARTY}

    parts = Path(args.parts) if args.parts else None
    if parts is not None and parts.exists() and not parts.is_dir():
        parser.error(f"--parts={args.parts!r} is a file, but should be a directory")
    lock = threading.Lock()

    def done(result) -> None:
        with lock:
            if result.status == "unavailable":
                print(f"[rbcheck] {result.name}: the adapter did not load ({result.why})", file=sys.stderr, flush=True)
            elif result.seconds is not None:
                print(f"[rbcheck] {result.name}: done in {result.seconds:.1f} s", file=sys.stderr, flush=True)
            if parts is not None:
                write_part(result, parts)

    def start(name: str) -> None:
        with lock:
            print(f"[rbcheck] {name}: running the conformance suite ...", file=sys.stderr, flush=True)

    finished: dict[str, ImplResult] = {}

    def done_and_kept(result) -> None:
        finished[result.name] = result
        done(result)

    out = Path(args.out) if args.out else None
    html = Path(args.html) if args.html else None
    must_load = set(names) if args.must_load else set()
    try:
        with _signals_interrupt(), tempfile.TemporaryDirectory(prefix="rbcheck-") as tmp:
            results = run_many(names, args.profile, args.pytest_arg, Path(tmp), jobs=args.jobs, only=args.only,
                               known_failures=known, progress=True, start=start, done=done_and_kept,
                               device=args.device)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Interrupted): a partial report, exit 2
        signame = getattr(err, "signame", "SIGINT")
        stopped = runner.stop_all()
        results = [finished.get(n) or ImplResult(
            name=n, status="crashed",
            why=f"interrupted by {signame}" + (f" while running {suite_relative(stopped[n])}" if stopped.get(n)
                                               else " before it finished" if n in stopped else " before it started"))
            for n in names]
        print(f"[rbcheck] interrupted by {signame}: the runs under way were stopped; the report below is partial "
              f"(exit 2)", file=sys.stderr, flush=True)
        conclude(results, informational=informational, out=out, must_load=must_load, html=html)
        return 2
    return conclude(results, informational=informational, out=out, must_load=must_load, html=html)


class Interrupted(KeyboardInterrupt):
    """A signal that ends ``rbcheck validate`` as Ctrl-C does (SIGTERM, SIGHUP)."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread while
    the suite runs, so they end the run as Ctrl-C does: the runs stopped, a
    partial report, exit 2."""
    def interrupt(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    # pkg.module:factory names a module of the working directory (a console
    # script does not put it on sys.path by itself)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["report"]:  # the report's own options (python -m rbcheck.harness.report)
        from rbcheck.harness.report import main as report_main

        return report_main(argv[1:], prog="rbcheck report")
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _list()
        return validate(args, parser)
    except BrokenPipeError:  # the reader went away (`rbcheck list | head`): say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail again
        return 0 if args.command == "list" else 2


if __name__ == "__main__":
    sys.exit(main())
