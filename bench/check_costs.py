"""What rbcheck's checks cost in the cells closest to 1.2x (``python -m bench.peers --checks``).

The peers table (``bench/peers.py``) times whole calls. The peers here are the raw faces of the
stable-baselines3 and cpprb adapters (``bench/faces.py``), rbcheck's is the ``device`` variant's. Where a cell stays near or below
1.2x, the question is whether rbcheck could be faster with every check kept, or only by
dropping one. This times, side by side in one process, the peer's call and up to three
ways of making rbcheck's:

* ``shipped``: the public call (``ReplayBuffer.extend`` / ``update_priority``);
* ``at hand``: extends only. The product's own ``extend_fast._write`` called directly: the
  same checks of the batch (each column's type, dtype, shape, device, contiguity and address;
  the rows' memory not moved; the generation column, and for the prioritized buffer the trees,
  max priority, ``alpha`` and ``eps``, still the ones bound, at the same addresses), the same
  native call and counters, with the buffer's parts (storage, writer, sampler, plan) already
  found: what finding them costs;
* ``dropped``: the same with the product's switch turned off for the call
  (``extend_fast.CHECKS`` / ``update_fast.CHECKS`` False): none of the Python checks run. The
  checks of values made in C stay (a priority finite and >= 0, an index in range, no transform
  overflowing).

The cells: a 1-row extend into the uniform buffer against stable-baselines3's ``add``, a
1-row extend into the prioritized buffer against cpprb's ``add``, and ``update_priority`` of
``batch`` slots against cpprb's ``update_priorities``. Every call is cold: 32 MiB are written
by ``memset`` before each (C code neither side runs, where NumPy's or torch's own writes
would warm the code of one side). Each repetition calls, in a shuffled order, every peer's
cell and one of rbcheck's ways per operation, the ways taking turns: with all three in
every repetition, two calls of rbcheck's code would warm the caches for the third.

Each way writes its own buffer, built alike and given the same calls. After timing, every
buffer must equal the shipped one (rows, generations, counters, trees, max priority):
``dropped`` and ``at hand`` are timed only because they give the same state.
"""

from __future__ import annotations

import ctypes
import random
import statistics
import time

import torch

from bench import faces as P
from rbcheck.harness.failure import fail

COLD_BYTES = 32 << 20
WAYS = ("shipped", "at hand", "dropped")


class _Cold:
    """``memset`` over ``COLD_BYTES`` before each timed call (``cold()``)."""

    def __init__(self):
        self.block = ctypes.create_string_buffer(COLD_BYTES)
        self.fill = 0

    def __call__(self):
        self.fill = (self.fill + 1) & 0xFF
        ctypes.memset(self.block, self.fill, COLD_BYTES)


def extend_at_hand(buf, data):
    """``buf.extend(data)`` for a 1-row batch of the buffer's exact layout, with the buffer's
    parts found once: the product's own ``extend_fast._write`` (every check of the batch, the
    native call, the counters) called directly, under the storage's extend lock."""
    from rbcheck.variants import native
    from rbcheck.variants.extend_fast import _write, extend_lock

    storage, calls = buf.storage, native.calls()
    plan, source, prioritized = storage._extend_plan, data._tensordict, buf.prioritized
    column = plan.priority_column(buf.priority_key) if prioritized else None
    if prioritized and (column is None or not plan.c_pow):
        raise RuntimeError("the prioritized cell needs a priority column and the pow in C")

    def call():
        with extend_lock(storage):
            index = _write(buf, data, plan, calls, source, 1, storage.capacity, prioritized)
        if index is None:
            raise AssertionError("the fast path refused the row")
        return index

    return call


def extend_dropped(buf, data):
    """``extend_at_hand`` with the product's switch ``extend_fast.CHECKS`` off: none of the
    batch's Python checks (the checks of values in C stay)."""
    from rbcheck.variants import extend_fast

    at_hand = extend_at_hand(buf, data)

    def call():
        extend_fast.CHECKS = False
        try:
            return at_hand()
        finally:
            extend_fast.CHECKS = True

    return call


