"""Sum tree and min tree over ``capacity`` float64 leaves.

Contract
--------
* The tree is a complete binary tree stored in an array ``nodes`` of length ``2 * size`` where
  ``size`` is ``capacity`` rounded up to a power of two. Node 1 is the root, node ``k`` has
  children ``2k`` and ``2k + 1`` and leaf ``i`` lives at node ``size + i`` (node 0 is unused).
* ``update(index, value)`` sets the leaves in order (a repeated index: the last value wins),
  then recomputes every touched parent bottom up as ``left + right`` (SumTree; unused leaves
  hold 0) or ``min(left, right)`` (MinTree; unused leaves hold +inf).
* ``SumTree.find_prefix(mass)`` descends from the root; at each node it goes left if
  ``mass < left_sum or right_sum == 0``, else does ``mass -= left_sum`` and goes right.
  Optimized implementations must use exactly this arithmetic so that the same masses give the
  same leaves. A leaf holding 0 is never reached while the total is positive and ``mass >= 0``.
* The state is the leaves alone; the inner nodes are rebuilt on load.

Cost: ``update`` O(k log capacity) for k indices, ``find_prefix`` O(B log capacity) for B
masses, ``total``/``min`` O(1); memory 2 * size floats.
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_index, check_int, last_occurrence


class _Tree:
    def __init__(self, capacity: int):
        self.capacity = check_int("capacity", capacity)
        self.size = 1 << (capacity - 1).bit_length()  # next power of two
        self.nodes = torch.full((2 * self.size,), self.empty, dtype=torch.float64)

    def update(self, index, value) -> None:
        """Set leaves ``index`` to ``value`` (same shape) and refresh their ancestors."""
        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", torch.float64)
        if value.shape != index.shape:
            raise ValueError(f"value.shape={tuple(value.shape)}, but should be {tuple(index.shape)}")
        keep = last_occurrence(index, self.capacity)  # a repeated index: last write wins
        self.nodes[self.size + index[keep]] = value[keep]
        parent = torch.unique((index + self.size) // 2)
        while len(parent) and parent[0] >= 1:  # up to the root (none for an empty index)
            self.nodes[parent] = self.combine(self.nodes[2 * parent], self.nodes[2 * parent + 1])
            parent = torch.unique(parent // 2)

    def leaf(self, index) -> torch.Tensor:
        """The float64 leaf values at ``index``."""
        return self.nodes[self.size + check_index(index, self.capacity)]

    def state_dict(self) -> dict:
        return {"leaves": self.nodes[self.size:self.size + self.capacity].clone()}

    def load_state_dict(self, state: dict) -> None:
        """Rebuild the tree from the leaves; ValueError (nothing changed) if invalid."""
        leaves = state["leaves"]
        if not isinstance(leaves, torch.Tensor) or leaves.dtype != torch.float64 \
                or tuple(leaves.shape) != (self.capacity,):
            got = f"{leaves.dtype}{list(leaves.shape)}" if isinstance(leaves, torch.Tensor) else type(leaves).__name__
            raise ValueError(f"leaves={got}, but should be torch.float64[{self.capacity}]")
        if not self.valid_leaf(leaves).all():
            raise ValueError(f"{type(self).__name__} leaves={leaves[~self.valid_leaf(leaves)][:5].tolist()}, "
                             f"but should be finite and >= 0")
        nodes = torch.full((2 * self.size,), self.empty, dtype=torch.float64)
        nodes[self.size:self.size + self.capacity] = leaves.cpu()
        for level in range(self.size.bit_length() - 2, -1, -1):  # each level from its children
            parent = torch.arange(1 << level, 2 << level)
            nodes[parent] = self.combine(nodes[2 * parent], nodes[2 * parent + 1])
        self.nodes = nodes


class SumTree(_Tree):
    """Leaves and their partial sums; ``total()`` is the sum of all leaves."""

    empty, combine = 0.0, staticmethod(torch.add)  # an unused leaf; a parent from its children
    valid_leaf = staticmethod(lambda leaf: torch.isfinite(leaf) & (leaf >= 0))

    def total(self) -> float:
        return float(self.nodes[1])

    def find_prefix(self, mass) -> torch.Tensor:
        """For each float64 ``mass``, the leaf whose prefix-sum interval contains it."""
        mass = torch.as_tensor(mass, dtype=torch.float64).clone()
        node = torch.ones(mass.shape, dtype=torch.long)
        for _ in range(self.size.bit_length() - 1):  # depth of the tree
            left = 2 * node
            left_sum, right_sum = self.nodes[left], self.nodes[left + 1]
            go_left = (mass < left_sum) | (right_sum == 0)
            mass, node = torch.where(go_left, mass, mass - left_sum), torch.where(go_left, left, left + 1)
        return node - self.size


class MinTree(_Tree):
    """Leaves and their partial minima; ``min()`` is the smallest leaf."""

    empty, combine = float("inf"), staticmethod(torch.minimum)
    valid_leaf = staticmethod(lambda leaf: leaf > 0)  # zero priorities are stored as +inf

    def min(self) -> float:
        return float(self.nodes[1])
