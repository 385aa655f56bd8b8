"""Seed invariant 4: a policy that cannot be deep-copied is used in place
when no copy is needed, and otherwise fails with a clear error naming the
policy's class and the fix -- never a raw traceback from ``deepcopy``."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, fail

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
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def forward(self, x):
        return self.net(x).argmax(-1)


NON_COPYABLE = {"LockHoldingPolicy": LockHoldingPolicy, "RefusesCopyPolicy": RefusesCopyPolicy}
CPU = torch.device("cpu")


def _trace(impl, call: str) -> Trace:
    trace = Trace(impl, None)
    trace.op(call)
    return trace


def _params(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


@given(kind=st.sampled_from(sorted(NON_COPYABLE)))
def test_non_copyable_policy_is_used_in_place_when_no_copy_is_needed(impl, kind):
    """exact: place_policy(policy, cpu, allow_in_place=True) for a
    non-copyable policy already on the CPU returns the very same object,
    with its parameters unchanged."""
    policy = NON_COPYABLE[kind]()
    before = _params(policy)
    trace = _trace(impl, f"adapter.place_policy({kind}(), torch.device('cpu'), True)")
    try:
        placed = impl.place_policy(policy, CPU, True)
    except Exception as err:  # noqa: BLE001
        fail(
            "place_policy(...)",
            f"<{type(err).__name__}: {err}>",
            "the policy itself (no copy is needed)",
            trace,
        )
    if placed is not policy:
        fail("place_policy(...) is policy", False, "True (used in place)", trace)
    for a, b in zip(_params(policy), before, strict=False):
        if not torch.equal(a, b):
            fail("policy parameters after place_policy", a, b, trace)


@given(kind=st.sampled_from(sorted(NON_COPYABLE)))
def test_non_copyable_policy_needing_a_copy_fails_with_a_clear_error(impl, kind):
    """exact: when a copy is needed (allow_in_place=False), a non-copyable
    policy raises an error whose message names the policy's class and says
    how to fix it (allow_in_place / make it copyable); a bare deepcopy
    TypeError / RuntimeError without that context fails the check."""
    policy = NON_COPYABLE[kind]()
    trace = _trace(impl, f"adapter.place_policy({kind}(), torch.device('cpu'), False)")
    try:
        impl.place_policy(policy, CPU, False)
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


def test_copyable_policy_is_copied_when_a_copy_is_asked_for(impl):
    """exact: a copyable policy with allow_in_place=False comes back as a
    different object with equal parameters on the device; the caller's
    policy is untouched."""
    policy = CopyablePolicy()
    trace = _trace(impl, "adapter.place_policy(CopyablePolicy(), torch.device('cpu'), False)")
    placed = impl.place_policy(policy, CPU, False)
    if placed is policy:
        fail("place_policy(...) is policy", True, "False (a private copy)", trace)
    for a, b in zip(placed.parameters(), policy.parameters(), strict=False):
        if not torch.equal(a.detach(), b.detach()) or a.device != CPU:
            fail("copied parameter", a, b, trace)
        if a.data_ptr() == b.data_ptr():
            fail("copied parameter storage", "<shared with the original>", "a private copy", trace)
