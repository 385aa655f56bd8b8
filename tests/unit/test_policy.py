"""Seed invariant 4 (exact): a policy that cannot be deep-copied is used in place
when no copy is needed, and otherwise fails with a clear NotCopyableError naming
the policy's class and the fix, with the original error as ``__cause__`` --
never a raw traceback from deepcopy. Also ``make_target_params`` without deepcopy.

No accelerator is needed: "a copy is needed" is exercised with the ``meta``
device (a module can be moved there on a CPU-only machine) and by patching
``needs_move``.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

import rbcheck.reference.policy as policy_mod
from rbcheck.reference.policy import (
    COPYABLE_MARKER,
    NotCopyableError,
    make_target_params,
    needs_move,
    place_policy,
)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.norm = torch.nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


class Uncopyable(Net):
    """``__deepcopy__`` raises, like a policy holding an open handle."""

    deepcopy_calls = 0

    def __deepcopy__(self, memo):
        type(self).deepcopy_calls += 1
        raise RuntimeError("this policy holds a process handle")


class Marked(Net):
    rbcheck_copyable = False

    def __deepcopy__(self, memo):  # must never be reached: the marker is checked first
        raise AssertionError("deepcopy attempted on a policy marked non-copyable")


class WithLock(Net):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()  # deepcopy raises TypeError: cannot pickle a lock


def test_marker_name_is_documented():
    assert COPYABLE_MARKER == "rbcheck_copyable"
    assert COPYABLE_MARKER in policy_mod.__doc__


def test_already_on_device_is_used_in_place():
    net = Net()
    assert not needs_move(net, "cpu")
    assert not needs_move(net, torch.device("cpu:0"))
    assert place_policy(net, "cpu") is net


def test_policy_without_tensors_is_used_in_place():
    def act(observation):
        return observation

    assert place_policy(act, "meta") is act
    empty = torch.nn.Identity()
    assert place_policy(empty, "meta") is empty


def test_copy_when_device_differs_leaves_the_original_alone():
    net = Net()
    placed = place_policy(net, "meta")
    assert placed is not net
    assert {p.device.type for p in placed.parameters()} == {"meta"}
    assert {b.device.type for b in placed.buffers()} == {"meta"}
    assert {p.device.type for p in net.parameters()} == {"cpu"}


def test_mixed_devices_need_a_move():
    net = Net()
    net.norm.to("meta")
    assert needs_move(net, "cpu") and needs_move(net, "meta")


def test_uncopyable_is_used_in_place_when_no_copy_is_needed():
    Uncopyable.deepcopy_calls = 0
    net = Uncopyable()
    assert place_policy(net, "cpu") is net
    assert Uncopyable.deepcopy_calls == 0


@pytest.mark.parametrize("cls", [Uncopyable, WithLock])
def test_uncopyable_needing_a_copy_raises_a_clear_error(cls):
    net = cls()
    with pytest.raises(NotCopyableError) as info:
        place_policy(net, "meta")
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, TypeError)
    message = str(err)
    assert f"policy={cls.__qualname__}" in message
    assert "policy.to('meta')" in message  # the fix
    assert "deep-copyable" in message
    assert "device='meta'" in message
    # the original error is kept as the cause, not re-raised raw
    with pytest.raises(Exception) as original:
        copy.deepcopy(cls())
    assert err.__cause__ is not None
    assert type(err.__cause__) is type(original.value)
    assert str(err.__cause__) == str(original.value)
    # the caller's policy was not moved
    assert {p.device.type for p in net.parameters()} == {"cpu"}


def test_marker_is_honoured_without_trying_deepcopy():
    net = Marked()
    assert place_policy(net, "cpu") is net
    with pytest.raises(NotCopyableError, match=r"policy=Marked is marked rbcheck_copyable=False"):
        place_policy(net, "meta")
    instance_marked = Net()
    instance_marked.rbcheck_copyable = False
    with pytest.raises(NotCopyableError, match=r"policy=Net"):
        place_policy(instance_marked, "meta")


def test_allow_in_place_false_always_copies():
    net = Net()
    placed = place_policy(net, "cpu", allow_in_place=False)
    assert placed is not net
    for a, b in zip(net.parameters(), placed.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    with pytest.raises(NotCopyableError, match=r"pass allow_in_place=True") as info:
        place_policy(Uncopyable(), "cpu", allow_in_place=False)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_fake_target_device_through_needs_move(monkeypatch):
    # stands in for "the policy is on CPU, the collector runs on an accelerator"
    monkeypatch.setattr(policy_mod, "needs_move", lambda policy, device: True)
    net = Net()
    assert place_policy(net, "cpu") is not net
    with pytest.raises(NotCopyableError, match=r"policy=Uncopyable cannot be deep-copied"):
        place_policy(Uncopyable(), "cpu")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"device='nowhere', but should be"):
        place_policy(Net(), "nowhere")
    with pytest.raises(TypeError, match=r"allow_in_place=1, but should be True or False"):
        place_policy(Net(), "cpu", allow_in_place=1)
    with pytest.raises(TypeError, match=r"policy=int, but should be a callable"):
        place_policy(3, "cpu")


def test_make_target_params_works_without_deepcopy():
    Uncopyable.deepcopy_calls = 0
    net = Uncopyable()
    net.norm.running_mean.fill_(0.5)
    target = make_target_params(net)
    assert Uncopyable.deepcopy_calls == 0
    source = dict(net.named_parameters()) | dict(net.named_buffers())
    keys = {".".join(k) for k in target.keys(include_nested=True, leaves_only=True)}
    assert keys == set(source)
    for name, tensor in source.items():
        got = target.get(tuple(name.split(".")))
        assert torch.equal(got, tensor) and got.dtype == tensor.dtype
        assert got.data_ptr() != tensor.data_ptr()  # a copy, not a view
        assert not got.requires_grad


def test_target_params_are_frozen_and_usable_functionally():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(4, 2)
    target = make_target_params(net)
    before = net(x).detach()
    with torch.no_grad():
        net.linear.weight.add_(1.0)  # the online network trains on
    assert not torch.allclose(net(x), before)
    with target.to_module(net):
        assert torch.equal(net(x), before)
    with pytest.raises(TypeError, match=r"module=dict, but should be a torch.nn.Module"):
        make_target_params({})


def _observable(module: torch.nn.Module) -> dict:
    """What the caller can see of its policy: per tensor value, device, storage
    and requires_grad; per module the training flag."""
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {
        "tensors": {n: (t.detach().clone(), t.device, t.data_ptr(), t.requires_grad)
                    for n, t in tensors.items()},
        "training": {n: m.training for n, m in module.named_modules()},
    }


def _same(a: dict, b: dict) -> bool:
    if a["training"] != b["training"] or a["tensors"].keys() != b["tensors"].keys():
        return False
    return all(torch.equal(x[0], y[0]) and x[1:] == y[1:]
               for x, y in zip(a["tensors"].values(), b["tensors"].values(), strict=True))


def test_a_parameter_free_module_asked_for_a_copy_gets_one():
    empty = torch.nn.Identity()
    placed = place_policy(empty, "cpu", allow_in_place=False)
    assert placed is not empty and type(placed) is torch.nn.Identity
    placed.eval()
    assert empty.training  # the copy shares no state with the caller's module


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_callers_policy_is_untouched_by_a_copy(device):
    net = Net()
    net.linear.bias.requires_grad_(False)
    net.norm.eval()
    before = _observable(net)
    placed = place_policy(net, device, allow_in_place=False)
    assert _same(_observable(net), before)
    placed.train(not placed.training)
    with torch.no_grad():
        for t in (*placed.parameters(), *placed.buffers()):
            t.add_(1)
    assert _same(_observable(net), before)


def test_the_collector_leaves_the_callers_policy_untouched():
    from rbcheck.reference.collector import SyncCollector
    from rbcheck.reference.env import ChainEnv

    class Act(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(1.0))
            self.register_buffer("count", torch.tensor(0))

        def forward(self, observation):
            self.count += 1  # state that changes as the policy runs
            return (self.weight > 0).to(torch.int64)

    class Sink:
        def extend(self, td):
            pass

    policy = Act()
    before = _observable(policy)
    collector = SyncCollector(ChainEnv(), policy, Sink(), frames_per_batch=4, allow_in_place=False)
    collector.collect()
    assert collector.policy is not policy and int(collector.policy.count) == 4
    assert _same(_observable(policy), before)
    assert not _same(_observable(collector.policy), before)  # the comparison can tell a change
