"""Deliberately broken adapters: each one plants one bug class in a copy of
the reference, and the conformance suite must catch it.

Run one by hand with::

    python -m pytest rbcheck/conformance --impl rbcheck.harness.mutants:<factory>

Every mutant is built from the reference (a subclass of
``reference.ReplayBuffer`` or of one of its components) through
``rbcheck.harness.adapters.reference.buffer_adapter``, so it differs from the
reference in exactly one place. :data:`MUTANTS` lists each factory with the
bug class it plants and the conformance tests expected to catch it.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import CAPABILITIES
from rbcheck.reference import pinning
from rbcheck.reference.arguments import check_int
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.policy import place_policy as reference_place_policy
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.random_sampler import RandomSampler
from rbcheck.reference.slice_sampler import SliceSampler
from rbcheck.reference.storage import TensorStorage
from rbcheck.reference.sum_tree import SumTree
from rbcheck.reference.writer import RoundRobinWriter


def _place_policy(policy, device, allow_in_place=True):
    return reference_place_policy(policy, device, allow_in_place)


def _adapter(name: str, buffer_cls=ReplayBuffer, *, place_policy=_place_policy,
             conventions=None, prefix: str = "mutant", **components) -> object:
    return buffer_adapter(
        f"{prefix}-{name}", "0", buffer_cls, CAPABILITIES,
        components=SimpleNamespace(**components), place_policy=place_policy,
        pin_module="rbcheck.reference.pinning", conventions=conventions,
    )


def _with_writer(writer_cls: type) -> type:
    """The reference buffer with ``writer_cls`` in place of its writer."""

    class Buffer(ReplayBuffer):
        def __init__(self, capacity=None, **kwargs):
            super().__init__(capacity, **kwargs)
            self.writer = writer_cls(self.capacity)

    Buffer.__qualname__ = Buffer.__name__ = f"{writer_cls.__name__}Buffer"
    return Buffer


# --------------------------------------------------------------------------
# 1. checkpoints
# --------------------------------------------------------------------------


class TensorsInJsonBuffer(ReplayBuffer):
    """Also dumps its state as JSON with ``default=repr``: tensors end up as
    strings like ``"tensor([...])"`` in the metadata."""

    def dumps(self, path) -> None:
        super().dumps(path)
        (Path(path) / "state.json").write_text(json.dumps(self.state_dict(), default=repr))


def tensors_in_json_metadata():
    return _adapter("tensors-in-json-metadata", TensorsInJsonBuffer)


class PickledRngBuffer(ReplayBuffer):
    """Keeps the generator state in a ``torch.save`` file (a pickle in a zip)."""

    def dumps(self, path) -> None:
        super().dumps(path)
        torch.save(self.generator.get_state(), Path(path) / "rng.pt")

    def loads(self, path) -> None:
        super().loads(path)
        self.generator.set_state(torch.load(Path(path) / "rng.pt"))


def pickled_rng_state():
    return _adapter("pickled-rng-state", PickledRngBuffer)


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


def metadata_changes_types():
    return _adapter("metadata-changes-types", PrioritizedSampler=IntMaxPrioritySampler)


class Float32OnLoadStorage(TensorStorage):
    """Loads every floating column as float32 (a dtype "normalisation")."""

    def load_state_dict(self, state: dict, size: int) -> None:
        columns = [c.to(torch.float32) if c.is_floating_point() else c for c in state["columns"]]
        self.data = None  # skip the layout check against the old allocation
        super().load_state_dict({**state, "columns": columns}, size)


def load_changes_dtypes():
    return _adapter("load-changes-dtypes", TensorStorage=Float32OnLoadStorage)


# --------------------------------------------------------------------------
# 2. priorities
# --------------------------------------------------------------------------


class TwiceOnWriteSampler(PrioritizedSampler):
    """Transforms a new row's priority before handing it to ``_store``, which
    transforms it again: ``((p + eps) ** alpha + eps) ** alpha``."""

    def on_write(self, index, priority=None) -> None:
        n = len(torch.as_tensor(index))
        raw = (
            torch.full((n,), self.max_priority, dtype=torch.float64)
            if priority is None
            else self.check_priority(priority, n)
        )
        super().on_write(index, (raw + self.eps) ** self.alpha)


def priority_transformed_twice_on_add():
    return _adapter("priority-transformed-twice-on-add", PrioritizedSampler=TwiceOnWriteSampler)


class BatchNormalisedWeightsSampler(PrioritizedSampler):
    """Normalises the weights by the batch's largest weight instead of the
    buffer's smallest probability."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        total = self.sum_tree.total()
        p = self.sum_tree.leaf(info["index"]) / total
        w = (len(storage) * p) ** -self.beta
        info["weight"] = (w / w.max()).to(torch.float32)
        return info


def weights_normalised_over_batch():
    return _adapter(
        "weights-normalised-over-batch", PrioritizedSampler=BatchNormalisedWeightsSampler
    )


class StaleUpdateBuffer(ReplayBuffer):
    """Applies every priority update, even to slots overwritten since sampled."""

    def update_priority(self, index, priority, generation=None) -> None:
        super().update_priority(index, priority, generation=None)


def update_applied_to_overwritten_slot():
    return _adapter("update-applied-to-overwritten-slot", StaleUpdateBuffer)


# --------------------------------------------------------------------------
# 3. pinning
# --------------------------------------------------------------------------


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


def pinning_skipped_for_device_none():
    return _adapter("pinning-skipped-for-device-none", SkipPinForDeviceNoneBuffer)


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


def info_keys_added_after_pinning():
    return _adapter("info-keys-added-after-pinning", InfoAfterPinBuffer)


class NoAcceleratorCheckBuffer(ReplayBuffer):
    """Accepts pin_memory=True without an accelerator and quietly ignores it."""

    def __init__(self, capacity=None, *, pin_memory=False, **kwargs):
        super().__init__(capacity, pin_memory=False, **kwargs)


def pin_memory_silently_ignored():
    return _adapter("pin-memory-silently-ignored", NoAcceleratorCheckBuffer)


# --------------------------------------------------------------------------
# 4. policies
# --------------------------------------------------------------------------


def _raw_deepcopy_place_policy(policy, device, allow_in_place=True):
    """Copies whenever a copy is asked for, with no guard around deepcopy."""
    if allow_in_place:
        return policy
    clone = copy.deepcopy(policy)
    return clone.to(device) if isinstance(clone, torch.nn.Module) else clone


def raw_deepcopy_policy():
    return _adapter("raw-deepcopy-policy", place_policy=_raw_deepcopy_place_policy)


# --------------------------------------------------------------------------
# 5. slices and the ring
# --------------------------------------------------------------------------


