"""Reading the whole buffer at once (``sample_all``; reference/sample_all.py).
Each mutant is the reference buffer with ``sample_all`` broken in one way; the
reference is the control.
"""

from __future__ import annotations

import torch

from rbcheck.reference.buffer import ReplayBuffer
from tests.mutants.base import adapter
from tests.mutants.registry import mutant

ALL = "test_sample_all::test_sample_all_gives_every_held_row_once_in_slot_order"


class WholeAllocation(ReplayBuffer):
    """Every allocated slot, written or not (skrl's ``tensors_view``)."""

    def sample_all(self, mini_batches=1):
        size = self.capacity // mini_batches
        return [self.storage.data[i * size:(i + 1) * size].clone() for i in range(mini_batches)]


class LastRowDropped(ReplayBuffer):
    """The newest slot left out (an off-by-one end)."""

    def sample_all(self, mini_batches=1):
        newest = (self.cursor - 1) % self.capacity
        kept = torch.tensor([s for s in range(len(self)) if s != newest] or [newest])
        size = len(self) // mini_batches
        return [self.storage.get(kept[i * size:(i + 1) * size]) for i in range(mini_batches)]


class WriteOrder(ReplayBuffer):
    """The held rows oldest first (from the cursor once the ring has wrapped), not in slot order."""

    def sample_all(self, mini_batches=1):
        n = len(self)
        start = self.cursor if n == self.capacity else 0
        order = (start + torch.arange(n)) % self.capacity
        size = n // mini_batches
        return [self.storage.get(order[i * size:(i + 1) * size]) for i in range(mini_batches)]


class TailSpread(ReplayBuffer):
    """The tail kept, spread over the first batches (``np.array_split``), so the batches differ in size."""

    def sample_all(self, mini_batches=1):
        parts = torch.arange(len(self)).tensor_split(mini_batches)
        return [self.storage.get(p) for p in parts]


@mutant(in_process=True, bug="sample_all returns slots never written (the whole allocated memory)", catches=(ALL,))
def sample_all_returns_unwritten_rows():
    return adapter("sample-all-returns-unwritten-rows", WholeAllocation)


@mutant(in_process=True, bug="sample_all leaves out the newest held row", catches=(ALL,))
def sample_all_drops_a_held_row():
    return adapter("sample-all-drops-a-held-row", LastRowDropped)


@mutant(in_process=True, bug="sample_all gives the rows in write order, not slot order", catches=(ALL,))
def sample_all_in_write_order():
    return adapter("sample-all-in-write-order", WriteOrder)


@mutant(in_process=True, bug="sample_all keeps the tail, batches of unequal sizes", catches=(ALL,))
def sample_all_keeps_the_tail():
    return adapter("sample-all-keeps-the-tail", TailSpread)
