"""Checkpoints: save -> load round-trips exactly in plain JSON and no pickle, a
refused or damaged load changes nothing, a save is atomic and leaves the
user's files alone, a chain of checkpoints matches no checkpoint at all.
"""

from __future__ import annotations

import copy

import json
import os
from pathlib import Path

import torch

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.storage import TensorStorage
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant


class TensorsInJsonBuffer(ReplayBuffer):
    """Also dumps its state as JSON with ``default=repr``: tensors end up as
    strings like ``"tensor([...])"`` in the metadata."""

    def dumps(self, path) -> None:
        super().dumps(path)
        (Path(path) / "state.json").write_text(json.dumps(self.state_dict(), default=repr))


@mutant(bug="tensors left in JSON metadata",
        catches=("test_checkpoint_roundtrip::test_checkpoint_metadata_is_plain_json",))
def tensors_in_json_metadata():
    return adapter("tensors-in-json-metadata", TensorsInJsonBuffer)


class PickledRngBuffer(ReplayBuffer):
    """Keeps the generator state in a ``torch.save`` file (a pickle in a zip)."""

    def dumps(self, path) -> None:
        super().dumps(path)
        torch.save(self.generator.get_state(), Path(path) / "rng.pt")

    def loads(self, path) -> None:
        super().loads(path)
        self.generator.set_state(torch.load(Path(path) / "rng.pt"))


@mutant(bug="a pickle (torch.save) in the checkpoint",
        catches=("test_checkpoint_roundtrip::test_checkpoint_holds_no_pickle",))
def pickled_rng_state():
    return adapter("pickled-rng-state", PickledRngBuffer)