class BoundaryBlindSliceSampler(SliceSampler):
    """Picks slice starts uniformly over the whole ring (write order),
    ignoring where episodes end."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, _, _ = self.trajectories(storage, cursor)
        size = len(order)
        span = max(size - slice_len, 0) + 1
        first = torch.floor(
            torch.rand(num_slices, generator=generator, dtype=torch.float64) * span
        ).long()
        rows = min(slice_len, size)
        position = torch.cat([torch.arange(f, f + rows) for f in first.tolist()])
        return {"index": order[position], "traj": torch.zeros(len(position), dtype=torch.long)}


def slice_crosses_episode_boundary():
    return _adapter("slice-crosses-episode-boundary", SliceSampler=BoundaryBlindSliceSampler)


class OffByOneWriter(RoundRobinWriter):
    """Once the ring is full, overwrites from slot 1 instead of slot 0."""

    def next_indices(self, n: int) -> torch.Tensor:
        index = super().next_indices(n)
        rows = self.write_count - n + torch.arange(n)
        wrapped = rows >= self.capacity
        shifted = torch.where(wrapped, (rows + 1) % self.capacity, index)
        self.generation[shifted] = rows
        self.cursor = (self.write_count + (self.write_count >= self.capacity)) % self.capacity
        return shifted


def ring_eviction_off_by_one():
    return _adapter("ring-eviction-off-by-one", _with_writer(OffByOneWriter))


# --------------------------------------------------------------------------
# 6. bad input and checkpoint faults
# --------------------------------------------------------------------------


class NoPriorityCheckSampler(PrioritizedSampler):
    """Takes any priority as float64, NaN, infinite and negative included."""

    def check_priority(self, priority, n: int) -> torch.Tensor:
        return torch.as_tensor(priority).detach().to(torch.float64).reshape(n)


def bad_priority_accepted():
    return _adapter("bad-priority-accepted", PrioritizedSampler=NoPriorityCheckSampler)


class CursorFirstBuffer(ReplayBuffer):
    """Has moved the writer's cursor when a batch is refused (the check runs
    after the writer, as in buffers that validate while writing)."""

    def extend(self, data):
        try:
            return super().extend(data)
        except (ValueError, TypeError):
            self.writer.next_indices(1)
            raise


def extend_moves_cursor_before_checking():
    return _adapter("extend-moves-cursor-before-checking", CursorFirstBuffer)


class SaveInPlaceBuffer(ReplayBuffer):
    """Deletes the old checkpoint, then writes the new one: a save that dies in
    between leaves nothing loadable."""

    def dumps(self, path) -> None:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        super().dumps(path)


def save_not_atomic():
    return _adapter("save-not-atomic", SaveInPlaceBuffer)


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


def save_fails_in_a_forked_process():
    return _adapter("save-fails-in-a-forked-process", ForkUnsafeSaveBuffer)


class ClearThenLoadBuffer(ReplayBuffer):
    """Empties itself before reading the checkpoint: a refused load leaves the
    buffer changed."""

    def loads(self, path) -> None:
        self.writer.cursor, self.writer.write_count = 0, 0
        super().loads(path)


def refused_load_changes_buffer():
    return _adapter("refused-load-changes-buffer", ClearThenLoadBuffer)


class UnpicklingLoadBuffer(ReplayBuffer):
    """Also restores any ``*.pkl`` found in the checkpoint with pickle (as a
    prefetch queue might be): a crafted file runs code on load."""

    def loads(self, path) -> None:
        import pickle

        for extra in sorted(Path(path).rglob("*.pkl")):
            with open(extra, "rb") as handle:
                pickle.load(handle)  # noqa: S301 - the planted bug
        super().loads(path)


def load_unpickles():
    return _adapter("load-unpickles", UnpicklingLoadBuffer)


# --------------------------------------------------------------------------
# 7. one mutant for every remaining property
# --------------------------------------------------------------------------


class NoParamCheckSampler(PrioritizedSampler):
    """Stores alpha, beta and eps without checking them."""

    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, 0.5, 0.5, 1e-8)
        self.alpha, self.beta, self.eps = alpha, beta, eps


def bad_parameters_accepted():
    return _adapter("bad-parameters-accepted", PrioritizedSampler=NoParamCheckSampler)


class QuietMissingLoadBuffer(ReplayBuffer):
    """Loading from a missing or empty directory does nothing, silently."""

    def loads(self, path) -> None:
        path = Path(path)
        if not path.is_dir() or not any(path.iterdir()):
            return
        super().loads(path)


def missing_checkpoint_ignored():
    return _adapter("missing-checkpoint-ignored", QuietMissingLoadBuffer)


class MisfitLoadBuffer(ReplayBuffer):
    """Swallows the error of a checkpoint made for another buffer."""

    def loads(self, path) -> None:
        from rbcheck.reference import CheckpointError

        try:
            super().loads(path)
        except CheckpointError as error:
            if "does not fit" not in str(error):
                raise


def misfit_checkpoint_ignored():
    return _adapter("misfit-checkpoint-ignored", MisfitLoadBuffer)


class TwiceOnUpdateSampler(PrioritizedSampler):
    """Transforms updated priorities before ``_store`` transforms them again."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        raw = self.check_priority(priority, len(torch.as_tensor(index)))
        super().update_priority(index, (raw + self.eps) ** self.alpha, generation, current_generation)


def priority_transformed_twice_on_update():
    return _adapter("priority-transformed-twice-on-update", PrioritizedSampler=TwiceOnUpdateSampler)


def _flipped(t):
    return None if t is None else torch.as_tensor(t).flip(0)


class FirstWriteWinsSampler(PrioritizedSampler):
    """Applies an update's entries in reverse order: with a repeated index the
    first priority given wins instead of the last."""

    def update_priority(self, index, priority, generation=None, current_generation=None) -> None:
        index = torch.as_tensor(index).flip(0)
        priority = torch.as_tensor(priority).flip(0)
        super().update_priority(index, priority, _flipped(generation), _flipped(current_generation))


def update_first_write_wins():
    return _adapter("update-first-write-wins", PrioritizedSampler=FirstWriteWinsSampler)


class NeverLastRandomSampler(RandomSampler):
    """Never draws the last valid slot."""

    def indices_from_uniforms(self, u, size):
        return torch.floor(u * max(size - 1, 1)).long()


def uniform_sampler_skips_last_slot():
    return _adapter("uniform-sampler-skips-last-slot", RandomSampler=NeverLastRandomSampler)


class IgnoresPrioritiesSampler(PrioritizedSampler):
    """Draws slots uniformly; the weights still come from the trees."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        info["index"] = torch.floor(u * len(storage)).long().clamp_(max=len(storage) - 1)
        return info


def prioritized_sampler_ignores_priorities():
    return _adapter("prioritized-sampler-ignores-priorities", PrioritizedSampler=IgnoresPrioritiesSampler)


class RotatedRandomSampler(RandomSampler):
    """Maps u to the slot of (u + 1/2) mod 1: still uniform, but not the
    reference's slot for the same uniform."""

    def indices_from_uniforms(self, u, size):
        return super().indices_from_uniforms(torch.remainder(torch.as_tensor(u) + 0.5, 1.0), size)


def uniforms_mapped_differently():
    return _adapter("uniforms-mapped-differently", RandomSampler=RotatedRandomSampler)


class NotStrictSliceSampler(SliceSampler):
    """Slices episodes shorter than slice_len even with strict_length=True."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        strict, self.strict_length = self.strict_length, False
        try:
            return super().sample(storage, batch_size, generator, cursor)
        finally:
            self.strict_length = strict


def strict_length_ignored():
    return _adapter("strict-length-ignored", SliceSampler=NotStrictSliceSampler)


class WrapBlindSliceSampler(SliceSampler):
    """Reads trajectories in slot order, ignoring where the ring wrapped: an
    episode written across the last slot is cut in two."""

    def trajectories(self, storage, cursor: int):
        return super().trajectories(storage, 0)


def slice_ignores_ring_wrap():
    return _adapter("slice-ignores-ring-wrap", SliceSampler=WrapBlindSliceSampler)


class LengthWeightedSliceSampler(SliceSampler):
    """Picks an episode with probability proportional to its length (the
    episode of a uniform row) instead of uniformly among the eligible ones."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, start, length = self.trajectories(storage, cursor)
        eligible = torch.nonzero(length >= slice_len if self.strict_length else length > 0).flatten()
        pick = torch.multinomial(length[eligible].double(), num_slices, replacement=True,
                                 generator=generator)
        traj = eligible[pick]
        span = (length[traj] - slice_len).clamp(min=0) + 1
        offset = torch.floor(torch.rand(num_slices, generator=generator, dtype=torch.float64) * span)
        first = start[traj] + offset.long().minimum(span - 1)
        rows = length[traj].clamp(max=slice_len)
        position = torch.cat([torch.arange(f, f + r) for f, r in zip(first.tolist(), rows.tolist(), strict=True)])
        return {"index": order[position], "traj": traj.repeat_interleave(rows)}


