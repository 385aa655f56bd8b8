"""What the NumPy-backed third-party adapters (cpprb, tianshou,
stable-baselines3) share: rows between a ``TensorDict`` and NumPy arrays, a
per-buffer stream of NumPy's global generator, and how they talk about
errors.

None of this validates data on a library's behalf: rows are handed over as
they come (every leaf, whatever its key, shape or dtype), so what a library
accepts or refuses is the library's own doing.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

#: A row layout: (key as a tuple, per-row shape, torch dtype), in a fixed order.
RowLayout = tuple[tuple[tuple[str, ...], tuple[int, ...], torch.dtype], ...]


def as_key(key: Any) -> tuple[str, ...]:
    return tuple(key) if isinstance(key, tuple) else (key,)


def layout_from_spec(layout: Mapping[Any, tuple[tuple[int, ...], torch.dtype]] | None) -> RowLayout | None:
    """``BufferSpec.layout`` as a :data:`RowLayout` (sorted by key), or None."""
    if layout is None:
        return None
    return tuple(sorted((as_key(k), tuple(shape), dtype) for k, (shape, dtype) in layout.items()))


def layout_from_rows(data: TensorDictBase, batched: bool = True) -> RowLayout:
    """The layout of ``data`` (rows with a batch dimension unless ``batched=False``)."""
    skip = 1 if batched else 0
    return tuple(
        sorted(
            (as_key(k), tuple(v.shape[skip:]), v.dtype)
            for k, v in data.items(include_nested=True, leaves_only=True)
        )
    )


def to_numpy(value: Any) -> np.ndarray:
    """A tensor (or array) as a NumPy array on the CPU, WITHOUT a copy where
    NumPy can view the tensor's memory (a CPU tensor): the library receives
    the caller's own memory, so whether it keeps a reference is the
    library's doing and the ownership properties see it. A tensor on the
    ``meta`` device has no data to hand a NumPy-based library: the calling
    test is skipped as not applicable (it is not a refusal by the library)."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            import pytest

            pytest.skip("not applicable: the library takes NumPy arrays, and a tensor on the meta "
                        "device has no data to convert")
        return value.detach().cpu().resolve_conj().resolve_neg().numpy()
    return np.asarray(value)


def leaves(data: TensorDictBase | Mapping[Any, Any]) -> dict[tuple[str, ...], np.ndarray]:
    """Every leaf of ``data`` (a TensorDict, or a plain mapping of arrays) as
    a NumPy array on the CPU (a view of the caller's memory where possible:
    :func:`to_numpy`), by tuple key."""
    if not isinstance(data, TensorDictBase):
        return {as_key(k): to_numpy(v) for k, v in data.items()}
    return {as_key(k): to_numpy(v) for k, v in data.items(include_nested=True, leaves_only=True)}


def row_count(data: TensorDictBase | Mapping[Any, Any]) -> int:
    """Rows in ``data``: its first batch dimension (a plain mapping: its first leaf's length)."""
    if isinstance(data, TensorDictBase):
        return data.batch_size[0] if data.batch_dims else 1
    first = next(iter(data.values()), None)
    return len(first) if first is not None and np.ndim(first) else 1


def as_torch(array: Any) -> torch.Tensor:
    """``array`` as a tensor sharing its memory (no copy): what a library
    returns is handed through as it is, so a returned array that aliases the
    library's storage is seen by the ownership properties. Only memory torch
    cannot view (negative strides, strides that are not a multiple of the
    item size: rows of bytes viewed as wider types) is copied; the SB3
    adapter checks what SB3 returns at its boundary instead."""
    array = np.asarray(array)
    if any(stride < 0 or stride % max(array.itemsize, 1) for stride in array.strides):
        array = np.array(array, copy=True, order="C")  # a copy even where NumPy calls it contiguous
    with warnings.catch_warnings():  # a read-only array: torch warns that writes would be undefined
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(array)


def rows_from_arrays(layout: RowLayout, arrays: Mapping[tuple[str, ...], Any], n: int) -> TensorDict:
    """``n`` rows from per-key arrays of shape ``[n, *row_shape]`` (any array
    the layout's shape can be reshaped from; dtype as stored), sharing the
    arrays' memory wherever a view can (:func:`as_torch`; no copy in, no copy
    out, so a library's own aliasing is not hidden)."""
    td = TensorDict({}, batch_size=[n])
    for key, shape, _dtype in layout:
        td.set(key if len(key) > 1 else key[0], as_torch(arrays[key]).reshape(n, *shape))
    return td


