"""Which entry of a batched update wins: the last one for each distinct slot.

Shared by the torch and the Triton tree updates (``vector_tree``,
``triton_tree``), which both write one value per slot.
"""

from __future__ import annotations

import torch

#: Sort keys below this bound are sorted as int32 (``narrow_keys``); False: always int64
#: (kept to measure one against the other).
NARROW_KEYS = True


def narrow_keys(index: torch.Tensor, size: int) -> torch.Tensor:
    """``index`` as int32 when every key built from it (``index`` or ``2 * index + 1``,
    and ``index + size`` in the Triton kernels) stays below 2**31, i.e. ``size <= 2**29``
    for indices below the tree's ``size``; else unchanged. A stable sort of the same
    values gives the same order in either type, and a radix sort of 32-bit keys runs
    half the passes of a 64-bit one."""
    return index.to(torch.int32) if NARROW_KEYS and size <= 2**29 else index


def last_writes(index: torch.Tensor, mask: torch.Tensor | None = None, size: int = 2**62):
    """``(order, is_last)``: a stable sort of ``index`` and, in that order, True
    at the last kept entry of each distinct index (``size``: a bound on ``index``,
    the tree's leaf count; below 2**29 the keys are sorted as int32).

    Entries with ``mask`` False are sorted before the kept entries of the same
    index and never marked, so a masked-out entry can never win. O(k log k),
    no synchronisation with the device.
    """
    key = narrow_keys(index, size)
    key = key * 2 if mask is None else key * 2 + mask.to(key.dtype)
    key, order = torch.sort(key, stable=True)
    is_last = torch.ones_like(key, dtype=torch.bool)
    is_last[:-1] = key[1:] != key[:-1]
    if mask is not None:
        is_last &= (key & 1).bool()
    return order, is_last