def slice_episodes_weighted_by_length():
    return _adapter("slice-episodes-weighted-by-length", SliceSampler=LengthWeightedSliceSampler)


class DefaultBatchIgnoredBuffer(ReplayBuffer):
    """``sample()`` without an argument draws 16 rows, whatever batch_size the
    buffer was built with."""

    def sample(self, batch_size=None):
        return super().sample(16 if batch_size is None else batch_size)


def default_batch_size_ignored():
    return _adapter("default-batch-size-ignored", DefaultBatchIgnoredBuffer)


def _always_copy_place_policy(policy, device, allow_in_place=True):
    return reference_place_policy(policy, device, allow_in_place=False)


def policy_always_copied():
    return _adapter("policy-always-copied", place_policy=_always_copy_place_policy)


def _never_copy_place_policy(policy, device, allow_in_place=True):
    return policy


def policy_never_copied():
    return _adapter("policy-never-copied", place_policy=_never_copy_place_policy)


# ==========================================================================
# HISTORIC MUTANTS: each modelled on a bug as it shipped in a public replay
# buffer (the catalogue in docs/coverage.md). ``reproduces`` in HISTORIC
# names the issue or pull request. They are registered with the others in
# MUTANTS (below) and caught by tests/meta/test_mutants_caught.py.
# ==========================================================================


def _historic(name: str, buffer_cls=ReplayBuffer, **kwargs) -> object:
    return _adapter(name, buffer_cls, prefix="historic", **kwargs)


# -- invariant 1: every sampled index is a live slot; its weight is its own ----


class Float32PrefixSearchSampler(PrioritizedSampler):
    """pytorch/rl #2230 (PR #2239): the sum tree is summed and searched in
    float32 for the first prefix sum ABOVE the mass (``scan_lower_bound``).
    A mass that rounds up to the float32 total runs past the filled part,
    into a slot never written (leaf 0). ``sample`` computes the weight from
    that slot's leaf (0: an infinite weight) and only then clamps the index
    to ``len - 1``; the uniforms-to-slots map has no clamp at all."""

    def _search(self, u: torch.Tensor) -> torch.Tensor:
        level = self.sum_tree.nodes[self.sum_tree.size:].to(torch.float32)
        levels = [level]
        while len(level) > 1:  # the float32 tree: every inner sum rounded to float32
            level = level[0::2] + level[1::2]
            levels.append(level)
        mass = (torch.as_tensor(u, dtype=torch.float64).cpu() * float(levels[-1][0])).to(torch.float32)
        node = torch.zeros(len(mass), dtype=torch.long)
        for below in reversed(levels[:-1]):
            left = below[2 * node]
            right = mass >= left  # lower bound: the first prefix sum > mass
            mass = torch.where(right, mass - left, mass)
            node = 2 * node + right.long()
        return node

    def indices_from_uniforms(self, u, size=None):
        return self._search(u)

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        if len(storage) == 0:
            raise ValueError("len(buffer)=0, but should be >= 1 to sample")
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        index = self._search(u)
        total, n = self.sum_tree.total(), len(storage)
        p = self.sum_tree.nodes[self.sum_tree.size + index] / total
        p_min = self.min_tree.min() / total
        weight = (n * p) ** -self.beta / (n * p_min) ** -self.beta
        index = index.clamp(max=n - 1)  # the clamp, after the weight was computed
        return {"index": index, "weight": weight.to(torch.float32)}


def float32_prefix_search_clamped_after_weight():
    return _historic("float32-prefix-search", PrioritizedSampler=Float32PrefixSearchSampler)


class CursorRangeSampler(PrioritizedSampler):
    """ray-project/ray #7180: the range searched is ``[0, cursor)``, the
    writer's next slot taken for the number of rows. Right after the ring
    became exactly full the cursor is back at 0, the range is empty and the
    sample raises IndexError (Ray's came out of its segment tree); once
    wrapped, only the slots below the cursor are ever drawn."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        if len(storage) == 0:
            raise ValueError("len(buffer)=0, but should be >= 1 to sample")
        filled = cursor if cursor else len(storage) if len(storage) < storage.capacity else 0
        leaves = self.sum_tree.nodes[self.sum_tree.size: self.sum_tree.size + filled]
        prefix = torch.cumsum(leaves, 0)
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        index = torch.searchsorted(prefix, u * prefix[-1], right=True)  # IndexError when empty
        info = {"index": index}
        total, n = self.sum_tree.total(), len(storage)
        p = self.sum_tree.leaf(index) / total
        info["weight"] = ((n * p) ** -self.beta / (n * self.min_tree.min() / total) ** -self.beta).float()
        return info


def sample_range_from_cursor():
    return _historic("sample-range-from-cursor", PrioritizedSampler=CursorRangeSampler)


# -- invariant 2: transformed once; a new row's priority by one declared rule --


class NewRowsPriorityOneSampler(PrioritizedSampler):
    """ray-project/ray #11750 (also pytorch/rl PR #2215, #2242): rows added
    without a priority get priority 1, not the max priority seen."""

    def on_write(self, index, priority=None) -> None:
        if priority is None:
            priority = torch.ones(len(torch.as_tensor(index)), dtype=torch.float64)
        super().on_write(index, priority)


def new_rows_get_priority_one():
    return _historic("new-rows-get-priority-one", PrioritizedSampler=NewRowsPriorityOneSampler)


class TwoWritersOfNewPriorityBuffer(ReplayBuffer):
    """pytorch/rl #2211: two code paths write a new row's priority -- the
    priority carried in the data, then the writer's default (the max seen)
    over it -- so the data's priority is lost."""

    def extend(self, data):
        index = super().extend(data)
        if self.prioritized and self.priority_of(data) is not None:
            self.sampler.on_write(index, None)  # the second path: the default priority
        return index


def priority_written_by_two_paths():
    return _historic("priority-written-by-two-paths", TwoWritersOfNewPriorityBuffer)


# -- invariant 3: weights over a declared normaliser ----------------------------


def batch_option_uses_memory_minimum():
    """chainer/chainerrl PR #570: the "batch" weight normalisation option
    (declared: weight_normaliser="batch_max") still divided by the weight of
    the memory's smallest probability."""
    from rbcheck.harness.protocol import Conventions

    return _historic("batch-option-uses-memory-minimum",
                     conventions=Conventions(weight_normaliser="batch_max"))


# -- invariant 4: updates to overwritten slots; repeated slots ------------------


class NoGenerationBuffer(ReplayBuffer):
    """ray-project/ray #6534 (uber-research/ape-x #7): priorities from a batch
    sampled before the ring moved on are applied by slot: samples carry no
    write generation and updates are never checked against one."""

    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        info.pop("generation", None)
        return rows, info

    def update_priority(self, index, priority, generation=None) -> None:
        super().update_priority(index, priority)


def stale_priorities_applied_by_slot():
    return _historic("stale-priorities-applied-by-slot", NoGenerationBuffer)


class NeverWrittenLiveBuffer(ReplayBuffer):
    """pytorch/rl PR #4043: a slot never written (generation -1) is taken as
    live, so an update may give it a priority and it can then be sampled."""

    def update_priority(self, index, priority, generation=None) -> None:
        from rbcheck.reference.arguments import check_index

        index = check_index(index, self.capacity)
        self.sampler.update_priority(index, priority, None)


