"""Slice epochs, prioritized slices and staleness-aware sampling (issue 40).
Each mutant is the reference with one of these broken; the reference is the
control.
"""

from __future__ import annotations

import torch

from rbcheck.reference.prioritized_slice_sampler import PrioritizedSliceSampler
from rbcheck.reference.random_sampler import draw_uniforms
from rbcheck.reference.slice_without_replacement_sampler import SliceWithoutReplacementSampler
from rbcheck.reference.staleness_sampler import StalenessSampler
from tests.mutants.base import adapter
from tests.mutants.registry import mutant

SLICE_EPOCH = "test_slice_samplers::test_slice_epochs_draw_every_valid_start_once"
PRIORITIZED = "test_slice_samplers::test_prioritized_slice_starts_follow_the_start_priorities"
WEIGHTING = "test_staleness::test_staleness_draws_follow_the_declared_weighting"
NONE_LEFT = "test_staleness::test_no_eligible_row_is_an_error"
REPLAY = "test_staleness::test_staleness_draws_replay_from_the_seed"


# -- slice epochs ---------------------------------------------------------------------


class StartsWithReplacement(SliceWithoutReplacementSampler):
    """Each epoch's "permutation" of starts drawn with replacement: starts repeat, others are missed."""

    def sample(self, storage, batch_size, generator, cursor=0):
        info = super().sample(storage, batch_size, generator, cursor)
        if self.position == len(info["slice_end"].nonzero()) and len(self.epoch) > 1:  # an epoch just began
            pick = torch.floor(draw_uniforms(len(self.epoch), generator) * len(self.epoch)).long()
            self.epoch = self.epoch[pick.clamp_(max=len(self.epoch) - 1)]
        return info


@mutant(in_process=True, bug="slice starts of an epoch drawn with replacement", catches=(SLICE_EPOCH,))
def slice_epoch_with_replacement():
    return adapter("slice-epoch-with-replacement", SliceWithoutReplacementSampler=StartsWithReplacement)


class OneStartPastTheEnd(SliceWithoutReplacementSampler):
    """Counts one start too many per trajectory: its slice runs past the trajectory's end."""

    def valid_starts(self, start, length, slice_len):
        return super().valid_starts(start, length, max(slice_len - 1, 1))


@mutant(in_process=True, bug="a slice start whose slice runs past its trajectory's end", catches=(SLICE_EPOCH,))
def slice_start_past_the_end():
    return adapter("slice-start-past-the-end", SliceWithoutReplacementSampler=OneStartPastTheEnd)


class LastStartMissed(SliceWithoutReplacementSampler):
    """Leaves each trajectory's last valid start out of the epoch."""

    def valid_starts(self, start, length, slice_len):
        return super().valid_starts(start, length, slice_len + 1)


@mutant(in_process=True, bug="an epoch that never draws a trajectory's last valid start", catches=(SLICE_EPOCH,))
def slice_epoch_misses_last_start():
    return adapter("slice-epoch-misses-last-start", SliceWithoutReplacementSampler=LastStartMissed)


class EpochKeptOverWrites(SliceWithoutReplacementSampler):
    """A write does not end the epoch: its start positions go stale as the ring moves."""

    def on_write(self, index, priority=None):
        """The epoch in progress is kept."""


@mutant(in_process=True, bug="a slice epoch kept over a write (stale starts)", catches=(SLICE_EPOCH,))
def slice_epoch_kept_over_writes():
    return adapter("slice-epoch-kept-over-writes", SliceWithoutReplacementSampler=EpochKeptOverWrites)


class PhysicalOrderSlices(SliceWithoutReplacementSampler):
    """Reads trajectories in slot order from slot 0: a full ring's trajectory that wraps is cut
    in two, and rows either side of the write cursor are joined when their episode matches."""

    def trajectories(self, storage, cursor):
        return super().trajectories(storage, 0 if len(storage) < storage.capacity else storage.capacity)


@mutant(in_process=True, bug="slices read in slot order, not write order (the write cursor ignored)",
        catches=(SLICE_EPOCH, PRIORITIZED))
def slices_ignore_the_write_cursor():
    return adapter("slices-ignore-the-write-cursor", SliceWithoutReplacementSampler=PhysicalOrderSlices,
                   PrioritizedSliceSampler=PhysicalOrderPrioritized)


