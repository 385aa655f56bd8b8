"""TorchRL's Ray-served replay buffer (torchrl 0.14.1, ``service_backend="ray"``)
as a BufferUnderTest: ``--impl torchrl-ray``.

What runs (read from TorchRL's source, ``torchrl/data/replay_buffers/ray_buffer.py``):
``TensorDictReplayBuffer(storage=..., sampler=..., service_backend="ray",
service_backend_options={"remote_config": {"num_cpus": 0}})`` returns a
``RayReplayBuffer``: the buffer lives in a Ray actor (its own process); every
call is a round trip to it; ``client()`` hands out picklable clients that other
processes call the same actor with. An actor runs one call at a time, and
TorchRL's ``_replay_lock`` covers extend, sample and update inside it.

* Ray: the adapter starts a local Ray the first time a buffer is made
  (``num_cpus`` = the machine's cores, ``include_dashboard=False``, node
  address 127.0.0.1 in Ray's single-machine mode, usage reporting off) and
  shuts it down at exit (:func:`shutdown`); a Ray already running in this
  process is used as is. ``tests/ray`` checks the node address is loopback.
* Writers of the concurrency properties (``spawn_writer``) run as Ray tasks in
  other processes, each with its own ``client()``, as distributed collectors
  do; samplers, the updater and the saver call the owner from this process.
* Buffers are served by a small pool of actors: starting one is a new Python
  process importing torch (seconds), and Hypothesis builds a buffer per
  example. ``make(spec)`` takes an idle actor and rebuilds TorchRL's buffer in
  it from scratch (:class:`ServedBuffer.rebuild` runs ``__init__`` again with
  the spec's components), so each example gets a fresh TorchRL buffer; a
  buffer is given back when closed or garbage collected.
* Mapping as in ``torchrl.py`` (the in-process adapter): samplers
  ``RandomSampler()`` / ``PrioritizedSampler(capacity, alpha, beta, eps)``;
  ``sample(B, return_info=True, include_info=False)`` (the info stays out of
  the rows), TorchRL's ``"index"`` column hidden,
  ``"priority_weight"`` also given as ``"weight"``; ``save``/``load`` are
  ``dumps``/``loads`` (the actor writes and reads the directory, on this
  machine). ``update_priority`` takes no generation: "stale_updates" is not
  declared (TorchRL's ``update_if_present`` checks generations for data
  patches, not priorities). Stored priorities are not read back.
"""

from __future__ import annotations

import os

# Loopback only. Ray turns a node address of 127.0.0.1 into the machine's
# routable address unless it runs in single-machine mode; this switch (read
# when ray is imported; the name is Ray's) selects that mode: every Ray
# process of this machine then talks over 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine

import atexit
import functools
import gc
import importlib
import threading
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from rbcheck.harness.protocol import Adapter, BufferSpec
from rbcheck.harness.raw_calls import RawFace

CAPABILITIES = frozenset({"random", "prioritized", "save_load", "concurrent"})
BOOKKEEPING_KEY = "index"
#: Idle actors kept for reuse (each is a process holding torch).
MAX_IDLE = 3
#: Buffers alive at once (actors in use): a test holding more fails with a
#: clear error instead of filling the machine's memory (about 300 MB each).
MAX_LIVE = 12
#: Bound of one round trip to the actor that the adapter waits for, seconds
#: (120 s was exceeded once on a 2-core machine running two Rays and a test run).
CALL_TIMEOUT_S = 300.0
#: Bound of the rebuild that hands a reused (idle) actor to a new buffer: an actor
#: still serving calls queued by an earlier run (one stopped at its deadline
#: leaves them there) is replaced by a fresh one instead of failing the new
#: buffer's construction. A fresh actor's rebuild gets CALL_TIMEOUT_S. (A make
#: waited 300 s on a reused actor once, on a 2-core machine under load 7.)
REUSE_TIMEOUT_S = 60.0

_lock = threading.RLock()
_idle: list[Any] = []
_live: set[int] = set()
_started_ray = False
_shut_down = False  # after shutdown() nothing touches Ray (a Ray call would start it again)


