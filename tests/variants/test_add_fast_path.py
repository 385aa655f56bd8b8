"""``ReplayBuffer.add`` (rbcheck.variants.add_fast) against the reference's ``extend``, bit for bit.

Each program of rows runs on three buffers: the reference (``extend`` of the one-row
TensorDict ``add`` is defined as), the variant's ``add`` with its fast path and without it.
After every row the slot and the whole state (rows, generations, counters, trees, max
priority) are the reference's; a refused row raises the reference's error and changes
nothing; the fast path is shown to be the one taken, and the comparison to be able to fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import add_fast, native
from tests.variants.test_differential import assert_state_equal

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load")


def row(i: int, priority, kind: str) -> dict:
    """obs float32[3], action int64, reward float64 (and a priority), as NumPy or torch values."""
    values = {"obs": np.array([i, i / 3, -i], dtype=np.float32), "action": np.int64(i % 5),
              "reward": np.float64(i / 7)}
    if priority is not None:
        values["priority"] = np.float64(priority)
    if kind == "torch":
        return {k: torch.from_numpy(np.asarray(v)) for k, v in values.items()}
    if kind == "mixed":
        return {k: torch.from_numpy(np.asarray(v)) if k == "obs" else v for k, v in values.items()}
    return values


def three(capacity: int, prioritized: bool, alpha=0.6, eps=1e-8):
    def sampler(mod):
        return mod.PrioritizedSampler(capacity, alpha, 0.4, eps) if prioritized else mod.RandomSampler()
    ref = reference.ReplayBuffer(capacity, sampler=sampler(reference), generator=3)
    return ref, *(variants.ReplayBuffer(capacity, sampler=sampler(variants), generator=3, device="cpu")
                  for _ in range(2))


def add_all(ref, fast, slow, values, monkeypatch=None):
    got = [int(ref.extend(TensorDict(add_fast.one_row(values), batch_size=[1]))[0]), fast.add(**values)]
    add_fast.ENABLED = False
    try:
        got.append(slow.add(values))
    finally:
        add_fast.ENABLED = True
    return got


def assert_same(ref, *buffers):
    for var in buffers:
        assert (len(var), var.cursor, var.write_count) == (len(ref), ref.cursor, ref.write_count)
        assert_state_equal(var.state_dict(), ref.state_dict())
        assert_state_equal(var.writer.generation, ref.writer.generation, "writer.generation")


@settings(max_examples=25, deadline=None)
@given(capacity=st.sampled_from([1, 3, 64, 70]), prioritized=st.booleans(), column=st.booleans(),
       program=st.lists(st.tuples(st.sampled_from(["numpy", "torch", "mixed"]),
                                  st.sampled_from([0.0, 1e-300, 0.5, 3.25, 1e6]) | st.floats(0, 50)),
                        min_size=1, max_size=90))
def test_add_is_the_references_extend_bit_for_bit(capacity, prioritized, column, program):
    """Rows with a priority column (or none: the max priority) into both kinds of buffer."""
    ref, fast, slow = three(capacity, prioritized)
    for i, (kind, priority) in enumerate(program):
        values = row(i, priority if column else None, kind)
        slots = add_all(ref, fast, slow, values)
        assert slots[1:] == [slots[0]] * 2
        assert_same(ref, fast, slow)
    if len(ref):
        for buf in (ref, fast, slow):
            buf.generator.manual_seed(11)
        want = ref.sample(5)[1]
        for buf in (fast, slow):
            got = buf.sample(5)[1]
            assert torch.equal(got["index"], want["index"])


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_the_fast_path_is_taken(prioritized, kind, monkeypatch):
    _, fast, _ = three(8, prioritized)
    fast.add(**row(0, 1.0 if prioritized else None, kind))  # the first write allocates (full path)
    taken = []
    real = add_fast.try_add
    monkeypatch.setattr(add_fast, "try_add", lambda *a: taken.append(real(*a)) or taken[-1])
    for i in range(1, 12):
        assert fast.add(**row(i, 0.5 if prioritized else None, kind)) == i % 8
    assert taken == [i % 8 for i in range(1, 12)]


BAD = {
    "a float64 obs": lambda v: {**v, "obs": v["obs"].astype(np.float64)},
    "an obs of 4": lambda v: {**v, "obs": np.zeros(4, np.float32)},
    "a batch dimension": lambda v: {**v, "obs": v["obs"][None]},
    "a missing column": lambda v: {k: x for k, x in v.items() if k != "reward"},
    "an extra column": lambda v: {**v, "other": np.float32(1)},
    "a strided obs": lambda v: {**v, "obs": np.zeros(6, np.float32)[::2]},
    "a NaN priority": lambda v: {**v, "priority": np.float64("nan")},
    "a negative priority": lambda v: {**v, "priority": np.float64(-1)},
    "an infinite priority": lambda v: {**v, "priority": np.float64("inf")},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_refused_rows_raise_the_references_error_and_change_nothing(case, monkeypatch):
    ref, fast, slow = three(8, True)
    for i in range(3):
        add_all(ref, fast, slow, row(i, 1.0 + i, "numpy"), monkeypatch)
    bad = BAD[case](row(3, 2.0, "numpy"))
    try:
        ref.extend(TensorDict(add_fast.one_row(bad), batch_size=[1]))
    except (ValueError, TypeError, RuntimeError) as error:
        want = (type(error), str(error))
    else:  # a strided value is a layout the reference takes: then add must take it too
        want = None
    for buf in (fast, slow):
        before = buf.state_dict()
        if want is None:
            buf.add(**bad)
            continue
        with pytest.raises(want[0]) as raised:
            buf.add(**bad)
        assert str(raised.value) == want[1]
        assert_state_equal(buf.state_dict(), before)
    if want is None:
        assert_same(ref, fast, slow)


def test_a_value_torch_cannot_read_is_named():
    buf = variants.ReplayBuffer(4, device="cpu")
    with pytest.raises(ValueError, match=r"^obs=str, but should be a tensor, array or number"):
        buf.add(obs="seven")
    with pytest.raises(TypeError, match="keyword columns only"):
        buf.add({"obs": np.zeros(2)}, reward=1.0)


def test_a_tensordict_row_is_the_references_add(monkeypatch):
    """The reference's ``add(row)`` (batch size ``[]``) keeps its contract and takes the fast path."""
    ref, fast, slow = three(8, True)
    taken = []
    real = add_fast.try_add
    monkeypatch.setattr(add_fast, "try_add", lambda *a: taken.append(real(*a)) or taken[-1])
    for i in range(12):
        one = TensorDict({k: torch.as_tensor(v) for k, v in row(i, 0.5 + i, "numpy").items()}, batch_size=[])
        assert fast.add(one) == ref.add(one.clone()) == i % 8
    assert taken[1:] == [i % 8 for i in range(1, 12)]  # the first write allocates: the full path
    assert_same(ref, fast)
    with pytest.raises(ValueError, match=r"row.batch_size=\[2\], but should be \[\]"):
        fast.add(TensorDict({"obs": torch.zeros(2, 3)}, batch_size=[2]))


def test_the_comparison_catches_a_fast_path_that_skips_the_generation(monkeypatch):
    ref, fast, slow = three(8, False)
    add_all(ref, fast, slow, row(0, None, "numpy"), monkeypatch)
    real = add_fast.try_add

    def broken(buffer, columns):
        before = buffer.writer.generation.clone()
        slot = real(buffer, columns)
        buffer.writer.generation.copy_(before)
        return slot

    monkeypatch.setattr(add_fast, "try_add", broken)
    add_all(ref, fast, slow, row(1, None, "numpy"), monkeypatch)
    with pytest.raises(AssertionError):
        assert_same(ref, fast)


def test_the_row_memory_moved_in_place_is_rebound(monkeypatch):
    ref, fast, slow = three(8, True)
    for i in range(2):
        add_all(ref, fast, slow, row(i, 1.0, "numpy"), monkeypatch)
    fast.storage._cols[0][1].share_memory_()  # torch moves the rows' memory in place
    for i in range(2, 11):
        add_all(ref, fast, slow, row(i, 0.25 * i, "torch"), monkeypatch)
    assert_same(ref, fast, slow)