def update_dropped(buf, index: torch.Tensor, priority: torch.Tensor):
    """``buf.update_priority(index, priority)`` as the product's ``update_fast.try_update`` with its
    switch ``update_fast.CHECKS`` off: the one native call, none of the Python checks of the
    arguments or of the bound plan (the checks of values in C stay)."""
    from rbcheck.variants import update_fast
    from rbcheck.variants.native import torch_pow

    sampler = buf.sampler
    if not torch_pow.in_c(len(index), sampler.alpha) or update_fast.bind(sampler) is None:
        raise RuntimeError("the update cell needs the pow in C")

    def call():
        update_fast.CHECKS = False
        try:
            done = update_fast.try_update(sampler, index, priority)
        finally:
            update_fast.CHECKS = True
        if done is not True:
            raise AssertionError("a check in C failed")

    return call


def state_of(buf) -> dict:
    """Everything a way of calling could change, for ``same_state``."""
    s = buf.storage
    out = {f"rows/{k}": s.data[k].clone() for k in ("obs", "action", "reward")}
    out.update(generation=buf.writer.generation.clone(), counters=(buf.writer.write_count, buf.writer.cursor, s.size))
    if buf.prioritized:
        for name in ("sum_tree", "min_tree"):
            tree = getattr(buf.sampler, name)
            tree.materialize()
            out[name] = tree.raw_nodes.clone()
        out["max"] = buf.sampler._max_priority.clone()
    return out


def same_state(got: dict, want: dict, where: str) -> None:
    """Raises ``PropertyFailure`` naming the first part of ``got`` that differs from ``want``."""
    for key, value in want.items():
        other = got.get(key)
        same = (torch.equal(other, value) if isinstance(other, torch.Tensor) else False) \
            if isinstance(value, torch.Tensor) else other == value
        if not same:
            fail(f"{where}: {key}", "<differs from the shipped call's>", "the shipped call's state")


def measure(capacity: int, width: int, batch: int, reps: int, runs: int, log=print,
            uniform_peer: P.Peer | None = None, prioritized_peer: P.Peer | None = None) -> dict:
    """Median microseconds of every cell in each run; afterwards every way's buffer is
    checked equal to the shipped one's. The peers: stable-baselines3 (uniform) and cpprb
    (prioritized) unless given."""
    if reps < len(WAYS) or reps % len(WAYS):
        raise ValueError(f"reps={reps}, but should be a positive multiple of {len(WAYS)} (the ways "
                         "take turns; each must make as many calls for the states to be compared)")
    rb = P.base_peer()
    sb3 = uniform_peer or P.Peer.of_builtin("sb3", "sb3")
    cpprb = prioritized_peer or P.Peer.of_builtin("cpprb", "cpprb")
    for peer in (sb3, cpprb):
        why = peer.unavailable()
        if why:
            raise RuntimeError(f"--checks needs {peer.name}: {why}")
    row = P.make_rows(3 * capacity, 1, width)

    def built(peer, kind):
        face = P.filled(peer, capacity, width, kind, batch)
        return face, face.prepare(row.columns, row.priority if kind else None)

    # one buffer per (kind, way) (rbcheck's: the variant's ReplayBuffer); each extended once so
    # that its plan is bound
    made = {(kind, way): built(rb, kind) for kind in (False, True) for way in WAYS}
    bufs, one = {key: face.buffer for key, (face, _) in made.items()}, {kind: made[kind, "shipped"][1]
                                                                          for kind in (False, True)}
    for (kind, _), buf in bufs.items():
        buf.extend(one[kind])
    updated = {way: P.filled(rb, capacity, width, True, batch) for way in ("shipped", "dropped")}
    index, raw = updated["shipped"].prepare_update(*P.update_args(capacity, batch))
    updated = {way: face.buffer for way, face in updated.items()}
    (sb3_buf, sb3_one), (cp_buf, cp_one) = built(sb3, False), built(cpprb, True)
    cp_updated = P.filled(cpprb, capacity, width, True, batch)
    cp_args = cp_updated.prepare_update(*P.update_args(capacity, batch))
    cells = {}
    for kind, op, peer, peer_buf, peer_one in ((False, "extend 1 row, uniform", sb3, sb3_buf, sb3_one),
                                               (True, "extend 1 row, prioritized", cpprb, cp_buf, cp_one)):
        cells[op, peer.name] = lambda b=peer_buf, d=peer_one: b.add(d)
        cells[op, "shipped"] = lambda b=bufs[kind, "shipped"], d=one[kind]: b.extend(d)
        cells[op, "at hand"] = extend_at_hand(bufs[kind, "at hand"], one[kind])
        cells[op, "dropped"] = extend_dropped(bufs[kind, "dropped"], one[kind])
    op = f"update_priority {batch}"
    cells[op, cpprb.name] = lambda: cp_updated.update_priorities(*cp_args)
    cells[op, "shipped"] = lambda: updated["shipped"].update_priority(index, raw)
    cells[op, "dropped"] = update_dropped(updated["dropped"], index, raw)
    ways = {op: [way for o, way in cells if o == op and way in WAYS] for op, _ in cells}
    cold = _Cold()
    for fn in cells.values():  # every way once before timing
        fn()
    out = []
    for run in range(runs):
        times = {key: [] for key in cells}
        t0 = time.perf_counter()
        for rep in range(reps):
            # each operation's peer and ONE of rbcheck's ways (in turn): a rotation holds as many
            # calls like rbcheck's as the table's does, so no way warms the code of another for it
            order = [(key, fn) for key, fn in cells.items()
                     if key[1] not in WAYS or key[1] == ways[key[0]][rep % len(ways[key[0]])]]
            random.Random(f"checks/{width}/{run}/{rep}").shuffle(order)
            for key, fn in order:
                cold()
                times[key].append(P.timed(fn))
        out.append({f"{op}|{way}": statistics.median(ts) * 1e6 for (op, way), ts in times.items()})
        log(f"checks, width {width}, run {run + 1}/{runs}: {time.perf_counter() - t0:.0f} s")
    for kind in (False, True):
        want = state_of(bufs[kind, "shipped"])
        for way in WAYS[1:]:
            same_state(state_of(bufs[kind, way]), want, f"extend ({'prioritized' if kind else 'uniform'}), {way}")
    same_state(state_of(updated["dropped"]), state_of(updated["shipped"]), "update_priority, dropped")
    return {"width": width, "capacity": capacity, "batch": batch, "reps": reps, "runs": out}


