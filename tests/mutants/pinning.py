"""Pinning: the pin step is last, sees the transformed sample and its info,
and pin_memory=True without an accelerator is a clear error.
"""

from __future__ import annotations

from rbcheck.reference import pinning
from rbcheck.reference.buffer import ReplayBuffer
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant


class SkipPinForDeviceNoneBuffer(ReplayBuffer):
    """Pins only when the transformed sample says it is on the CPU: a
    transform that returns a TensorDict with ``device=None`` goes out unpinned."""

    def sample(self, batch_size=None):
        pin, self.pin_memory = self.pin_memory, False
        try:
            rows, info = super().sample(batch_size)
        finally:
            self.pin_memory = pin
        if pin and rows.device is not None:
            rows, info = pinning.pin_sample(rows, info)
        return rows, info


@mutant(bug="pinning skipped when a transform returns device=None",
        catches=("test_pin_memory::test_pin_step_is_last_and_sees_transformed_sample_and_info",))
def pinning_skipped_for_device_none():
    return adapter("pinning-skipped-for-device-none", SkipPinForDeviceNoneBuffer)


class InfoAfterPinBuffer(ReplayBuffer):
    """Pins first, then adds the write generations to info (left unpinned)."""

    def sample(self, batch_size=None):
        pin, self.pin_memory = self.pin_memory, False
        try:
            rows, info = super().sample(batch_size)
        finally:
            self.pin_memory = pin
        generation = info.pop("generation")
        if pin:
            rows, info = pinning.pin_sample(rows, info)
        info["generation"] = generation
        return rows, info


@mutant(bug="info keys added after pinning",
        catches=("test_pin_memory::test_pin_step_is_last_and_sees_transformed_sample_and_info",))
def info_keys_added_after_pinning():
    return adapter("info-keys-added-after-pinning", InfoAfterPinBuffer)


class NoAcceleratorCheckBuffer(ReplayBuffer):
    """Accepts pin_memory=True without an accelerator and quietly ignores it."""

    def __init__(self, capacity=None, *, pin_memory=False, **kwargs):
        super().__init__(capacity, pin_memory=False, **kwargs)


@mutant(bug="pin_memory=True a silent no-op without an accelerator",
        catches=("test_pin_memory::test_pin_memory_without_accelerator_is_a_clear_error",))
def pin_memory_silently_ignored():
    return adapter("pin-memory-silently-ignored", NoAcceleratorCheckBuffer)


class CloneAfterPinBuffer(ReplayBuffer):
    """pytorch/rl #2404: pinned memory lost: the sample is copied (cloned)
    after the pin step, and a clone is not pinned."""

    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        if self.pin_memory:
            rows = rows.clone()
        return rows, info


@mutant(bug="pinned memory lost by a copy after the pin step",
        catches=("test_pin_memory::test_pin_step_is_last_and_sees_transformed_sample_and_info",),
        reproduces="pytorch/rl #2404")
def pinned_sample_cloned_after_pinning():
    return historic("pinned-sample-cloned", CloneAfterPinBuffer)
