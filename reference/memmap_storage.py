"""Rows on disk: ``TensorStorage`` with every column a memory-mapped file of one directory.

Contract
--------
* ``MemmapStorage(capacity, directory)`` keeps ``storage.TensorStorage``'s contract (the same
  contents after any sequence of calls, the same errors); its columns are files
  ``rbcheck-memmap-<i>.bin`` of ``directory``, made on the first write and allocated whole
  (``posix_fallocate``), so a full disk is an error then, never a crash at a later write. CPU only.
* Files only where declared: ``directory`` is made if missing, and only names matching ``OWN``
  are ever written or removed in it; every other entry is left alone.
* A reused directory: a NEW storage starts empty. It removes what an earlier storage left there
  (the ``OWN`` names only) and never reads it. An earlier storage still open on that directory
  loses its files and raises ``StorageFileError`` at its next call.
* ``close(extra)`` fsyncs the columns, writes ``rbcheck-memmap.json`` (capacity, size, keys,
  layout and the caller's plain-JSON ``extra``: a temporary name, then a rename) and releases
  the files; every later call raises. ``MemmapStorage(capacity, directory, reopen=True)`` maps a
  cleanly closed directory again: the same contents and size, ``extra`` as ``self.extra`` (a
  buffer: ``memmap_reopen.py``). It removes the manifest: a directory whose storage was not
  closed (a crash, or open now) is refused.
* Every call first checks the files: each still there, the same file, of the size it was made
  with. A file removed, replaced or truncated under the storage raises ``StorageFileError``
  before anything is read or written (a truncated mapping would otherwise crash the process).
  A failed allocation removes what it made. Either way nothing changed.

Cost: as ``TensorStorage`` plus one ``stat`` per column per call; disk O(capacity * row size).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference.arguments import check_int
from rbcheck.reference.storage import TensorStorage, columns

MANIFEST = "rbcheck-memmap.json"
OWN = re.compile(r"rbcheck-memmap(-[0-9]+\.bin|\.json|\.json\.tmp)")


class StorageFileError(OSError):
    """A file of a disk-backed storage is not as the storage left it, or could not be made."""


class MemmapStorage(TensorStorage):
    """A ring of rows in memory-mapped files of ``directory`` (see module doc)."""

    on_disk = True  # a write may fail (OSError): the buffer then puts its writer back

    def __init__(self, capacity: int, directory, device="cpu", *, reopen: bool = False):
        super().__init__(capacity, device)
        if self.device.type != "cpu":
            raise ValueError(f"device={device}, but should be cpu (the rows are memory-mapped files)")
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise ValueError(f"directory={directory!r}, but should be a path (str or os.PathLike)")
        self.directory, self.files, self.closed, self.extra = Path(directory), [], False, None
        if reopen:
            self._reopen()
        else:
            self._clear()

    def _clear(self) -> None:
        """Make the directory if missing and remove what an earlier storage left in it."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in os.listdir(self.directory):
                if OWN.fullmatch(name) and not (self.directory / name).is_dir():
                    os.unlink(self.directory / name)
        except OSError as error:
            raise StorageFileError(f"directory={str(self.directory)!r} ({error.strerror}), but should be "
                                   f"a directory this process can write") from error

    def _check_files(self) -> None:
        if self.closed:
            raise StorageFileError("storage closed=True, but should be open (reopen=True maps it again)")
        for path, identity, nbytes in self.files:
            try:
                info = os.stat(path)
            except OSError as error:
                raise StorageFileError(f"{path.name} ({error.strerror}), but should be the storage's "
                                       f"file of {nbytes} bytes in {str(self.directory)!r}") from error
            if (info.st_dev, info.st_ino) != identity or info.st_size != nbytes:
                raise StorageFileError(f"{path.name} is {info.st_size} bytes (inode {info.st_ino}), but should "
                                       f"be the storage's own file of {nbytes} bytes (inode {identity[1]})")

    def _map(self, path: Path, shape, dtype: torch.dtype) -> torch.Tensor:
        numel = self.capacity * math.prod(shape)
        info = os.stat(path)
        self.files.append((path, (info.st_dev, info.st_ino), numel * dtype.itemsize))
        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(self.capacity, *shape)

    def _allocate(self, data: TensorDictBase) -> TensorDictBase:
        """One zeroed file of ``capacity`` rows per key of ``data``; all or none."""
        self._clear()  # a load that emptied the storage may have left its files
        out, made, self.files = TensorDict({}, batch_size=[self.capacity]), [], []
        try:
            for i, (key, value) in enumerate(columns(data).items()):
                path = self.directory / f"rbcheck-memmap-{i}.bin"
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                made.append(path)
                try:
                    nbytes = self.capacity * math.prod(value.shape[1:]) * value.dtype.itemsize
                    if nbytes:
                        os.posix_fallocate(fd, 0, nbytes)  # the disk space now, not at a later write
                finally:
                    os.close(fd)
                out.set(key, self._map(path, value.shape[1:], value.dtype))
        except OSError as error:
            self.files = []
            for path in made:
                path.unlink(missing_ok=True)
            raise StorageFileError(f"allocation in {str(self.directory)!r} failed ({error.strerror}), "
                                   f"but should have room for {self.capacity} rows") from error
        return out

    def set(self, index, data: TensorDictBase) -> None:
        self._check_files()
        super().set(index, data)

    def get(self, index) -> TensorDictBase:
        self._check_files()
        return super().get(index)

    def state_dict(self) -> dict:
        self._check_files()
        return super().state_dict()

    def load_state_dict(self, state: dict, size: int) -> None:
        """Validate in memory first (``TensorStorage``'s checks), then write into the files."""
        self._check_files()
        memory = TensorStorage(self.capacity)
        memory.data = self.data  # the layout a load must match
        memory.load_state_dict(state, size)
        if memory.data is not None and self.data is None:
            self.data = self._allocate(memory.data)
        for key, value in columns(memory.data).items():
            self.data.get(key).copy_(value)
        self.data, self.size = (self.data if memory.data is not None else None), memory.size

    def close(self, extra=None) -> None:
        """Flush the files, write the manifest, release the files (see module doc)."""
        self._check_files()
        keys = list(columns(self.data))
        manifest = {"capacity": self.capacity, "size": self.size, "keys": [list(k) for k in keys],
                    "layout": [[list(self.data.get(k).shape[1:]), str(self.data.get(k).dtype)] for k in keys],
                    "extra": extra}
        tmp = self.directory / f"{MANIFEST}.tmp"
        try:
            for path, _, _ in self.files:
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
            tmp.write_text(json.dumps(manifest, allow_nan=False))
            os.replace(tmp, self.directory / MANIFEST)
        except (OSError, ValueError) as error:
            tmp.unlink(missing_ok=True)
            raise StorageFileError(f"close of {str(self.directory)!r} failed ({error}), but should write "
                                   f"{MANIFEST} (the storage is still open)") from error
        self.data, self.files, self.closed = None, [], True

    def _reopen(self) -> None:
        try:
            manifest = json.loads((self.directory / MANIFEST).read_text())
            check_int("manifest capacity", manifest["capacity"], self.capacity, self.capacity + 1)
            size = check_int("manifest size", manifest["size"], 0, self.capacity + 1)
            data = TensorDict({}, batch_size=[self.capacity])
            for i, (key, (shape, dtype)) in enumerate(zip(manifest["keys"], manifest["layout"], strict=True)):
                dtype = getattr(torch, dtype.removeprefix("torch."))
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"manifest dtype={dtype!r}, but should be a torch dtype")
                path = self.directory / f"rbcheck-memmap-{i}.bin"
                if os.stat(path).st_size != self.capacity * math.prod(shape) * dtype.itemsize:
                    raise ValueError(f"{path.name} size={os.stat(path).st_size}, but should match the manifest")
                data.set(tuple(key), self._map(path, tuple(shape), dtype))
            os.unlink(self.directory / MANIFEST)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            self.files = []
            raise StorageFileError(f"reopen of {str(self.directory)!r}: {error!r}, but should find the files "
                                   f"and {MANIFEST} of a cleanly closed storage") from error
        self.data, self.size, self.extra = (data if manifest["keys"] else None), size, manifest["extra"]

