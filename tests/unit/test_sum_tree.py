"""SumTree / MinTree (exact): layout, hand-computed prefix search incl. zero leaves
and interval boundaries, last-write-wins updates, against a cumsum oracle."""

from __future__ import annotations

import pytest
import torch

from rbcheck.reference.sum_tree import MinTree, SumTree


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.fixture
def tree() -> SumTree:
    """Leaves [1, 0, 2, 0, 3]: prefix intervals [0,1) -> 0, [1,3) -> 2, [3,6) -> 4."""
    t = SumTree(5)
    t.update(torch.arange(5), f64(1, 0, 2, 0, 3))
    return t


def test_layout_rounds_capacity_up_to_a_power_of_two(tree):
    assert tree.size == 8 and tree.nodes.shape == (16,) and tree.nodes.dtype == torch.float64
    # root, then level by level: [1 + 0 + 2 + 0, 3 + 0 + 0 + 0], [1, 2, 3, 0]
    assert tree.nodes[1:8].tolist() == [6.0, 3.0, 3.0, 1.0, 2.0, 3.0, 0.0]
    assert tree.total() == 6.0
    assert tree.leaf(torch.tensor([0, 2, 4])).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "mass, leaf",
    [
        (0.0, 0), (0.5, 0), (0.999, 0),  # first interval
        (1.0, 2), (2.999, 2),  # boundary 1.0 belongs to leaf 2 (leaf 1 is zero)
        (3.0, 4), (5.999, 4),  # boundary 3.0 belongs to leaf 4 (leaf 3 is zero)
        (6.0, 4), (100.0, 4),  # mass >= total: the last non-zero leaf, never an unused one
    ],
)
def test_find_prefix_hand_masses(tree, mass, leaf):
    assert tree.find_prefix(f64(mass)).tolist() == [leaf]


def test_find_prefix_is_vectorized_and_returns_int64(tree):
    out = tree.find_prefix(f64(0.0, 1.0, 3.0, 5.5))
    assert out.dtype == torch.int64 and out.tolist() == [0, 2, 4, 4]


def test_find_prefix_goes_left_when_right_subtree_is_empty():
    t = SumTree(4)
    t.update(torch.tensor([0, 1]), f64(1, 1))  # right half (leaves 2, 3) is all zero
    assert t.find_prefix(f64(2.0, 2.5)).tolist() == [1, 1]


def test_update_last_write_wins_and_parents_follow():
    t = SumTree(5)
    t.update(torch.tensor([2, 2, 0]), f64(5, 7, 1))
    assert t.leaf(torch.tensor([2])).tolist() == [7.0]
    assert t.total() == 8.0 and t.nodes[2].item() == 8.0 and t.nodes[5].item() == 7.0
    t.update(torch.tensor([2]), f64(0))
    assert t.total() == 1.0


def test_capacity_one():
    t = SumTree(1)
    t.update(torch.tensor([0]), f64(2.5))
    assert t.size == 1 and t.total() == 2.5 and t.find_prefix(f64(0.0, 2.4)).tolist() == [0, 0]


def test_min_tree_unused_leaves_are_inf():
    t = MinTree(3)
    assert t.min() == float("inf")
    t.update(torch.tensor([0, 2]), f64(4, 2))
    assert t.min() == 2.0 and t.nodes[4 + 3].item() == float("inf")
    t.update(torch.tensor([2]), f64(9))
    assert t.min() == 4.0


def test_matches_cumsum_oracle_with_integer_masses():
    """Integer leaves are exact in float64: the leaf is the first with cumsum > mass."""
    g = torch.Generator().manual_seed(0)
    for capacity in (1, 2, 3, 7, 8, 13):
        leaves = torch.randint(0, 4, (capacity,), generator=g).double()
        leaves[0] += 1  # total > 0
        t = SumTree(capacity)
        t.update(torch.arange(capacity), leaves)
        cumsum = leaves.cumsum(0)
        masses = torch.arange(0, int(cumsum[-1]) * 2).double() / 2  # every integer and half
        expected = torch.searchsorted(cumsum, masses, right=True)
        assert torch.equal(t.find_prefix(masses), expected), (capacity, leaves)
        assert (leaves[t.find_prefix(masses)] > 0).all()


def test_bad_arguments_leave_tree_unchanged(tree):
    before = tree.nodes.clone()
    with pytest.raises(ValueError, match=r"index=\[5\], but should be in \[0, 5\)"):
        tree.update(torch.tensor([5]), f64(1))
    with pytest.raises(ValueError, match=r"value.shape=\(2,\), but should be \(1,\)"):
        tree.update(torch.tensor([1]), f64(1, 2))
    with pytest.raises(ValueError, match="index.dtype"):
        tree.update(torch.tensor([1.0]), f64(1))
    assert torch.equal(tree.nodes, before)


def test_state_dict_round_trip(tree):
    other = SumTree(5)
    other.load_state_dict(tree.state_dict())
    assert torch.equal(other.nodes, tree.nodes)
    assert set(tree.state_dict()) == {"leaves"}  # the inner nodes are rebuilt
    with pytest.raises(ValueError, match=r"leaves=torch.float64\[5\], but should be torch.float64\[6\]"):
        SumTree(6).load_state_dict(tree.state_dict())
    with pytest.raises(ValueError, match=r"leaves=\[-1.0\], but should be finite and >= 0"):
        other.load_state_dict({"leaves": torch.tensor([1.0, -1.0, 0, 0, 0], dtype=torch.float64)})
    assert torch.equal(other.nodes, tree.nodes)