class IntMaxPrioritySampler(PrioritizedSampler):
    """Writes an integral max priority as a JSON int and loads it back as is:
    ``max_priority`` comes back an ``int`` after save -> load."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        mp = state["max_priority"]
        state["max_priority"] = int(mp) if float(mp).is_integer() else mp
        return state

    def load_state_dict(self, state: dict) -> None:
        mp = state["max_priority"]
        super().load_state_dict({**state, "max_priority": float(mp)})
        self.max_priority = mp


@mutant(bug="metadata that round-trips into different types",
        catches=("test_checkpoint_roundtrip::test_checkpoint_metadata_is_plain_json",
                 "test_checkpoint_roundtrip::test_save_load_round_trips_exactly"))
def metadata_changes_types():
    return adapter("metadata-changes-types", PrioritizedSampler=IntMaxPrioritySampler)


class Float32OnLoadStorage(TensorStorage):
    """Loads every floating column as float32 (a dtype "normalisation")."""

    def load_state_dict(self, state: dict, size: int) -> None:
        columns = [c.to(torch.float32) if c.is_floating_point() else c for c in state["columns"]]
        self.data = None  # skip the layout check against the old allocation
        super().load_state_dict({**state, "columns": columns}, size)


@mutant(bug="a load that changes dtypes",
        catches=("test_checkpoint_roundtrip::test_save_load_round_trips_exactly",
                 "test_checkpoint_roundtrip::test_checkpoint_metadata_is_plain_json"))
def load_changes_dtypes():
    return adapter("load-changes-dtypes", TensorStorage=Float32OnLoadStorage)


class SaveInPlaceBuffer(ReplayBuffer):
    """Deletes the old checkpoint, then writes the new one: a save that dies in
    between leaves nothing loadable."""

    def dumps(self, path) -> None:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        super().dumps(path)


@mutant(bug="a save that deletes the old checkpoint before writing the new one",
        catches=("test_checkpoint_faults::test_interrupted_save_leaves_a_loadable_checkpoint",))
def save_not_atomic():
    return adapter("save-not-atomic", SaveInPlaceBuffer)


class ForkUnsafeSaveBuffer(ReplayBuffer):
    """Saves only from the process that made it (as a buffer whose save
    goes through a helper thread or handle that a fork does not carry), and
    raises anywhere else: the interrupted-save property, which saves from
    a forked child, must not count that raise as an interruption."""

    def __init__(self, capacity=None, **kwargs):
        super().__init__(capacity, **kwargs)
        self.owner_pid = os.getpid()

    def dumps(self, path) -> None:
        if os.getpid() != self.owner_pid:
            raise RuntimeError(f"save from pid {os.getpid()}: only pid {self.owner_pid} can save")
        super().dumps(path)


@mutant(bug="a save that fails on its own, taken for an interrupted one",
        catches=("test_checkpoint_faults::test_interrupted_save_leaves_a_loadable_checkpoint",))
def save_fails_in_a_forked_process():
    return adapter("save-fails-in-a-forked-process", ForkUnsafeSaveBuffer)


class ClearThenLoadBuffer(ReplayBuffer):
    """Empties itself before reading the checkpoint: a refused load leaves the
    buffer changed."""

    def loads(self, path) -> None:
        self.writer.cursor, self.writer.write_count = 0, 0
        super().loads(path)


@mutant(bug="a refused load that leaves the buffer changed",
        catches=("test_checkpoint_faults::test_damaged_checkpoint_is_refused_and_nothing_changes",))
def refused_load_changes_buffer():
    return adapter("refused-load-changes-buffer", ClearThenLoadBuffer)


class UnpicklingLoadBuffer(ReplayBuffer):
    """Also restores any ``*.pkl`` found in the checkpoint with pickle (as a
    prefetch queue might be): a crafted file runs code on load."""

    def loads(self, path) -> None:
        import pickle

        for extra in sorted(Path(path).rglob("*.pkl")):
            with open(extra, "rb") as handle:
                pickle.load(handle)  # noqa: S301 - the planted bug
        super().loads(path)


@mutant(bug="a load that unpickles a file of the checkpoint",
        catches=("test_checkpoint_faults::test_damaged_checkpoint_is_refused_and_nothing_changes",))
def load_unpickles():
    return adapter("load-unpickles", UnpicklingLoadBuffer)


class QuietMissingLoadBuffer(ReplayBuffer):
    """Loading from a missing or empty directory does nothing, silently."""

    def loads(self, path) -> None:
        path = Path(path)
        if not path.is_dir() or not any(path.iterdir()):
            return
        super().loads(path)


@mutant(bug="a load from a missing or empty directory that does nothing",
        catches=("test_checkpoint_faults::test_missing_or_empty_directory_is_refused",))
def missing_checkpoint_ignored():
    return adapter("missing-checkpoint-ignored", QuietMissingLoadBuffer)


class MisfitLoadBuffer(ReplayBuffer):
    """Swallows the error of a checkpoint made for another buffer."""

    def loads(self, path) -> None:
        from rbcheck.reference import CheckpointError

        try:
            super().loads(path)
        except CheckpointError as error:
            if "does not fit" not in str(error):
                raise


@mutant(bug="a checkpoint made for another buffer silently ignored",
        catches=("test_checkpoint_faults::test_checkpoint_that_does_not_fit_is_refused",))
def misfit_checkpoint_ignored():
    return adapter("misfit-checkpoint-ignored", MisfitLoadBuffer)


class TensorMetadataBuffer(ReplayBuffer):
    """pytorch/rl #3055 (#3056): the prioritized sampler's metadata (its max
    priority, kept as a 0-d tensor) is written with ``json.dump``, which
    cannot encode a tensor: the save fails."""

    def dumps(self, path) -> None:
        meta = {"sampler": {k: v for k, v in self.sampler.state_dict().items() if "tree" not in k}}
        if "max_priority" in meta["sampler"]:
            meta["sampler"]["max_priority"] = torch.tensor(meta["sampler"]["max_priority"])
        Path(path).mkdir(parents=True, exist_ok=True)
        json.dumps(meta)  # TypeError: Object of type Tensor is not JSON serializable
        super().dumps(path)


@mutant(bug="sampler metadata that JSON cannot encode",
        catches=("test_checkpoint_chain::test_save_load_chain_and_carrying_on_match_no_checkpoint",),
        reproduces="pytorch/rl #3055 (#3056)")
def sampler_metadata_not_json_encodable():
    return historic("sampler-metadata-not-json", TensorMetadataBuffer)


class FirstPathBuffer(ReplayBuffer):
    """pytorch/rl PR #4388: the checkpointer remembers the first path it
    saved to; a second checkpoint at a new path is written over the first
    one, and the new path holds nothing to load."""

    def dumps(self, path) -> None:
        self._first_path = getattr(self, "_first_path", None) or Path(path)
        Path(path).mkdir(parents=True, exist_ok=True)
        super().dumps(self._first_path)


@mutant(bug="a second checkpoint at a new path fails",
        catches=("test_checkpoint_chain::test_save_load_chain_and_carrying_on_match_no_checkpoint",),
        reproduces="pytorch/rl PR #4388")
def second_checkpoint_at_new_path_lost():
    return historic("second-checkpoint-at-new-path", FirstPathBuffer)


class FullFlagLostBuffer(ReplayBuffer):
    """AI4Finance-Foundation/ElegantRL PR #299: the "full" flag is not
    restored by a load: a wrapped buffer comes back with len == cursor."""

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.writer.write_count > self.capacity:
            self.storage.size = self.writer.cursor


@mutant(bug="the full flag not restored by a load",
        catches=("test_checkpoint_roundtrip::test_save_load_round_trips_exactly",
                 "test_checkpoint_chain::test_save_load_chain_and_carrying_on_match_no_checkpoint"),
        reproduces="AI4Finance-Foundation/ElegantRL PR #299")
def full_flag_not_restored():
    return historic("full-flag-not-restored", FullFlagLostBuffer)


class TopLevelOnlyStorage(TensorStorage):
    """thu-ml/tianshou #728: a field is missing after load: nested keys are
    not written to the checkpoint."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        kept = [i for i, k in enumerate(state["keys"]) if len(k) == 1]
        return {**state, "keys": [state["keys"][i] for i in kept],
                "columns": [state["columns"][i] for i in kept]}

    def load_state_dict(self, state: dict, size: int) -> None:
        self.data = None  # the fields it knows are the ones it saved
        super().load_state_dict(state, size)


