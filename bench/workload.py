"""Workloads shared by the asv benchmarks (``bench/*.py``) and the
pytest-benchmark files (``bench/micro/``).

One vocabulary for both: an *operation* (``extend``, ``sample_prioritized``,
...) needs a capability and a kind of buffer; a *size* is a capacity, a batch
size and a row width (the number of float32 features in ``observation``).
Buffers are filled with deterministic rows, so the implementation under test
and the reference hold identical data and can be compared slot by slot.

Every benchmark checks its answer against the reference before it is allowed
to produce a number (``check_*`` below raise ``AssertionError`` with a
``<what>=<got>, but should be <expected>`` message): a wrong fast answer is a
failure, not a speedup.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.assertions import fail
from rbcheck.harness.protocol import Adapter, BufferSpec, BufferUnderTest

#: Sizes of the pytest-benchmark grid, by mode (env ``RBCHECK_BENCH``).
GRIDS = {
    # each benchmark once, small: the CI smoke run checks every answer, times
    # nothing (at 2^16 filling the example's and the interpreted triton
    # variant's buffers took 2 of its 2.5 minutes)
    "smoke": {"capacity": (2**10,), "batch_size": (256,), "width": (8,)},
    # what ``nox -s bench`` runs; slow single calls are skipped (see BUDGET_S)
    "default": {"capacity": (2**16, 2**20), "batch_size": (256, 4096, 65536), "width": (8, 64)},
    # the same sizes with no time budget: every number, however slow
    "full": {"capacity": (2**16, 2**20), "batch_size": (256, 4096, 65536), "width": (8, 64)},
}
#: In the "default" grid a call slower than this (seconds, measured once on the
#: check call) is skipped with the reason; env ``RBCHECK_BENCH_BUDGET`` overrides.
BUDGET_S = 2.0

EPISODE_LEN = 200  # steps per episode in the filled data
SLICE_LEN = 32  # slice sampler: slices of 32 steps, batch_size // 32 slices
ALPHA, BETA, EPS = 0.6, 0.4, 1e-8


@dataclass(frozen=True)
class Operation:
    name: str
    capability: str | None  # what the adapter must declare (None: core API)
    sampler: str  # the BufferSpec.sampler of the buffer it runs on
    uses_batch: bool = True  # batch size is a parameter
    uses_width: bool = True  # row width is a parameter


OPERATIONS = {
    op.name: op
    for op in (
        Operation("extend", None, "random"),
        Operation("add", None, "random", uses_batch=False),
        Operation("sample_random", "random", "random"),
        Operation("sample_prioritized", "prioritized", "prioritized", uses_width=False),
        Operation("sample_slice", "slice", "slice", uses_width=False),
        Operation("update_priority", "prioritized", "prioritized", uses_width=False),
        Operation("save", "save_load", "random", uses_batch=False),
        Operation("load", "save_load", "random", uses_batch=False),
    )
}


def apply_thread_setting() -> int | None:
    """``torch.set_num_threads(n)`` from env ``RBCHECK_BENCH_THREADS`` (unset:
    torch's default). On a shared or oversubscribed machine torch's intra-op
    thread pool is the largest source of noise: a call that takes 0.2 ms with
    one thread can take 10 ms when its worker threads wait for a core."""
    value = os.environ.get("RBCHECK_BENCH_THREADS")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"RBCHECK_BENCH_THREADS={value!r}, but should be a positive integer")
    torch.set_num_threads(int(value))
    return int(value)


def grid_mode(default: str = "default") -> str:
    mode = os.environ.get("RBCHECK_BENCH", default) or default
    if mode not in GRIDS:
        raise ValueError(f"RBCHECK_BENCH={mode!r}, but should be one of {sorted(GRIDS)}")
    return mode


def budget_s(mode: str) -> float | None:
    """Seconds one call may take before the benchmark is skipped (None: no limit)."""
    if mode != "default":
        return None
    return float(os.environ.get("RBCHECK_BENCH_BUDGET", BUDGET_S))


def sizes(op: Operation, mode: str) -> list[tuple[int, int, int]]:
    """(capacity, batch_size, width) triples for ``op``; batch innermost so a
    filled buffer is reused across batch sizes. Unused dimensions take their
    smallest value (``add``/``save``/``load`` have no batch; priority and slice
    operations run at the smallest width, as width only changes the gather)."""
    grid = GRIDS[mode]
    batches = grid["batch_size"] if op.uses_batch else grid["batch_size"][:1]
    widths = grid["width"] if op.uses_width else grid["width"][:1]
    return [(c, b, w) for c in grid["capacity"] for w in widths for b in batches]


def pow2(n: int) -> str:
    """``65536 -> '2^16'``; other numbers as they are."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def size_label(capacity: int, batch_size: int, width: int, op: Operation | None = None) -> str:
    parts = [f"cap={pow2(capacity)}"]
    if op is None or op.uses_batch:
        parts.append(f"batch={batch_size}")
    if op is None or op.uses_width:
        parts.append(f"width={width}")
    return ",".join(parts)


# --- data -------------------------------------------------------------------


def make_rows(n: int, width: int, start: int = 0, device: str = "cpu") -> TensorDict:
    """Rows ``start .. start+n-1`` of the benchmark's endless trajectory stream.
    Row ``t`` is a pure function of ``t``, so any two buffers written with the
    same calls hold the same data."""
    t = torch.arange(start, start + n, dtype=torch.int64)
    features = torch.arange(width, dtype=torch.float32)
    observation = torch.sin(t.to(torch.float32)[:, None] * 0.01 + features)
    return TensorDict(
        {
            "observation": observation,
            "action": t % 7,
            "reward": torch.cos(t.to(torch.float32)),
            "episode": t // EPISODE_LEN,
            "steps": t % EPISODE_LEN,
            "done": (t % EPISODE_LEN) == EPISODE_LEN - 1,
        },
        batch_size=[n],
    ).to(device)


def raw_priorities(n: int, salt: int = 0) -> torch.Tensor:
    """Deterministic positive raw priorities in [0.05, 2.05)."""
    g = torch.Generator().manual_seed(1234 + salt)
    return torch.rand(n, generator=g, dtype=torch.float64) * 2.0 + 0.05


def bench_device(adapter: Adapter) -> str:
    """Where the buffer lives: CUDA when the adapter declares it and one exists."""
    return "cuda" if adapter.has("cuda") and torch.cuda.is_available() else "cpu"


def make_spec(op: Operation, capacity: int, batch_size: int, device: str = "cpu") -> BufferSpec:
    return BufferSpec(
        capacity=capacity,
        sampler=op.sampler,
        batch_size=batch_size,
        alpha=ALPHA,
        beta=BETA,
        eps=EPS,
        slice_len=SLICE_LEN if op.sampler == "slice" else None,
        device=device,
        seed=0,
    )


def fill(buffer: BufferUnderTest, capacity: int, width: int, device: str = "cpu", chunk: int = 65536):
    """Write exactly ``capacity`` rows (rows 0 .. capacity-1), so the buffer is
    full and the writer's cursor is back at slot 0."""
    for start in range(0, capacity, chunk):
        buffer.extend(make_rows(min(chunk, capacity - start), width, start, device))


def set_priorities(buffer: BufferUnderTest, capacity: int) -> None:
    """Give every slot a distinct priority (a uniform tree would hide bugs)."""
    buffer.update_priority(torch.arange(capacity), raw_priorities(capacity).to(torch.float32))


def build(adapter: Adapter, op: Operation, capacity: int, width: int, device: str = "cpu") -> BufferUnderTest:
    """A full buffer for ``op``: ``capacity`` rows, priorities set when prioritized.
    The batch size in the spec is only a default; benchmarks pass it explicitly."""
    buffer = adapter.make(make_spec(op, capacity, 256, device))
    fill(buffer, capacity, width, device)
    if op.sampler == "prioritized":
        set_priorities(buffer, capacity)
    return buffer


class BufferCache:
    """Keeps the last few filled buffers: filling 2^20 rows (and a prioritized
    tree) costs more than timing one operation, and every batch size of one
    (implementation, buffer kind, capacity, width) can share one buffer."""

    def __init__(self, size: int = 4):
        self.size = size
        self.items: OrderedDict = OrderedDict()

    def get(self, key, factory):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = factory()
        self.items[key] = value
        while len(self.items) > self.size:
            self.items.popitem(last=False)
        return value

    def drop(self, key) -> None:
        self.items.pop(key, None)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_once(fn, device: str = "cpu"):
    """Run ``fn`` once with device sync; return (result, seconds)."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


# --- checks against the reference --------------------------------------------


def _cpu(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu")


def check_layout(rows: TensorDictBase, expected: TensorDictBase, batch_size: int, where: str) -> None:
    """Same keys, per-row shapes and dtypes as the reference's rows."""
    if tuple(rows.batch_size) != (batch_size,):
        fail("rows.batch_size", tuple(rows.batch_size), (batch_size,), call=where)
    got = {k: (tuple(v.shape[1:]), v.dtype) for k, v in rows.items(True, True)}
    want = {k: (tuple(v.shape[1:]), v.dtype) for k, v in expected.items(True, True)}
    if got != want:
        fail("rows layout", got, want, call=where)


def check_index(index: torch.Tensor, batch_size: int, size: int, where: str) -> torch.Tensor:
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
        fail("info['index'].dtype", getattr(index, "dtype", type(index)), torch.int64, call=where)
    if tuple(index.shape) != (batch_size,):
        fail("info['index'].shape", tuple(index.shape), (batch_size,), call=where)
    index = _cpu(index)
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or hi >= size:
        fail("info['index'] range", (lo, hi), f"within [0, {size})", call=where)
    return index


def check_rows_match(rows: TensorDictBase, contents: TensorDictBase, index: torch.Tensor, where: str) -> None:
    """The gathered rows are the stored rows at ``index`` (exact)."""
    want = contents[index]
    for key, value in want.items(True, True):
        got = _cpu(rows.get(key))
        if not torch.equal(got, value):
            bad = (got != value).reshape(len(index), -1).any(-1).nonzero()[:3].flatten().tolist()
            fail(f"rows[{key!r}] at batch positions {bad}", "different", "storage rows at info['index']", call=where)


def check_weights(weight: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    """Finite, in (0, 1], and equal to the closed form computed from the
    reference's stored priorities (float64) within float32 rounding."""
    w = _cpu(weight).to(torch.float64)
    if tuple(w.shape) != tuple(expected.shape):
        fail("info['weight'].shape", tuple(w.shape), tuple(expected.shape), call=where)
    if not torch.isfinite(w).all():
        fail("info['weight']", "non-finite values", "finite", call=where)
    if w.min() <= 0 or w.max() > 1 + 1e-6:
        fail("info['weight'] range", (float(w.min()), float(w.max())), "within (0, 1]", call=where)
    err = ((w - expected).abs() / expected).max()
    if err > 1e-5:
        fail("info['weight'] max relative error vs reference", float(err), "<= 1e-5", call=where)


def check_slices(index: torch.Tensor, rows: TensorDictBase, capacity: int, where: str) -> None:
    """Every slice of SLICE_LEN consecutive batch positions covers consecutive
    slots (mod capacity) of one episode."""
    idx = index.reshape(-1, SLICE_LEN)
    step = (idx[:, 1:] - idx[:, :-1]) % capacity
    if not (step == 1).all():
        fail("slice slots", "not consecutive", "consecutive slots of one trajectory", call=where)
    episode = _cpu(rows.get("episode")).reshape(-1, SLICE_LEN)
    if not (episode == episode[:, :1]).all():
        fail("slice episodes", "mixed within a slice", "one episode per slice", call=where)


def priority_dtype(adapter: Adapter) -> torch.dtype:
    """The dtype ``adapter`` keeps priorities in (``Conventions.priority_dtype``;
    float64, the spec's, when it declares none)."""
    return getattr(getattr(adapter, "conventions", None), "priority_dtype", torch.float64)


def check_priorities(got: torch.Tensor, expected: torch.Tensor, where: str,
                     dtype: torch.dtype = torch.float64) -> None:
    """Stored (transformed) priorities equal the reference's, within the error of
    ``dtype``, the dtype the implementation declares for its trees (a tolerance
    tied to that dtype's own error): 2^-23 relative (one float32 rounding) for
    float64, and 2^-21 (four float32 ulps) for a float32 tree, which computes the
    transform in float32: the rounding of ``p + eps`` (times ``alpha`` through
    the power), float32 ``pow``'s own error of up to 1 ulp, and the rounding of
    the result. A priority transformed twice is off by far more
    (``p ** (alpha ** 2)`` vs ``p ** alpha``: above 1e-2 relative here)."""
    got = _cpu(got).to(torch.float64)
    if torch.equal(got, expected):
        return
    err = ((got - expected).abs() / expected.abs().clamp_min(1e-300)).max()
    bound, text = (2.0**-21, "2^-21 (float32 trees)") if dtype == torch.float32 else (2.0**-23, "2^-23")
    if err > bound:
        fail("stored_priority max relative error vs reference", float(err), f"<= {text}", call=where)


def check_same_state(got: BufferUnderTest, want: BufferUnderTest, where: str, prioritized: bool) -> None:
    """Length, cursor, write count, contents (and stored priorities) equal."""
    for name in ("__len__", "cursor", "write_count"):
        a = len(got) if name == "__len__" else getattr(got, name)
        b = len(want) if name == "__len__" else getattr(want, name)
        if a != b:
            fail(name.strip("_"), a, b, call=where)
    a, b = got.contents(), want.contents()
    for key, value in b.items(True, True):
        if not torch.equal(_cpu(a.get(key)), _cpu(value)):
            fail(f"contents[{key!r}]", "different", "the same rows", call=where)
    if prioritized:
        slots = torch.arange(len(want))
        check_priorities(got.stored_priority(slots), _cpu(want.stored_priority(slots)).double(), where)


# --- the reference as a model, without building a full reference buffer ------
# Filling the reference's prioritized buffer at 2^20 takes about a minute (its
# tree recomputes touched parents level by level), so the checks use the
# reference's own components on the known contents instead.


def model_leaves(capacity: int) -> torch.Tensor:
    """The priorities a filled prioritized buffer must store: the raw
    priorities ``set_priorities`` wrote (float32), transformed once in float64
    the way ``reference.PrioritizedSampler`` does: ``(p + eps) ** alpha``."""
    raw = raw_priorities(capacity).to(torch.float32).to(torch.float64)
    return (raw + EPS) ** ALPHA


def model_prioritized_sampler(capacity: int, leaves: torch.Tensor):
    """A ``reference.PrioritizedSampler`` whose sum tree holds ``leaves``, built
    bottom up as ``left + right`` (the SumTree contract's node layout), i.e. the
    same float64 tree the reference reaches after writing those leaves."""
    from rbcheck.reference import PrioritizedSampler

    sampler = PrioritizedSampler(capacity, ALPHA, BETA, EPS)
    tree = sampler.sum_tree
    nodes, n = tree.nodes, tree.size
    nodes[n : n + capacity] = leaves
    while n > 1:
        n //= 2
        nodes[n : 2 * n] = nodes[2 * n : 4 * n : 2] + nodes[2 * n + 1 : 4 * n : 2]
    return sampler


def reference_uniform_indices(u: torch.Tensor, size: int) -> torch.Tensor:
    from rbcheck.reference import RandomSampler

    return RandomSampler().indices_from_uniforms(u, size)


def reference_stored_after_update(capacity: int, index: torch.Tensor, priority: torch.Tensor) -> torch.Tensor:
    """What ``reference.PrioritizedSampler`` stores for ``index`` after
    ``update_priority(index, priority)``."""
    from rbcheck.reference import PrioritizedSampler

    sampler = PrioritizedSampler(capacity, ALPHA, BETA, EPS)
    sampler.update_priority(index, priority)
    return sampler.sum_tree.leaf(index).to(torch.float64)
