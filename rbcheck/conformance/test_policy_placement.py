"""Seed invariant 4: a policy that cannot be deep-copied is used in place
when no copy is needed, and otherwise fails with a clear error naming the
policy's class and the fix -- never a raw traceback from ``deepcopy``. A
copy, when asked for, is a private one, and the caller's policy is never
touched: its parameters and buffers keep their values, dtypes, devices,
storage (data pointers) and ``requires_grad``, and every module keeps its
training flag."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("policy_copy")


class LockHoldingPolicy(torch.nn.Module):
    """Holds a lock: ``copy.deepcopy`` fails with "cannot pickle '_thread.lock'"."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)
        self.lock = threading.Lock()

    def forward(self, x):
        return self.net(x).argmax(-1)


class RefusesCopyPolicy(torch.nn.Module):
    """Its ``__deepcopy__`` raises, the way a handle-owning module would."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def __deepcopy__(self, memo):
        raise RuntimeError("this policy owns an external handle and cannot be copied")

    def forward(self, x):
        return self.net(x).argmax(-1)


class CopyablePolicy(torch.nn.Module):
    """Parameters, a frozen parameter, a buffer and a submodule in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)
        self.norm = torch.nn.BatchNorm1d(2).eval()
        self.net.bias.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))

    def forward(self, x):
        return (self.norm(self.net(x)) * self.scale).argmax(-1)


class ParameterFreePolicy(torch.nn.Module):
    """No parameter, no buffer: a copy can only be told apart by identity and
    by its own state (the training flag)."""

    def forward(self, x):
        return (x.sum(-1) > 0).long()


NON_COPYABLE = {"LockHoldingPolicy": LockHoldingPolicy, "RefusesCopyPolicy": RefusesCopyPolicy}
COPYABLE = {"CopyablePolicy": CopyablePolicy, "ParameterFreePolicy": ParameterFreePolicy}
CPU = torch.device("cpu")


def _trace(impl) -> tuple[Trace, object]:
    """A repro that runs as pasted: the adapter as ``adapter`` (a recorded
    proxy: its ``place_policy`` calls are written as they are made), the
    policy classes imported from this file."""
    trace = Trace(impl, BufferSpec(capacity=1))
    trace.need("from rbcheck.conformance.test_policy_placement import *")
    trace.let("adapter", None, expr=f"load_adapter({trace.adapter!r})")
    return trace, trace.wrap(impl, "adapter")


def _tensors(policy) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``policy`` by qualified name."""
    return {**dict(policy.named_parameters()), **dict(policy.named_buffers())}


def snapshot(policy) -> dict:
    """What the caller can observe of its policy: per tensor its value (a
    clone), dtype, device, data pointer and ``requires_grad``; per module its
    training flag; the class."""
    tensors = {
        name: (t.detach().clone(), t.dtype, t.device, t.data_ptr(), t.requires_grad)
        for name, t in _tensors(policy).items()
    }
    training = {name or "<root>": m.training for name, m in policy.named_modules()}
    return {"class": type(policy).__name__, "tensors": tensors, "training": training}


def assert_untouched(policy, before: dict, trace: Trace, when: str) -> None:
    """The caller's policy is as :func:`snapshot` recorded it (exact)."""
    now = snapshot(policy)
    if now["class"] != before["class"]:
        fail(f"type(caller's policy) {when}", now["class"], before["class"], trace)
    if now["training"] != before["training"]:
        fail(f"caller's policy training flags {when}", str(now["training"]), str(before["training"]), trace)
    if sorted(now["tensors"]) != sorted(before["tensors"]):
        fail(f"caller's policy tensors {when}", str(sorted(now["tensors"])),
             str(sorted(before["tensors"])), trace)
    for name, (value, dtype, device, ptr, grad) in before["tensors"].items():
        v, d, dev, p, g = now["tensors"][name]
        if d != dtype:
            fail(f"caller's {name}.dtype {when}", str(d), str(dtype), trace)
        if dev != device:
            fail(f"caller's {name}.device {when}", str(dev), str(device), trace)
        if not torch.equal(v, value):
            fail(f"caller's {name} {when}", v, value, trace)
        if p != ptr:
            fail(f"caller's {name}.data_ptr() {when}", f"<{p:#x}, moved to new storage>",
                 f"{ptr:#x} (untouched)", trace)
        if g != grad:
            fail(f"caller's {name}.requires_grad {when}", g, grad, trace)


