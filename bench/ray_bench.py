"""Throughput of TorchRL's replay buffer served through Ray against the same
buffer in process, as ratios measured side by side in one run.

    python -m bench.ray_bench [--writers 1 2 4] [--rows 256] [--batches 40]
                              [--samples 200] [--out reports/ray_bench] [--smoke]
                              [--address auto]

What is timed (setup, Ray start and the workers' first import outside it):

* ``extend``: K writer processes (Ray tasks, each with its own ``client()``,
  as distributed collectors) each write ``batches`` batches of ``rows`` rows
  to one served buffer; against one in-process buffer written by this
  process with the same total rows (one writer: a buffer in a process is
  written by that process). Ratio = served rows/s / in-process rows/s.
* ``sample``: K sampler processes (Ray tasks) each draw ``samples`` batches
  of ``rows`` rows from a full served buffer; against in-process
  ``sample(rows)`` in this process, the same total batches. Each served
  number is taken right after its in-process counterpart, three times; the
  ratio is of the medians. The in-process numbers are taken in a Ray
  worker process too (like the served side's clients): the driver runs Ray's
  own threads, which would slow a buffer living there.
* ``update round trip``: ``sample`` then ``update_priority`` of the sampled
  slots (a learner step, in a worker process), served against in-process; per
  round trip, in milliseconds and as a ratio. With TorchRL's prioritized
  sampler when its C++ extension loads, else the uniform sampler (TorchRL's
  ``update_priority`` then does no tree work: the number is the transport's
  cost alone, and the report says so).

Each served measurement is checked before it counts: the write count equals
the rows written, every sampled row is whole (``rbcheck.harness.concurrency``
rows with checksums). Ray and TorchRL are reached only through the ``torchrl-ray`` adapter's raw
face (harness/adapters/torchrl_ray_raw.py: the served buffer, the Ray tasks, Ray's start and
``get``; the in-process buffer is the ``torchrl`` adapter's raw face). ``--address auto`` joins a running Ray cluster instead
of starting a local one (docs/benchmarks.md, "Ray: a real cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from bench.faces import Peer, spec_for


def _face():
    """The ``torchrl-ray`` adapter's raw face (harness/adapters/torchrl_ray_raw.py): the served
    buffer, Ray's start, tasks and ``get``; no library is imported here."""
    peer = Peer.of_builtin("torchrl-ray", "torchrl-ray")
    if peer.raw is None:
        raise SystemExit(f"torchrl-ray cannot run here: {peer.why}")
    return peer.raw


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(writers: list[int], rows: int, batches: int, samples: int, width: int,
            repeats: int = 3) -> dict:
    """Every served number is taken right after its in-process counterpart,
    ``repeats`` times; the ratio is of the medians."""
    face = _face()
    face.start()  # before any Ray call: a Ray call would start a default Ray
    prioritized = face.why_not("sample_prioritized") is None
    capacity = max(writers) * batches * rows
    tasks, get = face.tasks(), face.gather
    write, sample, in_process, served_update = (tasks[k] for k in ("write", "sample", "in_process", "served_update"))
    get([tasks["ready"].remote() for _ in range(max(writers))])  # warm the workers
    out: dict = {"extend": {}, "sample": {}, "rows": rows, "batches": batches, "samples": samples,
                 "width": width, "capacity": capacity, "prioritized": prioritized, "repeats": repeats}
    spec = spec_for(capacity, width, prioritized)
    sizes = dict(spec=spec, batches=batches, samples=samples, rows=rows, width=width)

    def local_extend(k: int) -> float:
        return get(in_process.remote("extend", k, **sizes))

    def local_sample(k: int) -> float:
        return get(in_process.remote("sample", k, **sizes))

    served = face(spec)
    try:
        for k in writers:
            local, remote = [], []
            for _ in range(repeats):
                local.append(local_extend(k))
                served.empty()
                secs = get([write.remote(c, w, batches, rows, width) for w, c in enumerate(served.clients(k))])
                want = k * ((batches - 1) * rows + 1)
                if served.write_count != want:
                    raise AssertionError(f"write_count={served.write_count}, but should be {want}")
                remote.append(k * (batches - 1) * rows / max(secs))  # the slowest writer bounds it
            out["extend"][k] = {"served_rows_per_s": _median(remote), "in_process_rows_per_s": _median(local),
                                "ratio": _median(remote) / _median(local)}
        totals = [batches * rows] * max(writers)
        for k in writers:
            local, remote = [], []
            for _ in range(repeats):
                local.append(local_sample(k))
                secs = get([sample.remote(c, samples, rows, totals) for c in served.clients(k)])
                remote.append(k * samples * rows / max(secs))
            out["sample"][k] = {"served_rows_per_s": _median(remote), "in_process_rows_per_s": _median(local),
                                "ratio": _median(remote) / _median(local)}
        local_s = [get(in_process.remote("update", 1, **sizes)) for _ in range(repeats)]
        served_s = [get(served_update.remote(served.client(), rows, samples)) for _ in range(repeats)]
        out["update"] = {"in_process_ms": _median(local_s) * 1e3, "served_ms": _median(served_s) * 1e3,
                         "ratio": _median(local_s) / _median(served_s)}
    finally:
        served.close()
    return out


def render(result: dict) -> str:
    lines = [
        "TorchRL replay buffer served through Ray vs in process (ratios: served / in-process, "
        f"higher is better for the served buffer; medians of {result['repeats']} side-by-side runs)",
        f"rows per call {result['rows']}, width {result['width']}, capacity {result['capacity']}, "
        f"{os.cpu_count()} cores, {platform.machine()}",
        "",
        "| writer / sampler processes | extend ratio | sample ratio |",
        "| --- | --- | --- |",
    ]
    for k in result["extend"]:
        lines.append(f"| {k} | {result['extend'][k]['ratio']:.3f} | {result['sample'][k]['ratio']:.3f} |")
    up = result["update"]
    kind = ("prioritized sampler" if result["prioritized"]
            else "uniform sampler: no tree work, the transport's cost alone")
    lines += ["", f"update round trip (sample + update_priority, {kind}): "
              f"in-process {up['in_process_ms']:.2f} ms, served {up['served_ms']:.2f} ms, "
              f"ratio {up['ratio']:.3f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--out", default="reports/ray_bench")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one run each: checks run, numbers mean nothing")
    parser.add_argument("--address", default=None, help="join this Ray cluster ('auto') instead of a local Ray")
    args = parser.parse_args(argv)
    if args.smoke:
        args.writers, args.rows, args.batches, args.samples = [1, 2], 8, 3, 3
    for name in ("writers", "rows", "batches", "samples", "width"):
        values = getattr(args, name)
        if any(v < 1 for v in (values if isinstance(values, list) else [values])):
            parser.error(f"--{name}={values}, but should be >= 1")
    face = _face()
    if args.address:
        face.start(args.address)
    try:
        result = measure(args.writers, args.rows, args.batches, args.samples, args.width,
                         repeats=1 if args.smoke else 3)  # a smoke run checks that it runs: once is enough
    finally:
        face.shutdown()
    text = render(result)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**result, "python": sys.version.split()[0],
                                                    "torch": torch.__version__}, indent=1))
    out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
