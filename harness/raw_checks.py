"""The checks a benchmark makes of each raw face's answers before timing it (``bench/peers.py``).

Every buffer is fed one row stream: row ``t`` is a pure function of ``t`` (:func:`rows_of`) and
carries ``t`` in ``obs[:, 0]`` (exact in float32 below 2^24), with the raw priority
:func:`raw_priority` (a float32 value, in [0.05, 3.05)). :class:`RowModel` follows what every
buffer must hold: the row number of each slot (the ring of ``capacity`` slots, full from the
start) and, per declared :class:`~rbcheck.harness.protocol.Conventions`, a
:class:`~rbcheck.harness.oracle.PriorityOracle` of the raw priorities. The checks raise
:class:`~rbcheck.harness.failure.PropertyFailure` (``<what>=<got>, but should be <expected>
[<where>]``): a wrong answer gets no number.

* :func:`check_rows`: exact equality of ``obs``/``action``/``reward``;
* :func:`check_sample`: each sampled row is the row its slot holds (its row number says which
  slot, ``t % capacity``, and that it was not overwritten), equal to the expected rows there;
  the indices, where returned, are those slots; prioritized weights are the oracle's under the
  face's conventions (``rtol`` :data:`WEIGHT_RTOL`: the trees' float32 sums);
* :func:`check_priorities`: stored priorities are the oracle's leaves (``rtol``
  :data:`PRIORITY_RTOL`).

Cost: O(capacity) NumPy per check of the contents; the oracles' writes are O(n) Python each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch

from rbcheck.harness.failure import fail
from rbcheck.harness.oracle import PriorityOracle
from rbcheck.harness.protocol import BufferSpec, Conventions
from rbcheck.harness.raw_calls import COLUMNS

WEIGHT_RTOL = 1e-4
PRIORITY_RTOL = 1e-5


def raw_priority(t: np.ndarray) -> np.ndarray:
    """Deterministic raw priorities in [0.05, 3.05), float32 values as float64."""
    frac = (t.astype(np.float64) * 0.6180339887498949) % 1.0
    return (frac * 3.0 + 0.05).astype(np.float32).astype(np.float64)


def rows_of(t: np.ndarray, width: int) -> dict[str, np.ndarray]:
    """The rows numbered ``t``: ``obs`` float32 ``[n, width]`` (``obs[:, 0] == t``), ``action``
    float32 ``[n, 2]``, ``reward`` float32 ``[n]``."""
    obs = np.sin(t[:, None].astype(np.float32) * np.float32(0.01) + np.arange(width, dtype=np.float32))
    obs[:, 0] = t
    action = np.stack([(t % 7).astype(np.float32), np.cos(t.astype(np.float32))], axis=1)
    reward = np.sin(t.astype(np.float32) * np.float32(0.1)).astype(np.float32)
    return {"obs": obs.astype(np.float32), "action": action, "reward": reward}


def _key(conventions: Conventions) -> str:
    return f"{conventions.priority_dtype}|{conventions.describe()}"


class RowModel:
    """What every buffer must hold after the (checked) calls so far: each slot's row number, the
    ring's write count and, per conventions, a :class:`PriorityOracle` of the raw priorities."""

    def __init__(self, spec: BufferSpec, conventions: Iterable[Conventions] = ()):
        self.capacity = spec.capacity
        self.t = np.arange(self.capacity, dtype=np.int64)
        self.written = self.capacity
        self.oracles: dict[str, PriorityOracle] = {}
        for conv in [Conventions(), *conventions]:
            if _key(conv) not in self.oracles:
                oracle = PriorityOracle(spec.but(sampler="prioritized"), conv)
                oracle.write(self.capacity, torch.from_numpy(raw_priority(self.t)))
                self.oracles[_key(conv)] = oracle

    def oracle(self, conventions: Conventions) -> PriorityOracle:
        return self.oracles[_key(conventions)]

    def write(self, t: np.ndarray) -> np.ndarray:
        """Rows ``t`` (with their raw priorities) written round the ring; returns their slots."""
        slots = (self.written + np.arange(len(t))) % self.capacity
        self.t[slots] = t
        self.written += len(t)
        for oracle in self.oracles.values():
            oracle.write(len(t), torch.from_numpy(raw_priority(t)))
        return slots

    def update(self, slots: np.ndarray, raw: np.ndarray) -> None:
        for oracle in self.oracles.values():
            oracle.update(torch.from_numpy(slots), torch.from_numpy(raw))

    def rows(self, slots: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """The rows the slots must hold."""
        return rows_of(self.t[slots], width)


def _first_diff(a: np.ndarray, b: np.ndarray):
    bad = np.argwhere(a != b) if a.shape == b.shape else np.empty((0, 1))
    return tuple(int(i) for i in bad[0]) if len(bad) else None


def check_rows(got: Mapping, want: Mapping, where: str) -> None:
    """Exact equality of the rows' ``obs``/``action``/``reward``."""
    for key in COLUMNS:
        g, w = np.asarray(got[key]), np.asarray(want[key])
        g = g.reshape(w.shape) if g.size == w.size else g
        if g.shape != w.shape:
            fail(f"{key}.shape", list(g.shape), list(w.shape), call=where)
        if not np.array_equal(g, w):
            at = _first_diff(g, w)
            fail(f"{key}{list(at)}", float(g[at]), float(w[at]), call=where)


def check_sample(out: Mapping, model: RowModel, expected: Callable[[np.ndarray], Mapping], batch: int,
                 where: str, conventions: Conventions | None = None) -> np.ndarray:
    """The sample's rows are the rows in the slots they name (their ``obs[:, 0]``), equal to
    ``expected(slots)`` (the base's rows there, or the model's); its indices,
    where given, are those slots; with ``conventions`` (a prioritized sample) its weights are
    the oracle's. Returns the slots."""
    obs = np.asarray(out["obs"])
    if obs.shape[0] != batch:
        fail("len(sample)", obs.shape[0], batch, call=where)
    t = obs[:, 0].astype(np.int64)
    slots = t % model.capacity
    if not np.array_equal(model.t[slots], t):
        fail("sampled rows", "<rows no longer in their slot>", "rows the buffer holds", call=where)
    check_rows(out, expected(slots), where)
    if out.get("index") is not None and not np.array_equal(np.asarray(out["index"], dtype=np.int64), slots):
        fail("sample index", "<not the slots of the returned rows>", "the slots of the returned rows", call=where)
    if conventions is not None:
        check_weights(np.asarray(out["weight"], dtype=np.float64), slots, model.oracle(conventions), where)
    return slots


def check_weights(weight: np.ndarray, slots: np.ndarray, oracle: PriorityOracle, where: str) -> None:
    """Importance weights of a sample at ``slots``: the oracle's, under its conventions."""
    want = oracle.weights(torch.from_numpy(slots)).numpy()
    if weight.shape != want.shape:
        fail("weight.shape", list(weight.shape), list(want.shape), call=where)
    if not np.allclose(weight, want, rtol=WEIGHT_RTOL, atol=0):
        at = int(np.argmax(np.abs(weight - want) / want))
        fail(f"weight[{at}] (slot {slots[at]})", float(weight[at]),
             f"{want[at]:.7g} (priorities under {oracle.conventions.describe()})", call=where)


def check_priorities(got, slots: np.ndarray, oracle: PriorityOracle, where: str) -> None:
    """Stored priorities of ``slots``: the oracle's leaves."""
    got = np.asarray(got, dtype=np.float64)
    want = oracle.leaves()[torch.from_numpy(slots)].numpy()
    if got.shape != want.shape or not np.allclose(got, want, rtol=PRIORITY_RTOL, atol=0):
        at = int(np.argmax(np.abs(got - want))) if got.shape == want.shape else 0
        fail(f"stored priority (slot {slots[at]})", float(got.reshape(-1)[at]), float(want[at]), call=where)


__all__ = ["PRIORITY_RTOL", "WEIGHT_RTOL", "RowModel", "check_priorities", "check_rows", "check_sample",
           "check_weights", "raw_priority", "rows_of"]
