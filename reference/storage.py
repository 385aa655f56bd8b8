"""Fixed-capacity storage of TensorDict rows in preallocated tensors.

Contract
--------
* ``TensorStorage(capacity, device)`` holds at most ``capacity`` rows. Nothing
  is allocated until the first ``set``: that batch fixes the layout (keys,
  per-row shapes, dtypes) and one tensor of ``capacity`` rows is allocated per
  key. Later batches must have exactly that layout.
* ``set(index, data)`` copies row ``i`` of ``data`` into slot ``index[i]``.
  When ``index`` repeats a slot (a batch larger than the ring) the LAST row
  wins. The writer fills slots ``0, 1, 2, ...`` in order, so the valid rows
  are ``0 .. size-1`` and ``size = min(rows written, capacity)``.
* ``get(index)`` returns a new TensorDict of ``len(index)`` rows (a copy).

Cost: ``set`` and ``get`` are O(len(index) * row size); memory is
O(capacity * row size), allocated once.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

#: Device types whose tensors can be read (copied) by the buffer.
READABLE_DEVICES = ("cpu", "cuda")


def as_tensor(value, name: str) -> torch.Tensor:
    """``value`` as a tensor on a readable device, or ValueError naming ``name``."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name}={value!r:.80}, but should be a tensor of numbers ({error})") from None
    if tensor.device.type not in READABLE_DEVICES:
        raise ValueError(f"{name}.device={tensor.device}, but should be one of {READABLE_DEVICES}")
    return tensor


def check_index(index, high: int, name: str = "index") -> torch.Tensor:
    """Return ``index`` as a 1-D int64 CPU tensor after checking ``0 <= index < high``."""
    index = as_tensor(index, name)
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise ValueError(f"{name}.dtype={index.dtype}, but should be an integer dtype")
    if index.dim() != 1:
        raise ValueError(f"{name}.shape={tuple(index.shape)}, but should be 1-D")
    index = index.long().cpu()
    bad = index[(index < 0) | (index >= high)]
    if bad.numel():
        raise ValueError(f"{name}={bad[:5].tolist()}, but should be in [0, {high})")
    return index


def last_occurrence(index: torch.Tensor, high: int) -> torch.Tensor:
    """Boolean mask keeping only the last occurrence of each value of ``index``."""
    position = torch.arange(len(index))
    last = torch.full((high,), -1, dtype=torch.long)
    last.scatter_reduce_(0, index, position, reduce="amax")
    return last[index] == position


def columns(data: TensorDictBase) -> dict[tuple[str, ...], torch.Tensor]:
    """The leaves of ``data`` keyed by their full key as a tuple of strings."""
    out = {}
    for key, value in data.items(include_nested=True, leaves_only=True):
        key = key if isinstance(key, tuple) else (key,)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"data[{key}]={type(value).__name__}, but should be a tensor")
        out[key] = value
    return out


class TensorStorage:
    """Rows of a TensorDict in ``capacity`` preallocated slots (see module doc)."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity={capacity!r}, but should be an int >= 1")
        self.capacity = capacity
        self.device = torch.device(device)
        self.data: TensorDictBase | None = None  # full-capacity TensorDict once allocated
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def layout(self) -> dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]]:
        """``{key: (row shape, dtype)}`` of the allocated storage ({} before the first write)."""
        if self.data is None:
            return {}
        return {k: (tuple(v.shape[1:]), v.dtype) for k, v in columns(self.data).items()}

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
        got = {k: (tuple(v.shape[1:]), v.dtype) for k, v in cols.items()}
        want = self.layout()
        if want and set(got) != set(want):
            raise ValueError(f"data keys={sorted(got)}, but should be {sorted(want)}")
        for key, (shape, dtype) in want.items():
            if got[key] != (shape, dtype):
                raise ValueError(
                    f"data[{key}] row shape, dtype={got[key]}, but should be {(shape, dtype)}"
                )

    def set(self, index, data: TensorDictBase) -> None:
        """Write the rows of ``data`` into the slots ``index`` (last row wins on repeats)."""
        index = check_index(index, self.capacity)
        self.check(data)
        if len(index) != data.batch_size[0]:
            raise ValueError(f"len(index)={len(index)}, but should be len(data)={data.batch_size[0]}")
        if self.data is None:
            self.data = TensorDict({}, batch_size=[self.capacity], device=self.device)
            for key, value in columns(data).items():
                shape = (self.capacity, *value.shape[1:])
                self.data.set(key, torch.zeros(shape, dtype=value.dtype, device=self.device))
        keep = last_occurrence(index, self.capacity)  # index_put with repeats is unordered
        rows = data if keep.all() else data[keep]
        self.data[index[keep].to(self.device)] = rows.to(self.device)
        self.size = max(self.size, int(index.max()) + 1)

    def get(self, index) -> TensorDictBase:
        """A copy of the rows at ``index`` (each must be a valid row)."""
        index = check_index(index, self.size)
        return self.data[index.to(self.device)]

    def state_dict(self) -> dict:
        """Plain values plus tensors: ``keys`` (lists of str) match ``columns`` one to one."""
        cols = columns(self.data) if self.data is not None else {}
        return {
            "capacity": self.capacity,
            "size": self.size,
            "keys": [list(k) for k in cols],
            "columns": [v.clone() for v in cols.values()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents; raises ValueError (before changing anything) on a mismatch."""
        if state["capacity"] != self.capacity:
            raise ValueError(f"capacity={state['capacity']}, but should be {self.capacity}")
        size = state["size"]
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= self.capacity:
            raise ValueError(f"size={size!r}, but should be an int in [0, {self.capacity}]")
        keys = [tuple(k) for k in state["keys"]]
        if not all(k and all(isinstance(part, str) and part for part in k) for k in keys):
            raise ValueError(f"keys={keys!r:.200}, but should be lists of non-empty strings")
        if len(set(keys)) != len(keys) or any(k[:i] in keys for k in keys for i in range(1, len(k))):
            raise ValueError(f"keys={keys!r:.200}, but should be distinct leaves (no key inside another)")
        if not keys and size:
            raise ValueError(f"size={size} with no columns, but should be 0")
        if len(keys) != len(state["columns"]):
            raise ValueError(f"len(columns)={len(state['columns'])}, but should be {len(keys)}")
        got = {}
        for key, value in zip(keys, state["columns"], strict=True):
            if not isinstance(value, torch.Tensor) or value.shape[:1] != (self.capacity,):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{key}.shape={shape}, but should start with {self.capacity}")
            got[key] = (tuple(value.shape[1:]), value.dtype)
        if self.data is not None and got != self.layout():
            raise ValueError(f"field layout={got}, but should be {self.layout()}")
        data = None
        if keys:
            data = TensorDict({}, batch_size=[self.capacity], device=self.device)
            for key, value in zip(keys, state["columns"], strict=True):
                data.set(key, value.to(self.device).clone())
        self.data, self.size = data, size