def never_written_slot_taken_as_live():
    return _historic("never-written-slot-taken-as-live", NeverWrittenLiveBuffer)


class DeltaSumTree(SumTree):
    """thu-ml/tianshou PR #94: an update writes each leaf (a repeated slot:
    the last value) but adds to the inner sums every entry's change against
    the leaf as it was BEFORE the update, repeats included: the sums no
    longer match the leaves, and sampling follows the sums."""

    def update(self, index, value) -> None:
        from rbcheck.reference.arguments import check_index, last_occurrence

        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", torch.float64)
        if len(index) == 0:
            return
        node = self.size + index
        delta = value - self.nodes[node]  # against the values before the update
        keep = last_occurrence(index, self.capacity)
        self.nodes[node[keep]] = value[keep]  # the leaves: last write wins
        node = node // 2
        while int(node[0]) >= 1:
            self.nodes.index_add_(0, node, delta)  # every entry's change, repeats included
            node = node // 2


class DeltaTreeSampler(PrioritizedSampler):
    """A prioritized sampler over :class:`DeltaSumTree` (tianshou PR #94)."""

    def __init__(self, capacity, alpha, beta, eps=1e-8):
        super().__init__(capacity, alpha, beta, eps)
        self.sum_tree = DeltaSumTree(capacity)


def repeated_update_sums_every_entry():
    return _historic("repeated-update-sums-every-entry", PrioritizedSampler=DeltaTreeSampler)


# -- invariant 5: the ring keeps the last capacity rows, any batch size ---------


class FoldedOnceWriter(RoundRobinWriter):
    """pytorch/rl PR #1295: the slots of a batch are ``cursor + arange(n)``
    folded ONCE (``- capacity`` past the end) instead of taken modulo the
    capacity: a batch of more than twice the capacity gets slots past the
    ring, and the extend fails."""

    def next_indices(self, n: int) -> torch.Tensor:
        check_int("n", n)
        raw = self.cursor + torch.arange(n)
        index = torch.where(raw >= self.capacity, raw - self.capacity, raw)
        rows = self.write_count + torch.arange(n)
        fits = index < self.capacity
        self.generation[index[fits]] = rows[fits]
        self.write_count += n
        self.cursor = self.write_count % self.capacity
        return index


def extend_over_twice_capacity_fails():
    return _historic("extend-over-twice-capacity", _with_writer(FoldedOnceWriter))


class FullFlagFirstStorage(TensorStorage):
    """assume-framework/assume PR #855: the "full" flag is raised when a
    write reaches the second-to-last slot, before the last one is written:
    len() is the capacity one row early, and the empty last slot can be
    sampled."""

    def set(self, index, data) -> None:
        super().set(index, data)
        if int(torch.as_tensor(index).max()) >= self.capacity - 2:
            self.size = self.capacity


def full_flag_set_before_the_write():
    return _historic("full-flag-set-before-the-write", TensorStorage=FullFlagFirstStorage)


class BatchCountingWriter(RoundRobinWriter):
    """ray-project/ray #24393 (#10958): capacity counted in batches, not in
    rows: the cursor and the write count move by one per batch, so the next
    batch overwrites the rows the previous one just wrote."""

    def next_indices(self, n: int) -> torch.Tensor:
        check_int("n", n)
        index = (self.cursor + torch.arange(n)) % self.capacity
        self.generation[index] = self.write_count
        self.write_count += 1  # one batch
        self.cursor = self.write_count % self.capacity
        return index


def capacity_counted_in_batches():
    return _historic("capacity-counted-in-batches", _with_writer(BatchCountingWriter))


# -- invariant 6: slices contiguous, inside one episode ------------------------


class StartAnywhereSliceSampler(SliceSampler):
    """pytorch/rl #2208: a slice's start is drawn over all the rows of its
    trajectory, not over the starts that leave room for slice_len rows, and
    the slice runs on in write order: into the next trajectory, or across
    the write cursor into the oldest rows."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        order, start, length = self.trajectories(storage, cursor)
        eligible = torch.nonzero(length >= slice_len if self.strict_length else length > 0).flatten()
        if len(eligible) == 0:
            raise ValueError(f"trajectories of length >= slice_len={slice_len}: 0, but should be >= 1")
        pick = torch.rand(num_slices, generator=generator, dtype=torch.float64)
        traj = eligible[torch.floor(pick * len(eligible)).long().clamp_(max=len(eligible) - 1)]
        offset = torch.floor(torch.rand(num_slices, generator=generator, dtype=torch.float64)
                             * length[traj]).long()
        first = start[traj] + offset
        position = torch.cat([(f + torch.arange(slice_len)) % len(order) for f in first.tolist()])
        return {"index": order[position], "traj": traj.repeat_interleave(slice_len)}


def slice_start_drawn_over_whole_trajectory():
    return _historic("slice-start-over-whole-trajectory", SliceSampler=StartAnywhereSliceSampler)


# -- invariant 7: save -> load is the identity -----------------------------------


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


def sampler_metadata_not_json_encodable():
    return _historic("sampler-metadata-not-json", TensorMetadataBuffer)


class FirstPathBuffer(ReplayBuffer):
    """pytorch/rl PR #4388: the checkpointer remembers the first path it
    saved to; a second checkpoint at a new path is written over the first
    one, and the new path holds nothing to load."""

    def dumps(self, path) -> None:
        self._first_path = getattr(self, "_first_path", None) or Path(path)
        Path(path).mkdir(parents=True, exist_ok=True)
        super().dumps(self._first_path)


def second_checkpoint_at_new_path_lost():
    return _historic("second-checkpoint-at-new-path", FirstPathBuffer)


class FullFlagLostBuffer(ReplayBuffer):
    """AI4Finance-Foundation/ElegantRL PR #299: the "full" flag is not
    restored by a load: a wrapped buffer comes back with len == cursor."""

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.writer.write_count > self.capacity:
            self.storage.size = self.writer.cursor


def full_flag_not_restored():
    return _historic("full-flag-not-restored", FullFlagLostBuffer)


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


def nested_field_missing_after_load():
    return _historic("nested-field-missing-after-load", TensorStorage=TopLevelOnlyStorage)


# -- invariant 8: a new buffer holds nothing it was not given --------------------

_SCRATCH: dict = {}


class ScratchDirStorage(TensorStorage):
    """pytorch/rl #2437: storage kept in a scratch directory named after its
    description; a new buffer with the same description reopens the previous
    run's files: its rows and its size."""

    def __init__(self, capacity, device="cpu"):
        super().__init__(capacity, device)
        previous = _SCRATCH.get((capacity, str(device)))
        if previous is not None:
            self.data, self.size = previous.data, previous.size
        _SCRATCH[(capacity, str(device))] = self


def scratch_dir_leaks_previous_run():
    return _historic("scratch-dir-leaks-previous-run", TensorStorage=ScratchDirStorage)


# -- invariant 9: device and pinning as asked -------------------------------------


class CloneAfterPinBuffer(ReplayBuffer):
    """pytorch/rl #2404: pinned memory lost: the sample is copied (cloned)
    after the pin step, and a clone is not pinned."""

    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        if self.pin_memory:
            rows = rows.clone()
        return rows, info


def pinned_sample_cloned_after_pinning():
    return _historic("pinned-sample-cloned", CloneAfterPinBuffer)