@mutant(bug="a field missing after load",
        catches=("test_checkpoint_roundtrip::test_save_load_round_trips_exactly",
                 "test_checkpoint_chain::test_save_load_chain_and_carrying_on_match_no_checkpoint"),
        reproduces="thu-ml/tianshou #728")
def nested_field_missing_after_load():
    return historic("nested-field-missing-after-load", TensorStorage=TopLevelOnlyStorage)


class LoadIntoHeldRowsStorage(TensorStorage):
    """rbcheck's own ``device`` variant before its fix (issue 12): a load
    copies the checkpoint into the rows the storage already holds, which a
    shallow copy shares with the live buffer: a load refused later (the
    sampler differs) leaves the checkpoint's rows in the live buffer."""

    def load_state_dict(self, state: dict, size: int) -> None:
        held = self.data
        super().load_state_dict(state, size)
        if held is not None and self.data is not None and set(held.keys(True, True)) == set(
                self.data.keys(True, True)):
            held.update_(self.data)  # into the held (shared) memory
            self.data = held


class StorageFirstLoadBuffer(ReplayBuffer):
    """The device variant's load order at the time (issue 12): the rows were
    loaded (into a staged copy of the storage) before the sampler's state was
    checked. The reference now loads its storage last, so the bug needs both
    halves: this order and a storage that writes into held rows."""

    def load_state_dict(self, state: dict) -> None:
        size = min(int(state["writer"]["write_count"]), self.capacity)
        copy.copy(self.storage).load_state_dict(state["storage"], size)
        super().load_state_dict(state)


@mutant(bug="a refused load writes the checkpoint into live rows",
        catches=("test_checkpoint_faults::test_checkpoint_that_does_not_fit_is_refused",),
        reproduces="rbcheck issue 12 (the device variant's data loss)")
def refused_load_writes_into_held_rows():
    return historic("refused-load-writes-into-held-rows", StorageFirstLoadBuffer,
                    TensorStorage=LoadIntoHeldRowsStorage)


class RngFirstLoadBuffer(ReplayBuffer):
    """A load that takes the checkpoint's generator state first, then checks
    the rest: a refused load leaves the buffer drawing the checkpoint's
    stream (length, cursor, rows and priorities untouched)."""

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        super().load_state_dict(state)


@mutant(bug="a refused load that replaced the generator state",
        catches=("test_checkpoint_faults::test_checkpoint_that_does_not_fit_is_refused",))
def rng_set_by_refused_load():
    return adapter("rng-set-by-refused-load", RngFirstLoadBuffer)


