"""Mutants that break memory ownership (test_ownership): the buffer keeps
the caller's tensors, changes the caller's arguments, or hands out memory
it still writes. Each is the reference with one such shortcut; the control
is the reference."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import CAPABILITIES
from rbcheck.reference.arguments import check_index
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.storage import TensorStorage
from tests.mutants.registry import mutant

KEEPS = "test_ownership::test_buffer_keeps_no_reference_to_the_callers_tensors"
ARGS = "test_ownership::test_calls_leave_their_arguments_unchanged"
SHARES = "test_ownership::test_returned_samples_and_contents_share_no_memory_with_the_storage"


def _adapter(name: str, buffer_cls=ReplayBuffer, **components):
    return buffer_adapter(f"mutant-{name}", "0", buffer_cls, CAPABILITIES - {"concurrent"},
                          components=SimpleNamespace(**components), pin_module="rbcheck.reference.pinning")


class AdoptingStorage(TensorStorage):
    """A zero-copy fast path: a first write that fills every slot in order is
    adopted as the storage itself (the caller's tensors, not a copy)."""

    def set(self, index, data) -> None:
        index = check_index(index, self.capacity)
        if self.data is None and torch.equal(index, torch.arange(self.capacity)):
            self.check(data)
            self.data, self.size = data, self.capacity
            return
        super().set(index, data)


@mutant(bug="a first batch that fills the ring is adopted without a copy (zero-copy extend)",
        catches=(KEEPS,))
def extend_adopts_the_callers_batch():
    return _adapter("extend-adopts-the-callers-batch", TensorStorage=AdoptingStorage)


class SliceViewStorage(TensorStorage):
    """Serves a contiguous run of slots as a slice of the storage: a view."""

    def get(self, index):
        index = check_index(index, self.size)
        start = int(index[0]) if len(index) else 0
        if len(index) and torch.equal(index, torch.arange(start, start + len(index))):
            return self.data[start:start + len(index)]
        return super().get(index)


@mutant(bug="a contiguous run of slots is sampled as a slice view of the storage", catches=(SHARES,))
def sample_returns_a_view_of_the_storage():
    return _adapter("sample-returns-a-view", TensorStorage=SliceViewStorage)


class ReusedOutputBuffer(ReplayBuffer):
    """Writes every sample into one output TensorDict per batch size, kept
    and returned by reference (the learner's batch changes under it)."""

    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        out = self.__dict__.setdefault("_out", {})
        key = tuple(rows.batch_size)
        if key not in out:
            out[key] = rows.clone()
        else:
            out[key].update_(rows)
        return out[key], info


@mutant(bug="an internal output buffer returned by reference, rewritten by the next sample",
        catches=(SHARES,), reproduces="Farama-Foundation/SuperSuit PR #116")
def sample_returns_its_output_buffer():
    return _adapter("sample-returns-its-output-buffer", ReusedOutputBuffer)


class SortingBuffer(ReplayBuffer):
    """Sorts the caller's index in place (and the priorities with it) before
    the tree update, for locality."""

    def update_priority(self, index, priority, generation=None) -> None:
        if isinstance(index, torch.Tensor) and index.dim() == 1 and len(index) > 1:
            values, order = index.sort()
            index.copy_(values)  # the caller's tensor
            priority = torch.as_tensor(priority)[order]
            generation = None if generation is None else torch.as_tensor(generation)[order]
        super().update_priority(index, priority, generation)


@mutant(bug="update_priority sorts the caller's index in place", catches=(ARGS,),
        reproduces="thu-ml/tianshou #82")
def update_sorts_the_callers_index():
    return _adapter("update-sorts-the-callers-index", SortingBuffer)


class TaggingBuffer(ReplayBuffer):
    """Writes the slot it used into the caller's row (bookkeeping)."""

    def add(self, row) -> int:
        slot = super().add(row)
        row.set("index", torch.tensor(slot))
        return slot


@mutant(bug="add writes its bookkeeping into the caller's row", catches=(ARGS,), reproduces="cpprb #116")
def add_writes_into_the_callers_row():
    return _adapter("add-writes-into-the-callers-row", TaggingBuffer)


class DeferredSampler(PrioritizedSampler):
    """Queues updates (the caller's index and priority tensors, no copy)
    and applies them when the tree is next read."""

    @property
    def sum_tree(self):
        pending = self.__dict__.get("_pending") or []
        self.__dict__["_pending"] = []
        for index, priority, generation, current in pending:
            super().update_priority(index, priority, generation, current)
        return self.__dict__["_sum_tree"]

    @sum_tree.setter
    def sum_tree(self, tree) -> None:
        self.__dict__["_sum_tree"] = tree

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        super().check_priority(priority, len(check_index(index, self.capacity)))  # refused now, applied later
        self.__dict__.setdefault("_pending", []).append((index, priority, generation, current_generation))


class DeferredBuffer(ReplayBuffer):
    def update_priority(self, index, priority, generation=None) -> None:
        current = self.writer.generation[check_index(index, self.capacity)]
        self.sampler.update_priority(index, priority, generation, current_generation=current)


@mutant(bug="priority updates queued with the caller's tensors and applied later", catches=(KEEPS,))
def update_queues_the_callers_tensors():
    return _adapter("update-queues-the-callers-tensors", DeferredBuffer, PrioritizedSampler=DeferredSampler)
