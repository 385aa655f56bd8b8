"""Trajectory slices: contiguous, inside one episode, across the ring's wrap,
episodes picked uniformly, strict_length honoured, the example as written.
"""

from __future__ import annotations

import torch

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.slice_sampler import SliceSampler
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant


class BoundaryBlindSliceSampler(SliceSampler):
    """Picks slice starts uniformly over the whole ring (write order),
    ignoring where episodes end."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, _, _ = self.trajectories(storage, cursor)
        size = len(order)
        span = max(size - slice_len, 0) + 1
        first = torch.floor(
            torch.rand(num_slices, generator=generator, dtype=torch.float64) * span
        ).long()
        rows = min(slice_len, size)
        position = torch.cat([torch.arange(f, f + rows) for f in first.tolist()])
        return {"index": order[position], "traj": torch.zeros(len(position), dtype=torch.long)}


@mutant(bug="a slice that crosses an episode boundary",
        catches=("test_trajectory_slices::test_slices_are_contiguous_and_inside_one_episode",))
def slice_crosses_episode_boundary():
    return adapter("slice-crosses-episode-boundary", SliceSampler=BoundaryBlindSliceSampler)


class NotStrictSliceSampler(SliceSampler):
    """Slices episodes shorter than slice_len even with strict_length=True."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        strict, self.strict_length = self.strict_length, False
        try:
            return super().sample(storage, batch_size, generator, cursor)
        finally:
            self.strict_length = strict


@mutant(bug="strict_length=True ignored: short episodes sliced",
        catches=("test_sampling_distributions::test_short_episodes_are_sliced_only_without_strict_length",))
def strict_length_ignored():
    return adapter("strict-length-ignored", SliceSampler=NotStrictSliceSampler)


class WrapBlindSliceSampler(SliceSampler):
    """Reads trajectories in slot order, ignoring where the ring wrapped: an
    episode written across the last slot is cut in two."""

    def trajectories(self, storage, cursor: int):
        return super().trajectories(storage, 0)


@mutant(bug="an episode written across the ring's last slot cut in two",
        catches=("test_trajectory_slices::test_slices_run_across_the_ring_wrap",))
def slice_ignores_ring_wrap():
    return adapter("slice-ignores-ring-wrap", SliceSampler=WrapBlindSliceSampler)


class LengthWeightedSliceSampler(SliceSampler):
    """Picks an episode with probability proportional to its length (the
    episode of a uniform row) instead of uniformly among the eligible ones."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, start, length = self.trajectories(storage, cursor)
        eligible = torch.nonzero(length >= slice_len if self.strict_length else length > 0).flatten()
        pick = torch.multinomial(length[eligible].double(), num_slices, replacement=True,
                                 generator=generator)
        traj = eligible[pick]
        span = (length[traj] - slice_len).clamp(min=0) + 1
        offset = torch.floor(torch.rand(num_slices, generator=generator, dtype=torch.float64) * span)
        first = start[traj] + offset.long().minimum(span - 1)
        rows = length[traj].clamp(max=slice_len)
        position = torch.cat([torch.arange(f, f + r) for f, r in zip(first.tolist(), rows.tolist(), strict=True)])
        return {"index": order[position], "traj": traj.repeat_interleave(rows)}


@mutant(bug="slices that pick episodes by length instead of uniformly",
        catches=("test_sampling_distributions::test_slice_sampling_matches_closed_form",))
def slice_episodes_weighted_by_length():
    return adapter("slice-episodes-weighted-by-length", SliceSampler=LengthWeightedSliceSampler)


class DefaultBatchIgnoredBuffer(ReplayBuffer):
    """``sample()`` without an argument draws 16 rows, whatever batch_size the
    buffer was built with."""

    def sample(self, batch_size=None):
        return super().sample(16 if batch_size is None else batch_size)


@mutant(bug="sample() ignoring the buffer's batch_size (the tutorial's example)",
        catches=("test_trajectory_slices::test_trajectory_example_runs_as_written",))
def default_batch_size_ignored():
    return adapter("default-batch-size-ignored", DefaultBatchIgnoredBuffer)


class StartAnywhereSliceSampler(SliceSampler):
    """pytorch/rl #2208: a slice's start is drawn over all the rows of its
    trajectory, not over the starts that leave room for slice_len rows, and
    the slice runs on in write order: into the next trajectory, or across
    the write cursor into the oldest rows."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, start, length = self.trajectories(storage, cursor)
        eligible = torch.nonzero(length >= slice_len if self.strict_length else length > 0).flatten()
        if len(eligible) == 0:
            raise ValueError(f"trajectories of length >= slice_len={slice_len}: 0, but should be >= 1")
        pick = torch.rand(num_slices, generator=generator, dtype=torch.float64)
        traj = eligible[torch.floor(pick * len(eligible)).long().clamp_(max=len(eligible) - 1)]
        offset = torch.floor(torch.rand(num_slices, generator=generator, dtype=torch.float64)
                             * length[traj]).long()
        first = start[traj] + offset
        position = torch.cat([(f + torch.arange(slice_len)) % len(order) for f in first.tolist()])
        return {"index": order[position], "traj": traj.repeat_interleave(slice_len)}


@mutant(bug="slices run into the next trajectory",
        catches=("test_trajectory_slices::test_slices_are_contiguous_and_inside_one_episode",),
        reproduces="pytorch/rl #2208")
def slice_start_drawn_over_whole_trajectory():
    return historic("slice-start-over-whole-trajectory", SliceSampler=StartAnywhereSliceSampler)
