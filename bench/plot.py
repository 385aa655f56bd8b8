"""Throughput vs batch size, per implementation, from pytest-benchmark JSON.

    python -m bench.plot                       # reports/bench.json -> reports/bench_throughput.png
    python -m bench.plot run.json -o out.png

One panel per operation (sample random / prioritized / slice, update
priority); one line per implementation, solid for the largest capacity in the
run and dashed for the smallest; at the smallest row width present. The title
names the machine, Python version, date and commit the numbers come from:
compare lines within one figure, not across figures from different machines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.ratios import Record, load

OPS = ("sample_random", "sample_prioritized", "sample_slice", "update_priority")
TITLES = {
    "sample_random": "sample (uniform)",
    "sample_prioritized": "sample (prioritized)",
    "sample_slice": "sample (slices of 32 steps)",
    "update_priority": "update_priority",
}


def series(records: list[Record]) -> dict[str, dict[tuple[str, int], list[tuple[int, float]]]]:
    """``{op: {(impl, capacity): [(batch_size, rows_per_s), ...]}}`` at the
    smallest width of each operation, points sorted by batch size."""
    out: dict = {}
    for op in OPS:
        mine = [r for r in records if r.op == op and r.batch_size is not None]
        if not mine:
            continue
        width = min(r.width for r in mine)
        lines: dict = {}
        for r in mine:
            if r.width == width:
                lines.setdefault((r.impl, r.capacity), []).append((r.batch_size, r.rows_per_s))
        out[op] = {k: sorted(v) for k, v in sorted(lines.items())}
    return out


def plot(records: list[Record], machine: str, path: str | Path, stat: str = "median") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(records)
    if not data:
        raise ValueError("records has no sample/update_priority benchmarks with a batch size, "
                         "but should have some (was the run made with timing enabled?)")
    def impl_order(name: str):
        return (name != "reference", name != "torchrl", name)

    impls = sorted({impl for lines in data.values() for impl, _ in lines}, key=impl_order)
    colors = {impl: plt.get_cmap("tab10")(i % 10) for i, impl in enumerate(impls)}
    capacities = sorted({cap for lines in data.values() for _, cap in lines})
    styles = {cap: "-" if cap == capacities[-1] else "--" for cap in capacities}

    ops = [op for op in OPS if op in data]
    ncols = 2 if len(ops) > 1 else 1
    nrows = (len(ops) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.0 * ncols, 4.2 * nrows), squeeze=False)
    for ax, op in zip(axes.flat, ops, strict=False):  # spare axes are hidden below
        for (impl, cap), points in sorted(data[op].items(), key=lambda kv: (impl_order(kv[0][0]), kv[0][1])):
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, styles[cap], marker="o", color=colors[impl],
                    label=f"{impl}, capacity {_pow2(cap)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(TITLES[op])
        ax.set_xlabel("batch size (rows per call)")
        ax.set_ylabel("throughput (rows / s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.suptitle(f"rbcheck replay-buffer throughput, rows/s from the {stat} time per call (higher is better)"
                 f"\nmeasured on: {machine}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pow2(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", default="reports/bench.json", help="pytest-benchmark JSON")
    parser.add_argument("-o", "--output", default="reports/bench_throughput.png")
    parser.add_argument("--stat", default="median", choices=("median", "min", "mean"))
    args = parser.parse_args(argv)
    records, machine = load(args.json, args.stat)
    try:
        out = plot(records, machine, args.output, args.stat)
    except ValueError as err:
        print(f"{args.json}: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
