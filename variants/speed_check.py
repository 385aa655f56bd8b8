"""Quick side-by-side speed check of the variants against the reference (not a test).

    python -m variants.speed_check [--capacity 1048576] [--batch 4096] [--reps 200]

Fills a reference buffer and each variant with the same rows (obs float32[8],
action float32[2], reward float32[1]) and priorities, checks that they sample
the same indices for the same seed, then times, interleaved round-robin so
that machine noise hits all alike, the median of many repetitions of:

* prioritized ``sample(batch)`` (indices, weights and gathered rows);
* a plain ``index_select`` of the same rows from the same columns (the floor);
* ``update_priority`` of ``batch`` random slots.

CUDA timings synchronise inside the timed region. Benchmarks proper live in
``bench/``; this is the quick check quoted in the variants' report.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict

import reference
import variants


def build(kind: str, capacity: int, device: str):
    if kind == "reference":
        return reference.ReplayBuffer(capacity, sampler=reference.PrioritizedSampler(capacity, 0.6, 0.4),
                                      generator=0)
    backend = "triton" if kind == "triton" else "torch"
    sampler = variants.PrioritizedSampler(capacity, 0.6, 0.4, backend=backend)
    return variants.ReplayBuffer(capacity, sampler=sampler, generator=0, device=device)


def fill(buffer, capacity: int, device: str, chunk: int = 1 << 16) -> None:
    g = torch.Generator().manual_seed(1)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        td = TensorDict({"obs": torch.randn(n, 8, generator=g), "action": torch.randn(n, 2, generator=g),
                         "reward": torch.randn(n, 1, generator=g),
                         "priority": torch.rand(n, generator=g) * 10}, batch_size=[n])
        buffer.extend(td.to(device))


def timer(fn, device: str):
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run() -> float:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    return run


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--device", default=str(variants.default_device()))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (on a busy 2-core machine 1 is far less noisy)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cap, batch, device = args.capacity, args.batch, args.device
    kinds = ["reference", "device"] + (["triton"] if device.startswith("cuda") else [])
    buffers = {k: build(k, cap, "cpu" if k == "reference" else device) for k in kinds}
    for buffer in buffers.values():
        fill(buffer, cap, "cpu" if buffer is buffers["reference"] else device)
    for k in kinds[1:]:  # correctness before speed: same seed, same indices
        want = buffers["reference"].sample(batch)[1]["index"]
        got = buffers[k].sample(batch)[1]["index"].cpu()
        agree = float((got == want).double().mean())
        print(f"{k}: fraction of indices equal to the reference's: {agree:.6f}")
    var = buffers["device"]
    columns = [var.storage.data[key] for key in ("obs", "action", "reward")]
    index = var.sample(batch)[1]["index"]
    g = torch.Generator().manual_seed(2)
    slots = torch.randint(0, cap, (batch,), generator=g)
    prio = torch.rand(batch, generator=g, dtype=torch.float64) * 10
    out = [torch.empty((batch, *c.shape[1:]), dtype=c.dtype, device=c.device) for c in columns]
    cases = {
        "index_select (fresh)": timer(lambda: [torch.index_select(c, 0, index) for c in columns], device),
        "index_select (out=)": timer(lambda: [torch.index_select(c, 0, index, out=o)
                                              for c, o in zip(columns, out, strict=True)], device),
    }
    for k, b in buffers.items():
        dev = "cpu" if k == "reference" else device
        cases[f"{k} sample"] = timer(lambda b=b: b.sample(batch), dev)
        s, p = slots.to(dev), prio.to(dev)
        cases[f"{k} update_priority"] = timer(lambda b=b, s=s, p=p: b.update_priority(s, p), dev)
    times = {name: [] for name in cases}
    for fn in cases.values():  # warm up (Triton compiles on first call)
        fn()
    reps = {name: args.reps if not name.startswith("reference") else max(args.reps // 10, 5)
            for name in cases}
    for rep in range(args.reps):
        for name, fn in cases.items():
            if rep < reps[name]:
                times[name].append(fn())
    median = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    print(f"capacity={cap} batch={batch} device={device} threads={torch.get_num_threads()}")
    for name, us in median.items():
        print(f"  {name:34s} {us:10.1f} us  (median of {len(times[name])})")
    floor = median["index_select (fresh)"]
    for k in kinds[1:]:
        print(f"{k}: sample {median['reference sample'] / median[f'{k} sample']:.1f}x faster than the "
              f"reference, {median[f'{k} sample'] / floor:.2f}x a plain index_select; update_priority "
              f"{median['reference update_priority'] / median[f'{k} update_priority']:.1f}x faster")
    return median


if __name__ == "__main__":
    main()
