"""Round-robin writer: decides which slot each new row goes to.

Contract
--------
* Row number ``j`` of the buffer's life (``j = 0, 1, 2, ...``) goes to slot ``j % capacity``:
  the ring overwrites the oldest row first. ``next_indices(n)`` returns the slots of the next
  ``n`` rows and advances; when ``n > capacity`` slots repeat and the later rows win.
* ``cursor`` is the next slot to write, ``write_count`` the rows written so far.
* ``generation[s]`` is the row number last written to slot ``s`` (``-1``: never), so a consumer
  that remembers the generation of a sampled slot can tell whether it was overwritten since.
* The state is the write count alone: cursor and generations follow from it
  (``ring_generation``), so a checkpoint cannot hold inconsistent ones.
* ``place(data)`` is what the buffer calls: the slots of ``data``'s rows (``next_indices``);
  ``check_edit(index, rows)`` accepts any in-place edit. ``ImmutableWriter`` refuses both with
  ``WriteRefusedError`` before anything changes; its state is the write count, so a checkpoint
  load or a reopened storage fills it (a read-only dataset).

Cost: ``next_indices`` is O(n); memory O(capacity) for ``generation``.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int


class RoundRobinWriter:
    """Ring cursor, write count and per-slot write generation (see module doc)."""

    def __init__(self, capacity: int):
        self.capacity = check_int("capacity", capacity)
        self.cursor, self.write_count = 0, 0
        self.generation = torch.full((capacity,), -1, dtype=torch.long)

    def next_indices(self, n: int) -> torch.Tensor:
        """Slots for the next ``n`` rows (int64, in write order); advances the cursor."""
        rows = self.write_count + torch.arange(check_int("n", n))  # life-time row numbers
        index = rows % self.capacity
        last = slice(max(n - self.capacity, 0), n)  # the rows that survive this write
        self.generation[index[last]] = rows[last]
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index

    def place(self, data) -> torch.Tensor:
        """The slots of the rows of ``data`` (batch ``[n]``), in write order; advances."""
        return self.next_indices(data.batch_size[0])

    def check_edit(self, index: torch.Tensor, rows) -> None:
        """An edit of held rows is allowed (ImmutableWriter: refused)."""

    def state_dict(self) -> dict:
        return {"write_count": self.write_count}

    def load_state_dict(self, state: dict) -> None:
        """Replace the state; raises ValueError (before changing anything) if invalid."""
        count = check_int("write_count", state["write_count"], 0, 2**62)
        self.generation = ring_generation(torch.arange(self.capacity), count, self.capacity)
        self.write_count, self.cursor = count, count % self.capacity


def ring_generation(slot: torch.Tensor, write_count: int, capacity: int) -> torch.Tensor:
    """The row number last written to each ``slot`` after ``write_count`` rows (-1: never)."""
    last = slot + (write_count - 1 - slot).div(capacity, rounding_mode="floor") * capacity
    return torch.where(slot < write_count, last, -1)


class WriteRefusedError(RuntimeError):
    """A write to a buffer whose writer takes none."""


class ImmutableWriter(RoundRobinWriter):
    """A round-robin writer's state that refuses every write and edit (see module doc)."""

    def next_indices(self, n: int) -> torch.Tensor:
        raise WriteRefusedError(f"a write of {n!r} rows, but should be none: the writer is immutable "
                                f"(writer='immutable'); nothing was changed")

    def check_edit(self, index: torch.Tensor, rows) -> None:
        raise WriteRefusedError(f"an edit of slots {index[:5].tolist()}, but should be none: the writer is "
                                f"immutable (writer='immutable'); nothing was changed")
