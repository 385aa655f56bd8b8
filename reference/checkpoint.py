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
* ``load_checkpoint(buffer, path)`` checks the pointer, the schema version,
  the sha256 of the tensor file, every tensor's dtype and shape, and then
  the state against the buffer (capacity, field layout when already
  allocated, sampler type) BEFORE changing the buffer. Any problem raises
  ``CheckpointError`` saying what is wrong; the buffer is then unchanged.
* The round trip is bit-exact: storage, writer, trees, max priority (a
  float), sampler parameters and generator state, hence the next samples.

Cost: O(size of the state) time and disk; one extra copy on disk during a save.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SCHEMA_VERSION = 1
FORMAT = "rbcheck.ReplayBuffer"
POINTER, META, TENSORS = "CURRENT", "meta.json", "tensors.safetensors"


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


def _join(obj, tensors: dict):
    """Inverse of ``_split``."""
    if isinstance(obj, dict):
        if set(obj) == {"tensor"}:
            return tensors[obj["tensor"]]
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(buffer, path) -> None:
    """Atomically write ``buffer``'s state as a checkpoint directory at ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict = {}
    state = _split(buffer.state_dict(), "state", tensors)
    new = Path(tempfile.mkdtemp(prefix="ckpt-", dir=path))
    save_file(tensors, new / TENSORS)
    layout = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
              for k, v in tensors.items()}
    meta = {"schema_version": SCHEMA_VERSION, "format": FORMAT,
            "sha256": {TENSORS: _sha256(new / TENSORS)}, "tensors": layout, "state": state}
    (new / META).write_text(json.dumps(meta, allow_nan=False, indent=1))
    for file in (new / TENSORS, new / META, new):
        _fsync(file)
    (path / (POINTER + ".tmp")).write_text(new.name + "\n")
    _fsync(path / (POINTER + ".tmp"))
    os.replace(path / (POINTER + ".tmp"), path / POINTER)
    _fsync(path)
    for old in path.glob("ckpt-*"):  # the previous checkpoint and leftovers of crashed saves
        if old != new:
            shutil.rmtree(old, ignore_errors=True)


def _reject_constant(name: str):
    raise CheckpointError(f"{META} contains {name}, but should contain only finite numbers")


def read_checkpoint(path) -> dict:
    """The validated state dict stored at ``path`` (raises CheckpointError)."""
    path = Path(path)
    if not (path / POINTER).is_file():
        raise CheckpointError(f"path={str(path)!r} has no {POINTER} file, but should be a checkpoint directory")
    name = (path / POINTER).read_text().strip()
    if not re.fullmatch(r"ckpt-[A-Za-z0-9_]+", name) or not (path / name).is_dir():
        raise CheckpointError(f"{POINTER}={name!r}, but should name an existing ckpt-* sub-directory")
    try:
        meta = json.loads((path / name / META).read_text(), parse_constant=_reject_constant)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{META} unreadable ({error}), but should be valid JSON") from error
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        got = meta.get("schema_version") if isinstance(meta, dict) else meta
        raise CheckpointError(f"schema_version={got!r}, but should be {SCHEMA_VERSION}")
    if meta.get("format") != FORMAT or not all(k in meta for k in ("sha256", "tensors", "state")):
        raise CheckpointError(f"{META} format={meta.get('format')!r}, but should be {FORMAT!r} "
                              "with sha256, tensors and state")
    file = path / name / TENSORS
    digest = _sha256(file) if file.is_file() else "missing"
    if digest != meta["sha256"].get(TENSORS):
        raise CheckpointError(f"sha256({TENSORS})={digest}, but should be {meta['sha256'].get(TENSORS)}")
    tensors = load_file(file)
    got = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
           for k, v in tensors.items()}
    if got != meta["tensors"]:
        raise CheckpointError(f"tensors={got}, but should be {meta['tensors']}")
    try:
        return _join(meta["state"], tensors)
    except KeyError as error:
        raise CheckpointError(f"tensor {error} is referenced, but should be in {TENSORS}") from error


def load_checkpoint(buffer, path) -> None:
    """Replace ``buffer``'s state with the checkpoint at ``path``; unchanged on error."""
    state = read_checkpoint(path)
    try:
        buffer.load_state_dict(state)
    except ValueError as error:
        raise CheckpointError(f"checkpoint at {str(path)!r} does not fit this buffer: {error}") from error
