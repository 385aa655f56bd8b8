"""Checkpoints of a replay buffer: a directory, plain JSON + safetensors, no pickle.

``path/CURRENT`` names the live sub-directory ``ckpt-XXXX/``, which holds ``meta.json`` and
``tensors.safetensors`` (what they hold: ``checkpoint_format.py``).

Contract
--------
* ``save_checkpoint(buffer, path)`` writes a NEW sub-directory, fsyncs it, then swaps
  ``CURRENT`` with ``os.replace`` and only then deletes the previous checkpoint and what crashed
  saves left. A crash at any point leaves the previous checkpoint loadable.
* A save never touches what it did not write: ``path`` may hold the user's files (a run
  directory with ``ckpt-1000/model.pt``, ``ckpt-best/``). It removes only what it created,
  recognised by an unguessable name (``ckpt-rbcheck_<16 hex>/``, ``CURRENT.rbcheck_<16
  hex>.tmp``): the sub-directory ``CURRENT`` named and its own leftovers, a sub-directory only
  while it holds nothing but ``meta.json`` and ``tensors.safetensors``. A ``CURRENT`` naming
  anything else (``ckpt-best``, an older rbcheck's ``ckpt-xxxxxxxx``) is in doubt: the save
  raises ``CheckpointError`` and writes and deletes nothing (loading it still works).
* ``load_checkpoint(buffer, path)`` never unpickles and never follows a symlink: ``CURRENT``
  must name a ``ckpt-*`` sub-directory holding exactly the two regular files, each within a size
  cap. The files are decoded and checked (``checkpoint_format.decode``), then the state's meaning
  (``checkpoint_meaning``: checksums can be recomputed by anyone) and the state against the
  buffer (``load_state_dict``) BEFORE changing the buffer. Any problem raises
  ``CheckpointError`` saying what is wrong; the buffer is then unchanged.
* It holds only what cannot be derived (no generations, storage size, inner tree nodes or min
  tree), so an inconsistent one cannot be written down. The round trip is bit-exact (rows, write
  count, priorities, max priority, sampler parameters, generator), hence the next samples.

Cost: O(size of the state) time; during a save one extra copy of the tensors in memory
(serialised before the disk is touched) and on disk (the old checkpoint).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from rbcheck.reference.checkpoint_format import (
    META,
    TENSORS,
    CheckpointError,
    decode,
    encode,
    require,
)
from rbcheck.reference.checkpoint_meaning import check_meaning

POINTER, NAME = "CURRENT", re.compile(r"ckpt-[A-Za-z0-9_]+")
OWN_DIR, OWN_POINTER = re.compile(r"ckpt-rbcheck_[0-9a-f]{16}"), re.compile(r"CURRENT\.rbcheck_[0-9a-f]{16}\.tmp")
MAX_POINTER_BYTES, MAX_META_BYTES, MAX_TENSOR_BYTES = 256, 1 << 26, 1 << 62


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


def _previous(path: Path) -> str | None:
    """The sub-directory ``path/CURRENT`` names (None: no pointer); refuses the user's file."""
    if not os.path.lexists(path / POINTER):
        return None
    hint = ("; it is not rbcheck's (the user's, or an older rbcheck's checkpoint: load it and save it "
            "elsewhere), so nothing was written or deleted: save into another directory")
    mode = os.lstat(path / POINTER).st_mode
    require(stat.S_ISREG(mode), f"{POINTER} is {stat.filemode(mode)}, but should be a regular file{hint}")
    try:
        name = _read(path / POINTER, MAX_POINTER_BYTES).decode("ascii", "replace")
    except CheckpointError as error:
        raise CheckpointError(f"{error}{hint}") from error
    require(name.endswith("\n") and bool(OWN_DIR.fullmatch(name[:-1])),  # only what rbcheck names
            f"{POINTER}={name!r:.80}, but should be a pointer to what rbcheck's save creates "
            f"('ckpt-rbcheck_<16 hex>\\n'){hint}")
    return name[:-1]


def _is_checkpoint_dir(sub: Path) -> bool:
    """A real directory holding nothing but (some of) a checkpoint's regular files."""
    return not sub.is_symlink() and sub.is_dir() and all(
        f.name in (META, TENSORS) and f.is_file() and not f.is_symlink() for f in sub.iterdir())


