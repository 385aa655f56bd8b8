"""A tiny conformance-style smoke test of the plumbing (``--impl``, fixtures,
``requires``): write a few rows, read them back, sample valid slots."""

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import BufferSpec


@pytest.mark.requires("random")
def test_extend_then_contents_and_sample(make_buffer, impl):
    buffer = make_buffer(BufferSpec(capacity=4, batch_size=3))
    rows = TensorDict({"obs": torch.arange(6.0)}, [6])
    index = buffer.extend(rows)
    assert index.tolist() == [0, 1, 2, 3, 0, 1], f"index={index.tolist()} [{impl.name}]"
    assert len(buffer) == 4 and buffer.cursor == 2 and buffer.write_count == 6
    assert buffer.contents()["obs"].tolist() == [4.0, 5.0, 2.0, 3.0]
    sample, info = buffer.sample()
    assert torch.equal(sample["obs"], buffer.contents()["obs"][info["index"]])


def test_reference_impl_is_the_reference(reference_impl):
    assert reference_impl.name == "reference"
