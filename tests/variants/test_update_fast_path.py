"""``update_priority``'s fast path (rbcheck.variants.update_fast) against the reference, bit for bit.

Each program of updates runs on three buffers: the reference, the variant with the
fast path and the variant without it. After every update the whole state (rows,
trees, max priority) is the reference's, bit for bit, and the next sample too; a
refused update raises the reference's error and changes nothing. The fast path is
checked to be the one taken, to bind again when a tree is replaced or moved, and the
comparison to be able to fail.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbcheck.variants import native, update_fast
from tests.variants.test_extend_fast_path import assert_same, flat_rows, three

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load: "
                                "the fast path needs it")


def filled(capacity: int, rows: int, monkeypatch):
    """(reference, fast, slow) prioritized buffers with ``rows`` rows written alike."""
    ref, fast, slow = three(capacity, "prioritized")
    data = flat_rows(rows, 0, priority=[0.5 + (i % 7) for i in range(rows)])
    for buf in (ref, fast, slow):
        buf.extend(data.clone())
    return ref, fast, slow


def update_all(ref, fast, slow, index, priority, monkeypatch):
    """The same update on the three (``slow`` with the fast path off): the error each raised, or None."""
    out = []
    for buf, enabled in ((ref, True), (fast, True), (slow, False)):
        with monkeypatch.context() as m:
            m.setattr(update_fast, "ENABLED", enabled)
            try:
                buf.update_priority(index.clone(), priority.clone())
                out.append(None)
            except (ValueError, IndexError, TypeError, RuntimeError) as err:
                out.append((type(err), str(err)))
    return out


def assert_trees(fast, slow) -> None:
    """Both trees, every node as a reader sees it (``nodes``: the shadow levels recomputed
    when an update marked them stale), as the path without the fast one left them (the
    state holds the leaves only; the min tree feeds the weights)."""
    for name in ("sum_tree", "min_tree"):
        got, want = getattr(fast.sampler, name), getattr(slow.sampler, name)
        assert torch.equal(got.nodes, want.nodes), name


def taken(monkeypatch) -> list:
    """Each ``try_update`` result, as the buffers call it."""
    results, real = [], update_fast.try_update

    def spy(*args):
        results.append(real(*args))
        return results[-1]

    monkeypatch.setattr("rbcheck.variants.prioritized.try_update", spy)
    return results


updates = st.lists(st.tuples(st.lists(st.integers(-2, 70), min_size=1, max_size=12),
                             st.sampled_from([torch.float32, torch.float64]),
                             st.lists(st.sampled_from([0.0, 1e-300, 0.5, 3.25, 1e6, -1.0, float("nan"),
                                                       float("inf")]) | st.floats(0, 50),
                                      min_size=12, max_size=12)),
                   min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(rows=st.sampled_from([40, 64, 90]), program=updates)
def test_updates_match_the_reference(rows, program):
    """Programs of updates (repeated and out-of-range slots, bad priorities) on a buffer
    partly and wholly written: the reference's state and errors after every update. 64
    slots: trees deep enough to have shadow levels, which the update leaves stale."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        results = taken(monkeypatch)
        ref, fast, slow = filled(64, rows, monkeypatch)
        assert fast.sampler.sum_tree.has_shadow
        for index, dtype, values in program:
            index = torch.tensor(index, dtype=torch.long)
            priority = torch.tensor(values[:len(index)], dtype=dtype)
            errors = update_all(ref, fast, slow, index, priority, monkeypatch)
            assert errors[1] == errors[0] and errors[2] == errors[0]
            assert_same(ref, fast, slow)
            assert_trees(fast, slow)
        assert all(r in (True, False, None) for r in results)
        want = ref.sample(16)[1]
        for buf in (fast, slow):
            got = buf.sample(16)[1]
            assert torch.equal(got["index"], want["index"]) and torch.equal(got["weight"], want["weight"])


