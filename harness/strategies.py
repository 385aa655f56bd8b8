"""Hypothesis strategies for the conformance suite.

Everything a property draws goes through here, and tests draw it with a label
(``data.draw(capacities(), label="capacity")``) so a failing example prints as
``Draw 1 (capacity): 5``. Drawn values have a ``repr`` that is valid Python
(``Layout(...)``, ``ScaleFloats(2.0)``), so a failure's repro snippet can be
pasted as is after ``from harness.strategies import *``.

Data are not random tensors: each row's values are a function of its row id
(``Layout.batch(start, n)``), so rows are cheap to build, NaN-free, and any
mix-up between rows shows up as a wrong id. What Hypothesis draws is the
*shape* of the data: which fields, their trailing shapes and dtypes, nested
keys, and the sizes of the writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.protocol import BufferSpec, Conventions, ParamRange
from rbcheck.harness.scale import (  # the sizes of a real run, re-exported here
    LARGE_CAPACITIES,
    TRAINING_BATCHES,
    batch_schedule,
    scale_limit,
    training_batch_sizes,
)

__all__ = [
    "Field",
    "Layout",
    "EpisodeLayout",
    "ScaleFloats",
    "RebuildWithoutDevice",
    "AddKey",
    "DropKey",
    "Chain",
    "capacities",
    "batch_sizes",
    "training_batch_sizes",
    "batch_schedule",
    "scale_limit",
    "LARGE_CAPACITIES",
    "TRAINING_BATCHES",
    "layouts",
    "episode_layouts",
    "priorities",
    "priority_vectors",
    "alphas",
    "betas",
    "epsilons",
    "param_values",
    "spec_layout",
    "transforms",
    "operations",
    "specs",
]

DTYPES = ("float32", "float64", "int64", "int32", "uint8", "bool")
ID_KEY = "id"


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One leaf of the stored TensorDict: a (possibly nested) key, the shape of
    one row's entry and its dtype name."""

    key: tuple[str, ...]
    shape: tuple[int, ...] = ()
    dtype: str = "float32"

    def values(self, ids: torch.Tensor, salt: int) -> torch.Tensor:
        """Deterministic values for rows ``ids``: distinct per row and element."""
        numel = 1
        for s in self.shape:
            numel *= s
        offsets = torch.arange(numel, dtype=torch.int64).reshape(self.shape)
        base = ids.to(torch.int64).reshape((-1,) + (1,) * len(self.shape))
        raw = base * 64 + offsets + salt
        dtype = getattr(torch, self.dtype)
        if dtype is torch.bool:
            return (raw % 2).to(torch.bool)
        if dtype is torch.uint8:
            return (raw % 256).to(torch.uint8)
        if dtype.is_floating_point:
            return (raw.to(torch.float64) / 4).to(dtype)  # exact in float32 for small ids
        return raw.to(dtype)


@dataclass(frozen=True)
class Layout:
    """The schema of the rows a buffer stores. Every layout has an int64
    ``"id"`` field (the row id) so contents can be compared row by row."""

    fields: tuple[Field, ...] = ()

    def batch(self, start: int, n: int, **extra: torch.Tensor) -> TensorDict:
        """Rows ``start .. start+n-1`` as a TensorDict with batch size ``[n]``;
        ``extra`` adds top-level entries (e.g. ``priority=...``)."""
        ids = torch.arange(start, start + n, dtype=torch.int64)
        td = TensorDict({ID_KEY: ids}, batch_size=[n])
        for salt, f in enumerate(self.fields):
            td.set(f.key if len(f.key) > 1 else f.key[0], f.values(ids, salt + 1))
        for k, v in extra.items():
            td.set(k, v)
        return td

    def spec_layout(self, **extra: tuple[tuple[int, ...], torch.dtype]) -> dict:
        """The rows' layout for :attr:`BufferSpec.layout`: key -> (per-row
        shape, dtype), ``id`` included; ``extra`` adds keys (e.g.
        ``priority=((), torch.float64)``)."""
        out: dict = {ID_KEY: ((), torch.int64)}
        for f in self.fields:
            out[f.key if len(f.key) > 1 else f.key[0]] = (tuple(f.shape), getattr(torch, f.dtype))
        out.update(extra)
        return out

    def row(self, i: int, **extra: torch.Tensor) -> TensorDict:
        """Row ``i`` alone, without a batch dimension (for ``add``)."""
        extra = {k: v.reshape(1, *v.shape) for k, v in extra.items()}
        return self.batch(i, 1, **extra)[0]


