"""Max-value writer: keeps the ``capacity`` rows with the largest value of one key.

Contract
--------
* ``MaxValueWriter(capacity, value_key)``: a row's value is ``data[value_key]``, one real
  number per row (row shape ``()`` or ``(1,)``), taken as float64; a missing key, another shape
  or a NaN is refused (ValueError) before anything changes.
* The held rows are always the top ``capacity`` of every row written, the larger value first;
  a tie goes to the EARLIER-written row. So a new row enters a full buffer only if its value is
  strictly larger than the lowest held value, and evicts the latest-written row holding that
  value. A lower row is DROPPED, not refused: ``place`` gives it slot ``-1``.
* Slots: kept new rows, in write order, take the free slots in increasing order (never-written
  ones and those of evicted rows), so the valid rows stay ``0 .. size-1``.
* ``write_count`` counts every row written, kept or not; ``generation[s]`` is the write number
  of the row in slot ``s`` (-1: never); ``cursor`` is the slot the next row takes if kept: the
  first never-written one, or once full that of the lowest-ranked held row.
* ``check_edit`` refuses an edit that changes a held row's value (ValueError): the ranking is of
  the values written, and an edit must not make it disagree with the rows.
* State: the write count and each slot's value and generation (the values cannot be derived
  from the count). A reopened memory-mapped storage cannot restore them (memmap_storage.py).

Cost: ``place`` O((capacity + n) log(capacity + n)); memory O(capacity).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int


class MaxValueWriter:
    """Keeps the top-``capacity`` rows by ``value_key`` (see module doc)."""

    def __init__(self, capacity: int, value_key="value"):
        self.capacity = check_int("capacity", capacity)
        if not (isinstance(value_key, str) and value_key) and not (
                isinstance(value_key, tuple) and value_key and all(isinstance(k, str) and k for k in value_key)):
            raise ValueError(f"value_key={value_key!r}, but should be a key (a str or a tuple of str)")
        self.value_key, self.write_count = value_key, 0
        self.value = torch.full((capacity,), -torch.inf, dtype=torch.float64)
        self.generation = torch.full((capacity,), -1, dtype=torch.long)

    @property
    def size(self) -> int:
        return min(self.write_count, self.capacity)

    @property
    def cursor(self) -> int:
        if self.size < self.capacity:
            return self.size
        lowest = self.value == self.value.min()
        return int(torch.where(lowest, self.generation, -1).argmax())

    def values(self, data) -> torch.Tensor:
        """The checked values of ``data``'s rows, float64[n]."""
        n = data.batch_size[0]
        if self.value_key not in data.keys(include_nested=True):
            raise ValueError(f"data keys lack {self.value_key!r}, but should hold value_key={self.value_key!r}")
        value = data.get(self.value_key)
        if value.numel() != n or value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"data[{self.value_key!r}] shape, dtype={tuple(value.shape)}, {value.dtype}, but "
                             f"should be one real number per row ({n},)")
        value = value.detach().reshape(n).to("cpu", torch.float64)
        if bool(value.isnan().any()):
            raise ValueError(f"data[{self.value_key!r}]={value.tolist()[:5]}, but should hold no NaN")
        return value

    def place(self, data) -> torch.Tensor:
        """The slot of each row of ``data`` (-1: dropped), in write order; updates the ranking."""
        value, n, size = self.values(data), data.batch_size[0], self.size
        new_gen = self.write_count + torch.arange(n)
        cand_value = torch.cat([self.value[:size], value])
        cand_gen = torch.cat([self.generation[:size], new_gen])
        order = torch.argsort(cand_gen, stable=True)  # earlier first, then by value (stable): ties to the earlier
        order = order[torch.argsort(-cand_value[order], stable=True)]
        kept = order[: self.capacity]
        kept_new = kept[kept >= size].sort().values - size  # in write order
        held = torch.zeros(size, dtype=torch.bool)
        held[kept[kept < size]] = True
        free = torch.cat([torch.nonzero(~held).reshape(-1), torch.arange(size, self.capacity)])[: len(kept_new)]
        index = torch.full((n,), -1, dtype=torch.long)
        index[kept_new] = free
        self.value[free], self.generation[free] = value[kept_new], new_gen[kept_new]
        self.write_count += n
        return index

    def check_edit(self, index: torch.Tensor, rows) -> None:
        """Refuse an edit that changes a held row's value."""
        new = self.values(rows)
        if not torch.equal(new, self.value[index]):
            raise ValueError(f"edit of {self.value_key!r} to {new.tolist()[:5]}, but should keep the held values "
                             f"{self.value[index].tolist()[:5]} (a max-value buffer ranks the values written)")

    def state_dict(self) -> dict:
        return {"write_count": self.write_count, "value": self.value.clone(), "generation": self.generation.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the state; ValueError (nothing changed) unless it is consistent."""
        count = check_int("write_count", state["write_count"], 0, 2**62)
        value, gen, size = state["value"], state["generation"], min(count, self.capacity)
        for name, got, dtype in (("value", value, torch.float64), ("generation", gen, torch.long)):
            if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != (self.capacity,):
                raise ValueError(f"{name}={got!r:.80}, but should be a {dtype} tensor of shape ({self.capacity},)")
        held = gen[:size]
        if bool((gen[size:] != -1).any() or (held < 0).any() or (held >= count).any()) \
                or len(held.unique()) != size or bool(value[:size].isnan().any()):
            raise ValueError(f"generation={gen.tolist()[:8]}, but should hold {size} distinct write numbers "
                             f"below {count} in slots 0..{size - 1} (-1 after) and values without NaN")
        self.write_count, self.value, self.generation = count, value.clone(), gen.clone()
