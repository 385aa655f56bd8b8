"""The ring: it keeps the last ``capacity`` rows for any batch size, evicts
the oldest, and a new buffer holds nothing it was not given.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.storage import TensorStorage
from rbcheck.reference.writer import RoundRobinWriter
from tests.mutants.base import adapter, historic, with_writer
from tests.mutants.registry import mutant


class OffByOneWriter(RoundRobinWriter):
    """Once the ring is full, overwrites from slot 1 instead of slot 0."""

    def next_indices(self, n: int) -> torch.Tensor:
        index = super().next_indices(n)
        rows = self.write_count - n + torch.arange(n)
        wrapped = rows >= self.capacity
        shifted = torch.where(wrapped, (rows + 1) % self.capacity, index)
        self.generation[shifted] = rows
        self.cursor = (self.write_count + (self.write_count >= self.capacity)) % self.capacity
        return shifted


@mutant(bug="an off-by-one in ring eviction",
        catches=("test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form",))
def ring_eviction_off_by_one():
    return adapter("ring-eviction-off-by-one", with_writer(OffByOneWriter))


class FoldedOnceWriter(RoundRobinWriter):
    """pytorch/rl PR #1295: the slots of a batch are ``cursor + arange(n)``
    folded ONCE (``- capacity`` past the end) instead of taken modulo the
    capacity: a batch of more than twice the capacity gets slots past the
    ring, and the extend fails."""

    def next_indices(self, n: int) -> torch.Tensor:
        check_int("n", n)
        raw = self.cursor + torch.arange(n)
        index = torch.where(raw >= self.capacity, raw - self.capacity, raw)
        rows = self.write_count + torch.arange(n)
        fits = index < self.capacity
        self.generation[index[fits]] = rows[fits]
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index


@mutant(bug="an extend of more than 2x capacity gets slots past the ring",
        catches=("test_ring_eviction::test_ring_keeps_the_last_capacity_rows_for_any_batch_size",),
        reproduces="pytorch/rl PR #1295")
def extend_over_twice_capacity_fails():
    return historic("extend-over-twice-capacity", with_writer(FoldedOnceWriter))


class FullFlagFirstStorage(TensorStorage):
    """assume-framework/assume PR #855: the "full" flag is raised when a
    write reaches the second-to-last slot, before the last one is written:
    len() is the capacity one row early, and the empty last slot can be
    sampled."""

    def set(self, index, data) -> None:
        super().set(index, data)
        if int(torch.as_tensor(index).max()) >= self.capacity - 2:
            self.size = self.capacity


@mutant(bug="the full flag set before the write",
        catches=("test_ring_eviction::test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
                 "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"),
        reproduces="assume-framework/assume PR #855")
def full_flag_set_before_the_write():
    return historic("full-flag-set-before-the-write", TensorStorage=FullFlagFirstStorage)


class BatchCountingWriter(RoundRobinWriter):
    """ray-project/ray #24393 (#10958): capacity counted in batches, not in
    rows: the cursor and the write count move by one per batch, so the next
    batch overwrites the rows the previous one just wrote."""

    def next_indices(self, n: int) -> torch.Tensor:
        check_int("n", n)
        index = (self.cursor + torch.arange(n)) % self.capacity
        self.generation[index] = self.write_count
        self.write_count += 1  # one batch
        self.cursor = self.write_count % self.capacity
        return index


@mutant(bug="capacity counted in batches, not rows",
        catches=("test_ring_eviction::test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
                 "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"),
        reproduces="ray-project/ray #24393, #10958")
def capacity_counted_in_batches():
    return historic("capacity-counted-in-batches", with_writer(BatchCountingWriter))


_SCRATCH: dict = {}


class ScratchDirStorage(TensorStorage):
    """pytorch/rl #2437: storage kept in a scratch directory named after its
    description; a new buffer with the same description reopens the previous
    run's files: its rows and its size."""

    def __init__(self, capacity, device="cpu"):
        super().__init__(capacity, device)
        previous = _SCRATCH.get((capacity, str(device)))
        if previous is not None:
            self.data, self.size = previous.data, previous.size
        _SCRATCH[(capacity, str(device))] = self


@mutant(bug="a new buffer shows a previous run's rows",
        catches=("test_ring_eviction::test_new_buffer_holds_nothing_it_was_not_given",),
        reproduces="pytorch/rl #2437")
def scratch_dir_leaks_previous_run():
    return historic("scratch-dir-leaks-previous-run", TensorStorage=ScratchDirStorage)
