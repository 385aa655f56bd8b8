"""Scale: buffers that are wrong only at the sizes of a real training run --
batches of 32 to 256 rows, rings of tens of thousands of slots, trees of
more than 2**12 leaves, thousands of small sample calls -- and right at the
handful of rows a property draws by default. Each one shows that the suite
checks every behaviour at the sizes users run (issue 39, item 5).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.random_sampler import RandomSampler, check_not_empty, draw_uniforms
from rbcheck.reference.sum_tree import SumTree
from rbcheck.reference.writer import RoundRobinWriter
from tests.mutants.base import adapter, with_writer
from tests.mutants.registry import mutant

#: the batch sizes of a training loop's fast path in the mutants below
TRAINING = range(32, 257)


class TrainingBatchRandomSampler(RandomSampler):
    """A fast path taken for batches of 32..256 (a warp-sized kernel, say)
    maps the uniforms with ``len - 1`` cells: the last held slot is never
    drawn in a training batch; every other batch size is right."""

    def sample(self, storage, batch_size: int, generator, cursor: int = 0) -> dict:
        if batch_size not in TRAINING:
            return super().sample(storage, batch_size, generator, cursor)
        check_not_empty(storage)
        u = draw_uniforms(batch_size, generator)
        size = len(storage)
        return {"index": torch.floor(u * max(size - 1, 1)).long()}


@mutant(bug="a uniform sample that never draws the last slot in batches of 32..256",
        catches=("test_sampling_distributions::test_uniform_sampling_matches_closed_form",))
def uniform_biased_in_training_batches():
    return adapter("uniform-biased-in-training-batches", RandomSampler=TrainingBatchRandomSampler)


class TrainingBatchWeightsSampler(PrioritizedSampler):
    """For batches of 32..256 the weights come back one position late (a
    fused path that writes them with an offset): each weight belongs to the
    previous draw's slot. Other batch sizes are right."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        if batch_size in TRAINING:
            info["weight"] = torch.roll(info["weight"], 1)
        return info


@mutant(bug="weights of another slot in batches of 32..256",
        catches=("test_sampled_slots::test_sampled_slots_are_live_and_weights_belong_to_them",
                 "test_model_comparison::test_implementation_matches_reference_model"))
def weights_shifted_in_training_batches():
    return adapter("weights-shifted-in-training-batches", PrioritizedSampler=TrainingBatchWeightsSampler)


class Int16SlotWriter(RoundRobinWriter):
    """Slots kept in a 16-bit signed type (``int16``) and folded back into
    the ring with ``% capacity``: past slot 32767 a row lands ``65536 -
    capacity`` slots early, and the cursor with it. Every ring of at most
    32768 slots is right, and so is one of exactly 2**16 (the fold lands on
    the right slot): a ring of 40000 is not."""

    def next_indices(self, n: int) -> torch.Tensor:
        rows = self.write_count + torch.arange(check_int("n", n))
        index = (rows % self.capacity).to(torch.int16).to(torch.int64) % self.capacity
        last = slice(max(n - self.capacity, 0), n)
        self.generation[index[last]] = rows[last]
        self.write_count += n
        self.cursor = int(torch.tensor(self.write_count % self.capacity).to(torch.int16)) % self.capacity
        return index


@mutant(bug="ring slots kept in int16: wrong slots past 32767 in a ring of more than 2**15",
        catches=("test_ring_eviction::test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
                 "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"))
def int16_ring_slots():
    return adapter("int16-ring-slots", with_writer(Int16SlotWriter))


#: levels the mutant's descent is unrolled for: trees of at most 2**12 leaves
DEPTH = 12


class TwelveLevelSumTree(SumTree):
    """The descent unrolled for 12 levels (a kernel built for at most 4096
    leaves): in a bigger tree it stops at an inner node and returns the
    first leaf below it, a slot that may hold 0 or never have been written."""

    def find_prefix(self, mass) -> torch.Tensor:
        mass = torch.as_tensor(mass, dtype=torch.float64).clone()
        node = torch.ones(mass.shape, dtype=torch.long)
        depth = self.size.bit_length() - 1
        for _ in range(min(depth, DEPTH)):
            left = 2 * node
            left_sum, right_sum = self.nodes[left], self.nodes[left + 1]
            go_left = (mass < left_sum) | (right_sum == 0)
            mass, node = torch.where(go_left, mass, mass - left_sum), torch.where(go_left, left, left + 1)
        return (node << max(depth - DEPTH, 0)) - self.size


class TwelveLevelSampler(PrioritizedSampler):
    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, alpha, beta, eps)
        self.sum_tree = TwelveLevelSumTree(capacity)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        tree = TwelveLevelSumTree(self.capacity)
        tree.nodes = self.sum_tree.nodes
        self.sum_tree = tree


@mutant(bug="a tree descent unrolled for 2**12 leaves: wrong slots in a bigger tree",
        catches=("test_sampling_mass::test_boundary_masses_map_to_the_right_slot",
                 "test_model_comparison::test_implementation_matches_reference_model"))
def tree_descent_capped_at_4096_leaves():
    return adapter("tree-descent-capped-at-4096-leaves", PrioritizedSampler=TwelveLevelSampler)


class NewestInEveryBatchSampler(RandomSampler):
    """Combined experience replay slipped into a uniform sampler: the newest
    row replaces the first draw of every batch. One extra draw per call is
    lost in one call of thousands; in thousands of calls of 32 the newest
    row is drawn ~1/32 of the time more than it should be."""

    def sample(self, storage, batch_size: int, generator, cursor: int = 0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        info["index"][0] = (cursor - 1) % storage.capacity
        return info


@mutant(bug="the newest row put in every batch: biased only over many small calls",
        catches=("test_sampling_distributions::test_uniform_sampling_matches_closed_form",))
def newest_row_in_every_batch():
    return adapter("newest-row-in-every-batch", RandomSampler=NewestInEveryBatchSampler)