class HostWeightsSampler(PrioritizedSampler):
    """pytorch/rl #2518: the weights are left on the host while the indices
    are on the buffer's device (visible with a CUDA buffer only)."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        info = super().sample(storage, batch_size, generator, cursor)
        info["index"] = info["index"].to(storage.device)
        info["weight"] = info["weight"].cpu()
        return info


def weights_left_on_host():
    return _historic("weights-left-on-host", PrioritizedSampler=HostWeightsSampler)


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


def refused_load_writes_into_held_rows():
    return _historic("refused-load-writes-into-held-rows", TensorStorage=LoadIntoHeldRowsStorage)


# --------------------------------------------------------------------------
# 8. priorities in another float dtype (modelled on TorchRL 0.14.1)
# --------------------------------------------------------------------------


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


def priority_dtype_crash_keeps_max():
    return _adapter("priority-dtype-crash-keeps-max", PrioritizedSampler=MaxBeforeDtypeCheckSampler)


# --------------------------------------------------------------------------
# the table the meta test runs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    factory: str  # attribute of this module
    bug: str  # the bug class it plants
    files: tuple[str, ...]  # conformance files to run (relative to rbcheck/conformance)
    targets: tuple[str, ...]  # test function names; at least one must fail
    #: the adapter that must pass the same targets (the control): "reference",
    #: or a factory of this module for a mutant declaring conventions
    control: str = "reference"
    reproduces: str = ""  # historic mutants: the public issue / PR it is modelled on
    needs_cuda: bool = False  # observable only on a CUDA buffer (--rbcheck-device cuda)


MUTANTS = (
    Mutant(
        "tensors_in_json_metadata",
        "tensors left in JSON metadata",
        ("test_checkpoint_roundtrip.py",),
        ("test_checkpoint_metadata_is_plain_json",),
    ),
    Mutant(
        "pickled_rng_state",
        "a pickle (torch.save) in the checkpoint",
        ("test_checkpoint_roundtrip.py",),
        ("test_checkpoint_holds_no_pickle",),
    ),
    Mutant(
        "metadata_changes_types",
        "metadata that round-trips into different types",
        ("test_checkpoint_roundtrip.py",),
        (
            "test_checkpoint_metadata_is_plain_json",
            "test_save_load_round_trips_exactly",
        ),
    ),
    Mutant(
        "load_changes_dtypes",
        "a load that changes dtypes",
        ("test_checkpoint_roundtrip.py",),
        (
            "test_save_load_round_trips_exactly",
            "test_checkpoint_metadata_is_plain_json",
        ),
    ),
    Mutant(
        "priority_transformed_twice_on_add",
        "a priority transformed twice on add",
        ("test_priority_transform.py",),
        (
            "test_writer_default_priority_is_transformed_once",
            "test_priority_key_in_data_is_transformed_once",
        ),
    ),
    Mutant(
        "weights_normalised_over_batch",
        "weights normalised over the batch instead of the buffer",
        ("test_sampling_distributions.py",),
        ("test_weights_are_normalised_as_declared",),
    ),
    Mutant(
        "update_applied_to_overwritten_slot",
        "an update applied to an overwritten slot",
        ("test_sampling_distributions.py",),
        ("test_stale_priority_updates_are_ignored",),
    ),
    Mutant(
        "pinning_skipped_for_device_none",
        "pinning skipped when a transform returns device=None",
        ("test_pin_memory.py",),
        ("test_pin_step_is_last_and_sees_transformed_sample_and_info",),
    ),
    Mutant(
        "info_keys_added_after_pinning",
        "info keys added after pinning",
        ("test_pin_memory.py",),
        ("test_pin_step_is_last_and_sees_transformed_sample_and_info",),
    ),
    Mutant(
        "pin_memory_silently_ignored",
        "pin_memory=True a silent no-op without an accelerator",
        ("test_pin_memory.py",),
        ("test_pin_memory_without_accelerator_is_a_clear_error",),
    ),
    Mutant(
        "raw_deepcopy_policy",
        "a raw deepcopy error for a non-copyable policy",
        ("test_policy_placement.py",),
        ("test_non_copyable_policy_needing_a_copy_fails_with_a_clear_error",),
    ),
    Mutant(
        "slice_crosses_episode_boundary",
        "a slice that crosses an episode boundary",
        ("test_trajectory_slices.py",),
        ("test_slices_are_contiguous_and_inside_one_episode",),
    ),
    Mutant(
        "bad_priority_accepted",
        "NaN, infinite or negative priorities accepted",
        ("test_bad_input.py",),
        ("test_bad_input_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "extend_moves_cursor_before_checking",
        "a refused batch that still moves the cursor",
        ("test_bad_input.py",),
        ("test_bad_input_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "save_not_atomic",
        "a save that deletes the old checkpoint before writing the new one",
        ("test_checkpoint_faults.py",),
        ("test_interrupted_save_leaves_a_loadable_checkpoint",),
    ),
    Mutant(
        "save_fails_in_a_forked_process",
        "a save that fails on its own, taken for an interrupted one",
        ("test_checkpoint_faults.py",),
        ("test_interrupted_save_leaves_a_loadable_checkpoint",),
    ),
    Mutant(
        "refused_load_changes_buffer",
        "a refused load that leaves the buffer changed",
        ("test_checkpoint_faults.py",),
        ("test_damaged_checkpoint_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "load_unpickles",
        "a load that unpickles a file of the checkpoint",
        ("test_checkpoint_faults.py",),
        ("test_damaged_checkpoint_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "bad_parameters_accepted",
        "alpha, beta or eps out of range accepted",
        ("test_bad_input.py",),
        ("test_bad_buffer_description_is_refused", "test_parameters_outside_the_declared_range_are_refused"),
    ),
    Mutant(
        "missing_checkpoint_ignored",
        "a load from a missing or empty directory that does nothing",
        ("test_checkpoint_faults.py",),
        ("test_missing_or_empty_directory_is_refused",),
    ),
    Mutant(
        "misfit_checkpoint_ignored",
        "a checkpoint made for another buffer silently ignored",
        ("test_checkpoint_faults.py",),
        ("test_checkpoint_that_does_not_fit_is_refused",),
    ),
    Mutant(
        "priority_transformed_twice_on_update",
        "a priority transformed twice on update",
        ("test_priority_transform.py",),
        ("test_updated_priority_is_transformed_once",),
    ),
    Mutant(
        "update_first_write_wins",
        "a repeated index in one update where the first priority wins",
        ("test_model_comparison.py",),
        ("test_implementation_matches_reference_model",),
    ),
    Mutant(
        "uniform_sampler_skips_last_slot",
        "a uniform sampler that never draws the last slot",
        ("test_sampling_distributions.py",),
        ("test_uniform_sampling_matches_closed_form",),
    ),
    Mutant(
        "prioritized_sampler_ignores_priorities",
        "a prioritized sampler that draws uniformly",
        ("test_sampling_distributions.py",),
        ("test_prioritized_sampling_matches_closed_form",),
    ),
    Mutant(
        "uniforms_mapped_differently",
        "the same uniforms mapped to other slots than the reference's",
        ("test_sampling_distributions.py",),
        ("test_same_uniforms_give_same_indices_as_reference",),
    ),
    Mutant(
        "strict_length_ignored",
        "strict_length=True ignored: short episodes sliced",
        ("test_sampling_distributions.py",),
        ("test_short_episodes_are_sliced_only_without_strict_length",),
    ),
    Mutant(
        "policy_always_copied",
        "a policy deep-copied even when it could be used in place",
        ("test_policy_placement.py",),
        ("test_non_copyable_policy_is_used_in_place_when_no_copy_is_needed",),
    ),
    Mutant(
        "policy_never_copied",
        "a policy used in place when a private copy was asked for",
        ("test_policy_placement.py",),
        ("test_copyable_policy_is_copied_when_a_copy_is_asked_for",),
    ),
    Mutant(
        "slice_ignores_ring_wrap",
        "an episode written across the ring's last slot cut in two",
        ("test_trajectory_slices.py",),
        ("test_slices_run_across_the_ring_wrap",),
    ),
    Mutant(
        "slice_episodes_weighted_by_length",
        "slices that pick episodes by length instead of uniformly",
        ("test_sampling_distributions.py",),
        ("test_slice_sampling_matches_closed_form",),
    ),
    Mutant(
        "default_batch_size_ignored",
        "sample() ignoring the buffer's batch_size (the tutorial's example)",
        ("test_trajectory_slices.py",),
        ("test_trajectory_example_runs_as_written",),
    ),
    Mutant(
        "priority_dtype_crash_keeps_max",
        "priorities in another float dtype refused after the max priority moved",
        ("test_bad_input.py",),
        ("test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly",),
    ),
    Mutant(
        "ring_eviction_off_by_one",
        "an off-by-one in ring eviction",
        ("test_ring_eviction.py",),
        ("test_ring_eviction_matches_reference_and_closed_form",),
    ),
)




# --------------------------------------------------------------------------
# 8. number types and declared conventions (issues 10.2 and 11.2)
#
# A buffer with float32 trees declares Conventions(priority_dtype=float32) and
# must pass (float32_tree, the control); declaring a convention must never
# hide a violation of the invariant it qualifies (the mutants below declare
# one and still break it). Each mutant's control is float32_tree.
# --------------------------------------------------------------------------


from rbcheck.harness.protocol import Conventions, ParamRange  # noqa: E402 - this section's own import
from rbcheck.reference.arguments import check_index, last_occurrence  # noqa: E402
from rbcheck.reference.sum_tree import MinTree, SumTree  # noqa: E402

#: What the float32-tree adapters claim: no checkpoints (the reference's
#: loader wants float64 trees) and no shared uniforms (float32 sums map
#: masses to other slots at the boundaries, legitimately).
FLOAT32_CAPABILITIES = frozenset(
    {"random", "prioritized", "priority_readback", "priority_key", "stale_updates"}
)
FLOAT32 = Conventions(
    priority_dtype=torch.float32,
    notes={"priority_dtype": "float32 leaves and sums, like TorchRL's SumSegmentTreeFp32"},
)


class _Float32Tree:
    """A reference tree whose nodes (leaves and partial sums/minima) are float32."""

    dtype = torch.float32

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.nodes = self.nodes.to(self.dtype)

    def update(self, index, value) -> None:
        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", self.dtype)
        if len(index) == 0:
            return
        keep = last_occurrence(index, self.capacity)
        self.nodes[self.size + index[keep]] = value[keep]
        parent = torch.unique((index + self.size) // 2)
        while parent[0] >= 1:
            self.nodes[parent] = self.combine(self.nodes[2 * parent], self.nodes[2 * parent + 1])
            parent = torch.unique(parent // 2)


class Float32SumTree(_Float32Tree, SumTree):
    pass


class Float32MinTree(_Float32Tree, MinTree):
    pass


class Float32TreeSampler(PrioritizedSampler):
    """The reference sampler with float32 trees: the priority is rounded to
    float32 and transformed ONCE in float32 arithmetic (correct)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8):
        super().__init__(capacity, alpha, beta, eps)
        self.sum_tree, self.min_tree = Float32SumTree(capacity), Float32MinTree(capacity)

    def transform(self, raw32: torch.Tensor) -> torch.Tensor:
        return (raw32 + self.eps) ** self.alpha

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(raw32)

    def _store(self, index: torch.Tensor, raw: torch.Tensor) -> None:
        raw32 = raw.to(torch.float32)
        value = self.leaf_value(raw32)
        self.sum_tree.update(index, value)
        self.min_tree.update(index, torch.where(value > 0, value, torch.full_like(value, math.inf)))
        if raw.numel():
            self.max_priority = max(self.max_priority, float(raw32.max()))


