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
rows with checksums). ``--address auto`` joins a running Ray cluster instead
of starting a local one (docs/benchmarks.md, "Ray: a real cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch


def _served_buffer(capacity: int, prioritized: bool):
    from rbcheck.harness.adapters.torchrl_ray import served_class, start_ray

    start_ray()
    import functools

    from torchrl.data import LazyTensorStorage
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

    sampler = (functools.partial(PrioritizedSampler, capacity, alpha=0.6, beta=0.4)
               if prioritized else RandomSampler)
    return served_class()(storage=functools.partial(LazyTensorStorage, capacity), sampler=sampler,
                          service_backend="ray",
                          service_backend_options={"remote_config": {"num_cpus": 0}})


def _tasks():
    import ray

    from rbcheck.harness.concurrency_checks import make_rows, torn_rows

    @ray.remote(num_cpus=0, max_retries=0)
    def write(client, writer: int, batches: int, rows: int, width: int) -> float:
        data = [make_rows(writer, i * rows, rows, width) for i in range(batches)]
        client.extend(data[0][:1].copy())  # the first call opens the connection: untimed
        start = time.perf_counter()
        for td in data[1:]:
            client.extend(td)
        return time.perf_counter() - start

    @ray.remote(num_cpus=0, max_retries=0)
    def sample(client, samples: int, rows: int, totals: list[int]) -> float:
        client.sample(rows)  # untimed: the connection
        start = time.perf_counter()
        for _ in range(samples):
            data = client.sample(rows)
        seconds = time.perf_counter() - start
        bad = torn_rows(data.exclude("index"), totals)
        if bad:
            raise AssertionError(f"sampled rows={bad}, but should be whole")
        return seconds

    @ray.remote(num_cpus=0, max_retries=0)
    def in_process(kind: str, k: int, capacity: int, prioritized: bool, batches: int, samples: int,
                   rows: int, width: int) -> float:
        """The in-process baseline, in a worker process like the served side's
        clients (the driver runs Ray's threads, which would slow it)."""
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

        sampler = PrioritizedSampler(capacity, alpha=0.6, beta=0.4) if prioritized else RandomSampler()
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)
        if kind == "extend":
            data = [make_rows(w, i * rows, rows, width) for w in range(k) for i in range(batches)]
            buffer.extend(data[0][:1].copy())
            start = time.perf_counter()
            for td in data[1:]:
                buffer.extend(td)
            return (len(data) - 1) * rows / (time.perf_counter() - start)
        buffer.extend(make_rows(0, 0, capacity, width))
        if kind == "update":
            return update_rounds(buffer, rows, samples)
        buffer.sample(rows)
        start = time.perf_counter()
        for _ in range(k * samples):
            buffer.sample(rows)
        return k * samples * rows / (time.perf_counter() - start)

    @ray.remote(num_cpus=0, max_retries=0)
    def served_update(client, rows: int, rounds: int) -> float:
        return update_rounds(client, rows, rounds)

    @ray.remote(num_cpus=0, max_retries=0)
    def ready() -> bool:
        import rbcheck.harness.concurrency  # noqa: F401 - imports torch in the worker

        return True

    return write, sample, in_process, served_update, ready


def update_rounds(buffer, rows: int, rounds: int) -> float:
    """Seconds per learner step: sample, then update_priority of the sampled slots."""
    with warnings.catch_warnings():  # TorchRL warns on update_priority with a uniform sampler
        warnings.simplefilter("ignore")
        _, info = buffer.sample(rows, return_info=True)
        start = time.perf_counter()
        for i in range(rounds):
            _, info = buffer.sample(rows, return_info=True)
            buffer.update_priority(info["index"], torch.full((rows,), 0.5 + i % 7))
        return (time.perf_counter() - start) / rounds


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(writers: list[int], rows: int, batches: int, samples: int, width: int,
            repeats: int = 3) -> dict:
    """Every served number is taken right after its in-process counterpart,
    ``repeats`` times; the ratio is of the medians."""
    import ray

    from rbcheck.harness.adapters.torchrl import probe_prioritized
    from rbcheck.harness.adapters.torchrl_ray import start_ray

    start_ray()  # before any Ray call: a Ray call would start a default Ray
    prioritized = probe_prioritized() is None
    capacity = max(writers) * batches * rows
    write, sample, in_process, served_update, ready = _tasks()
    ray.get([ready.remote() for _ in range(max(writers))], timeout=600)  # warm the workers
    out: dict = {"extend": {}, "sample": {}, "rows": rows, "batches": batches, "samples": samples,
                 "width": width, "capacity": capacity, "prioritized": prioritized, "repeats": repeats}
    sizes = dict(capacity=capacity, prioritized=prioritized, batches=batches, samples=samples,
                 rows=rows, width=width)

    def local_extend(k: int) -> float:
        return ray.get(in_process.remote("extend", k, **sizes), timeout=600)

    def local_sample(k: int) -> float:
        return ray.get(in_process.remote("sample", k, **sizes), timeout=600)

    served = _served_buffer(capacity, prioritized)
    try:
        for k in writers:
            local, remote = [], []
            for _ in range(repeats):
                local.append(local_extend(k))
                served.empty()
                secs = ray.get([write.remote(c, w, batches, rows, width)
                                for w, c in enumerate(served.clients(k))], timeout=600)
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
                secs = ray.get([sample.remote(c, samples, rows, totals) for c in served.clients(k)],
                               timeout=600)
                remote.append(k * samples * rows / max(secs))
            out["sample"][k] = {"served_rows_per_s": _median(remote), "in_process_rows_per_s": _median(local),
                                "ratio": _median(remote) / _median(local)}
        local_s = [ray.get(in_process.remote("update", 1, **sizes), timeout=600) for _ in range(repeats)]
        served_s = [ray.get(served_update.remote(served.client(), rows, samples), timeout=600)
                    for _ in range(repeats)]
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
    if args.address:
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=args.address)
    from rbcheck.harness.adapters.torchrl_ray import shutdown

    try:
        result = measure(args.writers, args.rows, args.batches, args.samples, args.width,
                         repeats=1 if args.smoke else 3)  # a smoke run checks that it runs: once is enough
    finally:
        shutdown()
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
