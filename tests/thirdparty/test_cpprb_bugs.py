"""Executed repros of the cpprb 11.0.0 bugs in docs/findings.md.

Each test states what the spec asks and is a strict xfail with the bug as
its reason (``raises=AssertionError``: only the stated assertion may fail):
while the bug is there it reports "xfailed"; once cpprb fixes it the test
XPASSes, which fails the run, and the finding must be updated. Skipped
(with the reason) where cpprb is not installed: ``nox -s thirdparty``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

cpprb = pytest.importorskip("cpprb", reason="cpprb is not installed (nox -s thirdparty installs it)")

VERSION = "cpprb 11.0.0"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def refuses(call) -> bool:
    """Whether ``call()`` raises (any exception is a refusal)."""
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


def per(capacity=8, **kwargs):
    return cpprb.PrioritizedReplayBuffer(capacity, {"x": {"shape": 1}}, **kwargs)


@bug("update_priorities writes outside its segment tree for an index >= capacity "
     "(SegmentTree.hh:138-151, no bound check): index 10**6 kills the process")
def test_out_of_range_index_is_refused_without_crashing():
    code = textwrap.dedent(
        """
        import numpy as np, cpprb
        rb = cpprb.PrioritizedReplayBuffer(8, {"x": {"shape": 1}})
        rb.add(x=np.arange(5))
        try:
            rb.update_priorities(np.array([0, 10**6]), np.array([1.0, 2.0]))
        except Exception:
            print("refused")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "refused" in proc.stdout, f"exit {proc.returncode}: {proc.stdout!r}"


@bug("an index == capacity is accepted and corrupts the tree: the next weights are ~1e-22 "
     "(SegmentTree.hh:138, access_index has no bound check)")