def _float32_adapter(name: str, sampler: type, conventions: Conventions = FLOAT32):
    return buffer_adapter(
        name,
        "0",
        ReplayBuffer,
        FLOAT32_CAPABILITIES,
        components=SimpleNamespace(PrioritizedSampler=sampler),
        pin_module=None,
        conventions=conventions,
    )


def float32_tree():
    """The control (not a mutant): a correct buffer with float32 trees that
    declares priority_dtype=float32. The suite must pass it."""
    return _float32_adapter("float32-tree", Float32TreeSampler)


class Float32TwiceSampler(Float32TreeSampler):
    """float32 trees that transform a priority twice on every path, as
    TorchRL 0.6-0.9's PrioritizedSampler did (the writer's transformed max
    fed back through the transform)."""

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(self.transform(raw32))


def float32_tree_transformed_twice():
    return _float32_adapter("mutant-float32-tree-transformed-twice", Float32TwiceSampler)


class BFloat16LeavesSampler(Float32TreeSampler):
    """Declares float32 but keeps its leaves in bfloat16 (8 significant bits):
    off by up to 2**-9 relative, far more than float32's own error."""

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(raw32).to(torch.bfloat16).to(torch.float32)


def float32_declared_bfloat16_kept():
    return _float32_adapter("mutant-float32-declared-bfloat16-kept", BFloat16LeavesSampler)


class BatchMaxSampler(Float32TreeSampler):
    """float32 trees whose weights are divided by the batch's largest weight
    (``weight_normaliser="batch_max"``, correct); ``reduce`` names the batch
    statistic divided by."""

    reduce = "max"

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        out = super().sample(storage, batch_size, generator, cursor)
        total, n = self.sum_tree.total(), len(storage)
        w = (n * self.sum_tree.leaf(out["index"]).double() / total) ** -self.beta
        out["weight"] = (w / getattr(w, self.reduce)()).to(torch.float32)
        return out


class BatchMaxWrongSampler(BatchMaxSampler):
    """Declares weight_normaliser="batch_max" but divides by the batch's
    SMALLEST weight: wrong in batch_max terms too (weights >= 1)."""

    reduce = "min"


BATCH_MAX = Conventions(priority_dtype=torch.float32, weight_normaliser="batch_max")


def batch_max_declared_but_divided_by_batch_min():
    return _float32_adapter("mutant-batch-max-declared-but-divided-by-batch-min", BatchMaxWrongSampler,
                            BATCH_MAX)


def batch_max_control():
    """The control for the batch_max mutant: float32 trees whose weights are
    correctly divided by the batch's largest weight, declared as such."""
    return _float32_adapter("batch-max-control", BatchMaxSampler, BATCH_MAX)


class PositiveAlphaSampler(PrioritizedSampler):
    """The reference sampler refusing alpha = 0, as tianshou does (``alpha > 0``)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8):
        if not (isinstance(alpha, (int, float)) and alpha > 0):
            raise ValueError(f"alpha={alpha!r}, but should be > 0")
        super().__init__(capacity, alpha, beta, eps)


POSITIVE_ALPHA = Conventions(
    param_ranges={"alpha": ParamRange(0.0, math.inf, low_closed=False)},
    notes={"param_ranges": "alpha > 0, as tianshou asserts"},
)


def _reference_with(name: str, conventions: Conventions, **components):
    adapter = _adapter(name, **components)
    adapter.name, adapter.conventions = name, conventions
    return adapter


def positive_alpha_control():
    """The control: declares alpha in (0, inf) and refuses alpha = 0."""
    return _reference_with("positive-alpha-control", POSITIVE_ALPHA, PrioritizedSampler=PositiveAlphaSampler)


def alpha_range_declared_not_enforced():
    """Declares alpha in (0, inf) but builds a buffer with alpha = 0."""
    return _reference_with("mutant-alpha-range-declared-not-enforced", POSITIVE_ALPHA)


STRATIFIED = Conventions(sampling="stratified")


class StratifiedSampler(PrioritizedSampler):
    """Draw k of a batch of B from the k-th of B equal segments of the mass
    (``u_k = (k + U_k) / B``), as the PER paper's proportional variant does."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        plain = self.indices_from_uniforms
        strata = torch.arange(batch_size, dtype=torch.float64)
        self.indices_from_uniforms = lambda u, size=None: plain((strata + u) / batch_size)
        try:
            return super().sample(storage, batch_size, generator, cursor)
        finally:
            del self.indices_from_uniforms


