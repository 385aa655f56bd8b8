"""What the one-process speed tables (``bench/add_speed.py``,
``bench/checkpoint_speed.py``) share: cells timed interleaved (every
repetition calls every cell once, in an order shuffled by the run and
repetition numbers), a median per cell and run, the machine they ran on, the
versions of the packages timed, and the table's line naming what was not
timed. Cost: ``runs * reps * len(calls)`` calls and as many clock reads.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch


def medians(calls: dict[str, Callable], reps: int, runs: int, pass_rep: bool) -> tuple[dict, list]:
    """Each cell's median seconds per run, and the load average before and after; a cell is called
    with the repetition number when ``pass_rep``, with nothing else."""
    out = {name: [] for name in calls}
    load0 = os.getloadavg()[0]
    for run in range(runs):
        times = {name: [] for name in calls}
        order = list(calls.items())
        for rep in range(reps):
            random.Random(f"{run}/{rep}").shuffle(order)
            for name, fn in order:
                t = time.perf_counter()
                fn(rep) if pass_rep else fn()
                times[name].append(time.perf_counter() - t)
        for name, ts in times.items():
            out[name].append(statistics.median(ts))
    return out, [round(load0, 1), round(os.getloadavg()[0], 1)]


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def machine(load_average: list, **extra) -> dict:
    return {"cpu": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__, **extra,
            "load_average": load_average}


def version(dist: str, missing: str) -> str:
    """The installed version of ``dist``, ``missing`` where it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(dist)
    except PackageNotFoundError:
        return missing


def not_timed(versions: dict) -> list[str]:
    """The table's closing lines naming the packages not timed here (their version says ``not ...``)."""
    missing = [f"{k}: {v}" for k, v in versions.items() if v.startswith("not ")]
    return ["", "Not timed here: " + "; ".join(missing) + "."] if missing else []


def parser(description: str, data, doc, *, reps: int) -> argparse.ArgumentParser:
    """The options every interleaved benchmark takes (its JSON, sizes, runs, and --render to its page)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=str(data))
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--render", action="store_true", help="only write the table of --out to --doc")
    parser.add_argument("--doc", default=str(doc))
    return parser


def write_report(args, measure: Callable[[], dict], render: Callable[[dict], str]) -> int:
    """Unless ``--render``: measure and write the JSON to ``--out``; then the table of ``--out`` to
    ``--doc``, and print it."""
    import json
    from pathlib import Path

    if not args.render:
        report = measure()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    Path(args.doc).write_text(render(json.loads(Path(args.out).read_text())))
    print(Path(args.doc).read_text())
    return 0
