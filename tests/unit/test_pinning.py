"""The pin step (exact): it runs last, on the transformed sample (also a TensorDict
built with device=None) and on every info tensor; without an accelerator
pin_memory=True fails at construction."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import PrioritizedSampler, ReplayBuffer, pinning

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-accelerator error")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs a CUDA device")


def rebuild_without_device(td):
    """A transform that builds a brand-new TensorDict with device=None and a new key."""
    return TensorDict({"y": td["x"] * 10, "x": td["x"]}, batch_size=td.batch_size, device=None)


@needs_no_cuda
def test_pin_memory_without_accelerator_is_an_error_at_construction():
    with pytest.raises(RuntimeError, match=r"pin_memory=True needs an accelerator"):
        ReplayBuffer(4, pin_memory=True)
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False"):
        pinning.require_accelerator()


def test_pin_step_gets_the_final_sample_and_info(monkeypatch):
    calls = []

    def transform(td):
        calls.append("transform")
        out = rebuild_without_device(td)
        calls.append(out)
        return out

    def recorder(sample, info):
        calls.append(("pin", sample, dict(info), set(sample.keys()), sample.device))
        marked = sample.clone().set("pinned", torch.ones(sample.batch_size))
        return marked, info | {"pinned": True}

    monkeypatch.setattr(pinning, "require_accelerator", lambda: calls.append("checked"))
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(4, 0.6, 0.4), transform=transform,
                      pin_memory=True, generator=0)
    assert calls == ["checked"]
    rb.extend(TensorDict({"x": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3]))
    monkeypatch.setattr(pinning, "pin_sample", recorder)  # looked up at call time
    rows, info = rb.sample(5)
    assert calls[1] == "transform" and calls[-1][0] == "pin" and len(calls) == 4
    _, handed, handed_info, keys, device = calls[-1]
    assert handed is calls[2]  # exactly the TensorDict the transform built (device=None)
    assert device is None and keys == {"x", "y"}
    assert torch.equal(handed["y"], handed["x"] * 10)
    assert set(handed_info) == {"index", "weight", "generation"}
    assert all(isinstance(v, torch.Tensor) for v in handed_info.values())
    assert torch.equal(handed["x"], torch.tensor([1.0, 2.0, 3.0])[handed_info["index"]])
    # what the pin step returns is what sample() returns: nothing runs after it
    assert "pinned" in rows.keys() and info["pinned"] is True


def test_no_pin_step_when_pin_memory_is_false(monkeypatch):
    monkeypatch.setattr(pinning, "pin_sample", lambda *a: pytest.fail("pin step called"))
    rb = ReplayBuffer(4, generator=0)
    rb.extend(TensorDict({"x": torch.tensor([1.0])}, batch_size=[1]))
    rb.sample(2)


@needs_cuda
def test_really_pinned_after_transform():
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(4, 0.6, 0.4), transform=rebuild_without_device,
                      pin_memory=True, generator=0)
    rb.extend(TensorDict({"x": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3]))
    rows, info = rb.sample(5)
    assert all(v.is_pinned() for v in rows.values(include_nested=True, leaves_only=True))
    assert set(info) == {"index", "weight", "generation"}
    assert all(v.is_pinned() for v in info.values())


def test_pin_sample_pins_every_leaf_and_info_tensor(monkeypatch):
    """CPU check of pin_sample itself: Tensor.pin_memory replaced by a recorder."""
    pinned = []

    def fake_pin(tensor):
        out = tensor.clone()
        pinned.append(out.data_ptr())
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    td = TensorDict({"a": torch.ones(2), "n": {"b": torch.zeros(2, 3)}}, batch_size=[2], device=None)
    info = {"index": torch.tensor([0, 1]), "weight": torch.ones(2), "generation": torch.tensor([4, 5])}
    out, out_info = pinning.pin_sample(td, info)
    leaves = [*out.values(include_nested=True, leaves_only=True), *out_info.values()]
    assert len(leaves) == 5 and sorted(t.data_ptr() for t in leaves) == sorted(pinned)
    assert out.batch_size == (2,) and set(out.keys(True, True)) == {"a", ("n", "b")}
    assert set(out_info) == set(info)
