"""ReplayBuffer (exact): eviction order, extend/add, random sampling from the generator,
info, bad input leaves the buffer unchanged, state_dict round trip."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import PrioritizedSampler, RandomSampler, ReplayBuffer, TensorStorage


def rows(n, start=0):
    x = torch.arange(start, start + n)
    return TensorDict({"x": x, "next": {"x": x + 1}}, batch_size=[n])


def same(a, b) -> bool:
    """Deep, bit-exact equality of nested state dicts (tensors: dtype, shape, values)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def test_eviction_order_oldest_first():
    rb = ReplayBuffer(3)
    assert [rb.add(rows(1, i)[0]) for i in range(5)] == [0, 1, 2, 0, 1]
    assert rb.storage.data["x"].tolist() == [3, 4, 2]  # rows 0 and 1 evicted, in that order
    assert (len(rb), rb.cursor, rb.write_count, rb.capacity) == (3, 2, 5, 3)
    assert rb.writer.generation.tolist() == [3, 4, 2]


def test_extend_returns_slots_and_wraps():
    rb = ReplayBuffer(3)
    assert rb.extend(rows(2)).tolist() == [0, 1] and len(rb) == 2
    assert rb.extend(rows(7, 2)).tolist() == [2, 0, 1, 2, 0, 1, 2]  # rows 2..8
    assert rb.storage.data["x"].tolist() == [6, 7, 8] and rb.storage.data["next", "x"].tolist() == [7, 8, 9]
    assert (rb.cursor, rb.write_count) == (0, 9)


def test_random_sample_consumes_float64_uniforms_from_the_generator():
    rb = ReplayBuffer(8, batch_size=16, generator=7)
    rb.extend(rows(5, 100))
    sample, info = rb.sample()
    twin = torch.Generator().manual_seed(7)
    u = torch.rand(16, generator=twin, dtype=torch.float64)
    assert torch.equal(info["index"], torch.floor(u * 5).long())
    assert torch.equal(sample["x"], info["index"] + 100) and sample.batch_size == (16,)
    assert torch.equal(info["generation"], info["index"])
    assert rb.indices_from_uniforms(torch.tensor([0.0, 0.199, 0.2, 0.9999999], dtype=torch.float64)).tolist() == [0, 0, 1, 4]


def test_same_seed_same_samples():
    a, b = ReplayBuffer(8, generator=3), ReplayBuffer(8, generator=torch.Generator().manual_seed(3))
    for rb in (a, b):
        rb.extend(rows(6))
    assert torch.equal(a.sample(10)[1]["index"], b.sample(10)[1]["index"])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda rb: rb.extend(TensorDict({"y": torch.ones(2)}, batch_size=[2])), "data keys="),
        (lambda rb: rb.extend(rows(2).set("x", torch.ones(2))), r"row shape, dtype="),
        (lambda rb: rb.add(rows(2)), r"row.batch_size=\[2\], but should be \[\]"),
        (lambda rb: rb.sample(0), r"batch_size=0, but should be an int >= 1"),
        (lambda rb: rb.sample(), r"batch_size=None, but should be an int >= 1"),
        (lambda rb: rb.update_priority(torch.tensor([0]), torch.tensor([1.0])), "sampler=RandomSampler, but should be prioritized"),
    ],
)
def test_bad_input_leaves_buffer_unchanged(call, message):
    rb = ReplayBuffer(4, generator=0)
    rb.extend(rows(3))
    before = rb.state_dict()
    with pytest.raises(ValueError, match=message):
        call(rb)
    assert same(rb.state_dict(), before)


def test_constructor_checks():
    with pytest.raises(ValueError, match=r"capacity=None, but should be an int >= 1"):
        ReplayBuffer()
    with pytest.raises(ValueError, match=r"capacity=4, but should be 5"):
        ReplayBuffer(4, storage=TensorStorage(5))
    with pytest.raises(ValueError, match=r"generator='x', but should be None, an int seed"):
        ReplayBuffer(4, generator="x")
    with pytest.raises(ValueError, match=r"len\(buffer\)=0, but should be >= 1"):
        ReplayBuffer(4).sample(1)
    assert ReplayBuffer(storage=TensorStorage(6)).capacity == 6


@pytest.mark.parametrize("sampler", [RandomSampler(), PrioritizedSampler(5, 0.6, 0.4)], ids=["random", "prioritized"])
def test_state_dict_round_trip_gives_identical_next_samples(sampler):
    rb = ReplayBuffer(5, sampler=sampler, generator=1)
    rb.extend(rows(7))
    rb.sample(3)
    if rb.prioritized:
        rb.update_priority(torch.tensor([0, 3]), torch.tensor([2.5, 0.5]))
    other = ReplayBuffer(5, sampler=type(sampler)() if not rb.prioritized else PrioritizedSampler(5, 1.0, 1.0), generator=9)
    other.load_state_dict(rb.state_dict())
    assert same(other.state_dict(), rb.state_dict())
    for _ in range(3):
        (s1, i1), (s2, i2) = rb.sample(4), other.sample(4)
        assert (s1 == s2).all() and same(i1, i2)


def test_load_state_dict_rejects_inconsistent_state_before_changing_anything():
    rb = ReplayBuffer(4, generator=0)
    rb.extend(rows(2))
    before = rb.state_dict()
    bad = ReplayBuffer(4, generator=0)
    bad.extend(rows(3))
    state = bad.state_dict()
    empty = ReplayBuffer(4).state_dict()
    state["storage"] = empty["storage"]  # no columns, but the writer says 3 rows were written
    with pytest.raises(ValueError, match=r"0 columns for keys=\[\] and size=3, but should be one per key"):
        rb.load_state_dict(state)
    state = bad.state_dict()
    state["writer"] = before["writer"]  # 3 rows held, 2 written: the size is the writer's
    twin = ReplayBuffer(4, generator=0)
    twin.load_state_dict(state)
    assert len(twin) == 2 and twin.write_count == 2
    with pytest.raises(ValueError, match="state=KeyError"):
        rb.load_state_dict({"capacity": 4, "storage": state["storage"]})
    state = bad.state_dict() | {"generator": torch.zeros(3, dtype=torch.uint8)}
    with pytest.raises(ValueError, match=r"generator state=3 bytes .*, but should be the state of a cpu generator"):
        rb.load_state_dict(state)
    assert same(rb.state_dict(), before)
