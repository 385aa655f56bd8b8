"""SliceSampler through the buffer (exact): hand-enumerated slice sets, including an
episode that wraps the ring's end; done flags; strict_length; argument checks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import ReplayBuffer, SliceSampler


def episodes(ids, done=None):
    ids = torch.tensor(ids)
    td = TensorDict({"episode": ids, "x": torch.arange(len(ids))}, batch_size=[len(ids)])
    if done is not None:
        td["done"] = torch.tensor(done, dtype=torch.bool)[:, None]
    return td


def slices_seen(rb, batch_size, slice_len, draws=60):
    """The set of slices (tuples of slots) seen over ``draws`` samples."""
    seen = set()
    for _ in range(draws):
        _, info = rb.sample(batch_size)
        index = info["index"].tolist()
        seen |= {tuple(index[i: i + slice_len]) for i in range(0, len(index), slice_len)}
    return seen


def test_slices_stay_inside_one_episode():
    # episodes 0: slots 0-2, 1: slots 3-4, 2: slots 5-8; slice_len 3 strict ->
    # episode 1 is too short, episode 0 has one start, episode 2 two.
    rb = ReplayBuffer(10, sampler=SliceSampler(slice_len=3), generator=0)
    rb.extend(episodes([0, 0, 0, 1, 1, 2, 2, 2, 2]))
    assert slices_seen(rb, 6, 3) == {(0, 1, 2), (5, 6, 7), (6, 7, 8)}
    rows, info = rb.sample(6)
    assert torch.equal(rows["x"], info["index"])  # the rows are the slots' rows


def test_episode_wrapping_the_ring_end():
    # capacity 8, 10 rows: slot s holds row s (s >= 2) or row s + 8 (s < 2).
    # Write order from the cursor (2): slots 2..7, 0, 1 = episodes [0, 1, 1, 2, 2, 2, 2, 3].
    rb = ReplayBuffer(8, sampler=SliceSampler(slice_len=3), generator=0)
    rb.extend(episodes([0, 0, 0, 1, 1, 2, 2, 2, 2, 3]))
    assert rb.cursor == 2
    assert slices_seen(rb, 3, 3) == {(5, 6, 7), (6, 7, 0)}
    rows, _ = rb.sample(30)
    assert (rows["episode"] == 2).all()


def test_same_id_not_adjacent_is_two_trajectories():
    rb = ReplayBuffer(6, sampler=SliceSampler(slice_len=2), generator=0)
    rb.extend(episodes([5, 5, 6, 5, 5]))
    assert slices_seen(rb, 2, 2) == {(0, 1), (3, 4)}


def test_done_flags_end_trajectories():
    rb = ReplayBuffer(8, sampler=SliceSampler(slice_len=2, done_key="done"), generator=0)
    # one episode id, but done at slots 1 and 4 -> trajectories 0-1, 2-4, 5-6
    rb.extend(episodes([0] * 7, done=[0, 1, 0, 0, 1, 0, 0]))
    assert slices_seen(rb, 4, 2) == {(0, 1), (2, 3), (3, 4), (5, 6)}


def test_num_slices_sets_the_slice_length_and_traj_info():
    rb = ReplayBuffer(10, sampler=SliceSampler(num_slices=2), generator=0)
    rb.extend(episodes([0, 0, 0, 0, 1, 1, 1, 1]))
    _, info = rb.sample(8)  # 2 slices of 4: each a whole episode
    assert sorted(info["index"].tolist()[:4]) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert info["traj"].tolist() == [info["traj"][0].item()] * 4 + [info["traj"][4].item()] * 4
    assert set(info["traj"].tolist()) <= {0, 1}


def test_strict_length_false_gives_short_slices():
    rb = ReplayBuffer(10, sampler=SliceSampler(slice_len=3, strict_length=False), generator=0)
    rb.extend(episodes([0, 1, 1, 1]))
    lengths = set()
    for _ in range(40):
        _, info = rb.sample(3)
        index = info["index"].tolist()
        assert index in ([0], [1, 2, 3])
        lengths.add(len(index))
    assert lengths == {1, 3}


def test_both_trajectories_get_picked_about_equally():
    # Trajectories are picked uniformly, whatever their length (1000 draws: 500 +- 5 sigma).
    rb = ReplayBuffer(12, sampler=SliceSampler(slice_len=2), generator=1)
    rb.extend(episodes([0, 0, 1, 1, 1, 1, 1, 1, 1, 1]))
    _, info = rb.sample(2000)
    first = (info["traj"][::2] == 0).sum().item()
    assert abs(first - 500) < 5 * (1000 * 0.25) ** 0.5


def test_errors():
    with pytest.raises(ValueError, match="but should be exactly one set"):
        SliceSampler()
    with pytest.raises(ValueError, match="but should be exactly one set"):
        SliceSampler(num_slices=2, slice_len=3)
    with pytest.raises(ValueError, match=r"slice_len=0, but should be an int >= 1"):
        SliceSampler(slice_len=0)
    rb = ReplayBuffer(10, sampler=SliceSampler(slice_len=4), generator=0)
    rb.extend(episodes([0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"batch_size=6, but should be a multiple of slice_len=4"):
        rb.sample(6)
    with pytest.raises(ValueError, match=r"slice_len=4: 0, but should be >= 1 \(longest is 3"):
        rb.sample(4)
    other = ReplayBuffer(4, sampler=SliceSampler(slice_len=1, episode_key="traj_id"))
    other.extend(episodes([0, 1]))
    with pytest.raises(ValueError, match="key='traj_id', but should be a key of the stored data"):
        other.sample(1)
