"""Transforms (exact): Compose order, transforms see a copy, the sample is transformed."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import Compose, ReplayBuffer, Transform


class AddOne(Transform):
    def forward(self, td):
        return td.set("x", td["x"] + 1)


def times_two(td):
    return td.set("x", td["x"] * 2)


def test_compose_applies_left_to_right():
    td = TensorDict({"x": torch.tensor([1.0, 2.0])}, batch_size=[2])
    assert Compose(AddOne(), times_two)(td.clone())["x"].tolist() == [4.0, 6.0]
    assert Compose(times_two, AddOne())(td.clone())["x"].tolist() == [3.0, 5.0]
    assert Compose()(td.clone())["x"].tolist() == [1.0, 2.0]


def test_transform_runs_on_each_sample_not_on_storage():
    rb = ReplayBuffer(4, transform=Compose(AddOne(), times_two), generator=0)
    rb.extend(TensorDict({"x": torch.tensor([10.0, 20.0])}, batch_size=[2]))
    rows, info = rb.sample(8)
    assert torch.equal(rows["x"], (torch.tensor([10.0, 20.0])[info["index"]] + 1) * 2)
    assert rb.storage.data["x"][:2].tolist() == [10.0, 20.0]  # in-place edits hit a copy
    rows2, _ = rb.sample(8)
    assert (rows2["x"] >= 22).all()  # not transformed twice


def test_errors():
    with pytest.raises(ValueError, match=r"transforms\[1\]=3, but should be callable"):
        Compose(AddOne(), 3)
    with pytest.raises(NotImplementedError, match="Transform.forward"):
        Transform()(TensorDict({}, batch_size=[1]))
    with pytest.raises(ValueError, match="transform=3, but should be callable or None"):
        ReplayBuffer(4, transform=3)
