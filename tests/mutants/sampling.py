"""Sampling: slots drawn with the closed-form frequencies, every sampled slot
live, the weights its own and normalised as declared, the same uniforms
mapped to the same slots as the reference.
"""

from __future__ import annotations

import torch

from rbcheck.harness.protocol import Conventions
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.random_sampler import RandomSampler
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant


class BatchNormalisedWeightsSampler(PrioritizedSampler):
    """Normalises the weights by the batch's largest weight instead of the
    buffer's smallest probability."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        total = self.sum_tree.total()
        p = self.sum_tree.leaf(info["index"]) / total
        w = (len(storage) * p) ** -self.beta
        info["weight"] = (w / w.max()).to(torch.float32)
        return info


@mutant(bug="weights normalised over the batch instead of the buffer",
        catches=("test_sampling_distributions::test_weights_are_normalised_as_declared",))
def weights_normalised_over_batch():
    return adapter(
        "weights-normalised-over-batch", PrioritizedSampler=BatchNormalisedWeightsSampler
    )


class NeverLastRandomSampler(RandomSampler):
    """Never draws the last valid slot."""

    def indices_from_uniforms(self, u, size):
        return torch.floor(u * max(size - 1, 1)).long()


@mutant(bug="a uniform sampler that never draws the last slot",
        catches=("test_sampling_distributions::test_uniform_sampling_matches_closed_form",))
def uniform_sampler_skips_last_slot():
    return adapter("uniform-sampler-skips-last-slot", RandomSampler=NeverLastRandomSampler)


class IgnoresPrioritiesSampler(PrioritizedSampler):
    """Draws slots uniformly; the weights still come from the trees."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        info["index"] = torch.floor(u * len(storage)).long().clamp_(max=len(storage) - 1)
        return info


@mutant(bug="a prioritized sampler that draws uniformly",
        catches=("test_sampling_distributions::test_prioritized_sampling_matches_closed_form",))
def prioritized_sampler_ignores_priorities():
    return adapter("prioritized-sampler-ignores-priorities", PrioritizedSampler=IgnoresPrioritiesSampler)


class RotatedRandomSampler(RandomSampler):
    """Maps u to the slot of (u + 1/2) mod 1: still uniform, but not the
    reference's slot for the same uniform."""

    def indices_from_uniforms(self, u, size):
        return super().indices_from_uniforms(torch.remainder(torch.as_tensor(u) + 0.5, 1.0), size)


@mutant(bug="the same uniforms mapped to other slots than the reference's",
        catches=("test_sampling_distributions::test_same_uniforms_give_same_indices_as_reference",))
def uniforms_mapped_differently():
    return adapter("uniforms-mapped-differently", RandomSampler=RotatedRandomSampler)


class Float32PrefixSearchSampler(PrioritizedSampler):
    """pytorch/rl #2230 (PR #2239): the sum tree is summed and searched in
    float32 for the first prefix sum ABOVE the mass (``scan_lower_bound``).
    A mass that rounds up to the float32 total runs past the filled part,
    into a slot never written (leaf 0). ``sample`` computes the weight from
    that slot's leaf (0: an infinite weight) and only then clamps the index
    to ``len - 1``; the uniforms-to-slots map has no clamp at all."""

    def _search(self, u: torch.Tensor) -> torch.Tensor:
        level = self.sum_tree.nodes[self.sum_tree.size:].to(torch.float32)
        levels = [level]
        while len(level) > 1:  # the float32 tree: every inner sum rounded to float32
            level = level[0::2] + level[1::2]
            levels.append(level)
        mass = (torch.as_tensor(u, dtype=torch.float64).cpu() * float(levels[-1][0])).to(torch.float32)
        node = torch.zeros(len(mass), dtype=torch.long)
        for below in reversed(levels[:-1]):
            left = below[2 * node]
            right = mass >= left  # lower bound: the first prefix sum > mass
            mass = torch.where(right, mass - left, mass)
            node = 2 * node + right.long()
        return node

    def indices_from_uniforms(self, u, size=None):
        return self._search(u)

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        if len(storage) == 0:
            raise ValueError("len(buffer)=0, but should be >= 1 to sample")
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        index = self._search(u)
        total, n = self.sum_tree.total(), len(storage)
        p = self.sum_tree.nodes[self.sum_tree.size + index] / total
        p_min = self.min_tree.min() / total
        weight = (n * p) ** -self.beta / (n * p_min) ** -self.beta
        index = index.clamp(max=n - 1)  # the clamp, after the weight was computed
        return {"index": index, "weight": weight.to(torch.float32)}


@mutant(bug="float32 prefix search past the filled part, clamped after the weight",
        catches=("test_sampled_slots::test_sampled_slots_are_live_and_weights_belong_to_them",
                 "test_model_comparison::test_implementation_matches_reference_model"),
        reproduces="pytorch/rl #2230 (PR #2239)")
def float32_prefix_search_clamped_after_weight():
    return historic("float32-prefix-search", PrioritizedSampler=Float32PrefixSearchSampler)


class CursorRangeSampler(PrioritizedSampler):
    """ray-project/ray #7180: the range searched is ``[0, cursor)``, the
    writer's next slot taken for the number of rows. Right after the ring
    became exactly full the cursor is back at 0, the range is empty and the
    sample raises IndexError (Ray's came out of its segment tree); once
    wrapped, only the slots below the cursor are ever drawn."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        if len(storage) == 0:
            raise ValueError("len(buffer)=0, but should be >= 1 to sample")
        filled = cursor if cursor else len(storage) if len(storage) < storage.capacity else 0
        leaves = self.sum_tree.nodes[self.sum_tree.size: self.sum_tree.size + filled]
        prefix = torch.cumsum(leaves, 0)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        index = torch.searchsorted(prefix, u * prefix[-1], right=True)  # IndexError when empty
        info = {"index": index}
        total, n = self.sum_tree.total(), len(storage)
        p = self.sum_tree.leaf(index) / total
        info["weight"] = ((n * p) ** -self.beta / (n * self.min_tree.min() / total) ** -self.beta).float()
        return info


@mutant(bug="sampling right after the ring became exactly full fails",
        catches=("test_sampled_slots::test_sampled_slots_are_live_and_weights_belong_to_them",),
        reproduces="ray-project/ray #7180")
def sample_range_from_cursor():
    return historic("sample-range-from-cursor", PrioritizedSampler=CursorRangeSampler)


@mutant(bug="the declared batch normaliser divides by the memory minimum",
        catches=("test_sampled_slots::test_sampled_slots_are_live_and_weights_belong_to_them",
                 "test_model_comparison::test_implementation_matches_reference_model"),
        reproduces="chainer/chainerrl PR #570")
def batch_option_uses_memory_minimum():
    """chainer/chainerrl PR #570: the "batch" weight normalisation option
    (declared: weight_normaliser="batch_max") still divided by the weight of
    the memory's smallest probability."""

    return historic("batch-option-uses-memory-minimum",
                     conventions=Conventions(weight_normaliser="batch_max"))


class HostWeightsSampler(PrioritizedSampler):
    """pytorch/rl #2518: the weights are left on the host while the indices
    are on the buffer's device (visible with a CUDA buffer only)."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        info["index"] = info["index"].to(storage.device)
        info["weight"] = info["weight"].cpu()
        return info


@mutant(bug="weights left on another device than the indices",
        catches=("test_sampled_slots::test_sampled_slots_are_live_and_weights_belong_to_them",),
        reproduces="pytorch/rl #2518",
        needs_cuda=True)
def weights_left_on_host():
    return historic("weights-left-on-host", PrioritizedSampler=HostWeightsSampler)
