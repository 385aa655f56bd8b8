"""Fixed-capacity storage of TensorDict rows in preallocated tensors.

Contract
--------
* ``TensorStorage(capacity, device)`` holds at most ``capacity`` rows. Nothing is allocated
  until the first ``set``: that batch fixes the layout (keys, per-row shapes, dtypes) and one
  tensor of ``capacity`` rows is allocated per key. Later batches must have exactly that layout.
* ``set(index, data)`` copies row ``i`` of ``data`` into slot ``index[i]``; when ``index``
  repeats a slot (a batch larger than the ring) the LAST row wins. The writer fills slots
  ``0, 1, 2, ...`` in order, so the valid rows are ``0 .. size-1`` with ``size = min(rows
  written, capacity)``. ``get(index)`` returns a new TensorDict of those rows (a copy).
* The state is the columns alone: ``load_state_dict(state, size)`` is told the size, which the
  buffer derives from its writer's write count.

Cost: ``set`` and ``get`` O(len(index) * row size); memory O(capacity * row size), allocated once.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference.arguments import READABLE_DEVICES, check_index, check_int, last_occurrence


def columns(data: TensorDictBase | None) -> dict[tuple[str, ...], torch.Tensor]:
    """The leaves of ``data`` keyed by their full key as a tuple of strings ({} for None)."""
    out = {}
    for key, value in data.items(include_nested=True, leaves_only=True) if data is not None else ():
        key = key if isinstance(key, tuple) else (key,)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"data[{key}]={type(value).__name__}, but should be a tensor")
        out[key] = value
    return out


class TensorStorage:
    """Rows of a TensorDict in ``capacity`` preallocated slots (see module doc)."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        self.capacity = check_int("capacity", capacity)
        self.device = torch.device(device)
        self.data: TensorDictBase | None = None  # full-capacity TensorDict once allocated
        self.size = 0  # rows 0 .. size-1 are valid

    def __len__(self) -> int:
        return self.size

    def check(self, data: TensorDictBase) -> None:
        """Raise ValueError unless ``data`` is a batch ``[n]`` matching the layout."""
        if not isinstance(data, TensorDictBase):
            raise ValueError(f"data={type(data).__name__}, but should be a TensorDict")
        if data.batch_dims != 1 or data.batch_size[0] < 1:
            raise ValueError(f"data.batch_size={list(data.batch_size)}, but should be [n] with n >= 1")
        cols = columns(data)
        if not cols:
            raise ValueError("data has no tensors, but should have at least one")
        for key, value in cols.items():
            if value.device.type not in {*READABLE_DEVICES, self.device.type}:
                raise ValueError(f"data[{key}].device={value.device}, but should be cpu or {self.device}")
        got, want = layout_of(data), layout_of(self.data)
        if want and set(got) != set(want):
            raise ValueError(f"data keys={sorted(got)}, but should be {sorted(want)}")
        wrong = [key for key in want if got[key] != want[key]]
        if wrong:
            raise ValueError(f"data[{wrong[0]}] row shape, dtype={got[wrong[0]]}, but should be {want[wrong[0]]}")

    def set(self, index, data: TensorDictBase) -> None:
        """Write the rows of ``data`` into the slots ``index`` (last row wins on repeats)."""
        index = check_index(index, self.capacity)
        self.check(data)
        if len(index) != data.batch_size[0]:
            raise ValueError(f"len(index)={len(index)}, but should be len(data)={data.batch_size[0]}")
        if self.data is None:
            self.data = self._allocate(data)
        keep = last_occurrence(index, self.capacity)  # index_put with repeats is unordered
        rows = data if keep.all() else data[keep]
        self.data[index[keep].to(self.device)] = rows.to(self.device)
        self.size = max(self.size, int(index.max()) + 1)

    def _allocate(self, data: TensorDictBase) -> TensorDictBase:
        """One zeroed column of ``capacity`` rows per key of ``data`` (the first batch)."""
        out = TensorDict({}, batch_size=[self.capacity], device=self.device)
        for key, value in columns(data).items():
            out.set(key, torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device))
        return out

    def get(self, index) -> TensorDictBase:
        """A copy of the rows at ``index`` (each must be a valid row)."""
        return self.data[check_index(index, self.size).to(self.device)]

    def state_dict(self) -> dict:
        """``keys`` (lists of str) and the full-capacity ``columns``, one to one."""
        cols = columns(self.data)
        return {"keys": [list(k) for k in cols], "columns": [v.clone() for v in cols.values()]}

    def load_state_dict(self, state: dict, size: int) -> None:
        """Replace the contents, ``size`` rows valid; ValueError (nothing changed) on a mismatch."""
        size = check_int("size", size, 0, self.capacity + 1)
        keys, values = [tuple(k) for k in state["keys"]], state["columns"]
        if len(keys) != len(values) or (size and not keys):
            raise ValueError(f"{len(values)} columns for keys={keys!r:.200} and size={size}, but "
                             f"should be one per key (and size 0 without any)")
        data = TensorDict({}, batch_size=[self.capacity], device=self.device) if keys else None
        for key, value in zip(keys, values, strict=True):
            if not isinstance(value, torch.Tensor) or value.shape[:1] != (self.capacity,):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{key}.shape={shape}, but should start with {self.capacity}")
            if not (key and all(isinstance(part, str) and part for part in key)) \
                    or keys.count(key) > 1 or any(key[:i] in keys for i in range(1, len(key))):
                raise ValueError(f"key={key!r:.100}, but should be a list of non-empty strings, "
                                 f"distinct from the others and not inside one")
            data.set(key, self._take(value))
        if self.data is not None and data is not None and layout_of(data) != layout_of(self.data):
            raise ValueError(f"field layout={layout_of(data)}, but should be {layout_of(self.data)}")
        self.data, self.size = data, size

    def _take(self, value: torch.Tensor) -> torch.Tensor:
        """A loaded column as this storage's own: a copy (the caller keeps its tensors)."""
        return value.to(self.device).clone()


def layout_of(data: TensorDictBase | None) -> dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (row shape, dtype)}`` of a TensorDict of rows ({} for None: nothing allocated)."""
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in columns(data).items()}
