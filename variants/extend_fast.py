"""``extend``'s fast path: the reference's checks and results, less Python.

Profiled (rows obs float32[8], action float32[2], reward float32[1], priority,
one torch thread, 2^16 slots, a busy 2-core machine): ``extend`` of one row
took ~270 us at best, nearly all of it Python around a few small copies:
the layout check walked the batch's and the storage's TensorDicts
(``columns`` twice, ``layout_of`` twice: ~25%), the priority was checked
twice (``priority_of``, then again in ``on_write``: two conversions, two
finiteness passes, two ``max`` reductions for the overflow guard), the
writer built its slots with ``arange`` + ``%`` and the generations with
another ``arange``, and the storage walked the batch's items once more.

``try_extend(buffer, data)`` does the same work once, in this order:

1. the layout: the batch is a plain ``TensorDict`` whose top-level tensors are
   exactly the storage's columns (same keys, per-row shapes, dtypes, on the
   CPU), compared against the storage's column list; anything else (nested
   keys, another class, the first write that allocates, another device)
   returns None and the full path runs (and raises the reference's errors);
2. the priority column (when the sampler is prioritized and the batch carries
   ``priority_key``): one C pass (``native.prepare_update``) checks the slots
   and priorities (finite, >= 0) and computes ``priority + eps`` and the new
   max priority, torch's ``pow`` finishes the reference's transform (the
   same bits), one C pass checks no transform overflowed and commits the
   max, and one C call per ring segment writes both trees' leaves and
   recomputes each ancestor of the range once (``native.update_range``; through
   ``PrioritizedSampler._update_native``, the path ``update_priority`` takes). A failed check changes
   nothing and returns None: the full path then raises the reference's
   error. Without a priority column: the max priority, as ``on_write``;
3. only then the writes, which cannot fail: each column with one or two
   slice copies (``ring_slices``), the generations with ``arange(out=)``
   into the generation column's slices, the write count, cursor, size.

Applies to ``DeviceStorage`` on the CPU, ``DeviceWriter`` and the variants'
``RandomSampler`` / ``PrioritizedSampler`` (CPU trees, native path loaded),
for ``1 <= n <= capacity`` rows; the state afterwards is the reference's bit
for bit (tests/variants/test_extend_fast_path.py).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.variants.device_storage import DeviceStorage, DeviceWriter, ring_slices
from rbcheck.variants.prioritized import PrioritizedSampler
from rbcheck.variants.random_sampler import RandomSampler

#: Set to False to turn the fast path off (the tests compare both paths).
ENABLED = True


def _sources(storage: DeviceStorage, data) -> list | None:
    """The batch's tensors in the storage's column order when its layout is exactly the
    storage's (top-level keys only), else None."""
    source = getattr(data, "_tensordict", None)
    cols = storage._cols
    if type(source) is not dict or len(source) != len(cols):
        return None
    out = []
    for key, column in cols:
        if len(key) != 1:
            return None
        value = source.get(key[0])
        if type(value) is not torch.Tensor or value.dtype != column.dtype \
                or value.device.type != "cpu" or value.shape[1:] != column.shape[1:]:
            return None
        out.append(value)
    return out


def try_extend(buffer, data) -> torch.Tensor | None:
    """The slots of ``data``'s rows, written as the reference writes them, or None when the
    fast path does not apply or a check fails (nothing changed: the caller runs the full
    path, which raises the reference's error)."""
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    if not ENABLED or type(data) is not TensorDict or type(storage) is not DeviceStorage \
            or type(writer) is not DeviceWriter or storage.data is None or storage.device.type != "cpu" \
            or writer.device.type != "cpu":
        return None
    batch = data.batch_size
    if len(batch) != 1:
        return None
    n, capacity = batch[0], storage.capacity
    if not 1 <= n <= capacity:
        return None
    sources = _sources(storage, data)
    if sources is None:
        return None
    prioritized = type(sampler) is PrioritizedSampler
    if not prioritized and type(sampler) is not RandomSampler:
        return None
    first = writer.cursor
    end = first + n
    if end <= capacity:
        index = torch.arange(first, end)
    else:
        index = torch.arange(first, end) % capacity
    if prioritized:
        key = buffer.priority_key
        priority = data._tensordict.get(key) if isinstance(key, str) else None
        if priority is None and key is not None and key in data.keys(include_nested=True):
            return None  # a nested priority key: the full path
        if priority is not None:
            if priority.dim() != 1 or not sampler._update_native(index, priority, first):
                return None  # another shape, or a check failed: nothing changed
        else:
            sampler._store(index, sampler._max_priority.expand(n))
    # the writes (nothing below can fail)
    count = writer.write_count
    generation = writer.generation
    for s0, s1, r0, r1 in ring_slices(first, n, capacity):
        for (_, column), value in zip(storage._cols, sources, strict=True):
            column[s0:s1].copy_(value[r0:r1])
        torch.arange(count + r0, count + r1, out=generation[s0:s1])
    storage.size = max(storage.size, min(end, capacity))
    storage.version += 1
    writer.write_count = count + n
    writer.cursor = writer.write_count % capacity
    return index
