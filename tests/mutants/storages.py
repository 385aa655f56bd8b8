"""Storages and writers of the field (issue 41): rows on disk, writers that
choose which rows to keep or keep none, and in-place edits. Each mutant is
the reference with one planted bug of a kind such buffers ship: stale data
from a reused directory, a length lost on reopen, a disk fault ignored or
half-applied, the wrong rows kept, a write let through, an edit that is
really a write.
"""

from __future__ import annotations

import os

import torch

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.max_value_writer import MaxValueWriter
from rbcheck.reference.memmap_storage import MANIFEST, MemmapStorage
from rbcheck.reference.writer import ImmutableWriter, RoundRobinWriter
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant

CALL_FOR_CALL = "test_memmap_storage::test_memmap_storage_matches_the_memory_reference_call_for_call"
REUSED = "test_memmap_storage::test_reused_scratch_dir_starts_empty_and_keeps_the_users_files"
FILE_FAULT = "test_memmap_faults::test_a_file_removed_or_truncated_under_the_storage_is_a_clear_error"
DISK_FULL = "test_memmap_faults::test_a_full_disk_is_a_clear_error"
TOP_K = "test_writers::test_max_value_writer_holds_the_top_k_of_everything_written"
IMMUTABLE = "test_writers::test_immutable_writer_refuses_every_write_and_nothing_changes"
EDIT = "test_edits::test_an_edit_changes_the_edited_rows_and_nothing_else"
EDIT_PAST = "test_edits::test_an_edit_past_the_held_length_is_refused_and_nothing_changes"


# -- rows on disk ---------------------------------------------------------------------------------


class AdoptingMemmapStorage(MemmapStorage):
    """pytorch/rl #2437: a new storage in a scratch directory a previous run
    left files in maps them instead of starting empty: the new buffer holds
    the previous run's rows (its writer starts at 0, so len is the old size)."""

    def __init__(self, capacity, directory, device="cpu", *, reopen=False):
        found = os.path.exists(os.path.join(directory, MANIFEST))
        super().__init__(capacity, directory, device, reopen=reopen or found)


@mutant(bug="a new memmap storage reads a previous run's rows from a reused directory",
        catches=(REUSED,), reproduces="pytorch/rl #2437")
def memmap_reads_previous_runs_rows():
    return historic("memmap-reads-previous-runs-rows", MemmapStorage=AdoptingMemmapStorage)


class LengthLosingMemmapStorage(MemmapStorage):
    """A reopen that maps the files but not what the manifest says about
    them: the length and write count start at 0 again (state lost on restore)."""

    def _reopen(self) -> None:
        super()._reopen()
        self.size, self.extra = 0, {"write_count": 0}


@mutant(bug="a reopen of a memmap storage loses the length", catches=(CALL_FOR_CALL, REUSED))
def memmap_reopen_loses_the_length():
    return adapter("memmap-reopen-loses-the-length", MemmapStorage=LengthLosingMemmapStorage)


class UncheckedMemmapStorage(MemmapStorage):
    """Never checks its files: writes through a removed file's mapping (lost
    with it) or past a truncated file's end, as if nothing happened."""

    def _check_files(self) -> None:
        pass


@mutant(bug="a memmap storage writes on after its file was removed or truncated", catches=(FILE_FAULT,))
def memmap_ignores_a_faulty_file():
    return adapter("memmap-ignores-a-faulty-file", MemmapStorage=UncheckedMemmapStorage)


class NoRollbackMemmapStorage(MemmapStorage):
    """Does not tell the buffer a write may fail: a write refused by the disk
    leaves the writer advanced, so len, cursor and write count count rows
    that were never stored."""

    on_disk = False


@mutant(bug="a write the disk refused still moves the writer", catches=(DISK_FULL,))
def failed_disk_write_moves_the_writer():
    return adapter("failed-disk-write-moves-the-writer", MemmapStorage=NoRollbackMemmapStorage)


# -- writers ----------------------------------------------------------------------------------------


class LastKWriter(MaxValueWriter):
    """Keeps the last ``capacity`` rows written (a ring), whatever their value."""

    def place(self, data) -> torch.Tensor:
        value, n = self.values(data), data.batch_size[0]
        rows = self.write_count + torch.arange(n)
        index = rows % self.capacity
        self.value[index], self.generation[index] = value, rows  # repeats: the last row wins
        self.write_count += n
        return index


@mutant(bug="a max-value writer keeps the last k rows instead of the top k", catches=(TOP_K,), in_process=True)
def max_value_writer_keeps_the_last_k():
    return adapter("max-value-writer-keeps-the-last-k", MaxValueWriter=LastKWriter)


class LaterTieWriter(MaxValueWriter):
    """Breaks ties toward the later-written row: an equal value evicts."""

    def place(self, data) -> torch.Tensor:
        value = self.values(data)
        nudged = data.clone()  # the same ranking with each new row a hair above its equals
        nudged.set(self.value_key, torch.nextafter(value, torch.tensor(float("inf"), dtype=torch.float64)))
        index = super().place(nudged)
        kept = index >= 0
        self.value[index[kept]] = value[kept]
        return index


@mutant(bug="a max-value writer breaks ties toward the later-written row", catches=(TOP_K,), in_process=True)
def max_value_writer_breaks_ties_the_wrong_way():
    return adapter("max-value-writer-breaks-ties-the-wrong-way", MaxValueWriter=LaterTieWriter)


class WritingImmutableWriter(ImmutableWriter):
    """Takes writes and edits like a round-robin writer, silently."""

    next_indices = RoundRobinWriter.next_indices

    def check_edit(self, index, rows) -> None:
        pass


@mutant(bug="an immutable writer silently writes", catches=(IMMUTABLE,))
def immutable_writer_writes():
    return adapter("immutable-writer-writes", ImmutableWriter=WritingImmutableWriter)


# -- edits ------------------------------------------------------------------------------------------


class EditAsWriteBuffer(ReplayBuffer):
    """An edit routed through the writer: the rows land in the slots asked
    for, but the cursor, the write count and the generations move as for a
    write."""

    def set(self, index, rows) -> None:
        super().set(index, rows)
        self.writer.next_indices(len(torch.as_tensor(index).reshape(-1)))


@mutant(bug="an edit moves the cursor and the write count", catches=(EDIT,), in_process=True)
def edit_moves_the_cursor():
    return adapter("edit-moves-the-cursor", EditAsWriteBuffer)


class EditResetsPriorityBuffer(ReplayBuffer):
    """An edit that gives the edited rows a new row's priority, as a write does."""

    def set(self, index, rows) -> None:
        super().set(index, rows)
        self.sampler.on_write(torch.as_tensor(index).reshape(-1), None)


@mutant(bug="an edit resets the edited rows' priorities", catches=(EDIT,), in_process=True)
def edit_resets_the_priority():
    return adapter("edit-resets-the-priority", EditResetsPriorityBuffer)


class EditPastLengthBuffer(ReplayBuffer):
    """Checks an edit's slots against the capacity, not the held length: an
    edit past the end writes there and the buffer grows."""

    def set(self, index, rows) -> None:
        self.storage.set(index, rows)


@mutant(bug="an edit past the held length is taken and grows the buffer", catches=(EDIT_PAST,), in_process=True)
def edit_past_the_length_is_taken():
    return adapter("edit-past-the-length-is-taken", EditPastLengthBuffer)
