"""Checkpoints of a replay buffer: a directory, plain JSON + safetensors, no pickle.

Layout of ``path/``::

    CURRENT                    one line: the name of the live sub-directory
    ckpt-XXXX/meta.json        plain JSON: schema_version, checksums, the state's
                               numbers/strings, tensor names with dtype and shape
    ckpt-XXXX/tensors.safetensors   every tensor of the state

Contract
--------
* ``save_checkpoint(buffer, path)`` writes a NEW sub-directory, fsyncs it,
  then swaps ``CURRENT`` with ``os.replace`` and only then deletes the older
  sub-directories. A crash at any point leaves the previous checkpoint
  loadable.
* ``load_checkpoint(buffer, path)`` never unpickles and never follows a
  symlink: ``CURRENT`` must name a ``ckpt-*`` sub-directory holding exactly
  the two regular files. It checks the schema version, the checksum of
  ``meta.json`` (sha256 of its canonical JSON, stored in it), the sha256 of
  the tensor file, every tensor's dtype and shape, that every tensor is used,
  then the state against the buffer (capacity, field layout when already
  allocated, sampler type, consistency of trees and writer) BEFORE changing
  the buffer. Any problem raises ``CheckpointError`` saying what is wrong;
  the buffer is then unchanged.
* The round trip is bit-exact: storage, writer, trees, max priority (a
  float), sampler parameters and generator state, hence the next samples.

Cost: O(size of the state) time; during a save one extra copy of the tensors in
memory (serialised before the disk is touched) and on disk (the old checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as dump_tensors

SCHEMA_VERSION = 1
FORMAT = "rbcheck.ReplayBuffer"
POINTER, META, TENSORS = "CURRENT", "meta.json", "tensors.safetensors"
META_KEYS = {"schema_version", "format", "checksum", "sha256", "tensors", "state"}
MAX_POINTER_BYTES, MAX_META_BYTES = 256, 1 << 26


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message says why."""


def _split(obj, name: str, tensors: dict):
    """JSON-able copy of ``obj`` with each tensor replaced by ``{"tensor": name}``."""
    if isinstance(obj, torch.Tensor):
        tensors[name] = obj.detach().to("cpu").contiguous()
        return {"tensor": name}
    if isinstance(obj, dict):
        return {str(k): _split(v, f"{name}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split(v, f"{name}.{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"state[{name!r}]={type(obj).__name__}, but should be a tensor or plain value")


def _join(obj, tensors: dict, used: set):
    """Inverse of ``_split``; records the tensor names it uses in ``used``."""
    if isinstance(obj, dict):
        if set(obj) == {"tensor"} and isinstance(obj["tensor"], str):
            used.add(obj["tensor"])
            return tensors[obj["tensor"]]
        return {k: _join(v, tensors, used) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors, used) for v in obj]
    return obj


def _checksum(meta: dict) -> str:
    """sha256 of ``meta`` without its checksum, as canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _write(file: Path, data: bytes) -> None:
    """Write and fsync a new file."""
    with open(file, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the directory entries (new files, the swapped pointer) reach the disk
    finally:
        os.close(fd)


def save_checkpoint(buffer, path) -> None:
    """Atomically write ``buffer``'s state as a checkpoint directory at ``path``."""
    path = Path(path)
    tensors: dict = {}
    state = _split(buffer.state_dict(), "state", tensors)
    blob = dump_tensors(tensors)  # everything is serialised before the disk is touched
    layout = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
              for k, v in tensors.items()}
    meta = {"schema_version": SCHEMA_VERSION, "format": FORMAT,
            "sha256": {TENSORS: hashlib.sha256(blob).hexdigest()}, "tensors": layout, "state": state}
    try:
        meta["checksum"] = _checksum(meta)
        text = json.dumps(meta, allow_nan=False, indent=1).encode()
    except ValueError as error:
        raise CheckpointError(f"state={error}, but should hold only finite numbers") from error
    path.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix="ckpt-", dir=path))
    _write(new / TENSORS, blob)
    _write(new / META, text)
    _fsync_dir(new)
    pointer = path / (POINTER + ".tmp")
    pointer.unlink(missing_ok=True)  # a leftover of a crashed save
    _write(pointer, new.name.encode() + b"\n")
    os.replace(pointer, path / POINTER)  # the commit point
    _fsync_dir(path)
    for old in path.glob("ckpt-*"):  # the previous checkpoint and leftovers of crashed saves
        # by name: mkdtemp returns an absolute path from Python 3.12 on, glob a relative one
        if old.name != new.name and re.fullmatch(r"ckpt-[A-Za-z0-9_]+", old.name):
            shutil.rmtree(old, ignore_errors=True)


