"""The reference's served table (issue 42, Reverb's model) as a buffer under test.

A spec is *served* (:func:`served_spec`) when it names a deterministic
selector (``sampler`` "fifo", "lifo", "min_heap" or "max_heap"), a remover
other than "fifo", ``max_times_sampled`` or a ``rate_limiter``. Such a spec
builds a :class:`TableBuffer` over ``rbcheck.reference.served_table.ServedTable``
(or a mutant's ``ServedTable`` component): each row written is one item, its
priority read from ``spec.priority_key`` (1.0 without one), and a sample of
``batch`` draws ``batch`` items one after the other. ``extend`` and
``sample`` take ``timeout`` (seconds; None: wait for ever) and raise a
``TimeoutError`` when the rate limiter does not admit the call in time.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from tensordict import TensorDictBase

from rbcheck.harness.protocol import BufferSpec

SELECTORS = ("fifo", "lifo", "min_heap", "max_heap")


def served_spec(spec: BufferSpec) -> bool:
    """Whether ``spec`` asks for a served table (module docstring)."""
    return (spec.sampler in SELECTORS or spec.remover != "fifo" or spec.max_times_sampled != 0
            or spec.rate_limiter is not None)


def limiter_of(spec: BufferSpec) -> Any:
    """The reference RateLimiter of ``spec.rate_limiter`` (None: Reverb's default, MinSize(1))."""
    from rbcheck.reference.rate_limiter import RateLimiter, min_size

    if spec.rate_limiter is None:
        return min_size(1)
    spi, size, low, high = spec.rate_limiter
    return RateLimiter(float(spi), int(size), float(low), float(high))


class TableBuffer:
    """A :class:`~rbcheck.harness.protocol.BufferUnderTest` over one served table."""

    def __init__(self, table: Any, spec: BufferSpec):
        self.table, self.spec = table, spec

    def __repr__(self) -> str:
        return f"TableBuffer({type(self.table).__qualname__}, {self.spec})"

    def _priority(self, row: TensorDictBase) -> float:
        return float(row[self.spec.priority_key]) if self.spec.priority_key else 1.0

    def extend(self, data: TensorDictBase, timeout: float | None = None) -> torch.Tensor:
        keys = [self.table.insert(data[i].clone(), self._priority(data[i]), timeout) for i in range(len(data))]
        return torch.tensor(keys, dtype=torch.int64)

    def add(self, row: TensorDictBase, timeout: float | None = None) -> int:
        return int(self.table.insert(row.clone(), self._priority(row), timeout))

    def __len__(self) -> int:
        return len(self.table)

    def sample(self, batch_size: int | None = None, timeout: float | None = None):
        batch = batch_size or self.spec.batch_size or 1
        draws = [self.table.sample(timeout) for _ in range(batch)]
        rows = torch.stack([row for _, row, _ in draws]) if draws else None
        info = {"index": torch.tensor([k for k, _, _ in draws], dtype=torch.int64),
                "times_sampled": torch.tensor([t for _, _, t in draws], dtype=torch.int64)}
        return rows, info

    def update_priority(self, index, priority, generation=None) -> None:
        for key, p in zip(torch.as_tensor(index).tolist(), torch.as_tensor(priority).tolist(), strict=True):
            self.table.update_priority(int(key), float(p))


def served_buffer(spec: BufferSpec, components: Any = None) -> TableBuffer:
    """A :class:`TableBuffer` for ``spec``, over ``components.ServedTable`` when a
    namespace (or a callable returning one) gives it, else the reference's."""
    given = components() if callable(components) and not isinstance(components, SimpleNamespace) else components
    table_cls = getattr(given, "ServedTable", None) if given is not None else None
    if table_cls is None:
        from rbcheck.reference.served_table import ServedTable as table_cls
    sampler = spec.sampler if spec.sampler in SELECTORS + ("random", "prioritized") else None
    if sampler is None:
        raise ValueError(f"spec.sampler={spec.sampler!r} for a served table, but should be one of "
                         f"{list(SELECTORS + ('random', 'prioritized'))}")
    table = table_cls(spec.capacity, sampler=sampler, remover=spec.remover,
                      max_times_sampled=spec.max_times_sampled, rate_limiter=limiter_of(spec),
                      alpha=spec.alpha, seed=spec.seed)
    return TableBuffer(table, spec)


__all__ = ["SELECTORS", "TableBuffer", "limiter_of", "served_buffer", "served_spec"]
