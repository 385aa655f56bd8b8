"""The raw face of the ``torchrl-ray`` adapter (``Adapter.raw``, harness/raw_calls.py): TorchRL's
replay buffer served through Ray (``TensorDictReplayBuffer(..., service_backend="ray")``, a
``RayReplayBuffer`` whose buffer lives in a Ray actor; harness/adapters/torchrl_ray.py), driven as
distributed users drive it: ``extend``/``sample``/``update_priority`` from this process, and the
same calls from other processes through ``client()`` handles in Ray tasks (:meth:`tasks`).

``bench/ray_bench.py`` times it against the in-process buffer (the ``torchrl`` adapter's raw face,
built in a Ray worker by the ``in_process`` task) and reaches Ray only through this face:
:meth:`start` (a local Ray, or ``address`` to join a cluster), :meth:`tasks` (the remote
functions), :meth:`gather` (``ray.get``) and :meth:`shutdown`. Rows are any TensorDict (the
benchmark's carry checksums, ``harness/concurrency_checks.py``): ``prepare`` takes one as is.
Unlike the pooled buffers of the conformance suite, each face starts its own served buffer (one
actor) and :meth:`close` ends it. Cost: a round trip to the actor per call."""

from __future__ import annotations

import functools
import os
import time
import warnings
from typing import Any

import torch

from rbcheck.harness.adapters.torchrl_raw import TorchRLFace, TorchRLRaw

#: Seconds any Ray call of the benchmark may take.
TIMEOUT_S = 600


class TorchRLRayRaw(TorchRLFace):
    """``served_class()(storage=partial(LazyTensorStorage, capacity), sampler=PrioritizedSampler
    (capacity, alpha, beta) or RandomSampler, service_backend="ray", service_backend_options=
    {"remote_config": {"num_cpus": 0}})``."""

    def __init__(self, spec):
        super().__init__(spec)
        from torchrl.data import LazyTensorStorage
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

        from rbcheck.harness.adapters.torchrl_ray import served_class

        self.start()
        s = spec
        sampler = (functools.partial(PrioritizedSampler, s.capacity, alpha=s.alpha, beta=s.beta)
                   if self.prioritized else RandomSampler)
        self.buffer = served_class()(storage=functools.partial(LazyTensorStorage, s.capacity), sampler=sampler,
                                     service_backend="ray",
                                     service_backend_options={"remote_config": {"num_cpus": 0}})

    # Ray
    @staticmethod
    def start(address: str | None = None) -> None:
        """A local Ray (harness/adapters/torchrl_ray.py's ``start_ray``), or ``ray.init(address)``
        (``"auto"``: a running cluster) where ``address`` is given; before any other Ray call."""
        if address:
            import ray

            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=address)
            return
        from rbcheck.harness.adapters.torchrl_ray import start_ray

        start_ray()

    @staticmethod
    def shutdown() -> None:
        """Stop what :meth:`start` started (torchrl_ray's ``shutdown``)."""
        from rbcheck.harness.adapters.torchrl_ray import shutdown

        shutdown()

    @staticmethod
    def gather(refs: Any, timeout: float = TIMEOUT_S) -> Any:
        """``ray.get(refs, timeout=timeout)``: the results of remote calls."""
        import ray

        return ray.get(refs, timeout=timeout)

    @staticmethod
    def tasks() -> dict:
        """The benchmark's Ray tasks (``.remote(...)`` each): ``write``, ``sample``, ``in_process``,
        ``served_update``, ``ready`` (see :func:`_tasks`)."""
        return _tasks()

    # the served buffer
    def prepare(self, rows, priority):
        return rows

    def add(self, prepared):
        self.buffer.extend(prepared)

    def sample(self, batch):
        return self.buffer.sample(batch)

    def update_priorities(self, index, priority):
        self.buffer.update_priority(index, priority)

    def empty(self) -> None:
        self.buffer.empty()

    @property
    def write_count(self) -> int:
        return self.buffer.write_count

    def client(self) -> Any:
        """A picklable handle on the served buffer for another process."""
        return self.buffer.client()

    def clients(self, k: int) -> list:
        return self.buffer.clients(k)

    def close(self) -> None:
        self.buffer.close()


def update_rounds(buffer, rows: int, rounds: int) -> float:
    """Seconds per learner step on ``buffer`` (TorchRL's, served or not): ``sample`` then
    ``update_priority`` of the sampled slots."""
    with warnings.catch_warnings():  # TorchRL warns on update_priority with a uniform sampler
        warnings.simplefilter("ignore")
        _, info = buffer.sample(rows, return_info=True)
        start = time.perf_counter()
        for i in range(rounds):
            _, info = buffer.sample(rows, return_info=True)
            buffer.update_priority(info["index"], torch.full((rows,), 0.5 + i % 7))
        return (time.perf_counter() - start) / rounds


@functools.cache
def _tasks() -> dict:
    import ray

    from rbcheck.harness.concurrency_checks import make_rows, torn_rows

    @ray.remote(num_cpus=0, max_retries=0)
    def write(client, writer: int, batches: int, rows: int, width: int) -> float:
        """Seconds ``client`` takes to extend by ``batches - 1`` batches of ``rows`` rows
        (the first, one row, opens the connection: untimed)."""
        data = [make_rows(writer, i * rows, rows, width) for i in range(batches)]
        client.extend(data[0][:1].copy())
        start = time.perf_counter()
        for td in data[1:]:
            client.extend(td)
        return time.perf_counter() - start

    @ray.remote(num_cpus=0, max_retries=0)
    def sample(client, samples: int, rows: int, totals: list[int]) -> float:
        """Seconds ``client`` takes to sample ``samples`` batches; the last batch's rows checked whole."""
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
    def in_process(kind: str, k: int, spec, batches: int, samples: int, rows: int, width: int) -> float:
        """The in-process baseline (the ``torchrl`` adapter's raw face over ``spec``), in a worker
        process like the served side's clients (the driver runs Ray's threads, which would slow it):
        rows/s of ``extend``/``sample``, or seconds per ``update`` round."""
        face = TorchRLRaw(spec)
        if kind == "extend":
            data = [make_rows(w, i * rows, rows, width) for w in range(k) for i in range(batches)]
            face.add(data[0][:1].copy())
            start = time.perf_counter()
            for td in data[1:]:
                face.add(td)
            return (len(data) - 1) * rows / (time.perf_counter() - start)
        face.add(make_rows(0, 0, spec.capacity, width))
        if kind == "update":
            return update_rounds(face.buffer, rows, samples)
        face.buffer.sample(rows)
        start = time.perf_counter()
        for _ in range(k * samples):
            face.buffer.sample(rows)
        return k * samples * rows / (time.perf_counter() - start)

    @ray.remote(num_cpus=0, max_retries=0)
    def served_update(client, rows: int, rounds: int) -> float:
        return update_rounds(client, rows, rounds)

    @ray.remote(num_cpus=0, max_retries=0)
    def ready() -> bool:
        import rbcheck.harness.concurrency  # noqa: F401 - imports torch in the worker

        return True

    return {"write": write, "sample": sample, "in_process": in_process, "served_update": served_update,
            "ready": ready}


__all__ = ["TIMEOUT_S", "TorchRLRayRaw", "update_rounds"]
