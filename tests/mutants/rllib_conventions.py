"""Mutants of two conventions first declared for RLlib's old-stack
prioritized buffer (and not specific to it): ``eps_rule="none"`` (the buffer
stores ``p ** alpha``, no eps at all; flashbax too) and
``positive_priorities`` (the buffer refuses a raw priority of 0).

Each pair: a control, the reference changed to follow the convention and
declaring it, which must pass; a mutant declaring the convention but
breaking it, which the named properties must catch. A declaration never
hides a violation: the invariant is checked in the convention's own terms.
"""

from __future__ import annotations

import math

import torch

from rbcheck.harness.protocol import Conventions
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from tests.mutants.base import adapter as _adapter
from tests.mutants.registry import control, mutant

EPS_NONE = Conventions(eps_rule="none")
POSITIVE = Conventions(positive_priorities=True)


# --- eps_rule="none" ----------------------------------------------------------


class NoEpsSampler(PrioritizedSampler):
    """The reference's sampler with no eps: stores ``p ** alpha`` whatever
    spec.eps, a raw 0 as 0 whatever alpha (the convention's rule)."""

    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, alpha, beta, 0.0)

    def _store(self, index: torch.Tensor, raw: torch.Tensor) -> None:
        value = torch.where(raw == 0, torch.zeros_like(raw), raw ** self.alpha)
        self.sum_tree.update(index, value)
        self.min_tree.update(index, torch.where(value > 0, value, math.inf))
        if raw.numel():
            self.max_priority = max(self.max_priority, float(raw.max()))


@control
def eps_none_control():
    return _adapter("eps-none", PrioritizedSampler=NoEpsSampler, conventions=EPS_NONE, prefix="control")


@mutant(bug="declares eps_rule='none' (stores p ** alpha) but adds spec.eps: (p + eps) ** alpha",
        catches=("test_priority_transform::test_updated_priority_is_transformed_once",
                 "test_priority_transform::test_writer_default_priority_is_transformed_once"),
        control=eps_none_control)
def eps_added_under_eps_rule_none():
    return _adapter("eps-added-under-eps-rule-none", conventions=EPS_NONE)


# --- positive_priorities --------------------------------------------------------


class PositiveOnlySampler(PrioritizedSampler):
    """The reference's sampler refusing a raw priority of 0 (before anything changes)."""

    def check_priority(self, priority, n: int) -> torch.Tensor:
        raw = super().check_priority(priority, n)
        if bool((raw == 0).any()):
            raise ValueError(f"priority={raw.tolist()}, but should be > 0")
        return raw


@control
def positive_priorities_control():
    return _adapter("positive-priorities", PrioritizedSampler=PositiveOnlySampler, conventions=POSITIVE,
                    prefix="control")


@mutant(bug="declares positive_priorities (refuses 0) but takes a priority of 0",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",),
        control=positive_priorities_control)
def zero_priority_taken_under_positive_priorities():
    return _adapter("zero-priority-taken-under-positive-priorities", conventions=POSITIVE)


class RefusesZeroMidUpdateSampler(PrioritizedSampler):
    """Refuses a 0 entry by entry, as a loop with an assert does: the entries
    before it are already stored when the refusal comes (a refused call that
    changed the buffer)."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        index = torch.as_tensor(index).reshape(-1)
        raw = torch.as_tensor(priority, dtype=torch.float64).reshape(-1)
        for i, p in zip(index.tolist(), raw.tolist(), strict=False):
            if p == 0:
                raise ValueError(f"priority={p}, but should be > 0")
            super().update_priority(torch.tensor([i]), torch.tensor([p], dtype=torch.float64))


@mutant(bug="refuses a priority of 0 only after storing the entries before it (a per-entry assert)",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",),
        control=positive_priorities_control)
def zero_refused_after_earlier_entries_stored():
    return _adapter("zero-refused-after-earlier-entries-stored", PrioritizedSampler=RefusesZeroMidUpdateSampler,
                    conventions=POSITIVE)
