"""Whether the machine's speed moves under the peers benchmark (``python -m bench.phases``).

The peers table (``bench/peers.py``) has had runs in which every memory-bound call of
rbcheck's was 1.3x-3.4x slower at once. This watches for such phases and records what
could explain them. In blocks of ``--reps`` shuffled repetitions it times rbcheck's
``update_priority``, uniform and prioritized ``sample`` (2^20 slots by default), cpprb's
``update_priorities`` and prioritized ``sample`` where cpprb is installed, and controls
that run no rbcheck code:

* ``gather_4k`` / ``gather_2m``: torch's ``index_select`` of ``batch`` random rows (chosen
  once) from a tensor as large as rbcheck's rows, in the allocator's pages (the peers
  table's control, ``peers.control_cell``) / in huge pages (``empty_huge``);
* ``compute``: 50 products of 64x64 float32 matrices (in cache).

Per block it writes one JSON line: each cell's median (us), the steal and idle time
(``/proc/stat``, ticks), khugepaged's collapses, the load average, the changed THP and
compaction counters (``/proc/vmstat``), and the huge pages backing rbcheck's rows and
sum tree and the two controls (``AnonHugePages`` of their mappings, KiB). Linux only.
``--summary FILE`` prints, for windows of ten blocks, each cell's range and its
correlation with the controls.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time

import numpy as np
import torch

from bench import peers as P


def _span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def huge_pages(spans: dict) -> dict:
    """``{name: KiB of huge pages}`` over the mappings that overlap each ``(start, end)``."""
    out, current = dict.fromkeys(spans, 0), []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                current = [k for k, (a, b) in spans.items() if low < b and a < high]
            elif line.startswith("AnonHugePages:"):
                for k in current:
                    out[k] += int(line.split()[1])
    return out


def counters() -> dict:
    cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    vm = {}
    for line in open("/proc/vmstat"):
        if line.startswith(("thp_", "compact_")):
            key, value = line.split()
            vm[key] = int(value)
    path = "/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed"
    try:
        collapsed = int(open(path).read())
    except OSError:
        collapsed = 0
    return {"steal": cpu[7], "idle": cpu[3], "vm": vm, "collapsed": collapsed}


def cells(capacity: int, width: int, batch: int) -> tuple[dict, dict]:
    """``({name: callable}, {name: (start, end)})``: the timed calls and the memory watched."""
    from rbcheck.variants.native import empty_huge

    base = P.base_peer()  # the device variant's raw face; .buffer is its ReplayBuffer
    faces = P.filled(base, capacity, width, True), P.filled(base, capacity, width, False)
    prio, uni = faces[0].buffer, faces[1].buffer
    index, raw = faces[0].prepare_update(*P.update_args(capacity, batch))
    control = P.control_cell(capacity, width, batch)
    plain = control.table
    huge = empty_huge((capacity, width + 3), torch.float32)
    huge.fill_(1.0)
    rows = torch.from_numpy(np.random.default_rng(5).integers(0, capacity, batch))
    a = torch.randn(64, 64)
    out = {"rb_update": lambda: prio.update_priority(index, raw),
           "rb_usample": lambda: uni.sample(batch), "rb_psample": lambda: prio.sample(batch),
           "gather_4k": control, "gather_2m": lambda: huge.index_select(0, rows),
           "compute": lambda: [torch.mm(a, a) for _ in range(50)]}
    cp = P.Peer.of_builtin("cpprb", "cpprb")  # cpprb's adapter's raw face
    if cp.unavailable() is None:
        cbuf = P.filled(cp, capacity, width, True)
        c_index, c_raw = cbuf.prepare_update(*P.update_args(capacity, batch))
        out["cp_update"] = lambda: cbuf.update_priorities(c_index, c_raw)
        out["cp_psample"] = lambda: cbuf.sample(batch)
    spans = {"rows": _span(prio.storage.data["obs"]), "tree": _span(prio.sampler.sum_tree.raw_nodes),
             "plain": _span(plain), "huge": _span(huge)}
    out["_keep"] = (prio, uni, plain, huge)
    return out, spans


def watch(minutes: float, capacity: int, width: int, batch: int, reps: int, out) -> int:
    """Blocks until ``minutes`` have passed (at least one); returns how many were written."""
    calls, spans = cells(capacity, width, batch)
    calls.pop("_keep")
    for fn in calls.values():
        fn()
    end, block = time.time() + 60 * minutes, 0
    while block == 0 or time.time() < end:
        before, t0 = counters(), time.time()
        times = {k: [] for k in calls}
        for _ in range(reps):
            order = list(calls.items())
            random.shuffle(order)
            for key, fn in order:
                t = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t) * 1e6)
        after = counters()
        out.write(json.dumps({
            "block": block, "t": t0, "median_us": {k: statistics.median(v) for k, v in times.items()},
            "steal": after["steal"] - before["steal"], "idle": after["idle"] - before["idle"],
            "collapsed": after["collapsed"] - before["collapsed"], "load": open("/proc/loadavg").read().split()[0],
            "vm": {k: v - before["vm"].get(k, 0) for k, v in after["vm"].items() if v != before["vm"].get(k)},
            "huge_kib": huge_pages(spans)}) + "\n")
        out.flush()
        block += 1
    return block


def _corr(a: list, b: list) -> float:
    ma, mb = statistics.mean(a), statistics.mean(b)
    den = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True)) / den if den else float("nan")


def summary(lines: list[dict], window: int = 10) -> list[str]:
    """Each cell's median, its range over windows of ``window`` blocks (slowest window's
    median over the fastest's) and its correlation with the controls."""
    if len(lines) < 2 * window:
        raise ValueError(f"{len(lines)} blocks, but the summary needs at least {2 * window} "
                         f"(two windows of {window})")
    keys = list(lines[0]["median_us"])
    smooth = {k: [statistics.median(r["median_us"][k] for r in lines[i:i + window])
                  for i in range(0, len(lines) - window + 1, window)] for k in keys}
    out = [f"{len(lines)} blocks, {len(smooth[keys[0]])} windows; steal {sum(r['steal'] for r in lines)} ticks, "
           f"khugepaged collapses {sum(r['collapsed'] for r in lines)}, huge pages (KiB, least seen) "
           + str({k: min(r["huge_kib"][k] for r in lines) for k in lines[0]["huge_kib"]})]
    for k in keys:
        s = smooth[k]
        out.append(f"{k}: median {statistics.median(s):.0f} us, range x{max(s) / min(s):.2f}, "
                   f"corr with gather_4k {_corr(s, smooth['gather_4k']):.2f}, with compute {_corr(s, smooth['compute']):.2f}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--capacity", type=int, default=P.CAPACITY)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=P.BATCH)
    parser.add_argument("--reps", type=int, default=40, help="repetitions per block")
    parser.add_argument("--out", default="reports/phases.jsonl")
    parser.add_argument("--summary", metavar="FILE", help="summarise a recorded FILE instead")
    args = parser.parse_args(argv)
    if args.summary:
        print("\n".join(summary([json.loads(line) for line in open(args.summary)])))
        return 0
    for name in ("capacity", "width", "batch", "reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)}, but should be an int >= 1")
    if args.batch > args.capacity:
        parser.error(f"--batch={args.batch}, but should be at most --capacity ({args.capacity})")
    torch.set_num_threads(1)
    with open(args.out, "w") as out:
        blocks = watch(args.minutes, args.capacity, args.width, args.batch, args.reps, out)
    print(f"wrote {blocks} blocks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
