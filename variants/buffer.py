"""The replay buffer over device storage and batched samplers.

Contract: the reference ``ReplayBuffer``'s (``reference/buffer.py``) — same
constructor arguments and methods, same validation and messages, same
checkpoint format and checks (``dumps``/``loads`` write and read the
reference's files in chunks, without its copies: ``checkpoint_stream.py``),
same random stream — plus:

* ``device``: where storage, writer generations, trees and returned samples
  live (default: the given storage's device, else CUDA when present, else the
  CPU; ``cuda`` is read as the current CUDA device, ``cuda:0``, its tensors'
  device). A seed makes a CPU ``torch.Generator``, so it gives the
  reference's draws on any device; with a generator on the buffer's GPU the
  uniform and prioritized samplers draw there, as the reference draws on the
  generator's device (``draw_uniforms``), with no host draw and no copy (the
  slice sampler reads its draws on the CPU, where its bookkeeping is).
* The prioritized sampler's ``backend`` (``PrioritizedSampler(...,
  backend="torch" | "triton")``) picks vectorized torch ops or Triton kernels
  for the trees (without CUDA the kernels run in Triton's interpreter: slow,
  meant for checking).
* Components not given are the variants' (``DeviceStorage``,
  ``DeviceWriter``, ``RandomSampler``); given samplers with a ``to`` method
  are moved to the device.
* ``add`` also takes one row as its columns (``add(**columns)``, ``add(dict)``: plain
  tensors or arrays), as ``extend`` of that row would (``add_fast``: the layout bound
  once, one native call, no TensorDict); a TensorDict row takes the same fast path.
* ``extend`` takes ``extend_fast.try_extend`` where it applies (the same
  checks and state, less Python); otherwise it
  updates the sampler's bookkeeping (``observe``) instead of the reference's
  indexed copy; ``sample`` takes ``sample_fast.try_sample`` where it applies
  (the same draws and results in one output block and two native calls);
  otherwise it gathers with ``DeviceStorage.gather`` into
  recycled memory that is never handed out while any tensor of an earlier
  sample still refers to it (see ``TensorPool``): a sample never aliases the
  storage or a sample the user still holds; ``update_priority`` without
  generations, once every slot is written, goes straight to the sampler (whose
  native path takes ``update_fast.try_update`` where it applies: one native
  call, its fixed arguments bound once per sampler and checked on every call).

Cost: ``extend`` O(n * row size) (+ O(n log n + n log capacity) prioritized);
``sample`` O(B * row size) plus the sampler's cost.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference import pinning
from rbcheck.reference.buffer import ReplayBuffer as ReferenceReplayBuffer
from rbcheck.variants import add_fast, checkpoint_stream, native
from rbcheck.variants.device_storage import (
    DeviceStorage,
    DeviceWriter,
    check_index_fast,
    default_device,
    same_device,
)
from rbcheck.variants.extend_fast import extend_lock, try_extend
from rbcheck.variants.random_sampler import RandomSampler
from rbcheck.variants.sample_fast import try_sample


class ReplayBuffer(ReferenceReplayBuffer):
    """A fixed-capacity replay buffer on a device (see module doc)."""

    def __init__(self, capacity=None, *, storage=None, sampler=None, writer=None, transform=None,
                 batch_size=None, pin_memory=False, priority_key="priority", generator=None,
                 device=None):
        if storage is None:
            if capacity is None:
                raise ValueError("capacity=None, but should be an int >= 1 (or pass storage=)")
            storage = DeviceStorage(capacity, default_device() if device is None else device)
        elif device is not None and not same_device(device, storage.device):
            raise ValueError(f"device={device!r}, but should be the storage's ({storage.device})")
        if writer is None:
            writer = DeviceWriter(storage.capacity, storage.device)
        super().__init__(capacity, storage=storage, sampler=RandomSampler() if sampler is None else sampler,
                         writer=writer, transform=transform, batch_size=batch_size,
                         pin_memory=pin_memory, priority_key=priority_key, generator=generator)
        self.device = storage.device
        if hasattr(self.sampler, "to"):
            self.sampler.to(self.device)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Write the rows of ``data`` (batch ``[n]``); return their int64 slots. Extends into
        one storage take turns, whichever path each takes (``extend_fast.extend_lock``)."""
        with extend_lock(self.storage):
            index = try_extend(self, data)  # the same checks and state, less Python
            if index is not None:
                return index
            self.storage.check(data)
            n, priority = data.batch_size[0], self.priority_of(data)  # the reference's checks
            first = self.writer.cursor
            index = self.writer.next_indices(n)
            if hasattr(self.storage, "write"):
                self.storage.write(first, data, checked=True)  # checked before the writer moved
            else:
                self.storage.set(index, data)
            self.sampler.on_write(index, priority)
            if hasattr(self.sampler, "observe"):
                self.sampler.observe(self.storage, n)
            return index

    def add(self, row=None, /, **columns) -> int:
        """Write ONE row and return its slot: the reference's ``add(row)`` (a TensorDict of
        batch size ``[]``, the same checks and errors), and also the row as its columns,
        ``add(obs=o, action=a, reward=r)`` or ``add({"obs": o, ...})`` (tensors, NumPy arrays
        or numbers of each column's row shape and dtype, no batch dimension): exactly
        ``extend`` of that row as a one-row TensorDict, without building it (``add_fast``:
        the layout bound once, one native call)."""
        if columns:
            if row is not None:
                raise TypeError(f"row={type(row).__name__} with {len(columns)} keyword columns, but should be "
                                "one row (a TensorDict or a dict of columns) or keyword columns only")
            return add_fast.add(self, columns)
        if type(row) is dict:
            return add_fast.add(self, row)
        if type(row) is TensorDict and row.batch_dims == 0:  # the reference's row, without its unsqueeze
            with extend_lock(self.storage):
                slot = add_fast.try_add(self, row._tensordict)
            if slot is not None:
                return slot
        return super().add(row)  # the reference's checks and errors

    def sample(self, batch_size: int | None = None) -> tuple[TensorDictBase, dict]:
        """``(rows, info)`` as the reference; tensors on the buffer's device."""
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size is None:
            raise ValueError("batch_size=None, but should be an int >= 1 (here or in the constructor)")
        fast = try_sample(self, batch_size)  # the same draws and results, fewer calls
        if fast is not None:
            return fast
        info = self.sampler.sample(self.storage, batch_size, self.generator, cursor=self.cursor)
        index = info["index"]
        generation = self.writer.generation
        index_there = index.to(generation.device)
        if isinstance(self.writer, DeviceWriter):  # computed from the write count, no gather
            out = self._generation_out(index_there.shape, generation.device)
            info["generation"] = self.writer.generation_at(index_there, out)
        else:
            info["generation"] = torch.index_select(generation, 0, index_there)
        rows = getattr(self.storage, "gather", self.storage.get)(index)
        if self.transform is not None:
            rows = self.transform(rows)
        if self.pin_memory:
            rows, info = pinning.pin_sample(rows, info)  # looked up now: tests may replace it
        return rows, info

    def _generation_out(self, shape, device) -> torch.Tensor:
        pool = getattr(self.storage, "pool", None)
        if pool is None:
            return torch.empty(shape, dtype=torch.long, device=device)
        return pool.take("generation", shape, torch.long, device)

    def load_state_dict(self, state: dict) -> None:
        """As the reference (validated on staged copies, then committed); the storage's
        loaded columns are moved into its interleaved rows only after the commit, so
        a refused load never touches the live rows."""
        super().load_state_dict(state)
        if hasattr(self.storage, "repack"):
            self.storage.repack()

    def dumps(self, path) -> None:
        """The reference's checkpoint, byte for byte, streamed from the rows (``checkpoint_stream``)."""
        checkpoint_stream.save(self, path)

    def loads(self, path) -> None:
        """The reference's load and checks; the tensor file read once (``checkpoint_stream``)."""
        checkpoint_stream.load(self, path)

    def update_priority(self, index, priority, generation=None) -> None:
        """As the reference; the current generations from the writer (``generation_at``
        for a ``DeviceWriter``, else ``index_select``), none when there is nothing to
        compare them with (no ``generation``) and every slot is known to be written."""
        sampler, writer = self.sampler, self.writer
        if generation is None and isinstance(writer, DeviceWriter) and writer.write_count >= self.storage.capacity \
                and hasattr(sampler, "update_priority"):  # a ring with every slot written, a prioritized sampler
            sampler.update_priority(index, priority)  # the sampler checks the index (the same message)
            return
        if not self.prioritized:
            raise ValueError(f"sampler={type(self.sampler).__name__}, but should be prioritized")
        index = check_index_fast(index, self.capacity)
        if generation is None and self._all_written(index):
            self.sampler.update_priority(index, priority)
            return
        index_there = index.to(self.writer.generation.device)
        if isinstance(self.writer, DeviceWriter):
            current = self.writer.generation_at(index_there)
        else:
            current = self.writer.generation.index_select(0, index_there)
        self.sampler.update_priority(index, priority, generation, current_generation=current)

    def _all_written(self, index: torch.Tensor) -> bool:
        """Whether every slot in ``index`` (checked: in ``[0, capacity)``) holds a row,
        known without reading generations: a ``DeviceWriter`` is a ring, so slot ``s``
        was written iff ``s < write_count`` (its ``generation_at`` is -1 exactly there)."""
        if not isinstance(self.writer, DeviceWriter):
            return False
        written = min(self.writer.write_count, self.capacity)
        if written == self.capacity:
            return True
        return native.usable(index) and native.index_in_range(index, written)