@dataclass(frozen=True)
class EpisodeLayout:
    """Episodes written back to back: ``lengths[k]`` steps of episode id
    ``first_episode + k``. Rows carry ``episode``, ``steps`` (position in the
    episode), ``id`` (global row id) and an observation."""

    lengths: tuple[int, ...]
    first_episode: int = 0

    @property
    def total(self) -> int:
        return sum(self.lengths)

    def surviving(self, capacity: int) -> list[list[int]]:
        """Closed form: the row ids (write order) of each trajectory still in a
        ring of ``capacity`` slots after writing all episodes; row ``j`` sits in
        slot ``j % capacity``."""
        episode = [k for k, n in enumerate(self.lengths) for _ in range(n)]
        runs: list[list[int]] = []
        for j in range(max(len(episode) - capacity, 0), len(episode)):
            if runs and episode[runs[-1][-1]] == episode[j]:
                runs[-1].append(j)
            else:
                runs.append([j])
        return runs

    def batch(self) -> TensorDict:
        episode, steps = [], []
        for k, n in enumerate(self.lengths):
            episode += [self.first_episode + k] * n
            steps += list(range(n))
        n = len(episode)
        ids = torch.arange(n, dtype=torch.int64)
        return TensorDict(
            {
                ID_KEY: ids,
                "episode": torch.tensor(episode, dtype=torch.int64),
                "steps": torch.tensor(steps, dtype=torch.int64),
                "observation": ids.to(torch.float32).unsqueeze(-1).expand(n, 2).clone(),
                ("next", "observation"): (ids + 1)
                .to(torch.float32)
                .unsqueeze(-1)
                .expand(n, 2)
                .clone(),
            },
            batch_size=[n],
        )


# --------------------------------------------------------------------------
# transforms (each has a repr that rebuilds it)
# --------------------------------------------------------------------------


class _Transform:
    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


class ScaleFloats(_Transform):
    """Multiply every floating leaf by ``factor``; returns a new TensorDict
    with the input's device."""

    def __init__(self, factor: float = 2.0) -> None:
        self.factor = factor

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        out = td.clone()
        for key, value in td.items(include_nested=True, leaves_only=True):
            if value.is_floating_point():
                out.set(key, value * self.factor)
        return out

    def __repr__(self) -> str:
        return f"ScaleFloats({self.factor!r})"


class RebuildWithoutDevice(_Transform):
    """Build a brand-new TensorDict with ``device=None`` from the leaves (the
    case where a pin step that only looks at ``td.device`` would skip work)."""

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        out = TensorDict({}, batch_size=td.batch_size, device=None)
        for key, value in td.items(include_nested=True, leaves_only=True):
            out.set(key, value.clone())
        return out

    def __repr__(self) -> str:
        return "RebuildWithoutDevice()"


class AddKey(_Transform):
    """Add a float32 leaf ``name`` = 2 * id (+ 0.5)."""

    def __init__(self, name: str = "extra") -> None:
        self.name = name

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        out = td.clone(recurse=False)
        out.set(self.name, td.get(ID_KEY).to(torch.float32) * 2 + 0.5)
        return out

    def __repr__(self) -> str:
        return f"AddKey({self.name!r})"


class DropKey(_Transform):
    """Drop one key (if present)."""

    def __init__(self, key: str | tuple[str, ...]) -> None:
        self.key = key

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        keys = set(td.keys(include_nested=True))
        if self.key in keys:
            return td.exclude(self.key)
        return td

    def __repr__(self) -> str:
        return f"DropKey({self.key!r})"


class Chain(_Transform):
    """Apply transforms left to right."""

    def __init__(self, *parts: _Transform) -> None:
        self.parts = parts

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        for part in self.parts:
            td = part(td)
        return td

    def __repr__(self) -> str:
        return "Chain(" + ", ".join(repr(p) for p in self.parts) + ")"


# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------