def stratified_control():
    """The control: a stratified sampler that declares sampling="stratified"."""
    return _reference_with("stratified-control", STRATIFIED, PrioritizedSampler=StratifiedSampler)


def stratified_sampler_declared_independent():
    """Stratifies its batches but declares the spec's independent draws."""
    return _reference_with("mutant-stratified-sampler-declared-independent", Conventions(),
                           PrioritizedSampler=StratifiedSampler)


def stratified_declared_sampled_independently():
    """Declares sampling="stratified" but draws every slot of a batch from
    the whole mass (the plain reference sampler)."""
    return _reference_with("mutant-stratified-declared-sampled-independently", STRATIFIED)


CONVENTION_MUTANTS = (
    Mutant(
        "alpha_range_declared_not_enforced",
        "a declared parameter range (alpha > 0) the buffer does not enforce",
        ("test_bad_input.py",),
        ("test_parameters_outside_the_declared_range_are_refused",),
        control="positive_alpha_control",
    ),
    Mutant(
        "float32_tree_transformed_twice",
        "a float32-tree buffer that transforms a priority twice (TorchRL 0.6-0.9)",
        ("test_priority_transform.py",),
        # one target keeps the run short (each failing property shrinks); the
        # writer-default and priority-key paths catch it too
        ("test_updated_priority_is_transformed_once",),
        control="float32_tree",
    ),
    Mutant(
        "float32_declared_bfloat16_kept",
        "a declared float32 dtype hiding bfloat16 leaves (error far above float32's)",
        ("test_priority_transform.py",),
        ("test_updated_priority_is_transformed_once",),
        control="float32_tree",
    ),
    Mutant(
        "batch_max_declared_but_divided_by_batch_min",
        "a declared batch_max normaliser hiding weights divided by the batch minimum",
        ("test_sampling_distributions.py",),
        ("test_weights_are_normalised_as_declared",),
        control="batch_max_control",
    ),
    Mutant(
        "stratified_sampler_declared_independent",
        "a stratified sampler declaring independent draws (the spec)",
        ("test_sampling_distributions.py",),
        ("test_draws_within_a_batch_are_independent",),
    ),
    Mutant(
        "stratified_declared_sampled_independently",
        "a declared stratified scheme hiding independent draws",
        ("test_sampling_distributions.py",),
        ("test_prioritized_sampling_matches_closed_form",),
        control="stratified_control",
    ),
)
MUTANTS = (*MUTANTS, *CONVENTION_MUTANTS)

def _historic_mutant(factory: str, bug: str, files: tuple[str, ...], targets: tuple[str, ...],
              reproduces: str, **more) -> Mutant:
    """A historic mutant; its fifth field is the public issue it reproduces
    (a keyword of :class:`Mutant`, after ``control``)."""
    return Mutant(factory, bug, files, targets, reproduces=reproduces, **more)


HISTORIC = (
    _historic_mutant("float32_prefix_search_clamped_after_weight",
           "float32 prefix search past the filled part, clamped after the weight",
           ("test_sampled_slots.py", "test_model_comparison.py"),
           ("test_sampled_slots_are_live_and_weights_belong_to_them", "test_implementation_matches_reference_model"),
           "pytorch/rl #2230 (PR #2239)"),
    _historic_mutant("sample_range_from_cursor", "sampling right after the ring became exactly full fails",
           ("test_sampled_slots.py",), ("test_sampled_slots_are_live_and_weights_belong_to_them",), "ray-project/ray #7180"),
    _historic_mutant("new_rows_get_priority_one", "new rows given priority 1 instead of the max",
           ("test_priority_transform.py",), ("test_writer_default_priority_is_transformed_once",),
           "ray-project/ray #11750; pytorch/rl PR #2215, #2242"),
    _historic_mutant("priority_written_by_two_paths", "two code paths write a new row's priority",
           ("test_priority_transform.py",), ("test_priority_key_in_data_is_transformed_once",),
           "pytorch/rl #2211"),
    _historic_mutant("batch_option_uses_memory_minimum", "the declared batch normaliser divides by the memory minimum",
           ("test_sampled_slots.py", "test_model_comparison.py"),
           ("test_sampled_slots_are_live_and_weights_belong_to_them",
            "test_implementation_matches_reference_model"),
           "chainer/chainerrl PR #570"),
    _historic_mutant("stale_priorities_applied_by_slot", "priorities of an old sample applied to recycled slots",
           ("test_sampling_distributions.py",), ("test_stale_priority_updates_are_ignored",),
           "ray-project/ray #6534; uber-research/ape-x #7"),
    _historic_mutant("never_written_slot_taken_as_live", "a never-written slot taken as live by an update",
           ("test_bad_input.py",), ("test_bad_input_is_refused_and_nothing_changes",), "pytorch/rl PR #4043"),
    _historic_mutant("repeated_update_sums_every_entry", "a repeated slot in one update summed twice in the tree",
           ("test_sampled_slots.py",), ("test_update_with_repeated_slots_samples_by_the_last_entry",), "thu-ml/tianshou PR #94"),
    _historic_mutant("extend_over_twice_capacity_fails", "an extend of more than 2x capacity gets slots past the ring",
           ("test_ring_eviction.py",), ("test_ring_keeps_the_last_capacity_rows_for_any_batch_size",), "pytorch/rl PR #1295"),
    _historic_mutant("full_flag_set_before_the_write", "the full flag set before the write",
           ("test_ring_eviction.py",),
           ("test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
            "test_ring_eviction_matches_reference_and_closed_form"),
           "assume-framework/assume PR #855"),
    _historic_mutant("capacity_counted_in_batches", "capacity counted in batches, not rows",
           ("test_ring_eviction.py",),
           ("test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
            "test_ring_eviction_matches_reference_and_closed_form"),
           "ray-project/ray #24393, #10958"),
    _historic_mutant("slice_start_drawn_over_whole_trajectory", "slices run into the next trajectory",
           ("test_trajectory_slices.py",), ("test_slices_are_contiguous_and_inside_one_episode",),
           "pytorch/rl #2208"),
    _historic_mutant("sampler_metadata_not_json_encodable", "sampler metadata that JSON cannot encode",
           ("test_checkpoint_chain.py",), ("test_save_load_chain_and_carrying_on_match_no_checkpoint",), "pytorch/rl #3055 (#3056)"),
    _historic_mutant("second_checkpoint_at_new_path_lost", "a second checkpoint at a new path fails",
           ("test_checkpoint_chain.py",), ("test_save_load_chain_and_carrying_on_match_no_checkpoint",), "pytorch/rl PR #4388"),
    _historic_mutant("full_flag_not_restored", "the full flag not restored by a load",
           ("test_checkpoint_chain.py", "test_checkpoint_roundtrip.py"),
           ("test_save_load_round_trips_exactly", "test_save_load_chain_and_carrying_on_match_no_checkpoint"),
           "AI4Finance-Foundation/ElegantRL PR #299"),
    _historic_mutant("nested_field_missing_after_load", "a field missing after load",
           ("test_checkpoint_chain.py", "test_checkpoint_roundtrip.py"),
           ("test_save_load_round_trips_exactly", "test_save_load_chain_and_carrying_on_match_no_checkpoint"),
           "thu-ml/tianshou #728"),
    _historic_mutant("scratch_dir_leaks_previous_run", "a new buffer shows a previous run's rows",
           ("test_ring_eviction.py",), ("test_new_buffer_holds_nothing_it_was_not_given",), "pytorch/rl #2437"),
    _historic_mutant("pinned_sample_cloned_after_pinning", "pinned memory lost by a copy after the pin step",
           ("test_pin_memory.py",), ("test_pin_step_is_last_and_sees_transformed_sample_and_info",),
           "pytorch/rl #2404"),
    _historic_mutant("weights_left_on_host", "weights left on another device than the indices",
           ("test_sampled_slots.py",), ("test_sampled_slots_are_live_and_weights_belong_to_them",), "pytorch/rl #2518",
           needs_cuda=True),
    _historic_mutant("refused_load_writes_into_held_rows", "a refused load writes the checkpoint into live rows",
           ("test_checkpoint_faults.py",), ("test_checkpoint_that_does_not_fit_is_refused",),
           "rbcheck issue 12 (the device variant's data loss)"),
)
MUTANTS = (*MUTANTS, *HISTORIC)

