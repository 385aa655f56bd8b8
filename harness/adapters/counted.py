"""What the adapters that count their own writes share.

A wrapper whose library does not report how many rows it has taken keeps
``self.written`` (rows written since ``make``) next to ``self.spec`` and
``self.rb`` (the library's buffer). ``CountedWrites`` derives from them what
every such wrapper answered alike: the slots of a write (write number modulo
``spec.capacity``), ``add`` as a one-row ``extend``, ``len`` as the library's
``len(self.rb)``, ``cursor`` as the next write's slot and ``write_count``.
A wrapper whose library knows better (its own insertion index, its own size)
overrides that one member. Cost: O(n) for the slots of n rows, O(1) else.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


class CountedWrites:
    def slots(self, start: int, n: int) -> torch.Tensor:
        """The slots of ``n`` rows written from write number ``start`` on."""
        return (start + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    def __len__(self) -> int:
        return len(self.rb)

    @property
    def cursor(self) -> int:
        return self.written % self.spec.capacity

    @property
    def write_count(self) -> int:
        return self.written


__all__ = ["CountedWrites"]
