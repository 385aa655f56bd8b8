"""The sizes of a real run, for the strategies and the properties (issue 39,
item 5): the capacities (up to 2**16) and batch sizes (1..4096) drawn beside
the small ones, the batch schedule of a distributional check taken as a
training loop takes it (many calls of 32..256 rows), and the cost hints an
adapter may give for a scale it is slow at. Re-exported by
:mod:`rbcheck.harness.strategies`.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

__all__ = ["LARGE_CAPACITIES", "TRAINING_BATCHES", "training_batch_sizes", "batch_schedule", "scale_limit"]

#: Capacities of a real run, drawn beside the small ones (``capacities(large=True)``):
#: just past 2**12 (a tree one level deeper than 4096 leaves), past 2**15
#: and not a power of two (a 16-bit signed slot wraps there), and 2**16.
LARGE_CAPACITIES = (4097, 40000, 2**16)
#: Batch sizes of a real training loop, tried at their edges: 1, 31/32/33,
#: 64, 100, 128, 255/256/257, 1024, 4096.
TRAINING_BATCHES = (1, 31, 32, 33, 64, 100, 128, 255, 256, 257, 1024, 4096)


def training_batch_sizes(max_value: int = 4096) -> st.SearchStrategy[int]:
    """Batch sizes from 1 to ``max_value``: a handful of rows (1..8), the
    sizes of a training loop at their edges (:data:`TRAINING_BATCHES`) and
    any size in between."""
    edges = [b for b in TRAINING_BATCHES if b <= max_value]
    return st.one_of(st.integers(1, min(8, max_value)), st.sampled_from(edges), st.integers(1, max_value))


def batch_schedule(total: int, low: int = 32, high: int = 256, seed: int = 0) -> tuple[int, ...]:
    """The sizes of the calls that draw ``total`` rows as a training loop
    does: many calls of ``low``..``high`` rows (seeded, the same every run;
    the last call takes what is left, at least 1). ``low == high``: calls of
    exactly that size (and one smaller call for a remainder)."""
    if not 1 <= low <= high or total < 1:
        raise ValueError(f"batch_schedule(total={total}, low={low}, high={high}), but should have "
                         "total >= 1 and 1 <= low <= high")
    gen = torch.Generator().manual_seed(seed)
    sizes: list[int] = []
    left = total
    while left > 0:
        b = low if low == high else int(torch.randint(low, high + 1, (1,), generator=gen))
        sizes.append(min(b, left))
        left -= sizes[-1]
    return tuple(sizes)


def scale_limit(impl, scale: str) -> tuple[int, str] | None:
    """``(limit, why)`` where the adapter gives a cost hint for ``scale``
    (its optional ``scale_limits`` mapping), else None. Scales:
    ``"prioritized_capacity"`` (the largest prioritized capacity a fixed
    large case fills), ``"sample_calls"`` (the most sample calls a
    distributional case makes), ``"sample_batch"`` (the largest batch a
    drawn sample takes). A property that runs smaller under a hint says so
    with ``why`` (a skip's reason, or the case's own message); the hint
    never turns a failure into a pass."""
    hint = (getattr(impl, "scale_limits", None) or {}).get(scale)
    if hint is None:
        return None
    limit, why = hint
    return int(limit), str(why)