def test_the_fast_path_is_taken_and_binds_again_when_the_trees_change(monkeypatch):
    results = taken(monkeypatch)
    ref, fast, slow = filled(64, 64, monkeypatch)
    index, priority = torch.tensor([3, 9, 9, 60]), torch.tensor([0.25, 4.0, 2.0, 7.5], dtype=torch.float64)
    update_all(ref, fast, slow, index, priority, monkeypatch)
    assert results.count(True) == 1
    plan = fast.sampler._update_plan
    fast.sampler.sum_tree._nodes.share_memory_()  # moved in place: the same tensor, another address
    ref.load_state_dict(ref.state_dict())
    update_all(ref, fast, slow, index + 1, priority * 3, monkeypatch)
    assert fast.sampler._update_plan is not plan and results.count(True) == 2  # fast's, never slow's
    assert_same(ref, fast, slow)
    plan = fast.sampler._update_plan
    fast.load_state_dict(fast.state_dict())  # new trees: another object
    update_all(ref, fast, slow, index + 2, priority / 3, monkeypatch)
    assert fast.sampler._update_plan is not plan
    assert_same(ref, fast, slow)
    assert_trees(fast, slow)


def test_a_copy_of_the_sampler_binds_its_own_trees(monkeypatch):
    ref, fast, slow = filled(64, 64, monkeypatch)
    index, priority = torch.tensor([5, 6]), torch.tensor([9.0, 0.5], dtype=torch.float64)
    fast.update_priority(index, priority)
    twin = copy.deepcopy(fast)
    assert twin.sampler.__dict__.get("_update_plan") is None
    before = fast.sampler.sum_tree.raw_nodes.clone()
    twin.update_priority(index, priority * 2)
    assert torch.equal(fast.sampler.sum_tree.raw_nodes, before)
    assert twin.sampler._update_plan.sum is twin.sampler.sum_tree._nodes


def test_the_comparison_catches_a_fast_path_that_skips_the_min_tree(monkeypatch):
    ref, fast, slow = filled(64, 64, monkeypatch)
    real = update_fast.try_update

    def broken(sampler, index, priority):
        saved = sampler.min_tree.raw_nodes.clone()
        done = real(sampler, index, priority)
        sampler.min_tree.raw_nodes.copy_(saved)  # the min tree left as it was
        return done

    monkeypatch.setattr("rbcheck.variants.prioritized.try_update", broken)
    update_all(ref, fast, slow, torch.tensor([1, 2]), torch.tensor([1e-3, 1e-4], dtype=torch.float64),
               monkeypatch)
    assert_same(ref, fast, slow)  # the leaves: the sum tree's
    with pytest.raises(AssertionError, match="min_tree"):
        assert_trees(fast, slow)


def test_a_new_alpha_or_eps_binds_again(monkeypatch):
    """``alpha`` and ``eps`` set on a sampler after its plan was bound: the next update uses
    them (the reference's bits), through a new plan."""
    ref, fast, slow = filled(64, 64, monkeypatch)
    index, priority = torch.tensor([7, 8, 40]), torch.tensor([0.5, 2.0, 9.0], dtype=torch.float64)
    update_all(ref, fast, slow, index, priority, monkeypatch)
    for name, value in (("alpha", 0.7), ("eps", 1e-3)):
        plan = fast.sampler._update_plan
        for buf in (ref, fast, slow):
            setattr(buf.sampler, name, value)
        update_all(ref, fast, slow, index, priority * 3, monkeypatch)
        assert fast.sampler._update_plan is not plan and getattr(fast.sampler._update_plan, name) == value
        assert_same(ref, fast, slow)
        assert_trees(fast, slow)


def test_the_comparison_catches_a_fast_path_that_leaves_no_stale_mark(monkeypatch):
    """The update leaves the shadow levels stale; a fast path that does not say so hands
    readers of ``nodes`` wrong inner nodes, and the comparison sees it."""
    ref, fast, slow = filled(64, 64, monkeypatch)
    real = update_fast.try_update

    def unmarked(sampler, index, priority):
        done = real(sampler, index, priority)
        sampler.sum_tree._stale = False
        return done

    monkeypatch.setattr("rbcheck.variants.prioritized.try_update", unmarked)
    update_all(ref, fast, slow, torch.tensor([1, 2, 3]), torch.tensor([5.0, 1e-3, 7.0], dtype=torch.float64),
               monkeypatch)
    with pytest.raises(AssertionError, match="sum_tree"):
        assert_trees(fast, slow)