# --------------------------------------------------------------------------
# the served class and the Ray runtime
# --------------------------------------------------------------------------


def _served_class() -> type:
    from torchrl.data import TensorDictReplayBuffer

    class ServedBuffer(TensorDictReplayBuffer):
        """TorchRL's TensorDictReplayBuffer plus ``rebuild``: run ``__init__``
        again with new arguments (a fresh buffer in a running actor)."""

        def rebuild(self, kwargs: dict, seed: int) -> bool:
            self.__init__(generator=torch.Generator().manual_seed(seed), **kwargs)
            return True

    ServedBuffer.__module__ = __name__
    ServedBuffer.__qualname__ = "ServedBuffer"
    return ServedBuffer


@functools.cache
def served_class() -> type:
    """The served subclass, importable from this module (Ray pickles it by name)."""
    cls = _served_class()
    globals()["ServedBuffer"] = cls
    return cls


def __getattr__(name: str) -> Any:  # Ray workers unpickle ``torchrl_ray.ServedBuffer``
    if name == "ServedBuffer":
        return served_class()
    raise AttributeError(name)


def ray_init_config() -> dict:
    """Local Ray: this machine's cores, loopback only, no dashboard."""
    return dict(
        address="local",  # always a new local instance, never a cluster found on the machine
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        ignore_reinit_error=True,
    )


def start_ray() -> None:
    """Start the local Ray runtime unless one is running in this process."""
    global _started_ray, _shut_down
    import ray
    from ray._private import ray_constants

    with _lock:
        if not ray.is_initialized():
            # the same switch, for a ray imported before this module set it
            ray_constants.ENABLE_RAY_CLUSTER = False
            ray.init(**ray_init_config())
            _started_ray = True
        _shut_down = False


def shutdown() -> None:
    """Kill every actor of the pool and stop Ray if this module started it."""
    global _started_ray, _shut_down
    with _lock:
        _shut_down = True
        owners, _idle[:] = list(_idle), []
        for owner in owners:
            _kill(owner)
        if _started_ray:
            import ray

            if ray.is_initialized():
                ray.shutdown()
            _started_ray = False


atexit.register(shutdown)


def _kill(owner: Any) -> None:
    try:
        owner.close()
    except Exception:  # noqa: BLE001 - already gone
        pass


def _new_owner() -> Any:
    start_ray()
    cls = served_class()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(
            storage=functools.partial(_lazy_storage, 1),
            service_backend="ray",
            service_backend_options={"remote_config": {"num_cpus": 0}},
        )


def _lazy_storage(capacity: int, device: str = "cpu") -> Any:
    from torchrl.data import LazyTensorStorage

    return LazyTensorStorage(capacity, device=device)


def _acquire() -> tuple[Any, bool]:
    """``(owner, reused)``: an idle actor if there is one, else a new one."""
    with _lock:
        if _idle:
            return _idle.pop(), True
    # Buffers caught in reference cycles (a failure's traceback holds its
    # frames) are only freed by the cycle collector; collecting now gives their
    # actors back before a new one (a process importing torch) is started.
    gc.collect()
    with _lock:
        if _idle:
            return _idle.pop(), True
        if len(_live) >= MAX_LIVE:
            raise RuntimeError(
                f"live served buffers={len(_live)}, but should be below MAX_LIVE={MAX_LIVE}: each is "
                f"a Ray actor process holding torch; close() buffers a test no longer uses"
            )
    return _new_owner(), False


def _release(owner: Any) -> None:
    with _lock:
        if _shut_down or id(owner) not in _live:
            return
        _live.discard(id(owner))
        if len(_idle) < MAX_IDLE and owner.is_alive:
            _idle.append(owner)
            return
    _kill(owner)


