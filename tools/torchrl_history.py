"""TorchRL's releases through the conformance suite: one table, release x property.

    python -m tools.torchrl_history [--prefixes DIR] [--cache DIR]
        [--out reports] [--profile ci] VERSION [VERSION ...]

Each release is installed on its own (``pip install --no-deps --target
DIR/<version> torchrl==<version>``) over the current environment, which holds
torch, tensordict and the suite's own dependencies; that prefix goes first on
``PYTHONPATH`` for everything run for the release, so each release imports
only its own Python code and its own ``torchrl._torchrl``. The extension is
rebuilt where the shipped one does not load against this torch
(``tools/torchrl_build.py``; built once per torch and sources, cached
in ``--cache``). Then the conformance suite runs against ``--impl torchrl``
with the release's known failures (``known_failures/torchrl-<version>.txt``).

The table has the same cells as the validate report (``harness.report``
renders both) and is written to ``<out>/torchrl_history.md`` and ``.json``,
with each release's run time and the line saying how its extension was
obtained. A repository tool (not in the wheel): run it from the repository's
root.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rbcheck.checks import run_subprocess
from rbcheck.harness import report as conformance_report
from tools.torchrl_build import default_cache

TITLE = "# TorchRL's history, as measured"
COMMAND = "nox -s history"


def prefix_env(prefix: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RBCHECK_IMPL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(prefix), *filter(None, [env.get("PYTHONPATH")])])
    return env


def installed_release(prefix: Path) -> str | None:
    """The torchrl release installed in ``prefix``, or None."""
    infos = sorted(prefix.glob("torchrl-*.dist-info"))
    if not infos or not (prefix / "torchrl" / "__init__.py").exists():
        return None
    return infos[0].name[len("torchrl-"):-len(".dist-info")]


def install_release(version: str, prefix: Path) -> None:
    """torchrl ``version`` alone (no dependencies) into ``prefix``."""
    if installed_release(prefix) == version:
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                    "--target", str(prefix), f"torchrl=={version}"], check=True)


def run_release(version: str, prefix: Path, cache: Path, profile: str, extra: list[str],
                workdir: Path) -> tuple[conformance_report.ImplResult, dict[str, Any]]:
    name = f"torchrl {version}"
    started = time.perf_counter()
    install_release(version, prefix)
    env = prefix_env(prefix)
    # run by path: the release's environment has its prefix, not the repository, on PYTHONPATH
    build = subprocess.run([sys.executable, str(Path(__file__).with_name("torchrl_build.py")), "--cache", str(cache)],
                           env=env, capture_output=True, text=True)
    lines = [ln for ln in build.stdout.splitlines() if ln.startswith("[torchrl_build]")]
    extension = lines[-1][len("[torchrl_build] "):] if lines else (build.stderr.strip().splitlines() or ["?"])[-1]
    print(f"[torchrl history] {name}: {extension}", file=sys.stderr, flush=True)
    run_dir = workdir / version
    run_dir.mkdir(parents=True, exist_ok=True)
    result = run_subprocess("torchrl", profile=profile, workdir=run_dir, extra=extra,
                            pythonpath=[str(prefix)], progress=False)
    result.name = name
    results = run_dir / "results-torchrl.json"
    seconds = time.perf_counter() - started
    meta = {"release": version, "extension": extension, "seconds": round(seconds, 1),
            "known_failures_hid_new": []}
    if results.exists():
        payload = json.loads(results.read_text())
        meta["known_failures_hid_new"] = payload.get("known_failures_hid_new", [])
        meta["known_failures_file"] = Path(payload.get("known_failures_file") or "").name or None
    print(f"[torchrl history] {name}: suite ran in {seconds:.0f} s", file=sys.stderr, flush=True)
    return result, meta


SUMMARY_CELL = 110
SHORT = {"pass": "pass", "fail": "FAIL", "error": "FAIL", "xfail": "known failure", "xpass": "XPASS",
         "skip": "skipped", "unavailable": "unavailable"}


def summary(table: dict[str, Any]) -> str:
    """Release x property, parametrizations folded into counts; a single
    result keeps the start of its message (the report below has it whole)."""
    order = table["order"]
    props: dict[str, list[dict[str, Any]]] = {}
    for row in table["rows"]:
        props.setdefault(row["id"].split("[", 1)[0], []).append(row)
    lines = ["| property | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for prop, rows in props.items():
        cells = []
        for name in order:
            got = [r["cells"][name] for r in rows if r["cells"][name]["outcome"] != "absent"]
            if len(got) == 1:
                cell = got[0]
                text = SHORT.get(cell["outcome"], cell["outcome"])
                if cell["outcome"] in ("fail", "error", "xfail") and cell["message"]:
                    text += ": " + conformance_report._clip(cell["message"], SUMMARY_CELL)
                cells.append(conformance_report._md_escape(text))
                continue
            counts: dict[str, int] = {}
            for cell in got:
                key = SHORT.get(cell["outcome"], cell["outcome"])
                counts[key] = counts.get(key, 0) + 1
            cells.append(", ".join(f"{n} {k}" for k, n in counts.items()) or "--")
        lines.append(f"| `{prop}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(table: dict[str, Any], runs: list[dict[str, Any]], header: dict[str, Any]) -> str:
    body = conformance_report.render_markdown(table).split("\n", 1)[1]  # without its title
    lines = [TITLE, "",
             f"`{COMMAND}` on {header['date']}, torch {header['torch']}, Hypothesis profile "
             f"`{header['profile']}`, {header['total_seconds']:.0f} s in all "
             f"({header['cpus']} CPU cores). Each release in its own prefix with its own "
             f"C++ extension:", ""]
    for run in runs:
        lines.append(f"- torchrl {run['release']}: {run['extension']}; suite {run['seconds']:.0f} s"
                     + (f"; known failures from {run['known_failures_file']}"
                        if run.get("known_failures_file") else ""))
        for hid in run["known_failures_hid_new"]:
            lines.append(f"  - {hid}")
    lines += ["", "## Summary (parametrizations counted)", "", summary(table), "", "## Every result"]
    return "\n".join(lines) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.torchrl_history",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="torchrl releases, in order")
    parser.add_argument("--prefixes", type=Path, default=Path(".torchrl-history"),
                        help="directory holding one install prefix per release")
    parser.add_argument("--cache", type=Path, default=None, help="extension build cache")
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--profile", default=os.environ.get("RBCHECK_PROFILE", "ci"))
    parser.add_argument("--pytest-arg", action="append", default=[],
                        help="extra argument passed to every pytest run (repeatable)")
    parser.add_argument("--runs", type=Path, default=None,
                        help="keep each release's run here (<version>.json; default: <out>/torchrl_history_runs)")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: build the table from the runs kept in --runs")
    args = parser.parse_args(argv)
    import torch

    cache = (args.cache or default_cache()).resolve()
    kept = args.runs or args.out / "torchrl_history_runs"
    kept.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for version in args.versions:
            if args.table_only:
                saved = json.loads((kept / f"{version}.json").read_text())
                result = conformance_report.ImplResult(**saved["result"])
                meta = saved["meta"]
            else:
                print(f"[torchrl history] torchrl {version} ...", file=sys.stderr, flush=True)
                result, meta = run_release(version, (args.prefixes / version).resolve(), cache,
                                           args.profile, args.pytest_arg, Path(tmp))
                (kept / f"{version}.json").write_text(
                    json.dumps({"result": dataclasses.asdict(result), "meta": meta}) + "\n")
            results.append(result)
            runs.append(meta)
    table = conformance_report.build(results)
    for name in table["order"]:
        table["implementations"][name]["third_party"] = True
    header = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "torch": torch.__version__,
              "profile": args.profile, "cpus": os.cpu_count(),
              "total_seconds": (sum(r["seconds"] for r in runs) if args.table_only
                                else time.perf_counter() - started), "command": COMMAND}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torchrl_history.md").write_text(render(table, runs, header))
    (args.out / "torchrl_history.json").write_text(
        json.dumps({**header, "runs": runs, **table}, indent=2) + "\n")
    print(conformance_report.render_text(table))
    print(f"\nwrote {args.out / 'torchrl_history.md'} and {args.out / 'torchrl_history.json'} "
          f"({header['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
