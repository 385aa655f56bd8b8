"""Bad input: refused with a clear error before anything changes, whatever
the dtype it comes in, including on buffers without priority read-back or
a seed (cpprb-like, with their control).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import CAPABILITIES, Conventions
from rbcheck.reference.arguments import check_index
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from tests.mutants.base import adapter
from tests.mutants.registry import control, mutant


class NoPriorityCheckSampler(PrioritizedSampler):
    """Takes any priority as float64, NaN, infinite and negative included."""

    def check_priority(self, priority, n: int) -> torch.Tensor:
        return torch.as_tensor(priority).detach().to(torch.float64).reshape(n)


@mutant(bug="NaN, infinite or negative priorities accepted",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",))
def bad_priority_accepted():
    return adapter("bad-priority-accepted", PrioritizedSampler=NoPriorityCheckSampler)


class CursorFirstBuffer(ReplayBuffer):
    """Has moved the writer's cursor when a batch is refused (the check runs
    after the writer, as in buffers that validate while writing)."""

    def extend(self, data):
        try:
            return super().extend(data)
        except (ValueError, TypeError):
            self.writer.next_indices(1)
            raise


@mutant(bug="a refused batch that still moves the cursor",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",))
def extend_moves_cursor_before_checking():
    return adapter("extend-moves-cursor-before-checking", CursorFirstBuffer)


class NoParamCheckSampler(PrioritizedSampler):
    """Stores alpha, beta and eps without checking them."""

    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, 0.5, 0.5, 1e-8)
        self.alpha, self.beta, self.eps = alpha, beta, eps


@mutant(bug="alpha, beta or eps out of range accepted",
        catches=("test_bad_input::test_bad_buffer_description_is_refused",
                 "test_bad_input::test_parameters_outside_the_declared_range_are_refused"))
def bad_parameters_accepted():
    return adapter("bad-parameters-accepted", PrioritizedSampler=NoParamCheckSampler)


class MaxBeforeDtypeCheckSampler(PrioritizedSampler):
    """Raises on priorities in another float dtype than its trees' (float64
    here) -- after recording their max, as TorchRL's float32 trees do
    (``update_priority`` sets ``_max_priority`` before the C++ tree refuses
    a double: "expected scalar type Float but found Double")."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        given = torch.as_tensor(priority)
        if given.is_floating_point() and given.dtype != torch.float64:
            if given.numel():
                self.max_priority = max(self.max_priority, float(given.max()))
            raise RuntimeError("expected scalar type Double but found Float")
        super().update_priority(index, priority, generation, current_generation)


@mutant(bug="priorities in another float dtype refused after the max priority moved",
        catches=("test_bad_input::test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly",))
def priority_dtype_crash_keeps_max():
    return adapter("priority-dtype-crash-keeps-max", PrioritizedSampler=MaxBeforeDtypeCheckSampler)


class Float64OnlySampler(PrioritizedSampler):
    """Takes priorities in float64 only (it declares float64, the spec's
    dtype) and refuses any other dtype with a crash, but never checks the
    VALUES: NaN, infinite and negative float64 priorities are stored. A
    catalogue that hands its bad priorities over as float32 sees only the
    dtype refusal."""

    def check_priority(self, priority, n: int) -> torch.Tensor:
        given = torch.as_tensor(priority).detach()
        if given.dtype != torch.float64:
            raise TypeError(f"expected scalar type Double but found {given.dtype}")
        return given.reshape(n)


@mutant(bug="bad priorities refused for their dtype alone (the values never checked)",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",))
def float64_only_values_unchecked():
    return adapter("float64-only-values-unchecked", PrioritizedSampler=Float64OnlySampler)


_BUFFERS_MADE = itertools.count(1)


class UnseededBuffer(ReplayBuffer):
    """Ignores its seed, as cpprb's sampler seeded from ``std::random_device``
    does: each buffer draws from a stream of its own, so two buffers of the
    same spec sample differently (deterministic over one run: the streams
    are numbered in the order the buffers are made)."""

    def __init__(self, capacity=None, *, generator=None, **kwargs):
        super().__init__(capacity, generator=1_000_003 * next(_BUFFERS_MADE), **kwargs)


#: What a cpprb-like buffer declares: no read-back of priorities, no seed.
UNSEEDED_CAPABILITIES = CAPABILITIES - {"priority_readback", "shared_rng", "save_load"}


UNSEEDED = Conventions(seedable=False, notes={"seedable": "each buffer draws from a stream of its own"})


def _unseeded_adapter(name: str, **components):
    return buffer_adapter(name, "0", UnseededBuffer, UNSEEDED_CAPABILITIES,
                          components=SimpleNamespace(**components), pin_module="rbcheck.reference.pinning",
                          conventions=UNSEEDED)


@control
def unseeded_without_readback_control():
    """The control (not a mutant): the reference, unseeded and without
    priority read-back, as cpprb's prioritized buffer. It refuses bad input
    before changing anything, so the suite must pass it."""
    return _unseeded_adapter("unseeded-without-readback-control")


class OneByOneUpdateSampler(PrioritizedSampler):
    """Checks the shapes, then writes an update entry by entry, each entry
    checked as it is written: a bad entry raises with the ones before it
    already applied (a refusal applied halfway)."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        index, given = check_index(index, self.capacity), torch.as_tensor(priority)
        if given.shape != index.shape:
            return super().update_priority(index, priority, generation, current_generation)
        for i in range(len(index)):
            part = slice(i, i + 1)
            super().update_priority(index[part], given[part],
                                    None if generation is None else torch.as_tensor(generation)[part],
                                    None if current_generation is None else current_generation[part])


@mutant(bug="an update refused halfway, on an unseeded buffer without priority read-back (cpprb-like)",
        catches=("test_bad_input::test_bad_input_is_refused_and_nothing_changes",),
        control=unseeded_without_readback_control)
def update_refused_halfway_without_readback():
    return _unseeded_adapter("mutant-update-refused-halfway-without-readback",
                             PrioritizedSampler=OneByOneUpdateSampler)


@mutant(bug="a refused update that moved the max priority, on an unseeded buffer without read-back",
        catches=("test_bad_input::test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly",),
        control=unseeded_without_readback_control)
def dtype_crash_keeps_max_without_readback():
    """The max priority moved by a refused update (priority_dtype_crash_keeps_max)
    on an unseeded buffer without read-back: seen only in the draws."""
    return _unseeded_adapter("mutant-dtype-crash-keeps-max-without-readback",
                             PrioritizedSampler=MaxBeforeDtypeCheckSampler)