def _kwargs(spec: BufferSpec) -> dict:
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

    if spec.sampler == "random":
        sampler = RandomSampler()
    elif spec.sampler == "prioritized":
        sampler = functools.partial(PrioritizedSampler, spec.capacity, alpha=spec.alpha,
                                    beta=spec.beta, eps=spec.eps)
    else:
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized' "
                         f"(what torchrl-ray declares)")
    kwargs: dict[str, Any] = dict(
        storage=functools.partial(_lazy_storage, spec.capacity, spec.device),
        sampler=sampler,
        batch_size=spec.batch_size,
    )
    if spec.priority_key is not None:
        kwargs["priority_key"] = spec.priority_key
    return kwargs


# --------------------------------------------------------------------------
# the buffer under test
# --------------------------------------------------------------------------


def _actor_error(err: BaseException) -> BaseException:
    """The error an actor raised, as it raised it. Ray hands it back as
    ``RayTaskError(<its class>)``, a class made anew for every raise, so two
    raises of one bug look like two bugs to Hypothesis (which then reports a
    FlakyFailure instead of the failure); the cause is stable."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def _unwrapping(method: Callable) -> Callable:
    """``method`` raising what the actor raised (:func:`_actor_error`)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        import ray

        try:
            return method(*args, **kwargs)
        except ray.exceptions.RayTaskError as err:
            error = _actor_error(err)
        # raised outside the handler: no __context__ pointing at Ray's wrapper
        error.__context__ = error.__cause__ = None
        raise error

    return call


class _RayWriter:
    """A writer running as a Ray task; ``join_result`` waits for its slots."""

    def __init__(self, ref: Any):
        self.ref = ref

    def join_result(self, timeout: float) -> list[list[int]]:
        import ray

        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(self.ref, force=True)
            raise TimeoutError("Ray writer task still running") from None
        except ray.exceptions.RayTaskError as err:
            raise _actor_error(err) from None

    def cancel(self) -> None:
        """Stop the task (the run it belongs to has ended)."""
        import ray

        ray.cancel(self.ref, force=True)


@functools.cache
def _writer_task() -> Any:
    import ray

    from rbcheck.harness.concurrency import run_writer

    @ray.remote(num_cpus=0, max_retries=0)
    def write(client: Any, job: Any) -> list[list[int]]:
        return run_writer(_ClientWriter(client), job)

    return write


class _ClientWriter:
    """What ``run_writer`` needs of a client: ``extend``."""

    def __init__(self, client: Any):
        self.client = client

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        return torch.as_tensor(self.client.extend(data.copy()))


