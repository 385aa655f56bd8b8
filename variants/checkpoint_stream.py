"""The variant buffer's checkpoints: the reference's files and checks, at the disk's speed.

Contract
--------
* ``save(buffer, path)`` writes the files ``reference.checkpoint.save_checkpoint`` writes,
  byte for byte (the same safetensors header, tensor order and ``meta.json``), through the
  same protocol (``commit_checkpoint``: a new sub-directory, fsync, the atomic swap of
  ``CURRENT``, the same clean-up), but from the buffer's own memory: no clone of the state,
  no safetensors bytes object. A contiguous tensor is written from its own memory
  (a ``memoryview``); a column that is a field of the storage's interleaved rows (strided)
  is gathered ``CHUNK`` bytes at a time into one reused staging buffer (cache-sized: the
  one copy a strided column needs before a ``write``). Each chunk is hashed (XXH3-128,
  ``checkpoint_format.hasher``) right after it is written, while it is still in cache: one
  pass over the bytes. On Linux each written range is handed to writeback
  (``sync_file_range``) as it goes, so the final fsync waits for less. A state this writer
  cannot stream (a dtype without a safetensors name, a big-endian host) is saved by the
  reference.
* ``read(path, capacity=None)`` makes the checks of ``reference.checkpoint.read_checkpoint``,
  in its order, and returns the same state, or raises the same ``CheckpointError``.
  ``meta.json`` is decoded first (schema version, keys, checksum); then the tensor file is
  read ONCE, hashed as it arrives: its safetensors header first; when the header is
  regular (``entries``: known keys and dtypes, offsets in order, aligned, exactly the
  file's size) every tensor is preallocated from it and the file is read straight into
  those tensors (``readinto``); the storage's columns (``capacity`` rows each, given by a
  loader whose storage keeps interleaved CPU rows) into new interleaved rows
  (``device_storage.interleaved_columns``), through the staging buffer. The digest is
  compared before anything is returned. Any doubt about the header (irregular, or a file
  that changed size) reads the file whole and asks the reference's decoder, which gives
  its own answer or error. The storage's columns come as ``FreshColumns`` (``packed`` when
  they are interleaved rows), which ``DeviceStorage`` adopts instead of copying.
* ``load(buffer, path)`` is ``reference.checkpoint.load_checkpoint`` over ``read``: the
  meaning and fit are checked on the new memory; the buffer is unchanged when anything is
  refused, and adopts the new memory only once everything was accepted.
* Schema 2 checkpoints (sha256) are read the same way with their own hash.

Cost: save O(state), ``CHUNK`` bytes of extra memory; load O(state), the new memory the
buffer keeps (plus ``CHUNK``), no second copy.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
from pathlib import Path

import torch

from rbcheck.reference import checkpoint_format as fmt
from rbcheck.reference.checkpoint import (
    MAX_META_BYTES,
    MAX_TENSOR_BYTES,
    _read,
    _write,
    commit_checkpoint,
    live_dir,
    load_checkpoint,
    open_regular,
    save_checkpoint,
)
from rbcheck.variants import native
from rbcheck.variants.device_storage import DeviceStorage, FreshColumns, interleaved_columns

META, TENSORS = fmt.META, fmt.TENSORS
CHUNK = 1 << 20  # bytes per write / read / hash step (about an L2 cache)
WRITEBACK = 32 << 20  # bytes between two writeback requests (Linux)
MAX_HEADER = 100_000_000  # safetensors' own limit
COLUMNS = "state.storage.columns."  # the names of the storage's columns in the tensor file

# safetensors' names, in the order its writer sorts tensors (then by name)
DTYPES = {
    torch.uint64: "U64", torch.int64: "I64", torch.float64: "F64", torch.float32: "F32",
    torch.uint32: "U32", torch.int32: "I32", torch.bfloat16: "BF16", torch.float16: "F16",
    torch.uint16: "U16", torch.int16: "I16", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
RANK = {name: i for i, name in enumerate(DTYPES.values())}
BY_NAME = {name: dtype for dtype, name in DTYPES.items()}


# --- save ----------------------------------------------------------------------------------


def state_view(buffer) -> dict:
    """``buffer.state_dict()`` with the storage's columns as views (``state_view``) where
    the storage has them."""
    view = getattr(buffer.storage, "state_view", None)
    if view is None:
        return buffer.state_dict()
    parts = {"storage": view(), **{name: getattr(buffer, name).state_dict() for name in ("writer", "sampler")}}
    return {"capacity": buffer.capacity, **parts, "generator": buffer.generator.get_state()}


def header(tensors: dict) -> tuple[bytes, list]:
    """safetensors' 8-byte length and JSON header for ``tensors`` (as its writer pads and
    orders them), and the names in file order; None for a dtype it has no name for."""
    if any(t.dtype not in DTYPES for t in tensors.values()):
        return None, []
    order = sorted(tensors, key=lambda n: (RANK[DTYPES[tensors[n].dtype]], n))
    entries, offset = {}, 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def _bytes(t: torch.Tensor):
    """A tensor's memory as a NumPy uint8 vector (no copy; ``t`` contiguous)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class _Staging:
    """One reused buffer of about ``CHUNK`` bytes through which strided rows pass."""

    def __init__(self):
        self.memory = None

    def rows(self, t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Contiguous scratch shaped like ``t[start:stop]`` (valid until the next call)."""
        shape = (stop - start, *t.shape[1:])
        need = math.prod(shape) * t.element_size()
        if self.memory is None or self.memory.numel() < need:
            self.memory = torch.empty(max(need, CHUNK), dtype=torch.uint8)
        return self.memory[:need].view(t.dtype).view(shape)


def _spans(t: torch.Tensor):
    """``(start, stop)`` row ranges of ``t`` of about ``CHUNK`` bytes each (at least one row)."""
    row = max(math.prod(t.shape[1:]) * t.element_size(), 1)
    per = max(CHUNK // row, 1)
    return [(start, min(start + per, t.shape[0])) for start in range(0, t.shape[0], per)]


def _chunks(t: torch.Tensor, staging: _Staging):
    """The bytes of ``t`` in row order, in chunks of about ``CHUNK`` bytes: views of its own
    memory when contiguous, else its rows gathered into the staging buffer in turn. (A
    worker thread gathering the next chunk while this one is written was slower on the
    shared two-core machine measured: 116 ms against 97 ms a save.)"""
    if t.numel() == 0:
        return
    if t.is_contiguous():
        flat = _bytes(t)
        for start in range(0, len(flat), CHUNK):
            yield flat[start:start + CHUNK]
        return
    for start, stop in _spans(t):
        stage = staging.rows(t, start, stop)
        stage.copy_(t[start:stop])
        yield _bytes(stage)


def _writeback():
    """``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: start writing a range
    to disk without waiting (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - no such call
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return lambda fd, offset, n: call(fd, offset, n, 2)


_WRITEBACK = _writeback()


def write_tensors(file: Path, head: bytes, tensors: list) -> str:
    """Write and fsync a new file: ``head`` then the bytes of each tensor; its digest,
    each chunk hashed right after it is written."""
    digest, staging = fmt.hasher(), _Staging()
    with open(file, "xb", buffering=0) as out:
        fd, written, flushed = out.fileno(), 0, 0
        for chunk in _stream(head, tensors, staging):
            _write_all(out, memoryview(chunk))
            digest.update(chunk)
            written += len(chunk)
            if _WRITEBACK is not None and written - flushed >= WRITEBACK:
                _WRITEBACK(fd, flushed, written - flushed)
                flushed = written
        os.fsync(fd)
    return digest.hexdigest()


def _stream(head: bytes, tensors: list, staging: _Staging):
    yield head
    for t in tensors:
        yield from _chunks(t, staging)


def _write_all(out, view: memoryview) -> None:
    while len(view):
        view = view[out.write(view):]


def save(buffer, path) -> None:
    """Atomically write ``buffer``'s state as a checkpoint directory at ``path`` (the
    reference's files; see the module doc)."""
    plain, tensors = fmt.split_state(state_view(buffer), contiguous=False)
    head, order = header(tensors)
    if head is None or sys.byteorder != "little":  # safetensors' data is little-endian
        save_checkpoint(buffer, path)  # the reference says what it cannot write
        return
    fmt.encode_meta(plain, "")  # a state JSON cannot hold is refused before the disk is touched

    def write_files(new: Path) -> None:
        digest = write_tensors(new / TENSORS, head, [tensors[name] for name in order])
        _write(new / META, fmt.encode_meta(plain, digest))

    commit_checkpoint(path, write_files)


# --- load ----------------------------------------------------------------------------------


def _read_exactly(handle, view: memoryview, digest) -> int:
    """Fill ``view`` from ``handle`` (fewer bytes at the end of the file), hashing what
    arrives; the number of bytes read."""
    got = 0
    while got < len(view):
        n = handle.readinto(view[got:])
        if not n:
            break
        digest.update(view[got:got + n])
        got += n
    return got


def _fill(handle, t: torch.Tensor, digest, staging: _Staging) -> bool:
    """Read ``t``'s bytes (row order) from ``handle``: into its own memory when contiguous,
    else through the staging buffer into its rows. False at a premature end of file."""
    if t.numel() == 0:
        return True
    if t.is_contiguous():
        view = memoryview(_bytes(t))
        return all(_read_exactly(handle, view[start:start + CHUNK], digest) == len(view[start:start + CHUNK])
                   for start in range(0, len(view), CHUNK))
    for start, stop in _spans(t):
        stage = staging.rows(t, start, stop)
        view = memoryview(_bytes(stage))
        if _read_exactly(handle, view, digest) != len(view):
            return False
        t[start:stop].copy_(stage)
    return True


def entries(head: bytes, size: int) -> list | None:
    """``[(name, dtype, shape, begin, end)]`` (absolute offsets, file order) of a regular
    safetensors header ``head`` (the JSON after the 8-byte length) of a file of ``size``
    bytes; None on any doubt (see the module doc)."""
    try:
        table = json.loads(head.decode("utf-8"), object_pairs_hook=_unique)
    except (ValueError, RecursionError, KeyError):
        return None
    if not isinstance(table, dict):
        return None
    out, base = [], 8 + len(head)
    for name, entry in table.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}
                and entry["dtype"] in BY_NAME and _ints(entry["shape"]) and _ints(entry["data_offsets"])
                and len(entry["data_offsets"]) == 2):
            return None
        dtype, shape, (begin, end) = BY_NAME[entry["dtype"]], entry["shape"], entry["data_offsets"]
        item = torch.empty((), dtype=dtype).element_size()
        if end - begin != math.prod(shape) * item or (base + begin) % item:
            return None
        out.append((name, dtype, tuple(shape), base + begin, base + end))
    out.sort(key=lambda e: (e[3], e[4]))
    position = base
    for _, _, _, begin, end in out:
        if begin != position:
            return None
        position = end
    return out if position == size else None


