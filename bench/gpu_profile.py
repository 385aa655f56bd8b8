"""Where the ``triton`` variant's GPU time goes, and what CUDA graphs could save (not a test).

    python -m bench.gpu_profile [--log2-capacity 20] [--batch 65536] [--out reports]

Needs CUDA (``--device cpu``: a dry run in Triton's interpreter, tiny sizes). On one
buffer (the rows and priorities of ``bench.gpu_bench``) it

1. profiles ``update_priority`` (its graph, ``update_graph``, and eager) and
   ``sample`` (a generator on the GPU) with
   ``torch.profiler``: the kernels of 20 calls, their count and GPU time per call,
   against each call's wall time; the difference is host work (Python, checks,
   launches, the synchronisation);
2. measures what a CUDA graph saves: each operation's part after its
   host synchronisation (the update: the transform and the trees; the sample: the
   descent kernel, the weights, the rows' gather and the generations; the draw
   stays outside) captured once and replayed, against the same part run
   eagerly, medians of interleaved calls. The part before the synchronisation
   cannot go in a graph: the reference's checks (an index out of range, a NaN
   priority, ``total > 0``) must raise before anything changes, and the weights'
   divisor is computed on the host from the trees' roots. Before timing, the
   replayed update must leave the trees of the eager one (after an update with
   other priorities in between) and the replayed sample the eager one's indices.

Writes ``gpu_profile.txt`` and ``gpu_profile.json`` into ``--out``. A step that
fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from bench import gpu_bench
from bench.gpu_bench import build, drawing_on, fill, measure, switched, sync, timed


def kernels(prof, calls: int) -> dict:
    """Per call: the launches, graph launches and copies the host issued (the CUDA API
    calls that name them) and the GPU time of the device's own rows (kernels, copies,
    sets: the operators' rows hold the same time again and are left out)."""
    issued, busy = 0, 0.0
    for row in prof.key_averages():
        if getattr(row, "device_type", None) == torch.autograd.DeviceType.CUDA:
            busy += getattr(row, "self_device_time_total", 0.0) or 0.0
        elif any(word in row.key for word in ("Launch", "Memcpy", "Memset")):
            issued += row.count
    return {"launches_and_copies_per_call": issued / calls, "gpu_us_per_call": busy / calls}


def profiled(name: str, fn, lines: list, calls: int = 20) -> dict:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            sync()
    walls = []
    for _ in range(40):
        walls.append(timed(fn)())
    stats = {"wall_median_us": statistics.median(walls) * 1e6, **kernels(prof, calls)}
    try:
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
    except Exception:  # an older torch's key
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
    lines += [f"## {name}: {stats}", "", table, ""]
    return stats


def eager(fn):
    """``fn`` with ``update_graph.GRAPHS`` off (the update's eager path)."""
    from rbcheck.variants import update_graph

    return switched(fn, update_graph, GRAPHS=False)


def interleaved(cases: dict, reps: int = 60) -> dict:
    """``gpu_bench.measure``'s round-robin medians and minima; a case that raises fails the step."""
    errors: list = []
    result = measure(cases, reps, errors, deadline=math.inf)
    if errors:
        raise RuntimeError(f"cases failed: {errors}")
    return result


def update_ceiling(buf, slots, prio, other) -> dict:
    """The update's part after its checks, eager against a replayed graph (two copies in)."""
    from rbcheck.variants.update_graph import capture, transform_and_update

    sampler = buf.sampler
    index, raw = slots.clone(), prio.clone()
    value = torch.empty_like(raw)

    def tail():
        transform_and_update(sampler, index, raw, value)

    eager(lambda: buf.update_priority(slots, prio))()
    want = sampler.sum_tree.nodes.clone(), sampler.min_tree.nodes.clone()
    graph = capture(tail, index.device)
    eager(lambda: buf.update_priority(slots, other))()  # other leaves: the replay must write them back
    graph.replay()
    sync()
    same = bool(torch.equal(sampler.sum_tree.nodes, want[0]) and torch.equal(sampler.min_tree.nodes, want[1]))

    def replay():
        index.copy_(slots)
        raw.copy_(prio)
        graph.replay()
    result = interleaved({"whole update_priority (graph)": timed(lambda: buf.update_priority(slots, prio)),
                          "whole update_priority (eager)": timed(eager(lambda: buf.update_priority(slots, prio))),
                          "after the checks, eager": timed(tail), "after the checks, graph replay": timed(replay)})
    return {"replay leaves the eager trees": same, **result}


