"""Ratio tables from pytest-benchmark JSON (``pytest bench/micro --benchmark-json=F``).

    python -m bench.ratios reports/bench.json
    python -m bench.ratios reports/bench.json --baseline old.json --format markdown -o table.md

For every operation and size, each implementation's time per call is shown
with its ratio against the reference and against TorchRL (and, with
``--baseline``, against the same implementation in another run). A ratio is
``baseline time / implementation time``: above 1 the implementation is that
many times faster. ``--baseline old.json --max-slowdown 1.2`` exits 1 when any
benchmark got more than 1.2x slower than in the old run. Ratios are only meaningful within one run on one machine;
absolute times on a shared machine are not (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

STATS = ("median", "min", "mean")
BASELINES = ("reference", "torchrl")


@dataclass(frozen=True)
class Record:
    op: str
    size: str
    impl: str
    seconds: float
    rows_per_call: int
    capacity: int
    batch_size: int | None
    width: int
    device: str = "cpu"

    @property
    def rows_per_s(self) -> float:
        return self.rows_per_call / self.seconds if self.seconds > 0 else math.inf


def _pow2(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def _size(info: dict) -> str:
    parts = [f"cap={_pow2(int(info['capacity']))}"]
    if info.get("batch_size") is not None:
        parts.append(f"batch={int(info['batch_size'])}")
    parts.append(f"width={int(info['width'])}")
    return ",".join(parts)


def load(path: str | Path, stat: str = "median") -> tuple[list[Record], dict]:
    """Records of one pytest-benchmark JSON file and its machine description.
    Benchmarks without rbcheck's ``extra_info`` (op, impl, sizes) are ignored."""
    data = json.loads(Path(path).read_text())
    records = records_of(data, stat)
    label = machine_label(data)
    threads = sorted({b["extra_info"]["torch_threads"] for b in data.get("benchmarks", [])
                      if "torch_threads" in (b.get("extra_info") or {})})
    if threads:
        label += f", torch threads {'/'.join(map(str, threads))}"
    return records, label


def records_of(data: dict, stat: str = "median") -> list[Record]:
    """The records of pytest-benchmark JSON already read (see :func:`load`)."""
    if stat not in STATS:
        raise ValueError(f"stat={stat!r}, but should be one of {STATS}")
    records = []
    for bench in data.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        if not {"op", "impl", "capacity", "width"} <= set(info):
            continue
        seconds = bench.get("stats", {}).get(stat)
        if seconds is None:
            continue
        records.append(
            Record(
                op=info["op"], size=_size(info), impl=info["impl"], seconds=float(seconds),
                rows_per_call=int(info.get("rows_per_call") or 1), capacity=int(info["capacity"]),
                batch_size=None if info.get("batch_size") is None else int(info["batch_size"]),
                width=int(info["width"]), device=info.get("device", "cpu"),
            )
        )
    return records


def machine_label(data: dict) -> str:
    """One line naming the machine a run was measured on."""
    m = data.get("machine_info") or {}
    cpu = m.get("cpu") or {}
    parts = [m.get("node") or "unknown machine"]
    brand = cpu.get("brand_raw") or m.get("processor")
    if brand:
        parts.append(str(brand))
    if cpu.get("count"):
        parts.append(f"{cpu['count']} logical CPUs")
    if m.get("gpu"):
        parts.append(f"GPU {m['gpu']}")
    if m.get("python_version"):
        parts.append(f"Python {m['python_version']}")
    when = data.get("datetime")
    if when:
        parts.append(str(when)[:16].replace("T", " "))
    commit = (data.get("commit_info") or {}).get("id")
    if commit:
        parts.append(f"commit {commit[:8]}")
    return ", ".join(parts)