@given(kind=st.sampled_from(sorted(NON_COPYABLE)))
def test_non_copyable_policy_is_used_in_place_when_no_copy_is_needed(impl, kind):
    """exact: place_policy(policy, cpu, allow_in_place=True) for a
    non-copyable policy already on the CPU returns the very same object,
    with its parameters, buffers and training flags untouched."""
    policy = NON_COPYABLE[kind]()
    before = snapshot(policy)
    trace, adapter = _trace(impl)
    try:
        placed = adapter.place_policy(trace.name(policy, f"{kind}()"), CPU, True)
    except Exception as err:  # noqa: BLE001
        fail(
            "place_policy(...)",
            f"<{type(err).__name__}: {err}>",
            "the policy itself (no copy is needed)",
            trace,
        )
    if placed is not policy:
        fail("place_policy(...) is policy", False, "True (used in place)", trace)
    assert_untouched(policy, before, trace, "after place_policy")


@given(kind=st.sampled_from(sorted(NON_COPYABLE)))
def test_non_copyable_policy_needing_a_copy_fails_with_a_clear_error(impl, kind):
    """exact: when a copy is needed (allow_in_place=False), a non-copyable
    policy raises an error whose message names the policy's class and says
    how to fix it (allow_in_place / make it copyable); a bare deepcopy
    TypeError / RuntimeError without that context fails the check."""
    policy = NON_COPYABLE[kind]()
    trace, adapter = _trace(impl)
    try:
        adapter.place_policy(trace.name(policy, f"{kind}()"), CPU, False)
    except Exception as err:  # noqa: BLE001
        message = str(err)
        if kind not in message:
            fail(
                "error message",
                f"<{type(err).__name__}: {message}>",
                f"a message naming {kind}",
                trace,
            )
        lowered = message.lower()
        if "allow_in_place" not in message and "fix" not in lowered and "copyable" not in lowered:
            fail(
                "error message",
                f"<{type(err).__name__}: {message}>",
                "a message saying how to fix it (e.g. allow_in_place=True or make it copyable)",
                trace,
            )
        return
    fail("place_policy(non-copyable, allow_in_place=False)", "<returned>", "a clear error", trace)


@pytest.mark.parametrize("kind", sorted(COPYABLE))
def test_copyable_policy_is_copied_when_a_copy_is_asked_for(impl, kind):
    """exact: a copyable policy with allow_in_place=False comes back as a
    different object of the same class, with the same parameter and buffer
    names, equal values, dtypes and ``requires_grad``, on the device, in
    storage of its own, with the same training flags. The caller's policy is
    untouched (values, dtypes, devices, data pointers, ``requires_grad``,
    training flags), right after the call and after the copy is changed
    (its tensors overwritten, its training flag flipped): the copy shares no
    state with it. Checked for a policy with parameters, a frozen parameter,
    a buffer and an eval-mode submodule, and for one with no tensor at all
    (only identity and the training flag tell a copy apart there)."""
    policy = COPYABLE[kind]()
    before = snapshot(policy)
    trace, _ = _trace(impl)
    # written by hand, not recorded: the snippet's later steps change the copy, so it binds it
    trace.op(f"placed = adapter.place_policy({kind}(), torch.device('cpu'), False)")
    placed = impl.place_policy(policy, CPU, False)
    assert_untouched(policy, before, trace, "after place_policy")
    if placed is policy:
        fail("place_policy(...) is policy", True, "False (a private copy)", trace)
    if type(placed) is not type(policy):
        fail("type(place_policy(...))", type(placed).__name__, type(policy).__name__, trace)
    got, want = _tensors(placed), _tensors(policy)
    if sorted(got) != sorted(want):
        fail("the copy's parameter and buffer names", str(sorted(got)), str(sorted(want)), trace)
    for (name, a), (_, b) in zip(sorted(got.items()), sorted(want.items()), strict=True):
        if a.dtype != b.dtype or not torch.equal(a.detach(), b.detach()):
            fail(f"copied {name}", a, b, trace)
        if a.device != CPU:
            fail(f"copied {name}.device", str(a.device), str(CPU), trace)
        if a.requires_grad != b.requires_grad:
            fail(f"copied {name}.requires_grad", a.requires_grad, b.requires_grad, trace)
        if a.data_ptr() == b.data_ptr():
            fail(f"copied {name} storage", "<shared with the original>", "a private copy", trace)
    flags = {n or "<root>": m.training for n, m in placed.named_modules()}
    if flags != before["training"]:
        fail("the copy's training flags", str(flags), str(before["training"]), trace)
    # change the copy every way a collector might; the caller must not see it
    trace.op("placed.train(not placed.training)")
    placed.train(not placed.training)
    with torch.no_grad():
        for t in got.values():
            t.add_(1)
    trace.op("[t.add_(1) for t in placed.state_dict().values()]")
    assert_untouched(policy, before, trace, "after the copy is changed")
