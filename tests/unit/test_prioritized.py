"""PrioritizedSampler through the buffer (exact): (p + eps) ** alpha exactly once on
every write path, max priority, hand-computed weights, stale updates, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import PrioritizedSampler, ReplayBuffer


def rows(n, start=0, priority=None):
    td = TensorDict({"x": torch.arange(start, start + n)}, batch_size=[n])
    if priority is not None:
        td["priority"] = torch.as_tensor(priority, dtype=torch.float64)
    return td


def make(capacity=4, alpha=0.5, beta=0.4, eps=0.0, seed=0):
    return ReplayBuffer(capacity, sampler=PrioritizedSampler(capacity, alpha, beta, eps), generator=seed)


def stored(rb, *index):
    return rb.sampler.sum_tree.leaf(torch.tensor(index)).tolist()


def test_priority_transformed_exactly_once_on_each_path():
    # alpha = 0.5, eps = 0: a raw 4 is stored as 2, a raw 9 as 3. Twice would give sqrt(2), sqrt(3).
    rb = make()
    rb.extend(rows(1))  # 1) no priority: max priority (1.0) -> 1.0
    assert stored(rb, 0) == [1.0]
    rb.update_priority(torch.tensor([0]), torch.tensor([9.0]))  # 2) update
    assert stored(rb, 0) == [3.0]
    rb.add(rows(1, 1)[0])  # new row without priority: raw max 9 -> 3 (not max of stored values)
    assert stored(rb, 1) == [3.0]
    assert rb.sampler.max_priority == 9.0 and type(rb.sampler.max_priority) is float
    assert rb.sampler.min_tree.min() == 3.0 and rb.sampler.sum_tree.total() == 6.0

    keyed = make()
    keyed.extend(rows(2, priority=[4.0, 16.0]))  # 3) priority key in the data
    assert stored(keyed, 0, 1) == [2.0, 4.0]
    assert keyed.sampler.max_priority == 16.0
    assert keyed.storage.data["priority"][:2].tolist() == [4.0, 16.0]  # stored like any key
    keyed.update_priority(torch.tensor([0]), torch.tensor([25.0]))
    assert stored(keyed, 0, 1) == [5.0, 4.0] and keyed.sampler.sum_tree.total() == 9.0


def test_eps_added_once_in_float64():
    rb = make(alpha=0.7, eps=1e-3)
    rb.extend(rows(2, priority=[0.25, 3.0]))
    rb.update_priority(torch.tensor([1]), torch.tensor([7.0], dtype=torch.float32))
    expected = (torch.tensor([0.25, 7.0], dtype=torch.float64) + 1e-3) ** 0.7
    assert stored(rb, 0, 1) == expected.tolist()


def test_max_priority_is_over_the_buffers_life():
    rb = make(capacity=2)
    rb.extend(rows(2, priority=[5.0, 0.5]))
    rb.extend(rows(2, 2, priority=[0.1, 0.1]))  # the row with 5.0 is gone, max stays
    assert rb.sampler.max_priority == 5.0
    rb.priority_key = None  # the next row's priority column is not used: it gets the max
    rb.add(rows(1, 4, priority=[0.2])[0])
    assert stored(rb, 0) == [math.sqrt(5.0)]


def test_weights_hand_computed_four_items():
    # alpha = 1, eps = 0, raw [1, 2, 3, 4]: P = [.1, .2, .3, .4], N = 4, beta = 0.5
    # w_i = (N P_i)^-beta / (N P_min)^-beta = (P_i / 0.1)^-0.5 = [1, 1/sqrt2, 1/sqrt3, 1/2].
    rb = make(alpha=1.0, beta=0.5)
    rb.extend(rows(4, priority=[1.0, 2.0, 3.0, 4.0]))
    table = torch.tensor([1.0, 0.70710678, 0.57735027, 0.5])
    saw_other_than_0 = False
    for _ in range(20):  # batches of one: normalising by the batch would always give 1
        _, info = rb.sample(1)
        assert info["weight"].dtype == torch.float32
        torch.testing.assert_close(info["weight"], table[info["index"]], rtol=0, atol=1e-7)
        saw_other_than_0 |= bool(info["index"][0] != 0)
    assert saw_other_than_0


def test_weights_hand_computed_three_items_beta_one():
    # alpha = 1, raw [1, 1, 2]: P = [.25, .25, .5], N = 3, beta = 1 -> w = P_min / P = [1, 1, .5]
    rb = make(capacity=3, alpha=1.0, beta=1.0)
    rb.extend(rows(3, priority=[1.0, 1.0, 2.0]))
    _, info = rb.sample(50)
    assert torch.equal(info["weight"], torch.tensor([1.0, 1.0, 0.5])[info["index"]])
    assert set(info["index"].tolist()) == {0, 1, 2}


def test_indices_from_uniforms_and_shared_randomness():
    rb = make(alpha=1.0)
    rb.extend(rows(4, priority=[1.0, 2.0, 3.0, 4.0]))  # intervals [0,1) [1,3) [3,6) [6,10)
    u = torch.tensor([0.05, 0.1, 0.35, 0.6, 0.95], dtype=torch.float64)
    assert rb.indices_from_uniforms(u).tolist() == [0, 1, 2, 3, 3]
    twin = torch.Generator().manual_seed(0)
    _, info = rb.sample(16)
    u = torch.rand(16, generator=twin, dtype=torch.float64)
    assert torch.equal(info["index"], rb.indices_from_uniforms(u))


def test_zero_priority_is_never_sampled_and_left_out_of_weights():
    rb = make(capacity=3, alpha=1.0, beta=1.0)
    rb.extend(rows(3, priority=[0.0, 1.0, 3.0]))
    _, info = rb.sample(500)
    assert 0 not in info["index"].tolist()
    assert torch.equal(info["weight"], torch.tensor([0.0, 1.0, 1 / 3])[info["index"]].float())


def test_stale_update_is_ignored():
    rb = make(capacity=2)
    rb.extend(rows(2))
    _, info = rb.sample(8)
    index = torch.tensor([0, 1])
    generation = rb.writer.generation[index].clone()  # [0, 1]
    rb.add(rows(1, 2)[0])  # overwrites slot 0: its generation becomes 2
    assert info["generation"].tolist() == [[0, 1][i] for i in info["index"].tolist()]
    rb.update_priority(index, torch.tensor([100.0, 16.0]), generation=generation)
    assert stored(rb, 0, 1) == [1.0, 4.0]  # slot 0 keeps the priority of its new row
    assert rb.sampler.max_priority == 16.0  # the ignored 100 was never seen
    rb.update_priority(torch.tensor([0]), torch.tensor([25.0]), generation=torch.tensor([2]))
    assert stored(rb, 0) == [5.0]


@pytest.mark.parametrize(
    "index, priority, generation, message",
    [
        ([0], [float("nan")], None, r"priority=\[nan\], but should be finite and >= 0"),
        ([0], [float("inf")], None, r"priority=\[inf\], but should be finite and >= 0"),
        ([0], [-1.0], None, r"priority=\[-1.0\], but should be finite and >= 0"),
        ([0, 1], [1.0], None, r"priority.shape=\(1,\), but should be \(2,\)"),
        ([4], [1.0], None, r"index=\[4\], but should be in \[0, 4\)"),
        ([3], [1.0], None, r"index=\[3\], but should be slots already written"),
        ([0], [1.0], [0, 0], r"generation.shape=\(2,\), but should be \(1,\)"),
    ],
)
def test_bad_update_rejected_and_buffer_unchanged(index, priority, generation, message):
    rb = make()
    rb.extend(rows(3, priority=[1.0, 2.0, 3.0]))
    before = (rb.sampler.sum_tree.nodes.clone(), rb.sampler.min_tree.nodes.clone(), rb.sampler.max_priority)
    gen = None if generation is None else torch.tensor(generation)
    with pytest.raises(ValueError, match=message):
        rb.update_priority(torch.tensor(index), torch.tensor(priority), generation=gen)
    assert torch.equal(rb.sampler.sum_tree.nodes, before[0])
    assert torch.equal(rb.sampler.min_tree.nodes, before[1]) and rb.sampler.max_priority == before[2]


def test_bad_priority_key_on_extend_leaves_buffer_unchanged():
    rb = make()
    rb.extend(rows(2, priority=[1.0, 2.0]))
    nodes, data = rb.sampler.sum_tree.nodes.clone(), rb.storage.data.clone()
    with pytest.raises(ValueError, match=r"priority=\[-3.0\], but should be finite and >= 0"):
        rb.extend(rows(2, 2, priority=[1.0, -3.0]))
    assert (len(rb), rb.cursor, rb.write_count) == (2, 2, 2)
    assert torch.equal(rb.sampler.sum_tree.nodes, nodes) and (rb.storage.data == data).all()


def test_constructor_checks():
    with pytest.raises(ValueError, match=r"alpha=-1, but should be a finite number >= 0"):
        PrioritizedSampler(4, -1, 0.4)
    with pytest.raises(ValueError, match=r"sampler.capacity=8, but should be 4"):
        ReplayBuffer(4, sampler=PrioritizedSampler(8, 0.6, 0.4))
    with pytest.raises(ValueError, match=r"len\(buffer\)=0, but should be >= 1"):
        make().sample(2)


OVERFLOW_MESSAGE = (r"priority=\[1e\+200\], but should be at most about 1\.34e\+154 "
                    r"\(its transform \(p \+ eps\) \*\* alpha overflows float64")
OVERFLOW_CALLS = {
    "update_priority": lambda rb: rb.update_priority(torch.tensor([0, 1]), torch.tensor([2.0, 1e200],
                                                                                        dtype=torch.float64)),
    "update_priority_stale_entry": lambda rb: rb.update_priority(
        torch.tensor([0, 1]), torch.tensor([1e200, 2.0], dtype=torch.float64), generation=torch.tensor([-5, -5])),
    "extend": lambda rb: rb.extend(rows(2, 3, priority=[1.0, 1e200])),
    "add": lambda rb: rb.add(rows(1, 3, priority=[1e200])[0]),
    "sampler_on_write": lambda rb: rb.sampler.on_write(torch.tensor([3]), torch.tensor([1e200], dtype=torch.float64)),
}


@pytest.mark.parametrize("path", list(OVERFLOW_CALLS))
def test_priority_whose_transform_overflows_is_refused_and_nothing_changes(path):
    """exact: (1e200 + eps) ** 2 is inf in float64: such a priority is bad input on
    every path (update, a stale update entry, extend / add with the priority
    column, the sampler's on_write), refused with a message naming the bound,
    and the whole state is unchanged (it used to be stored as inf: NaN weights,
    and a checkpoint that loads refused)."""
    from .test_buffer import same

    rb = make(capacity=4, alpha=2.0, eps=1e-3)
    rb.extend(rows(3, priority=[1.0, 2.0, 3.0]))
    before = rb.state_dict()
    with pytest.raises(ValueError, match=OVERFLOW_MESSAGE):
        OVERFLOW_CALLS[path](rb)
    assert same(rb.state_dict(), before), f"{path}: the state changed on a refused call"


def test_priority_just_below_the_overflow_is_taken_and_round_trips(tmp_path):
    """exact: 1e154 with alpha = 2 is stored as (1e154 + eps) ** 2, finite; the
    weights are finite and a checkpoint holding it loads."""
    rb = make(capacity=4, alpha=2.0, eps=1e-3)
    rb.extend(rows(3, priority=[1.0, 2.0, 3.0]))
    rb.update_priority(torch.tensor([1]), torch.tensor([1e154], dtype=torch.float64))
    assert stored(rb, 1) == [(1e154 + 1e-3) ** 2] and math.isfinite(stored(rb, 1)[0])
    _, info = rb.sample(64)
    assert bool(torch.isfinite(info["weight"]).all())
    rb.dumps(tmp_path / "ckpt")
    again = make(capacity=4, alpha=2.0, eps=1e-3, seed=1)
    again.loads(tmp_path / "ckpt")
    assert stored(again, 0, 1, 2) == stored(rb, 0, 1, 2) and again.sampler.max_priority == 1e154


def test_checkpoint_whose_max_priority_transform_overflows_is_refused():
    """exact: a state whose max priority a new row could not take (its
    transform overflows under the state's alpha and eps) is refused, nothing
    changed."""
    rb = make(capacity=4, alpha=2.0, eps=1e-3)
    rb.extend(rows(2))
    state = rb.state_dict()
    state["sampler"] = {**state["sampler"], "max_priority": 1e200}
    before = (rb.sampler.max_priority, rb.sampler.sum_tree.nodes.clone())
    with pytest.raises(ValueError, match=r"max_priority=\[1e\+200\], but should be at most about"):
        rb.load_state_dict(state)
    assert (rb.sampler.max_priority, rb.sampler.sum_tree.nodes.tolist()) == (before[0], before[1].tolist())
