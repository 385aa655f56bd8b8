"""The rows a concurrency run writes, and the checks of what the run left.

:mod:`rbcheck.harness.concurrency` drives the run; the properties of
``rbcheck/conformance/test_concurrency.py`` check its record with these.

Rows
----
Every row carries ``writer`` (int64), ``seq`` (int64, the writer's own row
number, 0, 1, 2, ...), ``payload`` (int64 ``[width]``, a function of the two)
and ``checksum`` (int64, a function of all three plus a salt, so a zero row
that was never written fails it too). A row assembled from two writes (one
column from each) or never written fails :func:`torn_rows`.

What the run left
-----------------
:class:`State` is what a buffer holds after a run (or in a loaded snapshot);
:func:`ring_problems` and :func:`slot_problems` say how it is not the last
``capacity`` rows of one interleaving of the writers' rows;
:func:`identical_batches` and :func:`repeat_bound` tell copies of one random
stream from independent draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

#: The tag columns every concurrency row carries.
TAG_KEYS = ("writer", "seq", "payload", "checksum")
#: Added to every checksum: an all-zero (never written) row does not pass.
SALT = 0x5DEECE66D


# --------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------


def payload_of(writer: torch.Tensor, seq: torch.Tensor, width: int) -> torch.Tensor:
    """int64 ``[n, width]``: distinct per (writer, seq, column), below 2**31."""
    base = writer.to(torch.int64) * 1_000_003 + seq.to(torch.int64) * 7_919 + 17
    k = torch.arange(width, dtype=torch.int64)
    return (base[:, None] * 2_654_435_761 + k * 40_503 + 12_345) % 2**31


def checksum_of(writer: torch.Tensor, seq: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]`` over the tags and the payload (no overflow for width <= 64)."""
    weights = torch.arange(1, payload.shape[-1] + 1, dtype=torch.int64) * 31
    return (payload * weights).sum(-1) + writer.to(torch.int64) * 3_000_017 + seq.to(torch.int64) * 101 + SALT


def make_rows(writer: int, start: int, n: int, width: int) -> TensorDictBase:
    """Rows ``start .. start+n-1`` of writer ``writer`` (batch ``[n]``)."""
    w = torch.full((n,), writer, dtype=torch.int64)
    s = torch.arange(start, start + n, dtype=torch.int64)
    p = payload_of(w, s, width)
    return TensorDict({"writer": w, "seq": s, "payload": p, "checksum": checksum_of(w, s, p)}, batch_size=[n])


def torn_rows(rows: TensorDictBase, totals: Sequence[int]) -> list[str]:
    """Descriptions of rows that are not whole or were never written: the
    checksum does not match, or ``(writer, seq)`` is not a row some writer
    wrote (``totals[w]`` rows by writer ``w``). Empty when all are whole."""
    missing = [k for k in TAG_KEYS if k not in rows.keys()]
    if missing:
        return [f"keys {missing} missing from the rows (keys: {sorted(rows.keys())})"]
    w, s, p, c = (rows.get(k).cpu() for k in TAG_KEYS)
    w, s, c = w.reshape(-1), s.reshape(-1), c.reshape(-1)
    p = p.reshape(len(w), -1)
    bad = []
    good_sum = checksum_of(w, s, p) == c
    good_payload = (payload_of(w, s, p.shape[-1]) == p).all(-1)
    limits = torch.as_tensor(list(totals) or [0], dtype=torch.int64)
    known = (w >= 0) & (w < len(totals)) & (s >= 0)
    known &= s < limits[w.clamp(0, max(len(totals) - 1, 0))]
    for i in torch.nonzero(~(good_sum & good_payload & known)).reshape(-1)[:5].tolist():
        why = "checksum mismatch" if not good_sum[i] else "payload of another row" if not good_payload[i] else "a tag no writer wrote"
        bad.append(f"row {i}: writer={int(w[i])} seq={int(s[i])} checksum={int(c[i])} ({why})")
    return bad


def tags(rows: TensorDictBase) -> list[tuple[int, int]]:
    return list(zip(rows.get("writer").reshape(-1).tolist(), rows.get("seq").reshape(-1).tolist(), strict=True))