def _read(file: Path, limit: int) -> bytes:
    """The bytes of a regular file (not a symlink) of at most ``limit`` bytes."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise CheckpointError(f"{file.name} could not be opened ({error.strerror}), "
                              "but should be a regular file, not a symlink") from error
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise CheckpointError(f"{file.name} is {stat.filemode(info.st_mode)} of {info.st_size} "
                                  f"bytes, but should be a regular file of at most {limit} bytes")
        return handle.read(info.st_size)


def _parse_meta(raw: bytes) -> dict:
    def reject(name):
        raise ValueError(f"{name} is not a finite number")
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=reject)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{META} unreadable ({error}), but should be valid JSON") from None
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        got = meta.get("schema_version") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"schema_version={got!r}, but should be {SCHEMA_VERSION}")
    if set(meta) != META_KEYS or meta["format"] != FORMAT or not isinstance(meta["sha256"], dict):
        raise CheckpointError(f"{META} keys={sorted(meta)}, format={meta.get('format')!r}, "
                              f"but should be {sorted(META_KEYS)}, {FORMAT!r}")
    try:
        checksum = _checksum(meta)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{META} state unreadable ({error})") from None
    if meta["checksum"] != checksum:
        raise CheckpointError(f"{META} checksum={meta['checksum']!r:.80}, but should be {checksum} "
                              "(the file was changed after it was written)")
    return meta


def read_checkpoint(path) -> dict:
    """The validated state dict stored at ``path`` (raises CheckpointError)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"path={str(path)!r} is not a directory, but should be a checkpoint directory")
    if not os.path.lexists(path / POINTER):
        raise CheckpointError(f"path={str(path)!r} has no {POINTER} file, but should be a checkpoint directory")
    name = _read(path / POINTER, MAX_POINTER_BYTES).decode("ascii", "replace").strip()
    sub = path / name
    if not re.fullmatch(r"ckpt-[A-Za-z0-9_]+", name) or not sub.is_dir() or sub.is_symlink():
        raise CheckpointError(f"{POINTER}={name!r:.80}, but should name a ckpt-* sub-directory "
                              "(not a symlink, no path separators)")
    files = sorted(os.listdir(sub))
    if files != sorted([META, TENSORS]):
        raise CheckpointError(f"{name} files={files}, but should be {sorted([META, TENSORS])}")
    meta = _parse_meta(_read(sub / META, MAX_META_BYTES))
    raw = _read(sub / TENSORS, 1 << 62)
    digest, want = hashlib.sha256(raw).hexdigest(), meta["sha256"].get(TENSORS)
    if digest != want:
        raise CheckpointError(f"sha256({TENSORS})={digest}, but should be {want!r:.80}")
    try:
        tensors = load_tensors(raw)  # the bytes that were hashed: no second read
    except Exception as error:  # safetensors reports a bad header with its own error type
        raise CheckpointError(f"{TENSORS} unreadable ({error}), but should be a safetensors file") from None
    got = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
           for k, v in tensors.items()}
    if got != meta["tensors"]:
        raise CheckpointError(f"tensors={got}, but should be {meta['tensors']!r:.400}")
    used: set = set()
    try:
        state = _join(meta["state"], tensors, used)
    except (KeyError, TypeError, RecursionError) as error:
        raise CheckpointError(f"tensor {error!r:.80} is referenced, but should be in {TENSORS}") from None
    if used != set(tensors):
        raise CheckpointError(f"unused tensors={sorted(set(tensors) - used)}, but should be none")
    return state


def load_checkpoint(buffer, path) -> None:
    """Replace ``buffer``'s state with the checkpoint at ``path``; unchanged on error."""
    state = read_checkpoint(path)
    try:
        buffer.load_state_dict(state)
    except ValueError as error:
        raise CheckpointError(f"checkpoint at {str(path)!r} does not fit this buffer: {error}") from error