class PhysicalOrderPrioritized(PrioritizedSliceSampler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slices.__class__ = PhysicalOrderSlices


# -- prioritized slices --------------------------------------------------------------


class UniformStarts(PrioritizedSliceSampler):
    """Draws slice starts uniformly: the priorities only weight the batch."""

    def start_probabilities(self, storage, slice_len, cursor=0):
        order, start, length, valid, p = super().start_probabilities(storage, slice_len, cursor)
        return order, start, length, valid, torch.full_like(p, 1.0 / len(p))


@mutant(bug="prioritized slice starts drawn uniformly (priorities ignored)", catches=(PRIORITIZED,))
def prioritized_slice_starts_uniform():
    return adapter("prioritized-slice-starts-uniform", PrioritizedSliceSampler=UniformStarts)


class TrajectoryPriority(PrioritizedSliceSampler):
    """A start's mass is its trajectory's first step's priority, not its own."""

    def start_probabilities(self, storage, slice_len, cursor=0):
        order, start, length, valid, p = super().start_probabilities(storage, slice_len, cursor)
        first = start[torch.searchsorted(start, valid, right=True) - 1]
        mass = self.sum_tree.leaf(order[first])
        return order, start, length, valid, mass / mass.sum()


@mutant(bug="a slice start weighted by its trajectory's first priority, not its own step's",
        catches=(PRIORITIZED,))
def prioritized_slice_by_trajectory():
    return adapter("prioritized-slice-by-trajectory", PrioritizedSliceSampler=TrajectoryPriority)


class UpdateOneSlotOver(PrioritizedSliceSampler):
    """``update_priority`` lands on the next slot."""

    def update_priority(self, index, priority, generation=None, current_generation=None):
        super().update_priority((torch.as_tensor(index) + 1) % self.capacity, priority, generation, current_generation)


@mutant(bug="a slice priority update lands on the next slot", catches=(PRIORITIZED,))
def prioritized_slice_update_off_by_one():
    return adapter("prioritized-slice-update-off-by-one", PrioritizedSliceSampler=UpdateOneSlotOver)


class StartsPastTheEnd(PrioritizedSliceSampler):
    """Any held step may start a slice: slices run past their trajectory's end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slices.__class__ = OneStartPastTheEnd


@mutant(bug="a prioritized slice that runs past its trajectory's end", catches=(PRIORITIZED,))
def prioritized_slice_past_the_end():
    return adapter("prioritized-slice-past-the-end", PrioritizedSliceSampler=StartsPastTheEnd)


class BatchMaxWeights(PrioritizedSliceSampler):
    """Weights divided by the batch's largest weight instead of the held slots' largest."""

    def sample(self, storage, batch_size, generator, cursor=0):
        info = super().sample(storage, batch_size, generator, cursor)
        info["weight"] = info["weight"] / info["weight"].max()
        return info


@mutant(bug="prioritized slice weights normalised by the batch, not the held slots",
        catches=(PRIORITIZED,))
def prioritized_slice_batch_max_weights():
    return adapter("prioritized-slice-batch-max-weights", PrioritizedSliceSampler=BatchMaxWeights)


# -- staleness -------------------------------------------------------------------------


class ExponentialStaleness(StalenessSampler):
    """Weights ``2 ** -s`` instead of ``1 / (s + 1)``."""

    def probabilities(self, storage):
        slots, staleness = self.eligible(storage)
        weight = 0.5 ** staleness.double()
        return slots, weight / weight.sum()


@mutant(bug="staleness weighted 2**-s, not 1/(s+1)", catches=(WEIGHTING,))
def staleness_weight_exponential():
    return adapter("staleness-weight-exponential", StalenessSampler=ExponentialStaleness)


class GateOffByOne(StalenessSampler):
    """Keeps only rows with ``s < max_staleness`` (the gate's own value left out)."""

    def eligible(self, storage):
        slots, staleness = super().eligible(storage)
        keep = staleness < self.max_staleness if self.max_staleness >= 0 else staleness >= 0
        return (slots[keep], staleness[keep]) if bool(keep.any()) else (slots, staleness)


@mutant(bug="the staleness gate drops rows at exactly max_staleness", catches=(WEIGHTING,))
def staleness_gate_off_by_one():
    return adapter("staleness-gate-off-by-one", StalenessSampler=GateOffByOne)


class WithoutReplacementInBatch(StalenessSampler):
    """``torch.multinomial(w, B, replacement=B > eligible)``: a batch no larger than the eligible
    rows never repeats one, so its draws are not proportional to the weights."""

    def sample(self, storage, batch_size, generator, cursor=0):
        slots, p = self.probabilities(storage)
        pick = torch.multinomial(p, batch_size, replacement=batch_size > len(slots), generator=generator)
        return {"index": slots[pick]}


@mutant(bug="staleness draws without replacement within a batch (TorchRL's multinomial)",
        catches=(WEIGHTING,))
def staleness_without_replacement_in_batch():
    return adapter("staleness-without-replacement-in-batch", StalenessSampler=WithoutReplacementInBatch)


class GateIgnoredWhenEmpty(StalenessSampler):
    """Falls back to every row when none passes the gate."""

    def eligible(self, storage):
        try:
            return super().eligible(storage)
        except ValueError:
            gate, self.max_staleness = self.max_staleness, -1
            try:
                return super().eligible(storage)
            finally:
                self.max_staleness = gate


@mutant(bug="every row drawn when all are staler than max_staleness", catches=(NONE_LEFT,))
def staleness_gate_ignored_when_empty():
    return adapter("staleness-gate-ignored-when-empty", StalenessSampler=GateIgnoredWhenEmpty)


class GlobalRandomness(StalenessSampler):
    """Draws from torch's global generator, not the buffer's (TorchRL's ``torch.multinomial``)."""

    def sample(self, storage, batch_size, generator, cursor=0):
        slots, p = self.probabilities(storage)
        return {"index": slots[torch.multinomial(p, batch_size, replacement=True)]}


@mutant(bug="staleness draws ignore the buffer's generator (not seedable)", catches=(REPLAY,))
def staleness_ignores_the_generator():
    return adapter("staleness-ignores-the-generator", StalenessSampler=GlobalRandomness)