def capacities(min_value: int = 1, max_value: int = 16, *, large: bool = False) -> st.SearchStrategy[int]:
    """Small capacities, so the ring wraps within a handful of writes; with
    ``large``, also the capacities of a real run (:data:`LARGE_CAPACITIES`),
    about one draw in four (a large ring costs more per example)."""
    small = st.integers(min_value, max_value)
    return st.one_of(small, small, small, st.sampled_from(LARGE_CAPACITIES)) if large else small


def batch_sizes(max_value: int = 8) -> st.SearchStrategy[int]:
    return st.integers(1, max_value)


_keys = st.sampled_from(["obs", "action", "reward", "done", "state", "value"])


@st.composite
def _field(draw: st.DrawFn) -> Field:
    nested = draw(st.booleans())
    leaf = draw(_keys)
    key = ("next", leaf) if nested else (leaf,)
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = draw(st.sampled_from(DTYPES))
    return Field(key, shape, dtype)


@st.composite
def layouts(draw: st.DrawFn, max_fields: int = 4) -> Layout:
    """A schema: ``id`` plus 1..max_fields fields (some nested under
    ``"next"``), trailing shapes of rank 0..2, dtypes from :data:`DTYPES`."""
    fields = draw(st.lists(_field(), min_size=1, max_size=max_fields, unique_by=lambda f: f.key))
    return Layout(tuple(fields))


@st.composite
def episode_layouts(
    draw: st.DrawFn, max_episodes: int = 6, max_len: int = 8, min_len: int = 1
) -> EpisodeLayout:
    lengths = draw(st.lists(st.integers(min_len, max_len), min_size=1, max_size=max_episodes))
    return EpisodeLayout(tuple(lengths), first_episode=draw(st.integers(0, 3)))


def priorities(max_value: float = 100.0, conventions: Conventions | None = None) -> st.SearchStrategy[float]:
    """Raw priorities: zero included on purpose, finite, non-negative; under
    ``conventions.positive_priorities`` (the buffer refuses 0) only those
    that stay > 0 in its ``priority_dtype``: from its smallest normal number up."""
    if conventions is not None and conventions.positive_priorities:
        tiny = float(torch.finfo(conventions.priority_dtype).tiny)
        return st.one_of(
            st.just(tiny),
            st.floats(min_value=tiny, max_value=max_value, allow_nan=False, allow_infinity=False),
            st.sampled_from([1e-3, 0.5, 1.0, 2.0, 7.25]),
        )
    return st.one_of(
        st.just(0.0),
        st.floats(min_value=0.0, max_value=max_value, allow_nan=False, allow_infinity=False),
        st.sampled_from([1e-3, 0.5, 1.0, 2.0, 7.25]),
    )


def priority_vectors(n: int, max_value: float = 100.0, conventions: Conventions | None = None
                     ) -> st.SearchStrategy[torch.Tensor]:
    return st.lists(priorities(max_value, conventions), min_size=n, max_size=n).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64)
    )


#: Where an unbounded range is cut for drawing (alpha, eps up to this; the
#: draws still reach both ends of every bounded range).
DRAW_CAP = {"alpha": 3.0, "beta": 1.0, "eps": 1.0}
#: Values every range is tried at when it contains them.
LANDMARKS = {
    "alpha": (0.0, 0.5, 0.6, 1.0, 2.0),
    "beta": (0.0, 0.4, 1.0),
    "eps": (0.0, 1e-8, 1e-6, 1e-3, 0.01, 0.5),
}


def param_values(name: str, conventions: Conventions | None = None, *, at_least: float | None = None
                 ) -> st.SearchStrategy[float]:
    """``"alpha"``, ``"beta"`` or ``"eps"`` over the WHOLE declared range
    (``conventions.param_range(name)``, the spec's by default): its closed
    ends (eps = 0 where allowed), landmark values inside it, and any float
    in it (an unbounded end is cut at :data:`DRAW_CAP`). ``at_least`` keeps
    draws >= that value (a property that needs e.g. beta > 0 says so)."""
    rng: ParamRange = (conventions or Conventions()).param_range(name)
    low, high = rng.low, min(rng.high, max(DRAW_CAP[name], rng.low))
    if at_least is not None and at_least > low:
        low = at_least
        rng = ParamRange(at_least, rng.high, True, rng.high_closed)
    inside = [v for v in LANDMARKS[name] if rng.contains(v) and v <= high]
    for end in (rng.low, rng.high):
        if rng.contains(end) and end not in inside:
            inside.append(end)
    floats = st.floats(
        low,
        high,
        exclude_min=not rng.contains(low),
        exclude_max=not rng.contains(high),
        allow_nan=False,
        allow_infinity=False,
    )
    return st.one_of(st.sampled_from(sorted(inside)), floats) if inside else floats


