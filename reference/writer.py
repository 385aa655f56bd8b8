"""Round-robin writer: decides which slot each new row goes to.

Contract
--------
* Row number ``j`` of the buffer's life (``j = 0, 1, 2, ...``) goes to slot
  ``j % capacity``: the ring overwrites the oldest row first.
* ``cursor`` is the next slot to write, ``write_count`` the rows written so far.
* ``generation[s]`` is the row number ``j`` last written to slot ``s``
  (``-1`` if the slot was never written). A consumer that remembers the
  generation of a sampled slot can tell whether it was overwritten since.
* ``next_indices(n)`` returns the ``n`` slots for the next ``n`` rows and
  advances; when ``n > capacity`` slots repeat and the later rows win.

Cost: ``next_indices`` is O(n); memory O(capacity) for ``generation``.
"""

from __future__ import annotations

import torch


class RoundRobinWriter:
    """Ring cursor, write count and per-slot write generation (see module doc)."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity={capacity!r}, but should be an int >= 1")
        self.capacity = capacity
        self.cursor = 0
        self.write_count = 0
        self.generation = torch.full((capacity,), -1, dtype=torch.long)

    def next_indices(self, n: int) -> torch.Tensor:
        """Slots for the next ``n`` rows (int64, in write order); advances the cursor."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r}, but should be an int >= 1")
        rows = self.write_count + torch.arange(n)  # life-time row numbers
        index = rows % self.capacity
        last = slice(max(n - self.capacity, 0), n)  # the rows that survive this write
        self.generation[index[last]] = rows[last]
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index

    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "cursor": self.cursor,
            "write_count": self.write_count,
            "generation": self.generation.clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the state; raises ValueError (before changing anything) if inconsistent."""
        capacity, count = state["capacity"], state["write_count"]
        generation = state["generation"]
        if capacity != self.capacity:
            raise ValueError(f"capacity={capacity}, but should be {self.capacity}")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count < 2**62:
            raise ValueError(f"write_count={count!r}, but should be an int in [0, 2**62)")
        if state["cursor"] != count % capacity:
            raise ValueError(f"cursor={state['cursor']!r}, but should be write_count % capacity")
        if not isinstance(generation, torch.Tensor) or generation.dtype != torch.long \
                or tuple(generation.shape) != (capacity,):
            got = f"{generation.dtype}{list(generation.shape)}" if isinstance(generation, torch.Tensor) \
                else type(generation).__name__
            raise ValueError(f"generation={got}, but should be torch.int64[{capacity}]")
        if not torch.equal(generation.cpu(), expected_generation(count, capacity)):
            raise ValueError(f"generation={generation.tolist()[:5]}..., but should be the "
                             f"round-robin generations after write_count={count}")
        self.write_count, self.cursor = count, count % capacity
        self.generation = generation.clone()


def expected_generation(write_count: int, capacity: int) -> torch.Tensor:
    """``generation`` of a ring that has written ``write_count`` rows (-1: never written)."""
    return ring_generation(torch.arange(capacity), write_count, capacity)


def ring_generation(slot: torch.Tensor, write_count: int, capacity: int) -> torch.Tensor:
    """The row number last written to each ``slot`` after ``write_count`` rows (-1: never)."""
    last = slot + (write_count - 1 - slot).div(capacity, rounding_mode="floor") * capacity
    return torch.where(slot < write_count, last, -1)