def test_index_at_capacity_is_refused():
    code = textwrap.dedent(
        """
        import numpy as np, cpprb
        rb = cpprb.PrioritizedReplayBuffer(8, {"x": {"shape": 1}}, alpha=0.7, eps=1e-3)
        rb.add(x=np.arange(5))
        try:
            rb.update_priorities(np.array([0, 8]), np.array([1.0, 2.0]))
        except Exception:
            print("refused")
        else:
            print("weights", rb.sample(4, beta=0.5)["weights"].min())
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused" in proc.stdout, f"exit {proc.returncode}: {proc.stdout.strip()!r}"


@bug("with eps=0 and a zero priority held, every importance weight is 0: the min tree's 0 "
     "makes (p_min * N) ** -beta infinite (ReplayBuffer.hh:340-341)")
def test_weights_ignore_zero_priority_slots():
    rb = per(4, alpha=1.0, eps=0.0)
    rb.add(x=np.arange(4))
    rb.update_priorities(np.arange(4), np.array([0.0, 1.0, 2.0, 3.0]))
    out = rb.sample(64, beta=0.5)
    probs = np.array([0.0, 1.0, 2.0, 3.0]) / 6.0
    idx = out["indexes"].astype(np.int64)
    want = (4 * probs[idx]) ** -0.5 / (4 * probs[1]) ** -0.5  # min over the positive slots
    assert np.allclose(out["weights"], want, rtol=1e-5), out["weights"][:4]


@bug("NaN, infinite and negative priorities are accepted (update_priorities, pyx:1749; "
     "CppPrioritizedSampler::update_priorities, ReplayBuffer.hh:457): a NaN makes every weight NaN")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.5])
def test_bad_priority_is_refused(bad):
    rb = per(alpha=0.7, eps=1e-3)
    rb.add(x=np.arange(5))
    assert refuses(lambda: rb.update_priorities(np.array([0, 1]), np.array([1.0, bad])))


@bug("sample on an empty PrioritizedReplayBuffer returns never-written slots with NaN weights "
     "(sample_proportional over a zero total, ReplayBuffer.hh:314-331)")
def test_sample_of_empty_prioritized_buffer_is_refused():
    rb = per()
    assert refuses(lambda: rb.sample(4))


@bug("with every priority 0 (eps=0), sample returns slots with NaN weights instead of refusing")
def test_sample_with_zero_total_priority_is_refused():
    rb = per(eps=0.0)
    rb.add(x=np.arange(5))
    rb.update_priorities(np.arange(5), np.zeros(5))
    assert refuses(lambda: rb.sample(4))


@bug("capacity 0 is accepted (ReplayBuffer.__cinit__, pyx:961-969)")
def test_capacity_zero_is_refused():
    assert refuses(lambda: cpprb.ReplayBuffer(0, {"x": {"shape": 1}}))


@bug("alpha < 0 and eps < 0 are accepted (PrioritizedReplayBuffer.__cinit__, pyx:1577-1581)")
def test_negative_alpha_is_refused():
    assert refuses(lambda: per(alpha=-0.5, eps=-1e-3))


@bug("an add that misses a field raises KeyError after the ring index moved "
     "(fetch_add at pyx:1152, then the write loop at pyx:1173): the failed rows count as stored")
def test_failed_add_leaves_the_buffer_unchanged():
    rb = cpprb.ReplayBuffer(8, {"x": {"shape": 1}, "y": {"shape": 1}})
    rb.add(x=np.arange(5), y=np.arange(5))
    with pytest.raises(KeyError):
        rb.add(y=np.arange(2))
    assert rb.get_stored_size() == 5


@bug("fields the buffer does not have are dropped without a word (the write loop only "
     "visits its own fields, pyx:1173)")
def test_unknown_field_is_refused():
    rb = cpprb.ReplayBuffer(8, {"x": {"shape": 1}})
    rb.add(x=np.arange(5))
    assert refuses(lambda: rb.add(x=np.arange(2), z=np.arange(2)))


@bug("sample(0) returns an empty batch instead of refusing (np.random.randint(0, n, 0), pyx:1392)")
def test_batch_size_zero_is_refused():
    rb = cpprb.ReplayBuffer(8, {"x": {"shape": 1}})
    rb.add(x=np.arange(5))
    assert refuses(lambda: rb.sample(0))


@bug("an add whose batch wraps the ring end gives the wrapped rows the priorities of the "
     "batch's FIRST rows: SegmentTree::set(i, f, N, max) hands the stateful priority generator "
     "f to std::generate_n by value, so the copy for the second segment starts over "
     "(SegmentTree.hh, the wrap loop of set; found by bench/peers.py, issue 22)")
def test_batch_that_wraps_the_ring_keeps_each_rows_priority():
    rb = per(8, alpha=1.0, eps=0.0)
    rb.add(x=np.arange(6.0), priorities=np.arange(1.0, 7.0))  # slots 0..5
    rb.add(x=np.arange(6.0, 10.0), priorities=np.array([10.0, 20.0, 30.0, 40.0]))  # 6, 7, then 0, 1
    # slots 0..7 now hold x = 8, 9, 2, 3, 4, 5, 6, 7 with priorities 30, 40, 3, 4, 5, 6, 10, 20
    want = np.array([30.0, 40.0, 3.0, 4.0, 5.0, 6.0, 10.0, 20.0])
    out = rb.sample(4096, beta=1.0)
    # weight = (p / p_min) ** -beta with beta = 1: p = p_min / weight, p_min = 3
    got = {int(i): 3.0 / float(w) for i, w in zip(out["indexes"], out["weights"], strict=True)}
    assert {i: round(p, 3) for i, p in sorted(got.items())} == {i: want[i] for i in sorted(got)}


@bug("PrioritizedReplayBuffer.sample returns 'weights' and 'indexes' as views of the buffer's own "
     "vectors (PyReplayBuffer.pyx:1736-1742, self.weights.as_numpy(), self.indexes.as_numpy()): the "
     "next sample rewrites them, and a larger one reallocates them, leaving freed memory behind")
def test_sample_is_not_rewritten_by_the_next_sample():
    rb = per(4, alpha=0.6, eps=1e-4)
    rb.add(x=np.arange(4))
    first = rb.sample(3, beta=0.4)
    weights, indexes = first["weights"].copy(), first["indexes"].copy()
    rb.update_priorities(np.array([0]), np.array([100.0]))
    rb.sample(3, beta=0.4)  # same size: rewritten in place (a larger one would free the memory)
    assert np.array_equal(first["weights"], weights) and np.array_equal(first["indexes"], indexes), (
        f"first sample after a second one: weights {first['weights'].tolist()}, indexes "
        f"{first['indexes'].tolist()}, but should be {weights.tolist()}, {indexes.tolist()}")


@bug("add of a batch that wraps the ring more than once raises IndexError after moving the ring "
     "(PyReplayBuffer.pyx:1174: the slots past the end are shifted back by one capacity only)")
def test_batch_larger_than_the_ring_is_stored_from_any_cursor():
    rb = cpprb.ReplayBuffer(3, {"x": {"shape": 1}})
    rb.add(x=np.arange(2))
    try:
        rb.add(x=np.arange(10, 15))
    except IndexError as err:
        raise AssertionError(f"add of 5 rows at cursor 2 of a ring of 3 raised IndexError: {err}, but should "
                             f"keep the last 3 rows (the ring moved to {rb.get_next_index()} anyway)") from err
    assert sorted(rb.get_all_transitions()["x"].ravel().tolist()) == [12, 13, 14]