__all__ = ["HISTORIC", "MUTANTS", "Mutant", *[m.factory for m in MUTANTS], "float32_tree", "batch_max_control",
           "positive_alpha_control"]


# --------------------------------------------------------------------------
# 10. bad input that proves nothing (issue 17: priorities in the declared
# dtype, halfway refusals without read-back, refused loads, overflow)
# --------------------------------------------------------------------------


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


def float64_only_values_unchecked():
    return _adapter("float64-only-values-unchecked", PrioritizedSampler=Float64OnlySampler)


import itertools  # noqa: E402 - this section's own import

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


def update_refused_halfway_without_readback():
    return _unseeded_adapter("mutant-update-refused-halfway-without-readback",
                             PrioritizedSampler=OneByOneUpdateSampler)


def dtype_crash_keeps_max_without_readback():
    """The max priority moved by a refused update (priority_dtype_crash_keeps_max)
    on an unseeded buffer without read-back: seen only in the draws."""
    return _unseeded_adapter("mutant-dtype-crash-keeps-max-without-readback",
                             PrioritizedSampler=MaxBeforeDtypeCheckSampler)


class RngFirstLoadBuffer(ReplayBuffer):
    """A load that takes the checkpoint's generator state first, then checks
    the rest: a refused load leaves the buffer drawing the checkpoint's
    stream (length, cursor, rows and priorities untouched)."""

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        super().load_state_dict(state)


def rng_set_by_refused_load():
    return _adapter("rng-set-by-refused-load", RngFirstLoadBuffer)


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


def generations_set_by_refused_load():
    return _adapter("generations-set-by-refused-load", GenerationsFirstLoadBuffer)


BAD_INPUT_MUTANTS = (
    Mutant(
        "float64_only_values_unchecked",
        "bad priorities refused for their dtype alone (the values never checked)",
        ("test_bad_input.py",),
        ("test_bad_input_is_refused_and_nothing_changes",),
    ),
    Mutant(
        "update_refused_halfway_without_readback",
        "an update refused halfway, on an unseeded buffer without priority read-back (cpprb-like)",
        ("test_bad_input.py",),
        ("test_bad_input_is_refused_and_nothing_changes",),
        control="unseeded_without_readback_control",
    ),
    Mutant(
        "dtype_crash_keeps_max_without_readback",
        "a refused update that moved the max priority, on an unseeded buffer without read-back",
        ("test_bad_input.py",),
        ("test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly",),
        control="unseeded_without_readback_control",
    ),
    Mutant(
        "rng_set_by_refused_load",
        "a refused load that replaced the generator state",
        ("test_checkpoint_faults.py",),
        ("test_checkpoint_that_does_not_fit_is_refused",),
    ),
    Mutant(
        "generations_set_by_refused_load",
        "a refused load that replaced the write generations",
        ("test_checkpoint_faults.py",),
        ("test_checkpoint_that_does_not_fit_is_refused",),
    ),
)
MUTANTS = (*MUTANTS, *BAD_INPUT_MUTANTS)
__all__ += [m.factory for m in BAD_INPUT_MUTANTS] + ["unseeded_without_readback_control"]
# policy copies (issue 17): a copy that is no copy, a caller's policy changed
# --------------------------------------------------------------------------


def _same_module_if_no_tensors_place_policy(policy, device, allow_in_place=True):
    """"Nothing to copy" for a module without parameters or buffers: returns
    the caller's object even when a private copy was asked for."""
    if isinstance(policy, torch.nn.Module) and not any(
        True for _ in (*policy.parameters(), *policy.buffers())
    ):
        return policy
    return reference_place_policy(policy, device, allow_in_place)


def parameter_free_policy_not_copied():
    return _adapter("parameter-free-policy-not-copied",
                    place_policy=_same_module_if_no_tensors_place_policy)


def _moves_caller_place_policy(policy, device, allow_in_place=True):
    """"Moves" the caller's tensors to the device (into new storage, the
    values unchanged) before copying: the caller's policy no longer holds the
    storage its trainer (and any view of it) holds."""
    if isinstance(policy, torch.nn.Module):
        for t in (*policy.parameters(), *policy.buffers()):
            t.data = t.data.to(device, copy=True)
    return reference_place_policy(policy, device, allow_in_place)


def policy_copy_moves_the_caller():
    return _adapter("policy-copy-moves-the-caller", place_policy=_moves_caller_place_policy)


def _eval_caller_place_policy(policy, device, allow_in_place=True):
    """Puts the caller's policy in eval mode for collection, then copies it."""
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    return reference_place_policy(policy, device, allow_in_place)


def policy_copy_sets_the_caller_to_eval():
    return _adapter("policy-copy-sets-the-caller-to-eval", place_policy=_eval_caller_place_policy)


_PP = ("test_policy_placement.py",)
_COPY = ("test_copyable_policy_is_copied_when_a_copy_is_asked_for",)
POLICY_COPY_MUTANTS = (
    Mutant("parameter_free_policy_not_copied",
           "a parameter-free policy returned as its own copy", _PP, _COPY),
    Mutant("policy_copy_moves_the_caller",
           "the caller's policy moved to new storage while a copy is made", _PP, _COPY),
    Mutant("policy_copy_sets_the_caller_to_eval",
           "the caller's policy put in eval mode while a copy is made", _PP, _COPY),
)
MUTANTS = (*MUTANTS, *POLICY_COPY_MUTANTS)
__all__ += [m.factory for m in POLICY_COPY_MUTANTS]
# a save that deletes the user's files (issue 17)
# --------------------------------------------------------------------------


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


def save_deletes_the_users_ckpt_dirs():
    return _adapter("save-deletes-the-users-ckpt-dirs", CleanupTakesEveryCkptBuffer)


MUTANTS = (*MUTANTS, Mutant(
    "save_deletes_the_users_ckpt_dirs",
    "a save that deletes the user's files beside the checkpoint",
    ("test_checkpoint_user_files.py",),
    ("test_saving_into_a_directory_with_the_users_files_leaves_them_byte_identical",),
))
__all__ += ["save_deletes_the_users_ckpt_dirs"]
