"""The variant buffer's checkpoints: the reference's files and checks, streamed in chunks.

Contract
--------
* ``save(buffer, path)`` writes the files ``reference.checkpoint.save_checkpoint`` writes,
  byte for byte (the same safetensors header, tensor order and ``meta.json``), through the
  same protocol (``commit_checkpoint``: a new sub-directory, fsync, the atomic swap of
  ``CURRENT``, the same clean-up), but from the buffer's own memory: the storage's
  columns are not cloned out of its interleaved rows and no safetensors bytes object is
  built. The file is written in chunks of ``CHUNK`` bytes (a strided column is copied
  out of the rows one chunk at a time) while a worker thread hashes the chunks already
  written (hashlib releases the GIL); on Linux each written range is handed to writeback
  (``sync_file_range``) as it goes, so the final fsync waits for less. A state this
  writer cannot stream (a dtype without a safetensors name, a big-endian host) is saved
  by the reference.
* ``read(path)`` makes the checks of ``reference.checkpoint.read_checkpoint``, in its
  order, and returns the same state, or raises the same ``CheckpointError``: the tensor
  file is read once into new memory while a worker thread hashes what has arrived; its
  sha256 is compared; then its safetensors header is parsed into views of that memory
  (no copy). A header this parser does not take as regular (any doubt: unknown keys or
  dtypes, offsets out of order, misaligned data) goes to the reference's decoder, which
  gives its own answer or error. The storage's columns come as ``FreshColumns``, which
  ``DeviceStorage`` adopts instead of cloning; the other tensors are copied out (small),
  so that the read memory is freed once the storage has moved the columns into its rows.
* ``load(buffer, path)`` is ``reference.checkpoint.load_checkpoint`` over ``read``: the
  buffer is unchanged when anything is refused.

Cost: save O(state) with ``CHUNK`` bytes of extra memory per pipeline slot; load O(state)
with one extra copy of the tensors (the new memory) until the storage has taken them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
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
from rbcheck.variants.device_storage import FreshColumns

META, TENSORS = fmt.META, fmt.TENSORS
CHUNK = 4 << 20  # bytes per write / hash step
SLOTS = 4  # staging buffers in flight (strided columns)
WRITEBACK = 32 << 20  # bytes between two writeback requests (Linux)
MAX_HEADER = 100_000_000  # safetensors' own limit

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


class _Pipe:
    """sha256 of the chunks given to ``add`` (in order), computed by a worker thread."""

    def __init__(self):
        self.hash = hashlib.sha256()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rbcheck-sha256")

    def add(self, chunk):
        return self.pool.submit(self.hash.update, chunk)

    def digest(self) -> str:
        self.pool.shutdown(wait=True)
        return self.hash.hexdigest()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _chunks(t: torch.Tensor, stages: list, futures: list):
    """The bytes of ``t`` in row order, as chunks of about ``CHUNK`` bytes: views of its
    memory when contiguous, else rows copied into the staging buffers in turn (each reused
    only once the hash of its last chunk is done: ``futures`` holds them)."""
    if t.numel() == 0:
        return
    if t.is_contiguous():
        flat = _bytes(t)
        for start in range(0, len(flat), CHUNK):
            yield flat[start:start + CHUNK], None
        return
    row = max(math.prod(t.shape[1:]) * t.element_size(), 1)
    per = max(CHUNK // row, 1)
    for i, start in enumerate(range(0, t.shape[0], per)):
        slot = i % len(stages)
        if futures[slot] is not None:
            futures[slot].result()
        rows = t[start:start + per]
        need = rows.numel() * t.element_size()
        if stages[slot] is None or stages[slot].numel() < need:
            stages[slot] = torch.empty(max(need, CHUNK), dtype=torch.uint8)
        stage = stages[slot][:need].view(t.dtype).view(rows.shape)
        stage.copy_(rows)
        yield _bytes(stage), slot


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
    """Write and fsync a new file: ``head`` then the bytes of each tensor; its sha256."""
    pipe, stages, futures = _Pipe(), [None] * SLOTS, [None] * SLOTS
    try:
        with open(file, "xb", buffering=0) as out:
            fd, written, flushed = out.fileno(), 0, 0
            pipe.add(head)
            _write_all(out, memoryview(head))
            written = len(head)
            for t in tensors:
                for chunk, slot in _chunks(t, stages, futures):
                    future = pipe.add(chunk)
                    if slot is not None:
                        futures[slot] = future
                    _write_all(out, memoryview(chunk))
                    written += len(chunk)
                    if _WRITEBACK is not None and written - flushed >= WRITEBACK:
                        _WRITEBACK(fd, flushed, written - flushed)
                        flushed = written
            digest = pipe.digest()
            os.fsync(fd)
        return digest
    finally:
        pipe.close()


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


def read_tensor_file(handle, size: int) -> tuple[torch.Tensor, str]:
    """The first ``size`` bytes of ``handle`` in new memory (fewer if the file is shorter
    now), and their sha256, hashed by a worker thread while the rest is read."""
    blob = native.empty_huge((size,), torch.uint8)
    view, got, pipe = memoryview(blob.numpy()), 0, _Pipe()
    try:
        while got < size:
            n = handle.readinto(view[got:min(size, got + CHUNK)])
            if not n:
                break
            pipe.add(view[got:got + n])
            got += n
        return blob[:got], pipe.digest()
    finally:
        pipe.close()


def parse(blob: torch.Tensor) -> dict | None:
    """``{name: view of blob}`` for a regular safetensors file (see the module doc), else None."""
    size = blob.numel()
    if size < 8 or sys.byteorder != "little":  # views of little-endian data
        return None
    n = int.from_bytes(bytes(blob[:8].numpy()), "little")
    if n > min(MAX_HEADER, size - 8):
        return None
    try:
        entries = json.loads(bytes(blob[8:8 + n].numpy()).decode("utf-8"), object_pairs_hook=_unique)
    except (ValueError, RecursionError, KeyError):
        return None
    if not isinstance(entries, dict):
        return None
    spans, out, base = [], {}, 8 + n
    for name, entry in entries.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}
                and entry["dtype"] in BY_NAME and _ints(entry["shape"]) and _ints(entry["data_offsets"])
                and len(entry["data_offsets"]) == 2):
            return None
        dtype, shape, (begin, end) = BY_NAME[entry["dtype"]], entry["shape"], entry["data_offsets"]
        item = torch.empty((), dtype=dtype).element_size()
        if end - begin != math.prod(shape) * item or (base + begin) % item:
            return None
        spans.append((begin, end))
        if end == begin:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            out[name] = blob[base + begin:base + end].view(dtype).view(shape)
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            return None
        position = end
    return out if base + position == size else None


def _unique(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise KeyError("duplicate key")
    return dict(pairs)


def _ints(value) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def read(path) -> dict:
    """The validated state at ``path``, as ``read_checkpoint`` gives it (module doc)."""
    sub = live_dir(path)
    raw_meta = _read(sub / META, MAX_META_BYTES)
    handle, size = open_regular(sub / TENSORS, MAX_TENSOR_BYTES)
    with handle:
        meta = fmt.decode_meta(raw_meta)
        blob, digest = read_tensor_file(handle, size)
    fmt.check_digest(meta, digest)
    tensors = parse(blob)
    if tensors is None:
        tensors = fmt.load_blob(bytes(blob.numpy()))
    prefix = "state.storage.columns."  # the big ones; the rest is copied out of the blob
    tensors = {name: t if name.startswith(prefix) else t.clone() for name, t in tensors.items()}
    state = fmt.join_state(meta, tensors)
    storage = state.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("columns"), list):
        seen: list = []
        _tensor_ids(state, seen)
        cols = storage["columns"]
        if all(isinstance(c, torch.Tensor) and seen.count(id(c)) == 1 for c in cols):
            storage["columns"] = FreshColumns(cols)  # each used once: nothing else holds it
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
    load_checkpoint(buffer, path, read=read)
