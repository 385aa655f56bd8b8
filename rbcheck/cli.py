"""The ``rbcheck`` command.

    rbcheck validate IMPL [IMPL ...] [--profile ci] [--out DIR]
                     [--only PROPERTY ...] [--known-failures FILE]
    rbcheck validate --all [--third-party-informational] ...
    rbcheck list

``IMPL`` is a built-in name (``rbcheck list`` prints them) or
``pkg.module:factory`` importable from the working directory. Each runs
the conformance suite in its own pytest subprocess, isolated from the
working directory's pytest configuration; one line per property is printed
as it finishes, then the report (property x implementation). ``--out DIR``
also writes ``DIR/conformance.md`` and ``DIR/conformance.json``.

Exit status 0 when every implementation ran everything selected and
passed it, apart from skips with a reason and declared known failures; 1
when a test failed or a test a known failure covers passed (XPASS: update
the list); 2 when a run did not complete (a pytest usage, collection or
internal error, an interrupt, a test not run, a crash), an adapter did not
load, or the arguments are bad; the cause is printed, with pytest's own
output. ``--third-party-informational`` (``nox -s validate``) reports the
built-in third-party adapters' (``torchrl``, ...) failures, XPASSes and
failures to load without letting them set the exit status; a run of theirs
that did not complete still exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
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
    validate.add_argument("--out", metavar="DIR", default=None,
                          help="write the report to DIR/conformance.md and DIR/conformance.json")
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
    commands.add_parser("list", help="print the built-in implementations and the property ids")
    return parser


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
    from rbcheck.checks import node_path
    from rbcheck.harness.adapters import builtin_names
    from rbcheck.harness.report import THIRD_PARTY, conclude, run_one

    names = list(dict.fromkeys((builtin_names() if args.all else []) + args.impl))
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

    results = []
    with tempfile.TemporaryDirectory(prefix="rbcheck-") as tmp:
        for name in names:
            print(f"[rbcheck] {name}: running the conformance suite ...", file=sys.stderr, flush=True)
            result = run_one(name, args.profile, args.pytest_arg, Path(tmp), only=args.only,
                             known_failures=known, progress=True)
            if result.status == "unavailable":
                print(f"[rbcheck] {name}: the adapter did not load ({result.why})", file=sys.stderr, flush=True)
            results.append(result)
    return conclude(results, informational=informational, out=Path(args.out) if args.out else None)


def main(argv: list[str] | None = None) -> int:
    # pkg.module:factory names a module of the working directory (a console
    # script does not put it on sys.path by itself)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    return validate(args, parser)


if __name__ == "__main__":
    sys.exit(main())