def _unique(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise KeyError("duplicate key")
    return dict(pairs)


def _ints(value) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _destinations(table: list, capacity: int | None) -> tuple[dict, dict]:
    """New memory for each tensor of ``table``: ``(tensors, rows)``; the storage's columns
    as fields of new interleaved rows (``rows``, also in ``tensors``) when each has
    ``capacity`` rows of some bytes, else every tensor plain and contiguous."""
    cols = [(name, dtype, shape) for name, dtype, shape, begin, end in table if name.startswith(COLUMNS)]
    rows = {}
    if capacity and cols and all(len(shape) >= 1 and shape[0] == capacity and math.prod(shape[1:]) > 0
                                 for _, _, shape in cols):
        rows = interleaved_columns(capacity, {name: (shape[1:], dtype) for name, dtype, shape in cols},
                                   zeroed=False)  # every byte of every field is read into
    return {name: rows[name] if name in rows else native.empty_huge(shape, dtype)
            for name, dtype, shape, _, _ in table}, rows


def read_tensor_file(handle, size: int, digest, capacity: int | None = None):
    """Read the ``size`` bytes of ``handle`` once, hashing them into ``digest``:
    ``(tensors, rows, None)`` read into their own new memory for a regular header (see
    ``_destinations``; fewer bytes if the file is shorter now: the digest tells), else
    ``(None, {}, blob)``, the whole file in new memory."""
    prefix = bytearray(min(size, 8))
    got = _read_exactly(handle, memoryview(prefix), digest)
    n = int.from_bytes(prefix, "little") if got == 8 else -1
    if 0 <= n <= min(MAX_HEADER, size - 8) and sys.byteorder == "little":  # views of little-endian data
        head = bytearray(n)
        got += _read_exactly(handle, memoryview(head), digest)
        table = entries(bytes(head), size) if got == 8 + n else None
        if table is not None:
            tensors, rows = _destinations(table, capacity)
            staging = _Staging()
            all(_fill(handle, tensors[name], digest, staging) for name, *_ in table)
            return tensors, rows, None
        prefix += head
    blob = native.empty_huge((size,), torch.uint8)
    view = memoryview(blob.numpy())
    view[:got] = prefix[:got]
    got += _read_exactly(handle, view[got:], digest)
    return None, {}, blob[:got]


def read(path, capacity: int | None = None) -> dict:
    """The validated state at ``path``, as ``read_checkpoint`` gives it (module doc)."""
    sub = live_dir(path)
    raw_meta = _read(sub / META, MAX_META_BYTES)
    handle, size = open_regular(sub / TENSORS, MAX_TENSOR_BYTES)
    with handle:
        meta = fmt.decode_meta(raw_meta)
        digest = fmt.hasher(meta["schema_version"])
        tensors, rows, blob = read_tensor_file(handle, size, digest, capacity)
    fmt.check_digest(meta, digest.hexdigest())
    if tensors is None:
        tensors = fmt.load_blob(bytes(blob.numpy()))  # the reference's decoder: its answer or error
    state = fmt.join_state(meta, tensors)
    storage = state.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("columns"), list):
        seen: list = []
        _tensor_ids(state, seen)
        cols = storage["columns"]
        if all(isinstance(c, torch.Tensor) and seen.count(id(c)) == 1 for c in cols):
            storage["columns"] = FreshColumns(cols)  # each used once: nothing else holds it
            # interleaved rows exactly: the storage takes them as its rows, no repacking
            storage["columns"].packed = bool(rows) and sorted(map(id, cols)) == sorted(map(id, rows.values()))
    return state


def _tensor_ids(obj, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(id(obj))
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensor_ids(value, out)
    elif isinstance(obj, list):
        for value in obj:
            _tensor_ids(value, out)


def load(buffer, path) -> None:
    """Replace ``buffer``'s state with the checkpoint at ``path``; unchanged on error."""
    storage = buffer.storage
    rows = isinstance(storage, DeviceStorage) and storage.device.type == "cpu"
    load_checkpoint(buffer, path, read=lambda p: read(p, buffer.capacity if rows else None))
