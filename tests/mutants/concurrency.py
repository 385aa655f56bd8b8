"""Concurrency: shared buffers with one race each, as it occurs in real code:
no sleep is planted in a race window, so a property catches a race only if
the threads interleave there on their own (the runs make many such windows:
samplers go on while the writers write, and a run saves up to MAX_SAVES
times). Caught by
``rbcheck/conformance/test_concurrency.py``; the control is the reference
behind one lock (``reference-locked``), see
tests/meta/test_concurrent_mutants_caught.py.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import reference_adapter
from rbcheck.harness.concurrency import LockedBuffer, locked
from rbcheck.harness.protocol import CAPABILITIES
from rbcheck.reference.arguments import last_occurrence
from rbcheck.reference.checkpoint import save_checkpoint
from tests.mutants.registry import mutant


def _locked(name: str, buffer_cls: type) -> object:
    return locked(reference_adapter(), f"mutant-{name}", buffer_cls)


class PayloadAfterPublishBuffer(LockedBuffer):
    """``extend`` makes the rows visible (slots reserved, size, tags, sampler)
    under the lock, then copies the rest of each row in a second step: a
    sampler in between reads new tags with the old payload."""

    PUBLISHED = ("writer", "seq")

    def extend(self, data):
        rb = self.inner.buffer
        storage = rb.storage
        with self.lock:
            if storage.data is None:  # the first write allocates: whole, under the lock
                return rb.extend(data)
            storage.check(data)
            index = rb.writer.next_indices(data.batch_size[0])
            keep = last_occurrence(index, storage.capacity)
            for key in self.PUBLISHED:
                storage.data.get(key)[index[keep]] = data.get(key)[keep]
            storage.size = max(storage.size, int(index.max()) + 1)
            rb.sampler.on_write(index, None)
        with self.lock:
            for key in data.keys():
                if key not in self.PUBLISHED:
                    storage.data.get(key)[index[keep]] = data.get(key)[keep]
        return index


@mutant(bug="a row visible to samplers before its payload is written",
        catches=("test_concurrency::test_concurrent_samples_never_see_a_torn_row",),
        kind="concurrency")
def row_published_before_payload():
    return _locked("row-published-before-payload", PayloadAfterPublishBuffer)


class UnlockedReservationBuffer(LockedBuffer):
    """``extend`` reads the write count (where its rows go) before taking the
    lock: two writers reserve the same slots, one batch is lost and the write
    count falls short."""

    def extend(self, data):
        rb = self.inner.buffer
        start = rb.writer.write_count
        with self.lock:
            rb.writer.write_count = start
            return rb.extend(data)


@mutant(bug="two writers reserving the same slots (a lost batch)",
        catches=("test_concurrency::test_concurrent_writes_lose_and_duplicate_nothing",),
        kind="concurrency")
def slots_reserved_outside_lock():
    return _locked("slots-reserved-outside-lock", UnlockedReservationBuffer)


@mutant(bug="a buffer that is not thread-safe declared concurrent",
        catches=("test_concurrency::test_concurrent_writes_lose_and_duplicate_nothing",
                 "test_concurrency::test_concurrent_samples_never_see_a_torn_row"),
        kind="concurrency")
def unlocked_buffer():
    """The plain reference (not thread-safe, no lock) declared ``concurrent``,
    as it is: two writers that read the same write count before either
    advances it reserve the same slots, and a sampler can read a row a
    writer is half-way through."""
    return replace(reference_adapter(), name="mutant-unlocked-buffer", capabilities=CAPABILITIES)


class NoGenerationCheckBuffer(LockedBuffer):
    """``update_priority`` drops the generation: an update for a slot's
    previous occupant lands on the new one."""

    def update_priority(self, index, priority, generation=None):
        with self.lock:
            self.inner.update_priority(index, priority)


@mutant(bug="a priority update racing an overwrite lands on the new occupant",
        catches=("test_concurrency::test_concurrent_stale_updates_never_land_on_the_new_occupant",),
        kind="concurrency")
def update_without_generation_check():
    return _locked("update-without-generation-check", NoGenerationCheckBuffer)


class GeneratorPerThreadBuffer(LockedBuffer):
    """Each thread samples with its own generator, all seeded with the
    buffer's seed (like worker processes forked with one RNG state): every
    sampler draws the same stream."""

    def __init__(self, inner):
        super().__init__(inner)
        self.local = threading.local()

    def sample(self, batch_size=None):
        if not hasattr(self.local, "generator"):
            self.local.generator = torch.Generator().manual_seed(self.inner.spec.seed)
        with self.lock:
            rb = self.inner.buffer
            own, rb.generator = rb.generator, self.local.generator
            try:
                return rb.sample(batch_size)
            finally:
                rb.generator = own


@mutant(bug="concurrent samplers drawing copies of one random stream",
        catches=("test_concurrency::test_concurrent_sampling_matches_closed_form",),
        kind="concurrency")
def samplers_share_one_seed():
    return _locked("samplers-share-one-seed", GeneratorPerThreadBuffer)


class WriterFirstSaveBuffer(LockedBuffer):
    """``save`` reads the writer's state (cursor, write count) without the
    lock, as a cheap counter read, then takes the lock for the rest: a write
    that holds the lock meanwhile ends up in the rows but not in the writer's
    state, and the checkpoint mixes two moments of the buffer."""

    def save(self, path):
        rb = self.inner.buffer
        writer = rb.writer.state_dict()
        with self.lock:
            state = rb.state_dict()
        state["writer"] = writer
        save_checkpoint(SimpleNamespace(state_dict=lambda: state), path)


@mutant(bug="a checkpoint taken during writes that mixes two moments",
        catches=("test_concurrency::test_checkpoint_taken_during_writes_is_a_consistent_snapshot",),
        kind="concurrency")
def checkpoint_mixes_two_moments():
    return _locked("checkpoint-mixes-two-moments", WriterFirstSaveBuffer)


#: The per-call bound the hanging mutant declares (seconds): it promises every
#: call returns within this, so its hang is found without waiting for TIMEOUT_S.
HANG_BOUND_S = 0.5


class BlocksWhenFullBuffer(LockedBuffer):
    """``extend`` follows a blocking queue's rule: a batch that would
    overwrite rows waits, outside the lock, for room that nothing ever makes.
    Once the writers have written ``capacity`` rows, the next extend never
    returns (until the buffer is closed). Declares ``call_timeout_s``."""

    call_timeout_s = HANG_BOUND_S

    def __init__(self, inner):
        super().__init__(inner)
        self.closed = threading.Event()

    def extend(self, data):
        with self.lock:
            full = self.inner.write_count + data.batch_size[0] > self.inner.spec.capacity
            if not full:
                return self.inner.extend(data)
        self.closed.wait()  # room never comes
        raise RuntimeError("buffer closed while extend waited for room")

    def close(self) -> None:
        self.closed.set()


@mutant(bug="a writer's extend that never returns (a hang)",
        catches=("test_concurrency::test_concurrent_writes_lose_and_duplicate_nothing",),
        kind="concurrency")
def extend_waits_forever_when_full():
    return _locked("extend-waits-forever-when-full", BlocksWhenFullBuffer)