def ratio_rows(records: list[Record], baselines=BASELINES, previous: list[Record] | None = None) -> list[dict]:
    """One row per (operation, size, implementation), sorted for reading:
    operation, then capacity / batch / width, then implementation (the
    reference first). ``ratio[b]`` is ``time(b) / time(impl)`` or None when
    ``b`` has no number at that size."""
    by_key = {(r.op, r.size, r.impl): r for r in records}
    before = {(r.op, r.size, r.impl): r for r in previous or []}
    order = {name: i for i, name in enumerate(baselines)}

    def sort_key(r: Record):
        return (r.op, r.capacity, r.batch_size or 0, r.width, order.get(r.impl, len(order)), r.impl)

    rows = []
    for r in sorted(records, key=sort_key):
        ratios = {}
        for b in baselines:
            base = by_key.get((r.op, r.size, b))
            ratios[b] = base.seconds / r.seconds if base and r.seconds > 0 else None
        row = {"op": r.op, "size": r.size, "impl": r.impl, "seconds": r.seconds,
               "rows_per_s": r.rows_per_s, "device": r.device, "ratio": ratios}
        if previous is not None:
            old = before.get((r.op, r.size, r.impl))
            row["vs_baseline_run"] = old.seconds / r.seconds if old and r.seconds > 0 else None
        rows.append(row)
    return rows


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_rate(rate: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.3g}{unit}"
    return f"{rate:.3g}"


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def format_table(rows: list[dict], baselines=BASELINES, fmt: str = "text", title: str = "") -> str:
    head = ["operation", "size", "impl", "time/call", "rows/s"] + [f"vs {b}" for b in baselines]
    with_run = any("vs_baseline_run" in r for r in rows)
    if with_run:
        head.append("vs baseline run")
    body = []
    for r in rows:
        line = [r["op"], r["size"], r["impl"] + ("" if r["device"] == "cpu" else f" ({r['device']})"),
                fmt_time(r["seconds"]), fmt_rate(r["rows_per_s"])]
        line += [fmt_ratio(r["ratio"][b]) for b in baselines]
        if with_run:
            line.append(fmt_ratio(r.get("vs_baseline_run")))
        body.append(line)
    out = []
    if fmt == "markdown":
        if title:
            out.append(f"*{title}*\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|")
        out += ["| " + " | ".join(line) + " |" for line in body]
    elif fmt == "text":
        widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
        if title:
            out.append(title)
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
        out.append("  ".join("-" * w for w in widths))
        for line in body:
            cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
            out.append("  ".join(cells).rstrip())
    else:
        raise ValueError(f"fmt={fmt!r}, but should be 'text' or 'markdown'")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ratios", description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", default="reports/bench.json", help="pytest-benchmark JSON")
    parser.add_argument("--stat", default="median", choices=STATS, help="statistic per benchmark")
    parser.add_argument("--baseline", help="another run's JSON: adds a 'vs baseline run' column")
    parser.add_argument("--format", default="text", choices=("text", "markdown"))
    parser.add_argument("-o", "--output", help="also write the table to this file")
    parser.add_argument("--max-slowdown", type=float, metavar="FACTOR",
                        help="with --baseline: exit 1 if any benchmark is more than FACTOR times "
                             "slower than in the baseline run (e.g. 1.2)")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help="implementations to compare against (comma-separated)")
    args = parser.parse_args(argv)
    records, machine = load(args.json, args.stat)
    if not records:
        print(f"{args.json}: no rbcheck benchmarks with numbers (all skipped, or timing disabled?)",
              file=sys.stderr)
        return 1
    previous = load(args.baseline, args.stat)[0] if args.baseline else None
    baselines = tuple(b for b in args.baselines.split(",") if b)
    rows = ratio_rows(records, baselines, previous)
    title = (f"{args.stat} time per call; 'vs X' = time(X) / time(impl), >1 means faster than X. "
             f"Measured on: {machine}")
    table = format_table(rows, baselines, args.format, title)
    print(table)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n")
    if args.max_slowdown is not None:
        if previous is None:
            print("--max-slowdown needs --baseline", file=sys.stderr)
            return 2
        slower = [r for r in rows if r.get("vs_baseline_run") is not None
                  and 1.0 / r["vs_baseline_run"] > args.max_slowdown]
        for r in slower:
            print(f"SLOWER: {r['op']} {r['size']} {r['impl']}: {1.0 / r['vs_baseline_run']:.2f}x the "
                  f"baseline run's time, but should be <= {args.max_slowdown:g}x", file=sys.stderr)
        if slower:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
