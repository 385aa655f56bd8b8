"""The peers of ``python -m bench.peers`` as the benchmark drives them: each library through its
adapter's raw face (``Adapter.raw``, harness/raw_calls.py), the row stream every buffer is fed,
and the timer. No library is imported here or anywhere in ``bench/``: the adapters build the
libraries' buffers (docs/design.md, "Speed"). Shared by ``bench/peers.py`` (the table),
``bench/check_costs.py`` (``--checks``) and ``bench/phases.py``."""

from __future__ import annotations

import gc
import importlib.metadata
import time
from dataclasses import dataclass

import numpy as np
import torch

from rbcheck.harness.adapters import AdapterLoadError, load_adapter
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.raw_calls import RawCalls
from rbcheck.harness.raw_checks import raw_priority, rows_of

ALPHA, BETA, EPS = 0.6, 0.4, 1e-8
BATCH = 4096
BASE = "rbcheck"  # the baseline: rbcheck's `device` variant on the CPU


# --- data ----------------------------------------------------------------------------------


@dataclass
class Rows:
    """Rows ``start .. start+n-1`` of the stream (``harness/raw_checks.rows_of``): their columns
    (``obs``/``action``/``reward`` NumPy arrays) and raw priorities (float64, float32 values)."""

    t: np.ndarray  # int64 row numbers
    columns: dict
    priority: np.ndarray

    def __len__(self) -> int:
        return len(self.t)


def make_rows(start: int, n: int, width: int) -> Rows:
    t = np.arange(start, start + n, dtype=np.int64)
    return Rows(t, rows_of(t, width), raw_priority(t))


def transformed(raw: np.ndarray) -> np.ndarray:
    return (raw + EPS) ** ALPHA


def spec_for(capacity: int, width: int, prioritized: bool, batch: int = BATCH) -> BufferSpec:
    """The spec every raw face builds its buffer from (harness/raw_calls.py)."""
    layout = {"obs": ((width,), torch.float32), "action": ((2,), torch.float32), "reward": ((), torch.float32)}
    return BufferSpec(capacity, sampler="prioritized" if prioritized else "random", batch_size=batch,
                      alpha=ALPHA, beta=BETA, eps=EPS, seed=0, layout=layout)


# --- peers ---------------------------------------------------------------------------------

#: The benchmark's operations -> the raw face's (harness/raw_calls.py, ``OPERATIONS``).
RAW_OP = {"sample_uniform": "sample", "sample_prioritized": "sample_prioritized",
          "update_priority": "update_priorities", "save": "save", "load": "load"}


class Peer:
    """A replay-buffer library timed through its adapter's raw face (``Adapter.raw``, a
    :class:`~rbcheck.harness.raw_calls.RawCalls` subclass), under ``name``; ``why`` says why it
    cannot run here (its adapter does not load, or has no raw face)."""

    def __init__(self, name: str, raw: type[RawCalls] | None, version: str = "?", why: str | None = None):
        self.name, self.raw, self._version, self.why = name, raw, version, why

    @classmethod
    def of_builtin(cls, name: str, builtin: str) -> Peer:
        """The raw face of ``builtin``'s adapter (a built-in name or ``"pkg.module:factory"``)."""
        try:
            adapter = load_adapter(builtin)
        except (ImportError, AdapterLoadError) as err:
            return cls(name, None, "not installed", f"not installed ({err})")
        if adapter.raw is None:
            return cls(name, None, adapter.version, f"{builtin}'s adapter has no raw face (Adapter.raw)")
        return cls(name, adapter.raw, adapter.version)

    def version(self) -> str:
        return self._version

    def unavailable(self) -> str | None:
        return self.why or self.raw.unavailable()

    def why_not(self, op: str) -> str | None:
        return None if op.startswith("extend_") else self.raw.why_not(RAW_OP[op])

    @property
    def has_prioritized(self) -> bool:
        return self.raw.why_not("sample_prioritized") is None

    @property
    def conventions(self):
        return self.raw.conventions

    def extend_kind(self) -> bool:
        """Whether ``extend`` is timed on the prioritized buffer (one that cannot run: unknown, True)."""
        return self.raw is None or self.raw.extends_prioritized()


def all_peers() -> list[Peer]:
    """Every peer, in the order of the built-ins' records (``peers`` in harness/records.py), each
    the raw face of its built-in's adapter."""
    from rbcheck.harness.records import peer_builtins

    return [Peer.of_builtin(name, builtin) for name, builtin in peer_builtins().items()]


def base_peer() -> Peer:
    """rbcheck's ``device`` variant on the CPU: the baseline."""
    peer = Peer.of_builtin(BASE, "device")
    peer._version = _version("rbcheck")
    return peer


def filled(peer: Peer, capacity: int, width: int, prioritized: bool, batch: int = BATCH) -> RawCalls:
    """A buffer of ``peer`` holding rows ``0 .. capacity-1``."""
    face = peer.raw(spec_for(capacity, width, prioritized, batch))
    rows = make_rows(0, capacity, width)
    face.fill(rows.columns, rows.priority if prioritized else None)
    return face


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"



def update_args(capacity: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The slots (distinct) and raw priorities every ``update_priority`` cell is given."""
    g = np.random.default_rng(11)
    index = g.permutation(capacity)[:batch].astype(np.int64)
    raw = (g.random(batch) * 3.0 + 0.05).astype(np.float32).astype(np.float64)
    return index, raw


def timed(fn) -> float:
    """Seconds one call of ``fn`` takes, the garbage collector held off during it."""
    gc.disable()
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    gc.enable()
    return dt