def sample_ceiling(buf, batch: int, generator) -> dict:
    """The sample's part after its synchronisation and draw, eager against a replayed graph."""
    from rbcheck.variants import triton_tree
    from rbcheck.variants.update_graph import capture

    sampler, st = buf.sampler, buf.sampler.sum_tree
    u = torch.rand(batch, generator=generator, dtype=torch.float64, device=st.nodes.device)
    index = torch.empty(batch, dtype=torch.long, device=u.device)
    leaf = torch.empty(batch, dtype=torch.float64, device=u.device)
    weight = torch.empty(batch, dtype=torch.float32, device=u.device)
    n, divisor = len(buf), 0.5

    def tail():
        triton_tree.sample_prefix(st.nodes, u, st.size, n, index, leaf)
        torch.div(leaf.pow_(-sampler.beta), divisor, out=weight)
        return buf.storage.gather(index), buf.writer.generation_at(index)

    tail()
    want = index.clone()
    graph = capture(tail, index.device)
    index.zero_()
    graph.replay()
    sync()
    same = bool(torch.equal(index, want))
    result = interleaved({"whole sample (eager)": timed(lambda: drawing_on(buf, generator, batch)),
                          "after the sync and draw, eager": timed(tail),
                          "after the sync and draw, graph replay": timed(graph.replay)})
    return {"replay gives the eager indices": same, **result}


def step(out: dict, lines: list, name: str, fn) -> None:
    try:
        out[name] = fn()
    except Exception as error:  # recorded, not fatal
        traceback.print_exc()
        out[name] = {"error": f"{type(error).__name__}: {error}"}
    lines.append(f"## {name}\n\n{json.dumps(out[name], indent=1)}\n")
    print(lines[-1], flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-capacity", type=int, default=20)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--out", default="reports")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    gpu_bench.DEVICE = args.device
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to profile")
        return 2
    capacity, batch = 1 << args.log2_capacity, args.batch
    buf = build("triton", capacity)
    fill([buf], capacity)
    g = torch.Generator().manual_seed(5)
    slots = torch.randint(0, capacity, (batch,), generator=g).to(args.device)
    prio = (torch.rand(batch, generator=g, dtype=torch.float64) * 10).to(args.device)
    other = (torch.rand(batch, generator=g, dtype=torch.float64) * 10).to(args.device)
    gpu_gen = torch.Generator(device=args.device).manual_seed(6)
    out, lines = {"capacity": capacity, "batch": batch, "torch": torch.__version__}, []
    start = time.perf_counter()
    step(out, lines, "profile: update_priority", lambda: profiled(
        "update_priority", lambda: buf.update_priority(slots, prio), lines))
    step(out, lines, "profile: update_priority, no graph", lambda: profiled(
        "update_priority, no graph", eager(lambda: buf.update_priority(slots, prio)), lines))
    step(out, lines, "profile: sample, generator on the GPU", lambda: profiled(
        "sample", lambda: drawing_on(buf, gpu_gen, batch), lines))
    if args.device == "cuda":  # graphs need CUDA
        step(out, lines, "graph ceiling: update_priority", lambda: update_ceiling(buf, slots, prio, other))
        step(out, lines, "graph ceiling: sample", lambda: sample_ceiling(buf, batch, gpu_gen))
    out["seconds"] = time.perf_counter() - start
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_profile.json").write_text(json.dumps(out, indent=1))
    (folder / "gpu_profile.txt").write_text("\n".join(lines))
    failed = [name for name, value in out.items() if isinstance(value, dict) and "error" in value]
    print(f"done in {out['seconds']:.1f} s; failed steps: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
