"""GPU timings of the prioritized sampler's trees (not a test): the ``triton``
variant (its update in one launch and by the per-level path), the ``device``
variant (torch ops), and their ``index_select`` / ``index_copy_`` floors.

    python -m bench.gpu_bench [--log2-capacities 24,20] [--sample-batches 65536,4096]
                              [--update-batches 65536] [--reps 40] [--out reports]

Needs CUDA. For each capacity it builds one buffer per variant on the GPU
(rows: obs float32[8], action float32[2], reward float32[1]; priorities
uniform in [0, 10)), checks before timing that

* a batch of updates with repeated slots, then one with stale generations
  (the masked path), leaves the triton trees (single launch from a CUDA graph,
  per-level, single launch eager) bit-identical to the device variant's
  (both use torch's pow on CUDA for the stored values, so the leaves are the
  same bits);
* both sample the same indices from the same generator state, and with
  twin generators on the GPU the indices of the reference's draw;

then times, round-robin over all cases (one call each per round, so that
machine noise hits all alike), ``torch.cuda.synchronize()`` before the clock
starts and inside the timed region, the median and minimum of ``--reps``
calls of:

* ``sample`` (indices, weights and gathered rows) for each batch size, with
  the buffer's generator (on the CPU: the uniforms drawn on the host and
  copied) and with a generator on the GPU (drawn in place), and three of
  its parts (the sampler, the rows' gather, the write generations); the descent
  alone (``find_prefix`` on masses already on the GPU); the host draw of the
  uniforms and their copy to the GPU (what the reference's random stream
  costs with a CPU generator) and their draw on the GPU; and the floor:
  ``index_select`` of the rows of an earlier sample from separate contiguous
  columns;
* ``update_priority`` of a batch of random slots (the same every call:
  idempotent), with its checks read back in one synchronisation (the
  default off the CPU) and one by one (the full path), replayed from a CUDA
  graph (the default, ``update_graph``) and eager, the tree update alone
  (``update_trees`` / ``update_pair`` on values already transformed), and the floor:
  ``index_copy_`` of the batch's leaves into two float64 trees.

After timing, the trees of the two variants must still be equal. Writes
``gpu_bench.json`` and ``gpu_bench.md`` into ``--out``. Every case that
fails is recorded with its error and left out; the run goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

#: where the buffers live: "cuda", or "cpu" for a dry run of this script (Triton's
#: interpreter, tiny sizes: ``--device cpu --log2-capacities 6 --reps 2 ...``)
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def log(*parts) -> None:
    print(*parts, flush=True)


def build(backend: str, capacity: int):
    from rbcheck import variants

    sampler = variants.PrioritizedSampler(capacity, 0.6, 0.4, backend=backend)
    return variants.ReplayBuffer(capacity, sampler=sampler, generator=0, device=DEVICE)


def rows(n: int, g: torch.Generator):
    from tensordict import TensorDict

    dev = DEVICE
    return TensorDict({"obs": torch.randn(n, 8, generator=g, device=dev),
                       "action": torch.randn(n, 2, generator=g, device=dev),
                       "reward": torch.randn(n, 1, generator=g, device=dev),
                       "priority": torch.rand(n, generator=g, device=dev) * 10}, batch_size=[n])


def fill(buffers, capacity: int, chunk: int = 1 << 16) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(1)
    for start in range(0, capacity, chunk):
        data = rows(min(chunk, capacity - start), g)
        for buffer in buffers:
            buffer.extend(data)


def trees_equal(a, b) -> bool:
    sa, sb = a.sampler, b.sampler
    return bool(torch.equal(sa.sum_tree.nodes, sb.sum_tree.nodes)
                and torch.equal(sa.min_tree.nodes, sb.min_tree.nodes))


def drawing_on(buffer, generator, batch: int):
    """``buffer.sample(batch)`` drawing from ``generator`` (the buffer's own restored after)."""
    own, buffer.generator = buffer.generator, generator
    try:
        return buffer.sample(batch)
    finally:
        buffer.generator = own


def same_gpu_draws(dev_buf, tri_buf, batch: int) -> bool:
    """With three twin generators on the GPU: both variants sample the indices that the
    reference's draw (``draw_uniforms``) maps to through the trees (``indices_from_uniforms``)."""
    from rbcheck.reference.random_sampler import draw_uniforms

    twins = [torch.Generator(device=DEVICE).manual_seed(11) for _ in range(3)]
    want = tri_buf.sampler.indices_from_uniforms(draw_uniforms(batch, twins[2]))
    return all(torch.equal(drawing_on(b, g, batch)[1]["index"], want)
               for b, g in ((dev_buf, twins[0]), (tri_buf, twins[1])))


def switched(fn, module, **flags):
    """``fn`` run with ``module``'s switches set to ``flags``, each restored after."""
    def run():
        before = {name: getattr(module, name) for name in flags}
        for name, value in flags.items():
            setattr(module, name, value)
        try:
            return fn()
        finally:
            for name, value in before.items():
                setattr(module, name, value)
    return run


def per_op(fn):
    """``fn`` run with the triton sampler's earlier per-op path (``SAMPLE_FUSED = False``)."""
    from rbcheck.variants import triton_tree

    return switched(fn, triton_tree, SAMPLE_FUSED=False)


def same_fused_sample(tri_buf, batch: int) -> bool:
    """The triton sampler's one-launch sample and its per-op path, from twin GPU generators:
    the same indices, and weights within one float32 ulp. On CUDA the per-op path divided
    the leaves by ``total`` through its reciprocal (torch's CUDA division by a scalar), the
    kernel divides (the reference's operation on the CPU): their float64 bases may differ
    in the last bit, which the float32 weights almost always round away."""
    a, b = (torch.Generator(device=DEVICE).manual_seed(11) for _ in range(2))
    fused = tri_buf.sampler.sample(tri_buf.storage, batch, a)
    before = per_op(lambda: tri_buf.sampler.sample(tri_buf.storage, batch, b))()
    w, v = fused["weight"].double(), before["weight"].double()
    return torch.equal(fused["index"], before["index"]) and bool(((w - v).abs() <= v.abs() * 2.0**-23).all())


def timed(fn):
    def run() -> float:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t
    return run


def measure(cases: dict, reps: int, errors: list, deadline: float) -> dict:
    """``{name: {"median_us", "min_us", "reps"}}``, round-robin; a case that raises is
    recorded in ``errors`` and dropped; stops early (fewer reps) at ``deadline``."""
    live = {}
    for name, fn in cases.items():  # warm up: Triton compiles on first call
        try:
            fn()
            fn()
            live[name] = fn
        except Exception as error:  # recorded, not fatal
            errors.append({"case": name, "error": f"{type(error).__name__}: {error}"})
            log(f"  case {name} failed: {type(error).__name__}: {error}")
    times = {name: [] for name in live}
    for _ in range(reps):
        if time.monotonic() > deadline:
            done = len(next(iter(times.values()), []))
            errors.append({"case": "*", "error": f"time budget reached after {done} reps"})
            break
        for name, fn in list(live.items()):
            try:
                times[name].append(fn())
            except Exception as error:
                errors.append({"case": name, "error": f"{type(error).__name__}: {error}"})
                del live[name]
    return {name: {"median_us": statistics.median(t) * 1e6, "min_us": min(t) * 1e6, "reps": len(t)}
            for name, t in times.items() if t}


def check(results: list, what: str, fn) -> bool:
    try:
        ok = bool(fn())
        why = "" if ok else "not equal"
    except Exception as error:
        ok, why = False, f"{type(error).__name__}: {error}"
        traceback.print_exc()
    results.append({"check": what, "ok": ok, "why": why})
    log(f"  check {'ok  ' if ok else 'FAIL'} {what} {why}")
    return ok


def one_capacity(log2: int, sample_batches, update_batches, reps: int, out: dict, deadline: float) -> None:
    from rbcheck.variants import triton_tree, update_graph
    from rbcheck.variants.vector_tree import find_prefix_torch, update_pair

    capacity = 1 << log2
    checks, errors = out["checks"], out["errors"]
    t0 = time.perf_counter()
    dev_buf, tri_buf = build("torch", capacity), build("triton", capacity)
    fill([dev_buf, tri_buf], capacity)
    sync()
    log(f"2^{log2}: filled in {time.perf_counter() - t0:.1f} s")
    g = torch.Generator().manual_seed(2)
    tag = f"2^{log2}"

    # correctness before speed: updates with repeats, then stale generations (masked)
    triton_tree.FUSED, update_graph.GRAPHS = True, True  # whatever a failed capacity left
    for fused, graphs in ((True, True), (False, False), (True, False)):
        triton_tree.FUSED, update_graph.GRAPHS = fused, graphs
        path = ("single launch" if fused else "per-level") + (", CUDA graph" if graphs else ", eager")
        n = max(update_batches)
        for _ in range(3 if graphs else 1):  # with graphs: eager, captured, then replayed on new inputs
            slots = torch.randint(0, capacity, (n,), generator=g).to(DEVICE)
            slots[n // 2:] = slots[: n - n // 2]  # every slot of the second half repeated
            prio = (torch.rand(n, generator=g, dtype=torch.float64) * 10).to(DEVICE)
            for b in (dev_buf, tri_buf):
                b.update_priority(slots, prio)
        check(checks, f"{tag} update_priority {n} with repeats: triton ({path}) trees == device trees",
              lambda: trees_equal(dev_buf, tri_buf))
        _, info = dev_buf.sample(n)
        tri_buf.sample(n)  # keep the generators in step
        stale = rows(1 << 12, torch.Generator(device=DEVICE).manual_seed(3))
        for b in (dev_buf, tri_buf):
            b.extend(stale)  # overwrites the oldest slots: some sampled generations go stale
        prio = (torch.rand(n, generator=g, dtype=torch.float64) * 10).to(DEVICE)
        for b in (dev_buf, tri_buf):
            b.update_priority(info["index"], prio, generation=info["generation"])
        masked = path.replace(", CUDA graph", ", eager: an update with generations is never graphed")
        check(checks, f"{tag} update_priority {n} with stale generations: triton ({masked}) trees == "
                      "device trees",
              lambda: trees_equal(dev_buf, tri_buf))
    triton_tree.FUSED, update_graph.GRAPHS = True, True
    for batch in sample_batches:
        check(checks, f"{tag} sample {batch}, generator on the GPU: triton's one-launch sample == its "
                      "per-op path (indices; weights within one float32 ulp)",
              lambda batch=batch: same_fused_sample(tri_buf, batch))
        check(checks, f"{tag} sample {batch}: triton indices == device indices",
              lambda batch=batch: torch.equal(dev_buf.sample(batch)[1]["index"],
                                              tri_buf.sample(batch)[1]["index"]))
        check(checks, f"{tag} sample {batch}, generator on the GPU: triton indices == device indices == "
                      "the indices of the reference's draw (draw_uniforms) from a twin generator",
              lambda batch=batch: same_gpu_draws(dev_buf, tri_buf, batch))

    # the cases
    cases = {}
    held = [dev_buf.storage.data[key] for key in ("obs", "action", "reward")]
    columns = [c.contiguous().clone() for c in held]
    st, mt = tri_buf.sampler.sum_tree, tri_buf.sampler.min_tree
    ds, dm = dev_buf.sampler.sum_tree, dev_buf.sampler.min_tree
    total = float(ds.nodes[1])
    gpu_gen = torch.Generator(device=DEVICE).manual_seed(4)
    for batch in sample_batches:
        index_sets = [dev_buf.sample(batch)[1]["index"].clone() for _ in range(16)]
        turn = iter(range(1 << 62))
        mass = (torch.rand(batch, generator=g, dtype=torch.float64) * total).to(DEVICE)
        cases[f"sample {batch} | floor: index_select rows"] = timed(
            lambda s=index_sets, t=turn: [torch.index_select(c, 0, s[next(t) % 16]) for c in columns])
        cases[f"sample {batch} | uniforms: host draw + copy"] = timed(
            lambda batch=batch: torch.rand(batch, generator=g, dtype=torch.float64).to(DEVICE))
        cases[f"sample {batch} | uniforms: device draw"] = timed(
            lambda batch=batch: torch.rand(batch, generator=gpu_gen, dtype=torch.float64, device=DEVICE))
        cases[f"sample {batch} | triton"] = timed(lambda batch=batch: tri_buf.sample(batch))
        cases[f"sample {batch} | triton, generator on the GPU"] = timed(
            lambda batch=batch: drawing_on(tri_buf, gpu_gen, batch))
        cases[f"sample {batch} | triton, generator on the GPU: sampler only"] = timed(
            lambda batch=batch: tri_buf.sampler.sample(tri_buf.storage, batch, gpu_gen))
        cases[f"sample {batch} | triton, generator on the GPU: per-op path (before)"] = timed(
            per_op(lambda batch=batch: drawing_on(tri_buf, gpu_gen, batch)))
        cases[f"sample {batch} | triton, generator on the GPU: sampler only, per-op path (before)"] = timed(
            per_op(lambda batch=batch: tri_buf.sampler.sample(tri_buf.storage, batch, gpu_gen)))
        u_dev = torch.rand(batch, generator=gpu_gen, dtype=torch.float64, device=DEVICE)
        out_index = torch.empty(batch, dtype=torch.long, device=DEVICE)
        out_base = torch.empty(batch, dtype=torch.float64, device=DEVICE)
        cases[f"sample {batch} | triton sample kernel only (u * total, descent, base)"] = timed(
            lambda u=u_dev, i=out_index, b=out_base: triton_tree.sample_prefix(st.nodes, u, st.size, capacity,
                                                                                i, b))
        cases[f"sample {batch} | triton: gather only"] = timed(
            lambda s=index_sets, t=turn: tri_buf.storage.gather(s[next(t) % 16]))
        cases[f"sample {batch} | triton: generations only"] = timed(
            lambda s=index_sets, t=turn: tri_buf.writer.generation_at(s[next(t) % 16]))
        cases[f"sample {batch} | device"] = timed(lambda batch=batch: dev_buf.sample(batch))
        cases[f"sample {batch} | device, generator on the GPU"] = timed(
            lambda batch=batch: drawing_on(dev_buf, gpu_gen, batch))
        cases[f"sample {batch} | triton descent only"] = timed(
            lambda m=mass: triton_tree.find_prefix(st.nodes, m, st.size))
        cases[f"sample {batch} | device descent only"] = timed(
            lambda m=mass: find_prefix_torch(ds.nodes, m, ds.size))
    for batch in update_batches:
        slots = torch.randint(0, capacity, (batch,), generator=g).to(DEVICE)
        prio = (torch.rand(batch, generator=g, dtype=torch.float64) * 10).to(DEVICE)
        value = (prio + 1e-8) ** 0.6
        low = torch.where(value > 0, value, math.inf)
        leaves = slots + st.size
        floor_a, floor_b = torch.zeros_like(st.nodes), torch.zeros_like(mt.nodes)

        def set_fused(fused, fn, graphs=None):  # the per-level path runs eagerly
            return switched(switched(fn, triton_tree, FUSED=fused), update_graph,
                            GRAPHS=fused if graphs is None else graphs)

        cases[f"update_priority {batch} | floor: index_copy_ leaves (2 trees)"] = timed(
            lambda leaves=leaves, value=value, low=low, fa=floor_a, fb=floor_b: (
                fa.index_copy_(0, leaves, value), fb.index_copy_(0, leaves, low)))
        for fused, name in ((True, "triton single launch"), (False, "triton per-level")):
            cases[f"update_priority {batch} | {name}"] = timed(
                set_fused(fused, lambda s=slots, p=prio: tri_buf.update_priority(s, p)))
            cases[f"update_priority {batch} | {name}: trees only"] = timed(
                lambda s=slots, v=value, lo=low, fused=fused: triton_tree.update_trees(
                    [st, mt], s, [v, lo], None, fused=fused))
        cases[f"update_priority {batch} | triton single launch, eager (no CUDA graph)"] = timed(
            set_fused(True, lambda s=slots, p=prio: tri_buf.update_priority(s, p), graphs=False))

        def checks_one_by_one(fn, sampler=tri_buf.sampler):
            def run():
                sampler._update_one_sync = lambda *args, **kwargs: False  # the full path's checks
                try:
                    return fn()
                finally:
                    del sampler._update_one_sync
            return run

        cases[f"update_priority {batch} | triton single launch, checks one by one"] = timed(
            checks_one_by_one(lambda s=slots, p=prio: tri_buf.update_priority(s, p)))
        cases[f"update_priority {batch} | device"] = timed(
            lambda s=slots, p=prio: dev_buf.update_priority(s, p))
        cases[f"update_priority {batch} | device: trees only"] = timed(
            lambda s=slots, v=value: update_pair(ds, dm, s, v))
    measured = measure(cases, reps, errors, deadline)
    check(checks, f"{tag} after timing: triton trees == device trees", lambda: trees_equal(dev_buf, tri_buf))
    for name, stats in measured.items():
        op, case = name.split(" | ")
        out["cases"].append({"log2_capacity": log2, "op": op, "case": case, **stats})
        log(f"  {tag} {op:24s} {case:44s} median {stats['median_us']:10.1f} us  min {stats['min_us']:10.1f} us")


def markdown(out: dict) -> str:
    lines = [f"GPU timings: {out['gpu']}, torch {out['torch']}, triton {out['triton']}, "
             f"commit {out['commit']}, {out['reps']} interleaved calls per case; "
             "medians (minima) in microseconds, and the median over the floor's.", ""]
    lines += ["| capacity | op | case | median us | min us | x floor |", "|---|---|---|---|---|---|"]
    floors = {(c["log2_capacity"], c["op"]): c["median_us"] for c in out["cases"] if c["case"].startswith("floor")}
    for c in out["cases"]:
        floor = floors.get((c["log2_capacity"], c["op"]))
        ratio = f"{c['median_us'] / floor:.2f}" if floor else ""
        lines.append(f"| 2^{c['log2_capacity']} | {c['op']} | {c['case']} | {c['median_us']:.1f} | "
                     f"{c['min_us']:.1f} | {ratio} |")
    lines += ["", "| check | ok | why |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else 'NO'} | {c['why']} |" for c in out["checks"]]
    if out["errors"]:
        lines += ["", "Errors:", ""] + [f"- {e['case']}: {e['error']}" for e in out["errors"]]
    return "\n".join(lines) + "\n"


#: Recorded GPU runs (a record: title, measured, command, machine, note, data =
#: this script's JSON) and the page rendered from them (never edited by hand).
RECORDS = Path(__file__).resolve().parents[1] / "docs" / "results" / "data" / "gpu"
PAGE = RECORDS.parents[1] / "gpu.md"


def page(records: list[dict]) -> str:
    """The docs page of the recorded GPU runs, in file order."""
    lines = ["# GPU timings", "",
             "Generated by `python -m bench.gpu_bench --render` from docs/results/data/gpu/; do not edit.",
             "A GPU is lent to some sessions only: each run below is dated.", ""]
    for rec in records:
        lines += [f"## {rec['title']}", "", f"- measured: {rec['measured']}", f"- command: `{rec['command']}`",
                  f"- machine: {rec['machine']}", f"- note: {rec['note']}", "", markdown(rec["data"])]
    return "\n".join(lines)


def recorded() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if list(argv) == ["--render"]:
        PAGE.write_text(page(recorded()))
        print(f"wrote {PAGE}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-capacities", default="24,20")
    parser.add_argument("--sample-batches", default="65536,4096")
    parser.add_argument("--update-batches", default="65536")
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; fewer reps past it")
    parser.add_argument("--out", default="reports")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny sizes)")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: nothing to time")
        return 2
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except Exception:
        commit = "unknown"
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "none (cpu dry run)"
    out = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "commit": commit, "reps": args.reps,
           "cases": [], "checks": [], "errors": []}
    start = time.monotonic()
    caps = [int(x) for x in args.log2_capacities.split(",")]
    for i, log2 in enumerate(caps):
        share = (args.budget - (time.monotonic() - start)) / (len(caps) - i)
        try:
            one_capacity(log2, [int(x) for x in args.sample_batches.split(",")],
                         [int(x) for x in args.update_batches.split(",")], args.reps, out,
                         time.monotonic() + share * 0.7)
        except Exception as error:  # recorded, not fatal: the next capacity still runs
            traceback.print_exc()
            out["errors"].append({"case": f"2^{log2}", "error": f"{type(error).__name__}: {error}"})
        if DEVICE == "cuda":
            torch.cuda.empty_cache()  # the last capacity's buffers are gone with its frame
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu_bench.json").write_text(json.dumps(out, indent=1))
        (folder / "gpu_bench.md").write_text(markdown(out))
    log(markdown(out))
    return 0 if all(c["ok"] for c in out["checks"]) and not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
