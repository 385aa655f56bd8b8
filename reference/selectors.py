"""Item selectors of a served table (Reverb's model): which held item a
sample draws, and which item a full table removes.

Contract
--------
A selector holds keys with a priority and an *update number* (a counter of
the table's inserts and priority updates: the item's last one). ``select()``
names one held key without removing it:

* ``"fifo"``: the key inserted first (the oldest held);
* ``"lifo"``: the key inserted last (the newest held);
* ``"min_heap"``: the lowest priority; ties go to the smallest update number
  (the least recently inserted or updated), Reverb's rule
  (``reverb/cc/selectors/heap.h``: "the least recently inserted or updated
  key is sampled"; HeapNode ordered by (priority * sign, update_number));
* ``"max_heap"``: the highest priority, the same tie rule;
* ``"random"``: uniform over the held keys (Reverb's ``Uniform``);
* ``"prioritized"``: key k with probability ``p_k ** alpha / sum_j p_j ** alpha``
  (Reverb's ``Prioritized(priority_exponent)``); all-zero masses: uniform.

A priority update (``update``) moves a key in a heap and gives it a new
update number; it never changes its place in "fifo" or "lifo".

Cost: O(n) a ``select()`` over n held keys (a readable scan, not a heap);
O(1) ``insert``, ``update`` and ``delete``.
"""

from __future__ import annotations

import torch

KINDS = ("fifo", "lifo", "min_heap", "max_heap", "random", "prioritized")
#: The selectors that are deterministic (Reverb: options.is_deterministic).
DETERMINISTIC = ("fifo", "lifo", "min_heap", "max_heap")


class Selector:
    """One of :data:`KINDS` over the keys of one table (module docstring)."""

    def __init__(self, kind: str, alpha: float = 1.0, generator: torch.Generator | None = None):
        if kind not in KINDS:
            raise ValueError(f"selector={kind!r}, but should be one of {list(KINDS)}")
        self.kind, self.alpha, self.generator = kind, float(alpha), generator
        self.items: dict[int, tuple[float, int, int]] = {}  # key -> (priority, update number, insert number)

    def __len__(self) -> int:
        return len(self.items)

    def insert(self, key: int, priority: float, number: int) -> None:
        """Hold ``key`` (``number``: the table's counter of inserts and updates)."""
        if key in self.items:
            raise KeyError(f"key={key} already held, but should be new")
        self.items[key] = (float(priority), number, number)

    def update(self, key: int, priority: float, number: int) -> None:
        _, _, inserted = self.items[key]
        self.items[key] = (float(priority), number, inserted)

    def delete(self, key: int) -> None:
        del self.items[key]

    def select(self) -> int:
        """The key the next draw (or removal) takes; the items are kept."""
        if not self.items:
            raise IndexError("select() on an empty selector, but should hold at least one key")
        items = self.items.items()
        if self.kind == "fifo":
            return min(items, key=lambda kv: kv[1][2])[0]
        if self.kind == "lifo":
            return max(items, key=lambda kv: kv[1][2])[0]
        if self.kind == "min_heap":
            return min(items, key=lambda kv: (kv[1][0], kv[1][1]))[0]
        if self.kind == "max_heap":
            return min(items, key=lambda kv: (-kv[1][0], kv[1][1]))[0]
        keys = list(self.items)  # insertion order (dicts keep it)
        if self.kind == "random":
            mass = torch.ones(len(keys), dtype=torch.float64)
        else:
            mass = torch.tensor([self.items[k][0] for k in keys], dtype=torch.float64) ** self.alpha
            if float(mass.sum()) <= 0:
                mass = torch.ones(len(keys), dtype=torch.float64)
        return keys[int(torch.multinomial(mass, 1, generator=self.generator))]


__all__ = ["DETERMINISTIC", "KINDS", "Selector"]