# -- bytes: one flat uint8 vector per row (stable-baselines3's observations) --


def row_nbytes(layout: RowLayout) -> int:
    total = 0
    for _key, shape, dtype in layout:
        total += int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    return total


def pack_rows(data: TensorDictBase) -> np.ndarray:
    """``[n, nbytes]`` uint8: each row's leaves (sorted by key) as raw bytes,
    whatever leaves ``data`` has."""
    n = row_count(data)
    parts = [
        np.ascontiguousarray(value).reshape(n, -1).view(np.uint8)
        for _key, value in sorted(leaves(data).items())
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.uint8)


def skip_renamed_rows(data: TensorDictBase, layout: RowLayout, raw: np.ndarray, library: str) -> None:
    """Skip, as not applicable, rows whose keys differ from ``layout`` but
    whose packed size is the same: a library that stores each row as one
    unnamed byte array never sees what differs (the key names)."""
    if (isinstance(data, TensorDictBase) and data.batch_dims == 1
            and layout_from_rows(data) != layout and raw.shape[1] == row_nbytes(layout)):
        import pytest

        pytest.skip(f"not applicable: {library} stores each row as one unnamed array; rows whose keys "
                    "differ but whose size is the same cannot be told apart by it")


def unpack_rows(layout: RowLayout, raw: np.ndarray) -> TensorDict:
    """The inverse of :func:`pack_rows` for rows of ``layout``."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(len(raw), row_nbytes(layout))
    n, offset, arrays = len(raw), 0, {}
    for key, shape, dtype in layout:
        width = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        arrays[key] = raw[:, offset : offset + width].view(np_dtype)  # a view of the library's array
        offset += width
    return rows_from_arrays(layout, arrays, n)


# -- NumPy's global generator, one stream per buffer ------------------------


class GlobalNumpyStream:
    """A private state for NumPy's *global* generator (``np.random.*``).

    cpprb's ``ReplayBuffer.sample`` and stable-baselines3's
    ``BaseBuffer.sample`` draw from ``np.random`` and have no seed argument;
    a user makes them reproducible with ``np.random.seed``. To keep buffers
    (and the rest of the test process) from sharing one stream, each buffer
    keeps its own state, seeded with ``spec.seed``, and ``with stream:``
    swaps it in for the length of one library call (then puts the caller's
    state back).
    """

    def __init__(self, seed: int) -> None:
        self.state = np.random.RandomState(seed).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        outer = np.random.get_state()
        np.random.set_state(self.state)
        try:
            yield
        finally:
            self.state = np.random.get_state()
            np.random.set_state(outer)


def strip_paths(text: str) -> str:
    """Drop directories from file paths in an error text (keep the file name)."""
    return re.sub(r"(?<![\w:/.])(?:/[^/\s:]+)+/([^/\s:]+)", r"\1", text)


def check_batch_size(batch_size: Any, default: int | None) -> int:
    """The batch size to hand the library (the spec's default when None);
    the value is passed through unchecked: validating it is the library's job."""
    return default if batch_size is None else batch_size


__all__ = [
    "GlobalNumpyStream",
    "RowLayout",
    "as_key",
    "as_torch",
    "check_batch_size",
    "layout_from_rows",
    "layout_from_spec",
    "leaves",
    "pack_rows",
    "row_nbytes",
    "row_count",
    "rows_from_arrays",
    "strip_paths",
    "to_numpy",
    "unpack_rows",
]


class OwnRandomness:
    """Parts of the protocol a library that draws its own randomness and has
    no checkpoint of its buffer cannot offer: each raises, naming the
    capability left undeclared. ``LIBRARY`` names the library in the message."""

    LIBRARY = "this library"

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            f"{self.LIBRARY} draws its own random numbers (capability 'shared_rng' is not declared)")

    def save(self, path) -> None:
        raise NotImplementedError(
            f"{self.LIBRARY} has no checkpoint of the buffer state ('save_load' is not declared)")

    def load(self, path) -> None:
        raise NotImplementedError(
            f"{self.LIBRARY} has no checkpoint of the buffer state ('save_load' is not declared)")
