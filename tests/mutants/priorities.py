"""Priorities: transformed exactly once per path, a new row's priority by one
rule, updates applied by the last entry and never to a slot overwritten
since it was sampled.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_index, last_occurrence
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.sum_tree import SumTree
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant


class TwiceOnWriteSampler(PrioritizedSampler):
    """Transforms a new row's priority before handing it to ``_store``, which
    transforms it again: ``((p + eps) ** alpha + eps) ** alpha``."""

    def on_write(self, index, priority=None) -> None:
        n = len(torch.as_tensor(index))
        raw = (
            torch.full((n,), self.max_priority, dtype=torch.float64)
            if priority is None
            else self.check_priority(priority, n)
        )
        super().on_write(index, (raw + self.eps) ** self.alpha)


@mutant(bug="a priority transformed twice on add",
        catches=("test_priority_transform::test_writer_default_priority_is_transformed_once",
                 "test_priority_transform::test_priority_key_in_data_is_transformed_once"))
def priority_transformed_twice_on_add():
    return adapter("priority-transformed-twice-on-add", PrioritizedSampler=TwiceOnWriteSampler)


class StaleUpdateBuffer(ReplayBuffer):
    """Applies every priority update, even to slots overwritten since sampled."""

    def update_priority(self, index, priority, generation=None) -> None:
        super().update_priority(index, priority, generation=None)


@mutant(bug="an update applied to an overwritten slot",
        catches=("test_sampling_distributions::test_stale_priority_updates_are_ignored",))
def update_applied_to_overwritten_slot():
    return adapter("update-applied-to-overwritten-slot", StaleUpdateBuffer)


class TwiceOnUpdateSampler(PrioritizedSampler):
    """Transforms updated priorities before ``_store`` transforms them again."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        raw = self.check_priority(priority, len(torch.as_tensor(index)))
        super().update_priority(index, (raw + self.eps) ** self.alpha, generation, current_generation)


@mutant(bug="a priority transformed twice on update",
        catches=("test_priority_transform::test_updated_priority_is_transformed_once",))
def priority_transformed_twice_on_update():
    return adapter("priority-transformed-twice-on-update", PrioritizedSampler=TwiceOnUpdateSampler)


def _flipped(t):
    return None if t is None else torch.as_tensor(t).flip(0)


class FirstWriteWinsSampler(PrioritizedSampler):
    """Applies an update's entries in reverse order: with a repeated index the
    first priority given wins instead of the last."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        index = torch.as_tensor(index).flip(0)
        priority = torch.as_tensor(priority).flip(0)
        super().update_priority(index, priority, _flipped(generation), _flipped(current_generation))


@mutant(bug="a repeated index in one update where the first priority wins",
        catches=("test_model_comparison::test_implementation_matches_reference_model",))
def update_first_write_wins():
    return adapter("update-first-write-wins", PrioritizedSampler=FirstWriteWinsSampler)


class NewRowsPriorityOneSampler(PrioritizedSampler):
    """ray-project/ray #11750 (also pytorch/rl PR #2215, #2242): rows added
    without a priority get priority 1, not the max priority seen."""

    def on_write(self, index, priority=None) -> None:
        if priority is None:
            priority = torch.ones(len(torch.as_tensor(index)), dtype=torch.float64)
        super().on_write(index, priority)


@mutant(bug="new rows given priority 1 instead of the max",
        catches=("test_priority_transform::test_writer_default_priority_is_transformed_once",),
        reproduces="ray-project/ray #11750; pytorch/rl PR #2215, #2242")
def new_rows_get_priority_one():
    return historic("new-rows-get-priority-one", PrioritizedSampler=NewRowsPriorityOneSampler)


class TwoWritersOfNewPriorityBuffer(ReplayBuffer):
    """pytorch/rl #2211: two code paths write a new row's priority -- the
    priority carried in the data, then the writer's default (the max seen)
    over it -- so the data's priority is lost."""

    def extend(self, data):
        index = super().extend(data)
        if self.prioritized and self.priority_of(data) is not None:
            self.sampler.on_write(index, None)  # the second path: the default priority
        return index


@mutant(bug="two code paths write a new row's priority",
        catches=("test_priority_transform::test_priority_key_in_data_is_transformed_once",),
        reproduces="pytorch/rl #2211")
def priority_written_by_two_paths():
    return historic("priority-written-by-two-paths", TwoWritersOfNewPriorityBuffer)


class NoGenerationBuffer(ReplayBuffer):
    """ray-project/ray #6534 (uber-research/ape-x #7): priorities from a batch
    sampled before the ring moved on are applied by slot: samples carry no
    write generation and updates are never checked against one."""

    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        info.pop("generation", None)
        return rows, info

    def update_priority(self, index, priority, generation=None) -> None:
        super().update_priority(index, priority)


@mutant(bug="priorities of an old sample applied to recycled slots",
        catches=("test_sampling_distributions::test_stale_priority_updates_are_ignored",),
        reproduces="ray-project/ray #6534; uber-research/ape-x #7")
def stale_priorities_applied_by_slot():
    return historic("stale-priorities-applied-by-slot", NoGenerationBuffer)


class NeverWrittenLiveBuffer(ReplayBuffer):
    """pytorch/rl PR #4043: a slot never written (generation -1) is taken as
    live, so an update may give it a priority and it can then be sampled."""

    def update_priority(self, index, priority, generation=None) -> None:

        index = check_index(index, self.capacity)
        self.sampler.update_priority(index, priority, None)


@mutant(bug="a never-written slot taken as live by an update",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",),
        reproduces="pytorch/rl PR #4043")
def never_written_slot_taken_as_live():
    return historic("never-written-slot-taken-as-live", NeverWrittenLiveBuffer)


class DeltaSumTree(SumTree):
    """thu-ml/tianshou PR #94: an update writes each leaf (a repeated slot:
    the last value) but adds to the inner sums every entry's change against
    the leaf as it was BEFORE the update, repeats included: the sums no
    longer match the leaves, and sampling follows the sums."""

    def update(self, index, value) -> None:

        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", torch.float64)
        if len(index) == 0:
            return
        node = self.size + index
        delta = value - self.nodes[node]  # against the values before the update
        keep = last_occurrence(index, self.capacity)
        self.nodes[node[keep]] = value[keep]  # the leaves: last write wins
        node = node // 2
        while int(node[0]) >= 1:
            self.nodes.index_add_(0, node, delta)  # every entry's change, repeats included
            node = node // 2


class DeltaTreeSampler(PrioritizedSampler):
    """A prioritized sampler over :class:`DeltaSumTree` (tianshou PR #94)."""

    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, alpha, beta, eps)
        self.sum_tree = DeltaSumTree(capacity)


@mutant(bug="a repeated slot in one update summed twice in the tree",
        catches=("test_sampled_slots::test_update_with_repeated_slots_samples_by_the_last_entry",),
        reproduces="thu-ml/tianshou PR #94")
def repeated_update_sums_every_entry():
    return historic("repeated-update-sums-every-entry", PrioritizedSampler=DeltaTreeSampler)
