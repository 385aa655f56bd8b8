"""Mutants of the sampling mass (test_sampling_mass): a tree whose root
drifts from its leaves, mass on padding leaves, and prefix searches that
get the boundaries wrong. Each is the reference with one such change."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import CAPABILITIES, Conventions
from rbcheck.reference.arguments import check_index, last_occurrence
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.sum_tree import SumTree
from tests.mutants.registry import control, mutant

DRIFT = "test_sampling_mass::test_sampling_mass_survives_long_update_sequences"
BOUNDARY = "test_sampling_mass::test_boundary_masses_map_to_the_right_slot"
FLOAT32 = Conventions(priority_dtype=torch.float32,
                      notes={"priority_dtype": "the sum tree keeps float32 nodes (flashbax, TorchRL)"})


def _adapter(name: str, sum_tree: type, *, conventions=None, capabilities=CAPABILITIES - {"concurrent"},
             prefix: str = "mutant"):
    class Sampler(PrioritizedSampler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.sum_tree = sum_tree(self.capacity)

    Sampler.__name__ = Sampler.__qualname__ = f"{sum_tree.__name__}Sampler"
    return buffer_adapter(f"{prefix}-{name}", "0", ReplayBuffer,
                          capabilities, components=SimpleNamespace(PrioritizedSampler=Sampler),
                          pin_module="rbcheck.reference.pinning", conventions=conventions)


class Float32Tree(SumTree):
    """The reference tree with float32 nodes: every parent recomputed from
    its children (so the root is the float32 sum of the leaves)."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.nodes = self.nodes.to(torch.float32)

    def update(self, index, value) -> None:
        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", torch.float32)
        keep = last_occurrence(index, self.capacity)
        self.nodes[self.size + index[keep]] = value[keep]
        parent = torch.unique((index + self.size) // 2)
        while len(parent) and parent[0] >= 1:  # every parent recomputed from its children
            self.nodes[parent] = self.nodes[2 * parent] + self.nodes[2 * parent + 1]
            parent = torch.unique(parent // 2)

    def leaf(self, index):
        return super().leaf(index).to(torch.float64)

    def find_prefix(self, mass):
        return super().find_prefix(torch.as_tensor(mass, dtype=torch.float64))


class DeltaFloat32Tree(Float32Tree):
    """float32 nodes, each update adding ``new - old`` to every ancestor (no
    recompute): the root drifts from its leaves by what rounds away."""

    def update(self, index, value) -> None:
        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", torch.float32)
        keep = last_occurrence(index, self.capacity)
        for slot, v in zip(index[keep].tolist(), value[keep].tolist(), strict=True):
            node = self.size + slot
            delta = torch.tensor(v, dtype=torch.float32) - self.nodes[node]
            self.nodes[node] = v
            node //= 2
            while node >= 1:
                self.nodes[node] += delta
                node //= 2


@control
def float32_tree_recomputed():
    """Correct: a float32 tree whose parents are recomputed from their
    children, declaring priority_dtype=float32 (flashbax's fix)."""
    return _adapter("float32-tree-recomputed", Float32Tree, conventions=FLOAT32, prefix="control")


@mutant(bug="a float32 tree updated by deltas: the root drifts from its leaves", catches=(DRIFT,),
        control=float32_tree_recomputed, reproduces="instadeepai/flashbax #52")
def float32_root_drifts():
    return _adapter("float32-root-drifts", DeltaFloat32Tree, conventions=FLOAT32)


class PaddedTree(SumTree):
    """Padding leaves (past ``capacity``, up to the power of two) start at 1,
    like every new slot's priority, and a draw that lands there is clamped to
    the last slot: only capacities that are not powers of two have any."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.nodes[self.size + capacity:] = 1.0
        for level in range(self.size.bit_length() - 2, -1, -1):
            parent = torch.arange(1 << level, 2 << level)
            self.nodes[parent] = self.nodes[2 * parent] + self.nodes[2 * parent + 1]

    def find_prefix(self, mass):
        return super().find_prefix(mass).clamp_max(self.capacity - 1)


@mutant(bug="padding leaves of a tree whose capacity is not a power of two carry mass",
        catches=(DRIFT, BOUNDARY))
def padding_leaves_carry_mass():
    return _adapter("padding-leaves-carry-mass", PaddedTree)


class LeftOnTiesTree(SumTree):
    """The prefix search goes left when the mass equals the left sum
    (``<=``): a mass on a boundary, or u = 0, lands on a zero-priority slot."""

    def find_prefix(self, mass):
        mass = torch.as_tensor(mass, dtype=torch.float64).clone()
        node = torch.ones(mass.shape, dtype=torch.long)
        for _ in range(self.size.bit_length() - 1):
            left = 2 * node
            left_sum, right_sum = self.nodes[left], self.nodes[left + 1]
            go_left = (mass <= left_sum) | (right_sum == 0)
            mass, node = torch.where(go_left, mass, mass - left_sum), torch.where(go_left, left, left + 1)
        return node - self.size


@mutant(bug="the prefix search goes left on a tie: boundary masses pick a zero-priority slot",
        catches=(BOUNDARY,), reproduces="JuliaReinforcementLearning/ReinforcementLearningTrajectories.jl PR #56")
def zero_priority_slot_sampled():
    return _adapter("zero-priority-slot-sampled", LeftOnTiesTree)


class LastExcludedSampler(PrioritizedSampler):
    """Draws the mass over ``sum(0, n - 1)`` with an exclusive end: the last
    held slot is left out of the total and never reached."""

    def sample(self, storage, batch_size, generator, cursor=0):
        n = len(storage)
        total = self.sum_tree.total() - float(self.sum_tree.leaf(torch.tensor([n - 1]))[0])
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        index = self.sum_tree.find_prefix(u * total)
        p, p_min = self.sum_tree.leaf(index) / total, self.min_tree.min() / total
        weight = (n * p) ** -self.beta / (n * p_min) ** -self.beta
        return {"index": index, "weight": weight.to(torch.float32)}


@mutant(bug="the last held slot is left out of the total the mass is drawn over", catches=(BOUNDARY,),
        reproduces="hill-a/stable-baselines #941")
def last_slot_excluded_from_total():
    """Declares no shared randomness: the catch must come through sample()."""
    return buffer_adapter("mutant-last-slot-excluded-from-total", "0", ReplayBuffer,
                          CAPABILITIES - {"concurrent", "shared_rng"},
                          components=SimpleNamespace(PrioritizedSampler=LastExcludedSampler),
                          pin_module="rbcheck.reference.pinning")
