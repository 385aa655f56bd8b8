"""Which entry of a batched update wins: the last one for each distinct slot.

Shared by the torch and the Triton tree updates (``vector_tree``,
``triton_tree``), which both write one value per slot.
"""

from __future__ import annotations

import torch


def last_writes(index: torch.Tensor, mask: torch.Tensor | None = None):
    """``(order, is_last)``: a stable sort of ``index`` and, in that order, True
    at the last kept entry of each distinct index.

    Entries with ``mask`` False are sorted before the kept entries of the same
    index and never marked, so a masked-out entry can never win. O(k log k),
    no synchronisation with the device.
    """
    key = index * 2 if mask is None else index * 2 + mask.long()
    key, order = torch.sort(key, stable=True)
    is_last = torch.ones_like(key, dtype=torch.bool)
    is_last[:-1] = key[1:] != key[:-1]
    if mask is not None:
        is_last &= (key & 1).bool()
    return order, is_last
