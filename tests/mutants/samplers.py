"""The samplers the field uses (issue 40): epochs without replacement,
consuming samplers, iteration, prefetching, and the declared law of
replacement. Each mutant is the reference with one of these broken; the
reference is the control.
"""

from __future__ import annotations

import torch

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.consuming_sampler import ConsumingSampler, ConsumingWriter
from rbcheck.reference.iteration import Prefetch
from rbcheck.reference.random_sampler import RandomSampler, draw_uniforms
from rbcheck.reference.without_replacement_sampler import WithoutReplacementSampler
from tests.mutants.base import adapter
from tests.mutants.registry import mutant

WR = "test_sampling_without_replacement"
EPOCH = f"{WR}::test_an_epoch_draws_every_held_slot_exactly_once"
#: Fixed cases (parametrized: a pytest run) that catch what the drawn epochs reach only by luck.
EPOCH_CASES = f"{WR}::test_an_epoch_draws_each_slot_once_fixed_cases"
RESUME = f"{WR}::test_a_saved_epoch_resumes_after_load"
AT_MOST = "test_consuming::test_a_row_is_drawn_at_most_max_sample_count_times"
REUSE = "test_consuming::test_writes_reuse_consumed_slots_first"
CONSUMED_RESUME = "test_consuming::test_consumption_survives_save_and_load"
ITERATION = "test_iteration::test_iteration_gives_the_batches_of_repeated_sample"
PREFETCH = "test_iteration::test_prefetch_gives_the_stream_without_prefetch"
DECLARED = "test_replacement::test_samplers_draw_with_or_without_replacement_as_declared"


# -- epochs -------------------------------------------------------------------


class EpochWithReplacementSampler(WithoutReplacementSampler):
    """Draws each epoch's "permutation" with replacement: slots repeat, others are missed."""

    def sample(self, storage, batch_size, generator, cursor=0):
        n = len(storage)
        if self.left(batch_size) == 0 and n and not (self.drop_last and batch_size > n):
            self.epoch = torch.floor(draw_uniforms(n, generator) * n).long().clamp_(max=n - 1)
            self.position = 0
        return super().sample(storage, batch_size, generator, cursor)


@mutant(in_process=True, bug="a 'without replacement' sampler that draws an epoch with replacement",
        catches=(EPOCH, DECLARED))
def epoch_drawn_with_replacement():
    return adapter("epoch-drawn-with-replacement", WithoutReplacementSampler=EpochWithReplacementSampler)


class EpochDropsASlotSampler(WithoutReplacementSampler):
    """An epoch of more than one slot leaves its last slot out."""

    def sample(self, storage, batch_size, generator, cursor=0):
        starting = self.left(batch_size) == 0
        info = super().sample(storage, batch_size, generator, cursor)
        if starting and len(self.epoch) > 1:
            self.epoch = self.epoch[:-1]
            info["index"] = self.epoch[:len(info["index"])].clone()
            self.position = len(info["index"])
        return info


@mutant(bug="an epoch that never draws one of its slots", catches=(EPOCH_CASES, EPOCH))  # a pytest run
def epoch_drops_a_slot():
    return adapter("epoch-drops-a-slot", WithoutReplacementSampler=EpochDropsASlotSampler)


class DropLastIgnoredSampler(WithoutReplacementSampler):
    """Returns the epoch's short tail even with drop_last=True."""

    def left(self, batch_size):
        return len(self.epoch) - self.position


@mutant(bug="drop_last ignored: an epoch's short tail is returned",  # a pytest run: its fixed cases are parametrized
        catches=(f"{WR}::test_an_epochs_tail_follows_drop_last", EPOCH))
def drop_last_ignored():
    return adapter("drop-last-ignored", WithoutReplacementSampler=DropLastIgnoredSampler)


class WrittenSlotsJoinTheEpochSampler(WithoutReplacementSampler):
    """A slot written mid-epoch is put back at the end of the epoch in progress
    (drawn twice when the ring overwrote a slot already drawn; new slots drawn early)."""

    def on_write(self, index, priority=None):
        if self.position < len(self.epoch):
            self.epoch = torch.cat([self.epoch, torch.as_tensor(index).unique()])


@mutant(bug="a slot written mid-epoch is drawn again in the same epoch",  # a pytest run: fixed cases
        catches=(EPOCH_CASES, EPOCH))
def mid_epoch_write_drawn_twice():
    return adapter("mid-epoch-write-drawn-twice", WithoutReplacementSampler=WrittenSlotsJoinTheEpochSampler)


class EpochNotSavedSampler(WithoutReplacementSampler):
    """The checkpoint keeps the parameters but not the epoch: a load starts a new one."""

    def state_dict(self):
        return {**super().state_dict(), "epoch": torch.zeros(0, dtype=torch.long), "position": 0}


@mutant(in_process=True, bug="the epoch in progress is lost on save and load", catches=(RESUME,))
def epoch_lost_on_save():
    return adapter("epoch-lost-on-save", WithoutReplacementSampler=EpochNotSavedSampler)


# -- consuming ------------------------------------------------------------------


class OneDrawTooManySampler(ConsumingSampler):
    """A row leaves after max_sample_count + 1 draws."""

    def sample(self, storage, batch_size, generator, cursor=0):
        self.max_sample_count += 1
        try:
            return super().sample(storage, batch_size, generator, cursor)
        finally:
            self.max_sample_count -= 1


