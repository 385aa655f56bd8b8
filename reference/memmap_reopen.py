"""Closing a buffer over a ``MemmapStorage`` and reopening it from the files.

Contract
--------
* ``close_buffer(buffer)`` closes the storage (``memmap_storage.MemmapStorage.close``) with the
  write count in its manifest.
* ``reopened(buffer)`` takes a buffer built over ``MemmapStorage(..., reopen=True)`` to the write
  count it was closed with, so its length, cursor, write count, generations and contents are the
  closed buffer's. Priorities are not in the files: a prioritized sampler gives each held row a
  new row's priority. A writer whose state is more than a write count (max-value) is refused.

Cost: O(capacity) (the generations, and the held rows' priorities).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.memmap_storage import StorageFileError


def close_buffer(buffer) -> None:
    """Close ``buffer``'s memory-mapped storage; its manifest keeps the write count."""
    buffer.storage.close({"write_count": buffer.write_count})


def reopened(buffer):
    """``buffer`` (built over ``MemmapStorage(..., reopen=True)``) at the write count it was closed
    with: cursor and generations follow. Priorities are not in the files: a prioritized sampler
    gives each held row a new row's. A writer whose state is more than a write count (a max-value
    one) cannot be restored: ValueError. Returns ``buffer``."""
    extra, size = buffer.storage.extra, len(buffer.storage)
    count = check_int("write_count", (extra or {}).get("write_count") if isinstance(extra, dict) else None, 0, 2**62)
    if min(count, buffer.capacity) != size:
        raise StorageFileError(f"write_count={count} with {size} rows held, but should hold min(write_count, "
                               f"capacity={buffer.capacity}) rows")
    try:
        buffer.writer.load_state_dict({"write_count": count})
    except (KeyError, ValueError) as error:
        raise ValueError(f"writer={type(buffer.writer).__name__} ({error!r}), but should be restorable from a "
                         f"write count (a round-robin or immutable writer) to reopen") from error
    buffer.sampler.on_write(torch.arange(size), None)
    return buffer
