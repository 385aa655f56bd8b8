"""Quick side-by-side speed check of the variants against the reference (not a test).

    python -m bench.speed_check [--capacity 1048576] [--batch 4096] [--reps 200]
                                   [--threads 1,0]  # 0: torch's default
                                   [--scalar]  # the descent's scalar code, not AVX2
                                   [--no-torchrl]  # leave TorchRL's sampler out
                                   [--build-torchrl]  # rebuild TorchRL's extension first if it
                                                      # does not load (tools/torchrl_build.py)

Fills a reference buffer and the variants with the same rows (obs
float32[8], action float32[2], reward float32[1]) and priorities, checks that
they sample the same indices for the same seed, then times, interleaved
round-robin so that machine noise hits all alike, the median of many
repetitions of:

* prioritized ``sample(batch)`` (indices, weights and gathered rows), for the
  reference, the device variant (on the CPU: its native C path when
  ``rbcheck.variants.native`` loads) and the device variant with the native path
  suspended (its torch ops);
* the floor: a plain ``index_select`` of the rows of a sample from the same
  data laid out as separate contiguous columns (the reference's layout; the
  variant's CPU storage interleaves the fields of a row), into fresh tensors.
  "rows" cycles through the index sets of 64 earlier samples, so the rows
  are as cold in the caches as a new sample's; "warm" repeats one index set (the rows stay cached: a lower floor);
* ``update_priority`` of ``batch`` random slots (the same slots every call);
* ``extend`` of ``batch`` rows (with their priorities) into the full buffer;
* the same three for TorchRL's ``PrioritizedSampler`` (a
  ``TensorDictReplayBuffer`` over a ``LazyTensorStorage``, as the ``torchrl``
  adapter's raw face builds and drives it, harness/adapters/torchrl_raw.py;
  filled with the same rows and priorities) when TorchRL is installed and its C++ extension
  loads (else the reason is printed; ``--build-torchrl``, or ``python
  tools/torchrl_build.py`` as ``nox -s bench`` runs it, rebuilds a
  shipped extension that does not load against this torch). Each gets priorities in the dtype its
  trees hold: float64 for rbcheck, float32 for TorchRL's trees.

Ratios for every thread count (``--threads``) are printed together at the end
(of the medians; against TorchRL also of the minima, the quiet moments of a
busy machine).
CUDA timings synchronise inside the timed region. Benchmarks proper live in
``bench/``; this is the quick check quoted in the variants' report.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import native


def build(kind: str, capacity: int, device: str):
    if kind == "reference":
        return reference.ReplayBuffer(capacity, sampler=reference.PrioritizedSampler(capacity, 0.6, 0.4),
                                      generator=0)
    backend = "triton" if kind == "triton" else "torch"
    sampler = variants.PrioritizedSampler(capacity, 0.6, 0.4, backend=backend)
    return variants.ReplayBuffer(capacity, sampler=sampler, generator=0, device=device)


def rows(n: int, g: torch.Generator) -> TensorDict:
    return TensorDict({"obs": torch.randn(n, 8, generator=g), "action": torch.randn(n, 2, generator=g),
                       "reward": torch.randn(n, 1, generator=g),
                       "priority": torch.rand(n, generator=g) * 10}, batch_size=[n])


def fill(buffer, capacity: int, device: str, chunk: int = 1 << 16) -> None:
    g = torch.Generator().manual_seed(1)
    for start in range(0, capacity, chunk):
        buffer.extend(rows(min(chunk, capacity - start), g).to(device))


def build_torchrl(capacity: int, batch: int, rebuild: bool = False):
    """TorchRL's prioritized buffer as the ``torchrl`` adapter's raw face builds it
    (harness/adapters/torchrl_raw.py), or the reason it cannot run here; ``rebuild``:
    first rebuild its C++ extension where the shipped one does not load."""
    from bench.faces import Peer, spec_for

    if rebuild:
        from tools.torchrl_build import default_cache, ensure

        print(f"TorchRL's extension: {ensure(default_cache())[1]}")
    peer = Peer.of_builtin("torchrl", "torchrl")
    if peer.raw is None:
        return None, f"torchrl {peer.why}"
    why = peer.raw.why_not("sample_prioritized")
    if why is not None:
        return None, (f"{why.split(' (')[0]} (--build-torchrl or `python tools/torchrl_build.py` "
                      f"rebuilds the extension against this torch)")
    return peer.raw(spec_for(capacity, 8, True, batch)), None


def numpy_rows(data: TensorDict) -> tuple[dict, object]:
    """``rows(...)`` as a raw face takes them: NumPy columns and raw priorities."""
    return ({k: data[k].numpy() for k in ("obs", "action", "reward")}, data["priority"].double().numpy())


def timer(fn, device: str, torch_path: bool = False):
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run() -> float:
        sync()
        if torch_path:
            with native.suspended():
                t = time.perf_counter()
                fn()
                sync()
                return time.perf_counter() - t
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    return run


def measure(cases: dict, reps: int, slow: tuple) -> dict:
    """``(median us, repetitions, min us)`` per case; cases named with a prefix in
    ``slow`` get reps // 10."""
    for fn in cases.values():  # warm up (Triton compiles on first call)
        fn()
    times = {name: [] for name in cases}
    for rep in range(reps):
        for name, fn in cases.items():
            if not name.startswith(slow) or rep < max(reps // 10, 5):
                times[name].append(fn())
    return {name: (statistics.median(t) * 1e6, len(t), min(t) * 1e6) for name, t in times.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--device", default=str(variants.default_device()))
    parser.add_argument("--scalar", action="store_true",
                        help="the native descent's scalar code even where the CPU has AVX2 "
                             "(what a CPU without AVX2 runs)")
    parser.add_argument("--no-torchrl", action="store_true", help="leave TorchRL's sampler out")
    parser.add_argument("--build-torchrl", action="store_true",
                        help="rebuild TorchRL's C++ extension first where the shipped one does not "
                             "load against this torch (cached; tools/torchrl_build.py)")
    parser.add_argument("--threads", default="1,0",
                        help="comma-separated torch CPU thread counts, 0 = torch's default "
                             "(on a busy 2-core machine 1 is far less noisy)")
    args = parser.parse_args(argv)
    default_threads = torch.get_num_threads()
    cap, batch, device = args.capacity, args.batch, args.device
    cpu = not device.startswith("cuda")
    print(f"native path: {'on' if native.available() else 'OFF: ' + str(native.unavailable_reason())}")
    if native.available():
        print(f"native descent: {'AVX2' if native.vector_descent(not args.scalar) else 'scalar'}")
        print(f"native calls: {native.calls_reason() and 'ctypes (' + native.calls_reason() + ')' or 'calls.c module'}")
    kinds = ["reference", "device"] + (["triton"] if not cpu else [])
    buffers = {k: build(k, cap, "cpu" if k == "reference" else device) for k in kinds}
    for buffer in buffers.values():
        fill(buffer, cap, "cpu" if buffer is buffers["reference"] else device)
    trl, why = (None, "--no-torchrl") if args.no_torchrl else build_torchrl(cap, batch, args.build_torchrl)
    print(f"TorchRL's PrioritizedSampler: {'timed' if trl is not None else 'left out: ' + why}")
    if trl is not None:  # the same rows and priorities as fill()
        g1 = torch.Generator().manual_seed(1)
        for start in range(0, cap, 1 << 16):
            trl.add(trl.prepare(*numpy_rows(rows(min(1 << 16, cap - start), g1))))
    want = buffers["reference"].sample(batch)[1]["index"]  # each buffer's first draw, same seed
    for k in kinds[1:]:  # correctness before speed: same seed, same indices
        got = buffers[k].sample(batch)[1]["index"].cpu()
        agree = float((got == want).double().mean())
        print(f"{k}: fraction of indices equal to the reference's: {agree:.6f}")
    var = buffers["device"]
    # the floor reads separate contiguous columns (the reference's layout, huge pages where
    # the variant's storage has them), not the variant's interleaved rows
    held = [var.storage.data[key] for key in ("obs", "action", "reward")]
    columns = [native.empty_huge(c.shape, c.dtype).copy_(c) if c.device.type == "cpu"
               else c.contiguous() for c in held]
    index_sets = [var.sample(batch)[1]["index"].clone() for _ in range(64)]
    turn = iter(range(1 << 62))
    g = torch.Generator().manual_seed(2)
    slots = torch.randint(0, cap, (batch,), generator=g)
    prio = torch.rand(batch, generator=g, dtype=torch.float64) * 10
    new_rows = rows(batch, g)  # extend: each buffer its own copy (TorchRL adds keys in place)
    cases = {
        "index_select rows": timer(lambda: [torch.index_select(c, 0, index_sets[next(turn) % 64])
                                            for c in columns], device),
        "index_select warm": timer(lambda: [torch.index_select(c, 0, index_sets[0]) for c in columns],
                                   device),
    }
    variants_timed = [(k, False) for k in kinds[1:]] + ([("device", True)] if cpu else [])
    for k, b in buffers.items():
        s, p = slots.to(b.storage.device), prio.to(b.storage.device)
        for kk, torch_path in [(k, False)] if k == "reference" else [v for v in variants_timed if v[0] == k]:
            name = f"{kk}-torch" if torch_path else kk
            dev = "cpu" if k == "reference" else device
            cases[f"{name} sample"] = timer(lambda b=b: b.sample(batch), dev, torch_path)
            cases[f"{name} update_priority"] = timer(lambda b=b, s=s, p=p: b.update_priority(s, p),
                                                     dev, torch_path)
            if not torch_path:
                data = new_rows.to(dev)
                cases[f"{name} extend"] = timer(lambda b=b, data=data: b.extend(data), dev)
    if trl is not None:
        update, data = trl.prepare_update(slots.numpy(), prio.numpy()), trl.prepare(*numpy_rows(new_rows))
        cases["torchrl sample"] = timer(lambda: trl.sample(batch), "cpu")
        cases["torchrl update_priority"] = timer(lambda: trl.update_priorities(*update), "cpu")
        cases["torchrl extend"] = timer(lambda: trl.add(data), "cpu")
    names = ["device"] + (["device-torch"] if cpu else ["triton"])
    results = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads or default_threads)
        median = measure(cases, args.reps, ("reference", "device-torch"))
        results[torch.get_num_threads()] = median
        print(f"capacity={cap} batch={batch} device={device} threads={torch.get_num_threads()}")
        for name, (us, n, low) in median.items():
            print(f"  {name:30s} {us:10.1f} us  (median of {n}; min {low:.1f} us)")
    print("ratios of medians (sample: x faster than the reference | x the index_select of the same "
          "rows (cold / warm); update_priority, extend: x faster than the reference); vs TorchRL: "
          "TorchRL's time / this one's, of the medians and of the minima (on a busy machine the "
          "minima are the quiet moments)")
    for threads, median in results.items():
        ref_s, ref_u = median["reference sample"][0], median["reference update_priority"][0]
        floor, warm = median["index_select rows"][0], median["index_select warm"][0]
        for name in names:
            s, u = median[f"{name} sample"][0], median[f"{name} update_priority"][0]
            e = median[f"{name} extend"][0] if f"{name} extend" in median else math.nan
            print(f"  threads={threads} {name:13s} sample {ref_s / s:6.1f}x faster | "
                  f"{s / floor:5.2f}x / {s / warm:5.2f}x index_select | update {ref_u / u:6.1f}x faster"
                  f" | extend {median['reference extend'][0] / e:5.1f}x faster")
            if "torchrl sample" in median:
                for stat, at in (("medians", 0), ("minima", 2)):
                    ratio = {op: median[f"torchrl {op}"][at] / median[f"{name} {op}"][at]
                             if f"{name} {op}" in median else math.nan
                             for op in ("sample", "update_priority", "extend")}
                    print(f"  threads={threads} {name:13s} vs TorchRL ({stat}): sample "
                          f"{ratio['sample']:5.2f}x | update_priority {ratio['update_priority']:5.2f}x | "
                          f"extend {ratio['extend']:5.2f}x TorchRL's speed")
    return results


if __name__ == "__main__":
    main()
