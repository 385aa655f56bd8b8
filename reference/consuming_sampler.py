"""Consuming sampling: a row leaves after ``max_sample_count`` draws, and writes reuse its slot.

Contract
--------
* ``ConsumingSampler(capacity, max_sample_count)`` counts the draws of each slot's current row
  (``count``; a write resets the slot's count to 0). A held slot is CONSUMED once its count
  reaches ``max_sample_count``: it is never drawn again until a write replaces its row.
* ``sample`` draws ``min(B, unconsumed)`` distinct unconsumed slots, a uniformly random subset in
  random order: the unconsumed slots (ascending) permuted by ``argsort(draw_uniforms(unconsumed,
  generator))`` (stable), the first ``B`` of them. Each drawn slot's count goes up by one. No
  unconsumed held slot: ValueError, nothing changed.
* ``ConsumingWriter(capacity, sampler)`` places new rows: first in the consumed slots, in
  ascending slot order, then at the ring's cursor (round robin over ``0 .. capacity-1``,
  overwriting the oldest ring slot once full). ``write_count`` counts every row, the cursor
  only the ring's; ``size`` (the slots ever written, ``0 .. size-1``) is what the storage
  holds. ``generation[s]`` is the row number last written to slot ``s`` (-1: never), as for
  the round-robin writer; a batch that repeats a slot keeps its last row.
* Both states survive save and load: the counts, and the writer's counts and generations
  (with reuse, the generations no longer follow from the write count).

Replacement law: without within a batch; across batches with replacement, up to
``max_sample_count`` draws of a row.

Cost: ``sample`` O(len(storage)) (the unconsumed set and its uniforms), ``next_indices`` O(n +
capacity) (the consumed set); memory O(capacity).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms


def check_vector(name: str, value, capacity: int, low: int) -> torch.Tensor:
    """A copy of an int64[capacity] tensor with every entry ``>= low``, or ValueError."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.long and tuple(value.shape) == (capacity,)):
        raise ValueError(f"{name}={value!r:.80}, but should be an int64 tensor of shape ({capacity},)")
    if bool((value < low).any()):
        raise ValueError(f"{name}={value[value < low][:5].tolist()}, but should be >= {low}")
    return value.clone()


class ConsumingSampler:
    """Uniform draws without replacement in a batch, ``max_sample_count`` per row (module doc)."""

    replacement = "without_in_batch"

    def __init__(self, capacity: int, max_sample_count: int = 1):
        self.capacity = check_int("capacity", capacity)
        self.max_sample_count = check_int("max_sample_count", max_sample_count)
        self.count = torch.zeros(capacity, dtype=torch.long)

    def consumed(self, size: int) -> torch.Tensor:
        """The consumed slots among ``0 .. size-1``, ascending."""
        return torch.nonzero(self.count[:size] >= self.max_sample_count).flatten()

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        """``{"index": int64[min(batch_size, unconsumed)]}``; ``cursor`` is unused."""
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        live = torch.nonzero(self.count[:len(storage)] < self.max_sample_count).flatten()
        if len(live) == 0:
            raise ValueError(f"unconsumed rows=0, but should be >= 1 to sample (each of the {len(storage)} "
                             f"held rows was drawn max_sample_count={self.max_sample_count} times)")
        index = live[torch.argsort(draw_uniforms(len(live), generator), stable=True)[:batch_size]]
        self.count[index] += 1
        return {"index": index}

    def on_write(self, index, priority=None) -> None:
        """New rows at ``index`` have not been drawn yet."""
        self.count[index] = 0

    def state_dict(self) -> dict:
        return {"type": "ConsumingSampler", "max_sample_count": self.max_sample_count, "count": self.count.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "ConsumingSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'ConsumingSampler'")
        limit = check_int("max_sample_count", state["max_sample_count"])
        self.count, self.max_sample_count = check_vector("count", state["count"], self.capacity, 0), limit


class ConsumingWriter:
    """Consumed slots first, then the ring (see module doc)."""

    def __init__(self, capacity: int, sampler: ConsumingSampler):
        self.capacity, self.sampler = check_int("capacity", capacity), sampler
        self.write_count, self.ring_count = 0, 0  # rows written; rows the ring placed
        self.generation = torch.full((capacity,), -1, dtype=torch.long)

    cursor = property(lambda self: self.ring_count % self.capacity)
    size = property(lambda self: min(self.ring_count, self.capacity))

    def next_indices(self, n: int) -> torch.Tensor:
        """Slots for the next ``n`` rows (int64, in write order); advances."""
        free = self.sampler.consumed(self.size).tolist()[:check_int("n", n)]
        ring = (self.ring_count + torch.arange(n - len(free))) % self.capacity
        index = torch.cat([torch.tensor(free, dtype=torch.long), ring])
        for j, slot in enumerate(index.tolist()):  # the last row written to a slot wins
            self.generation[slot] = self.write_count + j
        self.write_count, self.ring_count = self.write_count + n, self.ring_count + len(ring)
        return index

    def state_dict(self) -> dict:
        return {"type": "ConsumingWriter", "write_count": self.write_count, "ring_count": self.ring_count,
                "generation": self.generation.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the state; ValueError (before changing anything) if invalid."""
        if state.get("type") != "ConsumingWriter":
            raise ValueError(f"writer type={state.get('type')!r}, but should be 'ConsumingWriter'")
        count = check_int("write_count", state["write_count"], 0, 2**62)
        ring = check_int("ring_count", state["ring_count"], 0, count + 1)
        generation = check_vector("generation", state["generation"], self.capacity, -1)
        size = min(ring, self.capacity)
        if bool((generation[:size] < 0).any() or (generation[size:] != -1).any() or (generation >= count).any()):
            raise ValueError(f"generation={generation[:8].tolist()}..., but should be in [0, write_count={count}) "
                             f"for the {size} slots written and -1 after them")
        self.write_count, self.ring_count, self.generation = count, ring, generation
