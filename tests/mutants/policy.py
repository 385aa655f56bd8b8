"""Policy placement: a copy when one is asked for (and only then), a clear
error for a policy that cannot be copied, the caller's policy left as it was.
"""

from __future__ import annotations

import copy

import torch

from rbcheck.reference.policy import place_policy as reference_place_policy
from tests.mutants.base import adapter
from tests.mutants.registry import mutant


def _raw_deepcopy_place_policy(policy, device, allow_in_place=True):
    """Copies whenever a copy is asked for, with no guard around deepcopy."""
    if allow_in_place:
        return policy
    clone = copy.deepcopy(policy)
    return clone.to(device) if isinstance(clone, torch.nn.Module) else clone


@mutant(bug="a raw deepcopy error for a non-copyable policy",
        catches=("test_policy_placement::test_non_copyable_policy_needing_a_copy_fails_with_a_clear_error",))
def raw_deepcopy_policy():
    return adapter("raw-deepcopy-policy", place_policy=_raw_deepcopy_place_policy)


def _always_copy_place_policy(policy, device, allow_in_place=True):
    return reference_place_policy(policy, device, allow_in_place=False)


@mutant(bug="a policy deep-copied even when it could be used in place",
        catches=("test_policy_placement::test_non_copyable_policy_is_used_in_place_when_no_copy_is_needed",))
def policy_always_copied():
    return adapter("policy-always-copied", place_policy=_always_copy_place_policy)


def _never_copy_place_policy(policy, device, allow_in_place=True):
    return policy


@mutant(bug="a policy used in place when a private copy was asked for",
        catches=("test_policy_placement::test_copyable_policy_is_copied_when_a_copy_is_asked_for",))
def policy_never_copied():
    return adapter("policy-never-copied", place_policy=_never_copy_place_policy)


def _same_module_if_no_tensors_place_policy(policy, device, allow_in_place=True):
    """"Nothing to copy" for a module without parameters or buffers: returns
    the caller's object even when a private copy was asked for."""
    if isinstance(policy, torch.nn.Module) and not any(
        True for _ in (*policy.parameters(), *policy.buffers())
    ):
        return policy
    return reference_place_policy(policy, device, allow_in_place)


@mutant(bug="a parameter-free policy returned as its own copy",
        catches=("test_policy_placement::test_copyable_policy_is_copied_when_a_copy_is_asked_for",))
def parameter_free_policy_not_copied():
    return adapter("parameter-free-policy-not-copied",
                    place_policy=_same_module_if_no_tensors_place_policy)


def _moves_caller_place_policy(policy, device, allow_in_place=True):
    """"Moves" the caller's tensors to the device (into new storage, the
    values unchanged) before copying: the caller's policy no longer holds the
    storage its trainer (and any view of it) holds."""
    if isinstance(policy, torch.nn.Module):
        for t in (*policy.parameters(), *policy.buffers()):
            t.data = t.data.to(device, copy=True)
    return reference_place_policy(policy, device, allow_in_place)


@mutant(bug="the caller's policy moved to new storage while a copy is made",
        catches=("test_policy_placement::test_copyable_policy_is_copied_when_a_copy_is_asked_for",))
def policy_copy_moves_the_caller():
    return adapter("policy-copy-moves-the-caller", place_policy=_moves_caller_place_policy)


def _eval_caller_place_policy(policy, device, allow_in_place=True):
    """Puts the caller's policy in eval mode for collection, then copies it."""
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    return reference_place_policy(policy, device, allow_in_place)


@mutant(bug="the caller's policy put in eval mode while a copy is made",
        catches=("test_policy_placement::test_copyable_policy_is_copied_when_a_copy_is_asked_for",))
def policy_copy_sets_the_caller_to_eval():
    return adapter("policy-copy-sets-the-caller-to-eval", place_policy=_eval_caller_place_policy)