@mutant(in_process=True, bug="a consumed row is drawn again (max_sample_count + 1 draws)", catches=(AT_MOST,))
def consumed_row_drawn_again():
    return adapter("consumed-row-drawn-again", ConsumingSampler=OneDrawTooManySampler)


class RingOnlyWriter(ConsumingWriter):
    """Writes at the ring's cursor only: consumed slots are not reused first."""

    def __init__(self, capacity, sampler):
        super().__init__(capacity, ConsumingSampler(capacity, 2**62))  # never sees a consumed slot


@mutant(in_process=True, bug="a write does not reuse the consumed slots first", catches=(REUSE,))
def consumed_slots_not_reused():
    return adapter("consumed-slots-not-reused", ConsumingWriter=RingOnlyWriter)


class CountsNotSavedSampler(ConsumingSampler):
    """The checkpoint holds every count as 0: consumed rows come back after a load."""

    def state_dict(self):
        return {**super().state_dict(), "count": torch.zeros_like(self.count)}


@mutant(in_process=True, bug="the draw counts are lost on save and load", catches=(CONSUMED_RESUME,))
def consumption_lost_on_save():
    return adapter("consumption-lost-on-save", ConsumingSampler=CountsNotSavedSampler)


class InBatchRepeatsSampler(ConsumingSampler):
    """Draws a batch's slots with replacement among the unconsumed (a slot may come twice)."""

    def sample(self, storage, batch_size, generator, cursor=0):
        live = torch.nonzero(self.count[:len(storage)] < self.max_sample_count).flatten()
        if len(live) == 0:
            return super().sample(storage, batch_size, generator, cursor)  # raises
        pick = torch.floor(draw_uniforms(min(batch_size, len(live)), generator) * len(live)).long()
        index = live[pick.clamp_(max=len(live) - 1)]
        self.count.index_add_(0, index, torch.ones_like(index))
        return {"index": index}


@mutant(in_process=True, bug="a consuming sampler that repeats a slot within a batch", catches=(AT_MOST, DECLARED))
def consuming_draws_with_replacement_in_batch():
    return adapter("consuming-draws-with-replacement-in-batch", ConsumingSampler=InBatchRepeatsSampler)


class PermutationRandomSampler(RandomSampler):
    """A uniform sampler that draws each batch without replacement (declared "with")."""

    def sample(self, storage, batch_size, generator, cursor=0):
        n = len(storage)
        if batch_size > n:
            return super().sample(storage, batch_size, generator, cursor)
        return {"index": torch.argsort(draw_uniforms(n, generator), stable=True)[:batch_size]}


@mutant(bug="a 'with replacement' uniform sampler that never repeats a slot in a batch", catches=(DECLARED,))
def random_sampler_without_replacement_in_batch():
    return adapter("random-sampler-without-replacement-in-batch", RandomSampler=PermutationRandomSampler)


# -- iteration and prefetch ---------------------------------------------------------


class RestartingIterationBuffer(ReplayBuffer):
    """Iteration yields a whole epoch's batches even when one is in progress."""

    def __iter__(self):
        batches = getattr(self.sampler, "batches_left", None)
        count = None if batches is None else -(-len(self) // self.batch_size)
        while count is None or count > 0:
            yield self.sample(self.batch_size)
            count = None if count is None else count - 1


@mutant(in_process=True, bug="iteration ignores the epoch in progress (too many batches, or too few)",
        catches=(ITERATION,))
def iteration_ignores_the_epoch_in_progress():
    return adapter("iteration-ignores-the-epoch-in-progress", RestartingIterationBuffer)


def with_prefetch(prefetch_cls: type) -> type:
    class Buffer(ReplayBuffer):
        def __init__(self, *args, prefetch=0, **kwargs):
            super().__init__(*args, prefetch=prefetch, **kwargs)
            self.prefetch = prefetch_cls(prefetch)

    Buffer.__qualname__ = Buffer.__name__ = f"{prefetch_cls.__name__}Buffer"
    return Buffer


class ReorderingPrefetch(Prefetch):
    """Returns the newest queued draw first."""

    def take(self, buffer, batch_size):
        if len(self.queue) > 1 and self.queue[0][0] == batch_size:
            self.queue.rotate(-1)  # the second-oldest draw comes out first
        return super().take(buffer, batch_size)


@mutant(in_process=True, bug="prefetch returns the queued batches out of order", catches=(PREFETCH,))
def prefetch_reorders():
    return adapter("prefetch-reorders", with_prefetch(ReorderingPrefetch))


class StalePrefetch(Prefetch):
    """Never takes the queued draws back: a write, an update or a load leaves
    draws made before it in the queue (indices of an older, larger state)."""

    def rewind(self, buffer):
        """Draws made before a write, an update or a load stay queued."""

    def take(self, buffer, batch_size):
        if self.queue and self.queue[0][0] != batch_size:  # only another batch size takes them back
            Prefetch.rewind(self, buffer)
        return super().take(buffer, batch_size)


@mutant(in_process=True, bug="prefetch keeps draws made before a write or a load (stale indices)",
        catches=(PREFETCH,))
def prefetch_keeps_stale_draws():
    return adapter("prefetch-keeps-stale-draws", with_prefetch(StalePrefetch))