def _span(values: list[float], digits: int = 0) -> str:
    low, high = min(values), max(values)
    fmt = f"{{:.{digits}f}}"
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}-{fmt.format(high)}"


def render(part: dict) -> list[str]:
    """The table's section for ``report["check_costs"]`` (``--checks``)."""
    lines = ["", "## What the checks cost where rbcheck is nearest 1.2x", "",
             f"`python -m bench.peers --checks` (bench/check_costs.py), {part['date']} at commit "
             f"{part['commit']}, load average {part['load_average'][0]} to {part['load_average'][1]}: "
             "each cell called cold (32 MiB written by `memset` before every call), in one process; "
             f"{part['widths'][0]['reps']} repetitions in each of {len(part['widths'][0]['runs'])} runs, "
             "each calling every peer's cell and one of rbcheck's ways per operation (in turn), "
             "shuffled; medians in microseconds (the range over runs). "
             "*shipped*: rbcheck's public call; *at hand*: the same checks of the batch, the same native "
             "call, the buffer's parts already found; *dropped*: the same native call with no Python "
             "check (the checks of values in C kept). Each way wrote its own buffer, and every buffer "
             "equalled the shipped one's afterwards. Ratios are the peer's time over each way's.", "",
             "| width | operation | peer | its time | shipped | at hand | dropped | / shipped | / at hand | / dropped |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for entry in part["widths"]:
        runs = entry["runs"]
        ops = list(dict.fromkeys(key.split("|")[0] for key in runs[0]))
        for op in ops:
            ways = {key.split("|")[1] for key in runs[0] if key.startswith(op + "|")}
            peer = next(w for w in ways if w not in WAYS)
            cell = [f"{entry['width']}", op, peer, _span([r[f"{op}|{peer}"] for r in runs])]
            for way in WAYS:
                cell.append(_span([r[f"{op}|{way}"] for r in runs]) if way in ways else "—")
            for way in WAYS:
                cell.append(_span([r[f"{op}|{peer}"] / r[f"{op}|{way}"] for r in runs], 2) + "x"
                            if way in ways else "—")
            lines.append("| " + " | ".join(cell) + " |")
    return lines
