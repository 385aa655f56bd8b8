"""The replay buffer: storage + writer + sampler + transform + pin step.

Contract
--------
* ``extend(data)`` writes the rows of a TensorDict ``[n]`` in order and returns their slots;
  ``add(row)`` writes one row (no batch dim) and returns its slot. With a prioritized sampler,
  rows whose data carry ``priority_key`` get those raw priorities, others the max priority seen
  (``priority_key=None``: always the max); the priority column is stored like any other key.
* ``sample(batch_size)`` returns ``(rows, info)``: the sampler picks slots, the rows are
  gathered (a copy), the transform runs, ``info`` gets each slot's write ``generation``, and the
  pin step ``pinning.pin_sample`` runs LAST when ``pin_memory=True``.
* ``set(index, rows)`` (``buffer[index] = rows``) edits held rows in place and nothing else.
  A writer may drop rows (slot -1 from ``extend``) or refuse writes (``writer.py``); a storage
  that fails to write (``OSError``: ``memmap_storage.py``) leaves the writer where it was.
* ``update_priority(index, priority, generation=None)`` ignores entries whose generation
  differs from the slot's current one (overwritten since sampled).
* Every argument is checked BEFORE anything changes; errors read
  ``<arg>=<got>, but should be <allowed>`` and leave the buffer unchanged.
* ``state_dict``/``load_state_dict`` and ``dumps``/``loads`` (a checkpoint directory,
  ``checkpoint.py``) round-trip the whole state, ``generator`` included (an int seed, None for
  torch's default seed, or a ``torch.Generator`` on any device: samplers draw on its device,
  ``random_sampler.draw_uniforms``), so the next samples are identical. A state saved from a
  generator on another kind of device is refused (ValueError, nothing changed).
* ``iter(buffer)`` yields ``sample(batch_size)`` batches (one epoch with a without-replacement
  sampler; ``iteration.iterate``). ``prefetch=N`` draws up to N batches ahead, taken back before
  any change, so the samples are the same as without (``iteration.Prefetch``).
* A writer with a ``size`` (``consuming_sampler.ConsumingWriter``: it reuses consumed slots)
  tells a load how many slots are held; otherwise it is ``min(write_count, capacity)``.

Cost: ``extend`` O(n * row size) (+ O(n log capacity) prioritized), ``sample`` O(B * row size)
plus the sampler's cost.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDictBase

from rbcheck.reference import pinning
from rbcheck.reference.arguments import as_generator, check_generator_state, check_index, check_int
from rbcheck.reference.checkpoint import load_checkpoint, save_checkpoint
from rbcheck.reference.iteration import Prefetch, iterate
from rbcheck.reference.random_sampler import RandomSampler
from rbcheck.reference.storage import TensorStorage
from rbcheck.reference.transitions import mark_slice_ends
from rbcheck.reference.writer import RoundRobinWriter


class ReplayBuffer:
    """A fixed-capacity replay buffer (see module doc)."""

    def __init__(self, capacity=None, *, storage=None, sampler=None, writer=None, transform=None,
                 batch_size=None, pin_memory=False, priority_key="priority", generator=None, prefetch=0):
        storage = TensorStorage(check_int("capacity", capacity)) if storage is None else storage
        writer = RoundRobinWriter(storage.capacity) if writer is None else writer
        sampler = RandomSampler() if sampler is None else sampler
        for name, got in (("capacity", storage.capacity if capacity is None else capacity),
                          ("writer.capacity", writer.capacity),
                          ("sampler.capacity", getattr(sampler, "capacity", storage.capacity))):
            if got != storage.capacity:
                raise ValueError(f"{name}={got}, but should be {storage.capacity} (the storage's capacity)")
        if transform is not None and not callable(transform):
            raise ValueError(f"transform={transform!r}, but should be callable or None")
        if batch_size is not None and check_int("batch_size", batch_size) and hasattr(sampler, "shape"):
            sampler.shape(batch_size)  # a slice sampler: batch_size must divide into slices
        if pin_memory:
            pinning.require_accelerator()
        self.storage, self.writer, self.sampler = storage, writer, sampler
        self.transform, self.batch_size, self.pin_memory = transform, batch_size, bool(pin_memory)
        self.priority_key, self.generator = priority_key, as_generator(generator)
        self.prefetch = Prefetch(prefetch)

    capacity = property(lambda self: self.storage.capacity)
    cursor = property(lambda self: self.writer.cursor)
    write_count = property(lambda self: self.writer.write_count)
    prioritized = property(lambda self: hasattr(self.sampler, "update_priority"))

    def __len__(self) -> int:
        return len(self.storage)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Write the rows of ``data`` (batch ``[n]``); return their int64 slots."""
        self.storage.check(data)
        n, priority = data.batch_size[0], self.priority_of(data)
        self.prefetch.rewind(self)
        before = self.writer.state_dict() if getattr(self.storage, "on_disk", False) else None  # a copy
        index = self.writer.place(data) if hasattr(self.writer, "place") else self.writer.next_indices(n)
        kept = index >= 0  # -1: a row the writer drops (max_value_writer.py)
        if not bool(kept.all()):
            data, priority = data[kept], (None if priority is None else priority[kept])
        try:
            if bool(kept.any()):
                self.storage.set(index[kept], data)
        except OSError:  # a disk-backed storage could not write: nothing changed, the writer goes back
            if before is not None:
                self.writer.load_state_dict(before)
            raise
        self.sampler.on_write(index[kept], priority)
        return index

    def priority_of(self, data: TensorDictBase) -> torch.Tensor | None:
        """The checked raw priorities ``data`` carries under ``priority_key`` (None: none)."""
        key, n = self.priority_key, data.batch_size[0]
        if not self.prioritized or key is None or key not in data.keys(include_nested=True):
            return None
        value = data.get(key)
        return self.sampler.check_priority(value.reshape(n) if value.numel() == n else value, n)

    def add(self, row: TensorDictBase) -> int:
        """Write one row (batch size ``[]``); return its slot."""
        if not isinstance(row, TensorDictBase) or row.batch_dims != 0:
            got = list(row.batch_size) if isinstance(row, TensorDictBase) else type(row).__name__
            raise ValueError(f"row.batch_size={got}, but should be [] (use extend for a batch)")
        return int(self.extend(row.unsqueeze(0))[0])

    def sample(self, batch_size: int | None = None) -> tuple[TensorDictBase, dict]:
        """``(rows, info)``; info holds ``index``, ``generation`` and the sampler's keys."""
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size is None:
            raise ValueError("batch_size=None, but should be an int >= 1 (here or in the constructor)")
        info = self.prefetch.take(self, batch_size)
        slice_end = info.pop("slice_end", None)
        rows = self.storage.get(info["index"])
        if slice_end is not None and "truncated" in rows.keys():  # env steps: a slice's end breaks the trajectory
            rows = mark_slice_ends(rows, slice_end)
        if self.transform is not None:
            rows = self.transform(rows)
        if self.pin_memory:
            rows, info = pinning.pin_sample(rows, info)  # looked up now: tests may replace it
        return rows, info

    def draw(self, batch_size: int) -> dict:
        """The sampler's draw (``info``) with each slot's write ``generation``; no rows."""
        info = self.sampler.sample(self.storage, batch_size, self.generator, cursor=self.cursor)
        info["generation"] = self.writer.generation[info["index"]]
        return info

    def __iter__(self):
        return iterate(self)

    def sample_all(self, mini_batches: int = 1) -> list[TensorDictBase]:
        """Every held row once, in slot order, in ``mini_batches`` equal batches (reference/sample_all.py)."""
        from rbcheck.reference.sample_all import sample_all

        return sample_all(self.storage, len(self), mini_batches)

    def set(self, index, rows: TensorDictBase) -> None:
        """Edit in place: ``rows`` (batch ``[len(index)]``; one row for an int) replace the held
        rows at ``index``, each below ``len(self)``. Nothing else changes (length, cursor, write
        count, generations, priorities); the writer may refuse (``check_edit``)."""
        if isinstance(index, int) and isinstance(rows, TensorDictBase) and rows.batch_dims == 0:
            index, rows = [index], rows.unsqueeze(0)
        index = check_index(index, len(self))
        self.storage.check(rows)
        if len(index) != rows.batch_size[0]:
            raise ValueError(f"len(index)={len(index)}, but should be len(rows)={rows.batch_size[0]}")
        if hasattr(self.writer, "check_edit"):
            self.writer.check_edit(index, rows)
        self.storage.set(index, rows)

    __setitem__ = set

    def update_priority(self, index, priority, generation=None) -> None:
        """Set raw priorities of written slots; stale ``generation`` entries are ignored."""
        if not self.prioritized:
            raise ValueError(f"sampler={type(self.sampler).__name__}, but should be prioritized")
        index = check_index(index, self.capacity)
        current = self.writer.generation[index]
        self.prefetch.rewind(self)
        self.sampler.update_priority(index, priority, generation, current_generation=current)

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        """The slots ``sample`` would pick for float64 uniforms ``u`` (shared randomness)."""
        return self.sampler.indices_from_uniforms(u, len(self))

    def state_dict(self) -> dict:
        self.prefetch.rewind(self)
        parts = {name: getattr(self, name).state_dict() for name in ("storage", "writer", "sampler")}
        return {"capacity": self.capacity, **parts, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the whole state. Everything is validated on copies first (ValueError)."""
        self.prefetch.rewind(self)
        try:
            if state["capacity"] != self.capacity:
                raise ValueError(f"capacity={state['capacity']}, but should be {self.capacity}")
            live = self.writer, self.storage, self.sampler
            writer, storage, sampler = staged = [copy.copy(part) for part in live]  # loads rebind, never mutate
            writer.load_state_dict(state["writer"])
            size = writer.size if hasattr(writer, "size") else min(writer.write_count, self.capacity)
            sampler.load_state_dict(state["sampler"])
            check_generator_state(state["generator"], self.generator.device)
            storage.load_state_dict(state["storage"], size)  # last: a disk-backed one writes its files
        except (KeyError, TypeError, AttributeError, IndexError, OverflowError, RuntimeError) as error:
            raise ValueError(f"state={error!r}, but should be a complete, valid state_dict") from error
        for part, loaded in zip(live, staged, strict=True):
            part.__dict__.update(loaded.__dict__)
        self.generator.set_state(state["generator"])

    # a checkpoint directory at ``path``: atomic save; load validated first (checkpoint.py)
    dumps, loads = save_checkpoint, load_checkpoint