def alphas(conventions: Conventions | None = None) -> st.SearchStrategy[float]:
    return param_values("alpha", conventions)


def betas(conventions: Conventions | None = None) -> st.SearchStrategy[float]:
    return param_values("beta", conventions)


def epsilons(conventions: Conventions | None = None) -> st.SearchStrategy[float]:
    return param_values("eps", conventions)


def transforms(include_none: bool = True) -> st.SearchStrategy:
    """Transforms applied to each sample, including one that returns a new
    TensorDict with ``device=None``."""
    one = st.sampled_from(
        [
            ScaleFloats(2.0),
            ScaleFloats(-0.5),
            RebuildWithoutDevice(),
            AddKey("extra"),
            DropKey("obs"),
        ]
    )
    chained = st.lists(one, min_size=2, max_size=3).map(lambda ps: Chain(*ps))
    options = [one, chained, st.just(Chain(ScaleFloats(3.0), RebuildWithoutDevice()))]
    if include_none:
        options.insert(0, st.none())
    return st.one_of(*options)


@st.composite
def operations(
    draw: st.DrawFn, capacity: int, *, prioritized: bool = False, max_ops: int = 12,
    conventions: Conventions | None = None, sample_sizes: st.SearchStrategy[int] | None = None,
) -> list[tuple]:
    """A sequence of buffer operations: ``("extend", n)`` with ``n <= capacity``,
    ``("add",)``, ``("sample", b)`` and, when ``prioritized``,
    ``("update", k, priorities)`` (update the slots of the last sample's first k
    entries; priorities drawn for ``conventions``, see :func:`priorities`).
    Always starts with a write. ``sample_sizes``: the batch sizes drawn
    (1..6 by default; :func:`training_batch_sizes` for a training loop's)."""
    sample_sizes = sample_sizes if sample_sizes is not None else st.integers(1, 6)
    ops: list[tuple] = [("extend", draw(st.integers(1, capacity)))]
    kinds = ["extend", "add", "sample"] + (["update"] if prioritized else [])
    for _ in range(draw(st.integers(0, max_ops))):
        kind = draw(st.sampled_from(kinds))
        if kind == "extend":
            ops.append(("extend", draw(st.integers(1, capacity))))
        elif kind == "add":
            ops.append(("add",))
        elif kind == "sample":
            ops.append(("sample", draw(sample_sizes)))
        else:
            k = draw(st.integers(1, 4))
            ops.append(("update", k, tuple(draw(st.lists(priorities(conventions=conventions), min_size=k,
                                                          max_size=k)))))
    return ops


@st.composite
def specs(
    draw: st.DrawFn,
    samplers: tuple[str, ...] = ("random", "prioritized"),
    *,
    capacity: st.SearchStrategy[int] | None = None,
    with_transform: bool = False,
    priority_key: bool = False,
    conventions: Conventions | None = None,
) -> BufferSpec:
    """A BufferSpec for one of ``samplers`` (callers pass only those the
    adapter declares); alpha, beta and eps over the adapter's declared
    ranges (``conventions``)."""
    sampler = draw(st.sampled_from(samplers))
    cap = draw(capacity if capacity is not None else capacities())
    kwargs: dict = {"capacity": cap, "sampler": sampler, "seed": draw(st.integers(0, 2**31 - 1))}
    if sampler == "prioritized":
        kwargs.update(
            alpha=draw(alphas(conventions)), beta=draw(betas(conventions)), eps=draw(epsilons(conventions))
        )
        if priority_key:
            kwargs["priority_key"] = "priority"
    if with_transform:
        kwargs["transform"] = draw(transforms())
    return BufferSpec(**kwargs)


def spec_layout(data: TensorDictBase) -> dict:
    """The layout of ``data`` (a batch of rows) for :attr:`BufferSpec.layout`."""
    return {
        key: (tuple(value.shape[len(data.batch_size):]), value.dtype)
        for key, value in data.items(include_nested=True, leaves_only=True)
    }