def save_checkpoint(buffer, path) -> None:
    """Atomically write ``buffer``'s state as a checkpoint directory at ``path``."""
    text, blob = encode(buffer.state_dict())  # everything is serialised before the disk is touched
    commit_checkpoint(path, lambda new: (_write(new / TENSORS, blob), _write(new / META, text)))


def commit_checkpoint(path, write_files) -> None:
    """The save protocol around ``write_files(new)``, which writes (and fsyncs) the files of
    the new sub-directory ``new``: refuse a ``CURRENT`` not naming what rbcheck creates, write
    into a new sub-directory, swap the pointer, then remove the previous checkpoint and leftovers."""
    path = Path(path)
    if path.is_dir():
        _previous(path)  # refuses a CURRENT that is in doubt before anything is written
    path.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    new, pointer = path / f"ckpt-rbcheck_{token}", path / f"{POINTER}.rbcheck_{token}.tmp"
    new.mkdir(mode=0o700)
    write_files(new)
    _fsync_dir(new)
    _write(pointer, new.name.encode() + b"\n")
    os.replace(pointer, path / POINTER)  # the commit point
    _fsync_dir(path)
    for old in os.listdir(path):  # the previous checkpoint and leftovers of crashed saves
        if OWN_POINTER.fullmatch(old) and (path / old).is_file() and not (path / old).is_symlink():
            (path / old).unlink()
        elif old != new.name and OWN_DIR.fullmatch(old) and _is_checkpoint_dir(path / old):  # previous included
            shutil.rmtree(path / old, ignore_errors=True)


def open_regular(file: Path, limit: int):
    """A binary file object of a regular file (not a symlink, not a FIFO) of at most
    ``limit`` bytes, and its size."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise CheckpointError(f"{file.name} could not be opened ({error.strerror}), "
                              "but should be a regular file, not a symlink") from error
    handle = os.fdopen(fd, "rb", buffering=0)
    info = os.fstat(handle.fileno())
    if not (stat.S_ISREG(info.st_mode) and info.st_size <= limit):
        handle.close()
        require(False, f"{file.name} is {stat.filemode(info.st_mode)} of {info.st_size} bytes, "
                f"but should be a regular file of at most {limit} bytes")
    return handle, info.st_size


def _read(file: Path, limit: int) -> bytes:
    """The bytes of a regular file (not a symlink, not a FIFO) of at most ``limit`` bytes."""
    handle, size = open_regular(file, limit)
    with handle:
        chunks = []
        while size > 0:  # one read returns at most ~2 GiB
            chunks.append(handle.read(size))
            size = size - len(chunks[-1]) if chunks[-1] else 0
        return b"".join(chunks)


def live_dir(path) -> Path:
    """The checked sub-directory ``path/CURRENT`` names: ``ckpt-*``, not a symlink, holding
    exactly ``meta.json`` and ``tensors.safetensors``."""
    path = Path(path)
    require(path.is_dir() and os.path.lexists(path / POINTER),
            f"path={str(path)!r} has no {POINTER} file, but should be a checkpoint directory")
    name = _read(path / POINTER, MAX_POINTER_BYTES).decode("ascii", "replace").strip()
    sub = path / name
    require(bool(NAME.fullmatch(name)) and sub.is_dir() and not sub.is_symlink(),
            f"{POINTER}={name!r:.80}, but should name a ckpt-* sub-directory (not a symlink)")
    files = sorted(os.listdir(sub))
    require(files == sorted([META, TENSORS]), f"{name} files={files}, but should be {sorted([META, TENSORS])}")
    return sub


def read_checkpoint(path) -> dict:
    """The validated state dict stored at ``path`` (raises CheckpointError)."""
    sub = live_dir(path)
    return decode(_read(sub / META, MAX_META_BYTES), _read(sub / TENSORS, MAX_TENSOR_BYTES))


def load_checkpoint(buffer, path, read=read_checkpoint) -> None:
    """Replace ``buffer``'s state with the checkpoint at ``path`` (read and validated by
    ``read``); unchanged on error."""
    state = read(path)
    try:
        check_meaning(state, buffer)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint at {str(path)!r} holds a state no buffer saves: {error}") from None
    try:
        buffer.load_state_dict(state)
    except ValueError as error:
        raise CheckpointError(f"checkpoint at {str(path)!r} does not fit this buffer: {error}") from error
