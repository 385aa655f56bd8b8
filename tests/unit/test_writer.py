"""RoundRobinWriter (exact): ring order, cursor, write count, per-slot generation."""

from __future__ import annotations

import pytest
import torch

from rbcheck.reference.writer import RoundRobinWriter


def test_ring_order_cursor_and_count():
    w = RoundRobinWriter(3)
    assert (w.cursor, w.write_count, w.generation.tolist()) == (0, 0, [-1, -1, -1])
    assert w.next_indices(2).tolist() == [0, 1]
    assert (w.cursor, w.write_count, w.generation.tolist()) == (2, 2, [0, 1, -1])
    assert w.next_indices(2).tolist() == [2, 0]  # wraps: the oldest slot (0) goes first
    assert (w.cursor, w.write_count, w.generation.tolist()) == (1, 4, [3, 1, 2])


def test_batch_larger_than_capacity_later_rows_win():
    w = RoundRobinWriter(3)
    index = w.next_indices(7)
    assert index.dtype == torch.int64 and index.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert (w.cursor, w.write_count, w.generation.tolist()) == (1, 7, [6, 4, 5])


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"capacity=0, but should be an int >= 1"):
        RoundRobinWriter(0)
    w = RoundRobinWriter(2)
    with pytest.raises(ValueError, match=r"n=0, but should be an int >= 1"):
        w.next_indices(0)
    assert (w.cursor, w.write_count) == (0, 0)


def test_state_dict_round_trip_and_validation():
    w = RoundRobinWriter(3)
    w.next_indices(4)
    other = RoundRobinWriter(3)
    other.load_state_dict(w.state_dict())
    assert (other.cursor, other.write_count, other.generation.tolist()) == (1, 4, [3, 1, 2])
    assert w.state_dict() == {"write_count": 4}  # cursor and generations follow from it
    for bad in (-1, 2**62, 1.0, True, "4"):
        with pytest.raises(ValueError, match=r"write_count=.*, but should be an int in \[0, "):
            other.load_state_dict({"write_count": bad})
    assert other.write_count == 4