def update_priority_of(writer: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """The raw priority the updater gives a row it sampled: distinct per tag,
    in (0, 0.5], so below the initial max priority 1.0 (new rows keep 1.0)."""
    return 1.0 / (2.0 + writer.to(torch.float64) * 100_003 + seq.to(torch.float64))


# --------------------------------------------------------------------------
# the state a run left
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """What a buffer holds, read after a run (or from a loaded snapshot)."""

    length: int
    write_count: int
    cursor: int
    capacity: int
    rows: TensorDictBase  # slots 0 .. length-1

    @classmethod
    def of(cls, buffer: Any, capacity: int) -> State:
        return cls(len(buffer), buffer.write_count, buffer.cursor, capacity, buffer.contents())

    def ring_order(self) -> list[int]:
        """Slots oldest to newest: 0 .. length-1, or from the cursor once full."""
        if self.length < self.capacity:
            return list(range(self.length))
        return [(self.cursor + i) % self.capacity for i in range(self.capacity)]


def ring_problems(state: State, totals: Sequence[int], final: bool) -> list[tuple[str, Any, Any]]:
    """``(what, got, expected)`` for each way ``state`` is not the last
    ``capacity`` rows of one interleaving of the writers' rows that keeps each
    writer's order (``final``: every writer wrote all its rows; otherwise a
    snapshot taken part way, so each writer wrote some prefix of its rows)."""
    out = []
    cap, wc = state.capacity, state.write_count
    total = sum(totals)
    if final and wc != total:
        out.append(("write_count", wc, f"{total} (the rows written: {list(totals)} per writer)"))
    if not final and not 0 <= wc <= total:
        out.append(("write_count of the snapshot", wc, f"in [0, {total}]"))
    if state.length != min(wc, cap):
        out.append(("len", state.length, f"min(write_count={wc}, capacity={cap})"))
    if state.cursor != wc % cap:
        out.append(("cursor", state.cursor, f"write_count % capacity = {wc % cap}"))
    if out:
        return out
    order = [tags(state.rows[[i]])[0] for i in state.ring_order()]
    per_writer: dict[int, list[int]] = {}
    for w, s in order:
        per_writer.setdefault(w, []).append(s)
    for w, seqs in sorted(per_writer.items()):
        if not 0 <= w < len(totals):
            out.append(("a row's writer", w, f"one of 0..{len(totals) - 1}"))
            continue
        want_end = totals[w] if final else seqs[-1] + 1
        want = list(range(want_end - len(seqs), want_end))
        if seqs != want:
            out.append((f"writer {w}'s sequence numbers in ring order", _short(seqs),
                        f"{_short(want)}: its last rows, each once, in write order"))
    if out:
        return out
    if wc <= cap:  # nothing overwritten: every row written so far is here
        if final:
            for w in range(len(totals)):
                if totals[w] and w not in per_writer:
                    out.append((f"rows of writer {w}", 0, f"{totals[w]} (nothing was overwritten)"))
        for w, seqs in per_writer.items():
            if seqs and seqs[0] != 0:
                out.append((f"writer {w}'s first sequence number", seqs[0], "0 (nothing was overwritten)"))
    else:
        written = sum(seqs[-1] + 1 for seqs in per_writer.values())
        absent = sum(totals[w] for w in range(len(totals)) if w not in per_writer)
        if not written <= wc <= written + absent:
            out.append(("write_count", wc, f"between {written} and {written + absent} "
                        f"(the rows up to the last of each writer present, plus absent writers' rows)"))
    return out


def slot_problems(state: State, slots: dict[int, list[list[int]]]) -> list[tuple[str, Any, Any]]:
    """Each surviving row sits in the slot its ``extend`` returned for it."""
    where: dict[tuple[int, int], int] = {}
    for w, batches in slots.items():
        seq = 0
        for batch in batches:
            for slot in batch:
                where[(w, seq)] = slot
                seq += 1
    out = []
    for slot, tag in enumerate(tags(state.rows)):
        if tag in where and where[tag] != slot:
            out.append((f"slot of row writer={tag[0]} seq={tag[1]}", slot,
                        f"{where[tag]}, the slot its extend returned"))
            if len(out) >= 3:
                break
    return out


def _short(seqs: list[int], limit: int = 12) -> str:
    return str(seqs) if len(seqs) <= limit else f"{seqs[:limit // 2]}...{seqs[-limit // 2:]} ({len(seqs)} rows)"


def identical_batches(samples: Sequence[Any]) -> list[tuple[int, int]]:
    """Pairs of sample numbers whose index batches are identical (``samples``:
    :class:`rbcheck.harness.concurrency.Sample`, each with ``info["index"]``)."""
    seen: dict[tuple[int, ...], int] = {}
    pairs = []
    for i, s in enumerate(samples):
        key = tuple(torch.as_tensor(s.info["index"]).reshape(-1).tolist())
        if key in seen:
            pairs.append((seen[key], i))
        else:
            seen[key] = i
    return pairs


def repeat_bound(batches: int, batch: int, size: int) -> float:
    """Probability that two of ``batches`` independent uniform batches of
    ``batch`` draws over ``size`` slots are identical (union bound)."""
    return math.comb(batches, 2) * float(size) ** -batch


__all__ = [
    "SALT", "TAG_KEYS", "State", "checksum_of", "identical_batches", "make_rows", "payload_of", "repeat_bound",
    "ring_problems", "slot_problems", "tags", "torn_rows", "update_priority_of",
]
