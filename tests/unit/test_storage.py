"""TensorStorage (exact): lazy allocation, layout checks, ring writes, copies, state."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference.storage import TensorStorage, layout_of


def batch(values, n=None):
    values = torch.as_tensor(values)
    n = len(values) if n is None else n
    return TensorDict(
        {"obs": values.float(), "act": values.long(), "next": {"obs": values.float()[:, None] * 10}},
        batch_size=[n],
    )


def test_lazy_allocation_fixes_layout_from_first_batch():
    s = TensorStorage(4)
    assert s.data is None and len(s) == 0 and layout_of(s.data) == {}
    s.set(torch.tensor([0, 1]), batch([5, 6]))
    assert s.data.batch_size == (4,) and len(s) == 2
    assert layout_of(s.data) == {
        ("obs",): ((), torch.float32),
        ("act",): ((), torch.int64),
        ("next", "obs"): ((1,), torch.float32),
    }
    assert s.get(torch.tensor([1, 0]))["act"].tolist() == [6, 5]
    assert s.get(torch.tensor([1]))["next", "obs"].tolist() == [[60.0]]


def test_repeated_slot_last_row_wins():
    s = TensorStorage(3)
    s.set(torch.tensor([0, 1, 2, 0, 1]), batch([1, 2, 3, 4, 5]))
    assert s.data["act"].tolist() == [4, 5, 3] and len(s) == 3


def test_get_returns_a_copy():
    s = TensorStorage(2)
    s.set(torch.tensor([0, 1]), batch([1, 2]))
    out = s.get(torch.tensor([0]))
    out["obs"].add_(100)
    assert s.data["obs"].tolist() == [1.0, 2.0]


def test_get_rejects_rows_never_written():
    s = TensorStorage(4)
    s.set(torch.tensor([0, 1]), batch([1, 2]))
    with pytest.raises(ValueError, match=r"index=\[2\], but should be in \[0, 2\)"):
        s.get(torch.tensor([0, 2]))


@pytest.mark.parametrize(
    "bad, message",
    [
        (TensorDict({"obs": torch.ones(2)}, batch_size=[2]), "data keys="),
        (batch([1, 2]).set("obs", torch.ones(2, dtype=torch.float64)), r"data\[\('obs',\)\] row shape, dtype="),
        (batch([1, 2]).set("obs", torch.ones(2, 3)), r"data\[\('obs',\)\] row shape, dtype="),
        (batch([1, 2]).set("extra", torch.ones(2)), "data keys="),
        (batch([1])[0], r"data.batch_size=\[\], but should be \[n\]"),
        ({"obs": torch.ones(2)}, "data=dict, but should be a TensorDict"),
    ],
)
def test_layout_mismatch_rejected_and_storage_unchanged(bad, message):
    s = TensorStorage(4)
    s.set(torch.tensor([0, 1]), batch([1, 2]))
    before = s.data.clone()
    with pytest.raises(ValueError, match=message):
        s.set(torch.tensor([2, 3]), bad)
    assert len(s) == 2 and (s.data == before).all()


def test_index_checks():
    s = TensorStorage(4)
    with pytest.raises(ValueError, match=r"index=\[4\], but should be in \[0, 4\)"):
        s.set(torch.tensor([4]), batch([1]))
    with pytest.raises(ValueError, match=r"len\(index\)=1, but should be len\(data\)=2"):
        s.set(torch.tensor([0]), batch([1, 2]))
    assert s.data is None
    with pytest.raises(ValueError, match=r"capacity=0, but should be an int >= 1"):
        TensorStorage(0)


def test_state_dict_round_trip_and_layout_validation():
    s = TensorStorage(3)
    s.set(torch.tensor([0, 1]), batch([1, 2]))
    state = s.state_dict()
    assert state["keys"] == [["obs"], ["act"], ["next", "obs"]] and set(state) == {"keys", "columns"}
    fresh = TensorStorage(3)
    fresh.load_state_dict(state, 2)  # the size is the caller's (the buffer's writer count)
    assert len(fresh) == 2 and (fresh.data == s.data).all()
    other = TensorStorage(3)
    other.set(torch.tensor([0]), TensorDict({"x": torch.ones(1)}, batch_size=[1]))
    with pytest.raises(ValueError, match="field layout="):
        other.load_state_dict(state, 2)
    assert other.data["x"].tolist() == [1.0, 0.0, 0.0] and len(other) == 1
    with pytest.raises(ValueError, match=r"\('obs',\).shape=\(3,\), but should start with 5"):
        TensorStorage(5).load_state_dict(state, 2)
    with pytest.raises(ValueError, match=r"0 columns for keys=\[\] and size=1, but should be"):
        TensorStorage(3).load_state_dict({"keys": [], "columns": []}, 1)
    for keys in ([["obs"], ["obs"]], [["next"], ["next", "obs"]], [[""], ["a"]]):  # twice, inside, empty
        with pytest.raises(ValueError, match=r"key=.*, but should be a list of non-empty strings, distinct"):
            TensorStorage(3).load_state_dict({"keys": keys, "columns": [torch.zeros(3)] * 2}, 2)