class TorchRLRayBuffer:
    """A :class:`BufferUnderTest` over one ``RayReplayBuffer`` owner."""

    #: read by the interrupted-save property, which injects its faults into
    #: this process: the save runs in the actor's
    saves_in_another_process = "TorchRL's dumps runs in the Ray actor that serves the buffer"
    #: the bound of one round trip, read by the concurrency driver: a run's
    #: limit is never shorter than one call may take (harness/concurrency.py)
    call_timeout_s = CALL_TIMEOUT_S

    def __init__(self, owner: Any, spec: BufferSpec):
        self.owner = owner
        self.spec = spec
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _release, owner)
        self._finalizer.atexit = False  # shutdown() cleans up at exit

    def __repr__(self) -> str:
        return f"TorchRLRayBuffer(RayReplayBuffer, {self.spec})"

    def close(self) -> None:
        self._finalizer()

    def _here(self) -> Any:
        """The owner, from the process that made this buffer only: a forked
        child would start a second Ray of its own (Ray does not support fork)."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"pid={os.getpid()} is a forked child, but should be the process that made the "
                f"buffer (pid {self._pid}): a Ray driver cannot be used after fork"
            )
        return self.owner

    @staticmethod
    def _visible(data: TensorDictBase) -> TensorDictBase:
        if BOOKKEEPING_KEY in data.keys():
            return data.exclude(BOOKKEEPING_KEY)
        return data

    # writing
    @_unwrapping
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        return torch.as_tensor(self._here().extend(data.copy()), dtype=torch.long)

    @_unwrapping
    def add(self, row: TensorDictBase) -> int:
        return int(self._here().add(row.copy()))

    def spawn_writer(self, job: Any) -> _RayWriter:
        """Run ``run_writer(client, job)`` as a Ray task (another process)."""
        return _RayWriter(_writer_task().remote(self._here().client(), job))

    # reading
    @_unwrapping
    def __len__(self) -> int:
        return len(self._here())

    @_unwrapping
    def sample(self, batch_size: int | None = None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data, info = self._here().sample(batch_size, return_info=True, include_info=False)
        info = dict(info)
        index = info.get("index")
        if isinstance(index, tuple) and len(index) == 1:
            info["index"] = index[0]
        if "priority_weight" in info:
            info["weight"] = info["priority_weight"]
        return self._visible(data), info

    @_unwrapping
    def contents(self) -> TensorDictBase:
        n = len(self.owner)
        return self._visible(self.owner[torch.arange(n, dtype=torch.long)]).clone()

    def _remote(self, attr: str) -> Any:
        import ray

        return ray.get(self.owner._rb._getattr.remote(attr), timeout=CALL_TIMEOUT_S)

    @property
    def cursor(self) -> int:
        return int(self._remote("_writer")._cursor)  # TorchRL has no public cursor

    @property
    @_unwrapping
    def write_count(self) -> int:
        return int(self.owner.write_count)

    # priorities
    @_unwrapping
    def update_priority(self, index, priority, generation=None) -> None:
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but TorchRL's update_priority(index, priority) "
                "takes no write generation (capability 'stale_updates' is not declared)"
            )
        self._here().update_priority(torch.as_tensor(index), torch.as_tensor(priority))

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("stored priorities are not read back through Ray "
                                  "(capability 'priority_readback' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("max_priority is not read back through Ray "
                                  "(capability 'priority_readback' is not declared)")

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("TorchRL samplers draw their own randomness "
                                  "(capability 'shared_rng' is not declared)")

    # checkpoints
    @_unwrapping
    def save(self, path: Path) -> None:
        self._here().dumps(str(path))

    @_unwrapping
    def load(self, path: Path) -> None:
        self._here().loads(str(path))


def _make(spec: BufferSpec) -> TorchRLRayBuffer:
    import ray

    kwargs = _kwargs(spec)
    owner, reused = _acquire()
    try:
        try:
            ray.get(owner._rb.rebuild.remote(kwargs, spec.seed),
                    timeout=REUSE_TIMEOUT_S if reused else CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            if not reused:
                raise
            _kill(owner)  # still busy with an earlier run's calls: a fresh actor instead
            owner = _new_owner()
            ray.get(owner._rb.rebuild.remote(kwargs, spec.seed), timeout=CALL_TIMEOUT_S)
    except Exception:
        _kill(owner)
        raise
    with _lock:
        _live.add(id(owner))
    return TorchRLRayBuffer(owner, spec)


def torchrl_ray_adapter() -> Adapter:
    """TorchRL's Ray-served buffer; what cannot run here is marked unavailable."""
    try:
        torchrl = importlib.import_module("torchrl")
        ray = importlib.import_module("ray")
    except ImportError as err:
        raise ImportError(
            f"{err.name} is not installed ({type(err).__name__}: {err}), but should be: install "
            f"the 'torchrl' and 'ray' dependency groups (nox -s ray)"
        ) from err
    from rbcheck.harness.adapters.torchrl import CONVENTIONS, probe_prioritized

    why = probe_prioritized()
    unavailable = {"prioritized": why} if why else {}
    version = f"{torchrl.__version__} (ray {ray.__version__}, torch {torch.__version__})"
    return Adapter(
        name="torchrl-ray",
        version=version,
        make=_make,
        capabilities=CAPABILITIES,
        unavailable=unavailable,
        # the served buffer is TorchRL's own sampler in the actor: its rules
        conventions=CONVENTIONS,
        raw=RawFace("rbcheck.harness.adapters.torchrl_ray_raw:TorchRLRayRaw"),  # bench/ray_bench.py's calls
    )


__all__ = ["CAPABILITIES", "TorchRLRayBuffer", "ray_init_config", "served_class", "shutdown",
           "start_ray", "torchrl_ray_adapter"]