class GenerationsFirstLoadBuffer(ReplayBuffer):
    """A load that sets the per-slot write generations from the checkpoint's
    write count first, then checks the rest: a refused load leaves the
    buffer's slots with the checkpoint's generations (length, cursor, write
    count, rows and priorities untouched)."""

    def load_state_dict(self, state: dict) -> None:
        from rbcheck.reference.writer import ring_generation

        count = int(state["writer"]["write_count"])
        self.writer.generation = ring_generation(torch.arange(self.capacity), count, self.capacity)
        super().load_state_dict(state)


@mutant(bug="a refused load that replaced the write generations",
        catches=("test_checkpoint_faults::test_checkpoint_that_does_not_fit_is_refused",))
def generations_set_by_refused_load():
    return adapter("generations-set-by-refused-load", GenerationsFirstLoadBuffer)


class CleanupTakesEveryCkptBuffer(ReplayBuffer):
    """Cleans up after a save as rbcheck's reference did before issue 17:
    ``rmtree`` on every ``ckpt-*`` entry but the live one and ``unlink`` of
    ``CURRENT.tmp``, so the user's ``ckpt-1000/`` and ``ckpt-best/`` in the
    same directory are deleted."""

    def dumps(self, path) -> None:
        import re
        import shutil

        super().dumps(path)
        path = Path(path)
        live = (path / "CURRENT").read_text().strip()
        (path / "CURRENT.tmp").unlink(missing_ok=True)
        for old in path.glob("ckpt-*"):
            if old.name != live and re.fullmatch(r"ckpt-[A-Za-z0-9_]+", old.name):
                shutil.rmtree(old, ignore_errors=True)


@mutant(bug="a save that deletes the user's files beside the checkpoint",
        catches=("test_checkpoint_user_files::test_saving_into_a_directory_with_the_users_files_leaves_them_byte_identical",))
def save_deletes_the_users_ckpt_dirs():
    return adapter("save-deletes-the-users-ckpt-dirs", CleanupTakesEveryCkptBuffer)


class MeaningUncheckedBuffer(ReplayBuffer):
    """rbcheck before issue 39 (item 6): ``loads`` checked the files (checksum,
    sha256, format) and the state against the buffer, but not the state's
    meaning: a re-sealed checkpoint of a full buffer said to hold 3 rows loaded,
    and every sample raised after; unknown keys were ignored."""

    def loads(self, path) -> None:  # reference.checkpoint.load_checkpoint without check_meaning
        from rbcheck.reference.checkpoint import CheckpointError, read_checkpoint

        state = read_checkpoint(path)
        try:
            self.load_state_dict(state)
        except ValueError as error:
            raise CheckpointError(f"checkpoint at {str(path)!r} does not fit this buffer: {error}") from error


@mutant(bug="a re-sealed checkpoint that contradicts itself loaded",
        catches=("test_checkpoint_faults::test_resealed_contradiction_is_refused_and_nothing_changes",))
def loads_skips_the_meaning_checks():
    return adapter("loads-skips-the-meaning-checks", MeaningUncheckedBuffer)


class PointerTakenForOwnBuffer(ReplayBuffer):
    """rbcheck before issue 39 (item 7): any ``ckpt-[A-Za-z0-9_]+`` in
    ``CURRENT`` was taken for a checkpoint of its own, and the next save removed
    the sub-directory it named once that held only ``meta.json`` and
    ``tensors.safetensors``: the user's ``ckpt-best/`` (a copy of a checkpoint)."""

    def dumps(self, path) -> None:
        import re
        import shutil

        from rbcheck.reference.checkpoint import _is_checkpoint_dir

        path, named = Path(path), None
        if (path / "CURRENT").is_file():
            name = (path / "CURRENT").read_text().strip()
            if re.fullmatch(r"ckpt-[A-Za-z0-9_]+", name):
                named = path / name
                (path / "CURRENT").unlink()  # past today's pointer check, as before the fix
        super().dumps(path)
        if named is not None and _is_checkpoint_dir(named):
            shutil.rmtree(named)


@mutant(bug="a save that deletes the user's directory CURRENT named",
        catches=("test_checkpoint_user_files::test_saving_never_deletes_the_directory_a_pointer_names",))
def save_deletes_the_directory_current_named():
    return adapter("save-deletes-the-directory-current-named", PointerTakenForOwnBuffer)
