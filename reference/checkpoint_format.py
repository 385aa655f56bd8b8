"""What a checkpoint holds, in bytes: a state dict <-> plain JSON + safetensors.

Contract
--------
* ``encode(state) -> (meta bytes, tensor bytes)``: every tensor of the (nested dict / list)
  state goes into one safetensors blob; the rest, with ``{"tensor": name}`` in each tensor's
  place, into ``meta.json``: plain JSON with ``schema_version``, ``format``, the sha256 of the
  blob and a checksum of itself (sha256 of its canonical JSON). Non-finite numbers or other
  objects in the state raise CheckpointError.
* ``decode(meta bytes, tensor bytes) -> state``: the inverse, never unpickling, after checking
  the schema version, the keys, the checksum, the blob's sha256 and that every tensor is used.
  Any problem raises ``CheckpointError`` saying what is wrong (``require``, the one check).
* Both are compositions of steps (``split_state``/``encode_meta``; ``decode_meta``,
  ``check_digest``, ``load_blob``, ``join_state``) that a faster writer or reader of the same
  bytes reuses (``rbcheck.variants.checkpoint_stream``).

Cost: O(size of the state) time and one extra copy of the tensors in memory.
"""

from __future__ import annotations

import hashlib
import json

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as dump_tensors

SCHEMA_VERSION = 2  # 2: no derived state (generations, storage size, inner tree nodes, min tree)
FORMAT = "rbcheck.ReplayBuffer"
META, TENSORS = "meta.json", "tensors.safetensors"
META_KEYS = {"schema_version", "format", "checksum", "sha256", "state"}


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message says why."""


def require(ok: bool, message: str) -> None:
    """Every check of a checkpoint: ``CheckpointError(message)`` unless ``ok``."""
    if not ok:
        raise CheckpointError(message)


def _split(obj, name: str, tensors: dict, contiguous: bool = True):
    """JSON-able copy of ``obj`` with each tensor replaced by ``{"tensor": name}``."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().to("cpu")
        tensors[name] = tensor.contiguous() if contiguous else tensor
        return {"tensor": name}
    if isinstance(obj, dict):
        return {str(k): _split(v, f"{name}.{k}", tensors, contiguous) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split(v, f"{name}.{i}", tensors, contiguous) for i, v in enumerate(obj)]
    require(obj is None or isinstance(obj, (bool, int, float, str)),
            f"state[{name!r}]={type(obj).__name__}, but should be a tensor or plain value")
    return obj


def _join(obj, tensors: dict, used: set):
    """Inverse of ``_split``; records the tensor names it uses in ``used``."""
    if isinstance(obj, dict):
        if set(obj) == {"tensor"} and isinstance(obj["tensor"], str):
            used.add(obj["tensor"])
            return tensors[obj["tensor"]]
        return {k: _join(v, tensors, used) for k, v in obj.items()}
    return [_join(v, tensors, used) for v in obj] if isinstance(obj, list) else obj


def _checksum(meta: dict) -> str:
    """sha256 of ``meta`` without its checksum, as canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def split_state(state: dict, contiguous: bool = True) -> tuple:
    """``(plain, tensors)``: the JSON-able state with ``{"tensor": name}`` in each tensor's
    place, and ``{name: CPU tensor}`` (made contiguous unless ``contiguous=False``)."""
    tensors: dict = {}
    return _split(state, "state", tensors, contiguous), tensors


def encode_meta(plain, digest: str) -> bytes:
    """``meta.json``'s bytes for the split state ``plain`` and the blob's sha256 ``digest``."""
    meta = {"schema_version": SCHEMA_VERSION, "format": FORMAT, "sha256": {TENSORS: digest}, "state": plain}
    try:
        meta["checksum"] = _checksum(meta)
        return json.dumps(meta, allow_nan=False, indent=1).encode()
    except ValueError as error:
        raise CheckpointError(f"state={error}, but should hold only finite numbers") from error


def encode(state: dict) -> tuple[bytes, bytes]:
    """``(meta.json bytes, safetensors bytes)`` for ``state``."""
    plain, tensors = split_state(state)
    blob = dump_tensors(tensors)
    return encode_meta(plain, hashlib.sha256(blob).hexdigest()), blob


def decode_meta(raw_meta: bytes) -> dict:
    """The checked contents of ``meta.json`` (JSON, schema version, keys, checksum)."""
    try:  # NaN or infinity in meta.json: ValueError from _checksum's allow_nan=False
        meta = json.loads(raw_meta.decode("utf-8"))
        checksum = _checksum(meta) if isinstance(meta, dict) else None
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{META} unreadable ({error}), but should be valid JSON") from None
    require(isinstance(meta, dict) and meta.get("schema_version") == SCHEMA_VERSION,
            f"schema_version={meta.get('schema_version') if isinstance(meta, dict) else meta!r:.40}, "
            f"but should be {SCHEMA_VERSION}")
    require(set(meta) == META_KEYS and meta["format"] == FORMAT and isinstance(meta["sha256"], dict),
            f"{META} keys={sorted(meta)}, format={meta.get('format')!r:.40}, but should be "
            f"{sorted(META_KEYS)}, {FORMAT!r}")
    require(meta["checksum"] == checksum, f"{META} checksum={meta['checksum']!r:.80}, but should be "
            f"{checksum} (the file was changed after it was written)")
    return meta


def check_digest(meta: dict, digest: str) -> None:
    """The tensor file's sha256 ``digest`` is the one ``meta`` records."""
    want = meta["sha256"].get(TENSORS)
    require(digest == want, f"sha256({TENSORS})={digest}, but should be {want!r:.80}")


def load_blob(blob: bytes) -> dict:
    """``{name: tensor}`` of a safetensors blob."""
    try:
        return load_tensors(blob)
    except Exception as error:  # safetensors reports a bad header with its own error type
        raise CheckpointError(f"{TENSORS} unreadable ({error}), but should be a safetensors file") from None


def join_state(meta: dict, tensors: dict) -> dict:
    """The state of a checked ``meta`` with its tensors put back; each must be used."""
    used: set = set()
    try:
        state = _join(meta["state"], tensors, used)
    except (KeyError, TypeError, RecursionError) as error:
        raise CheckpointError(f"tensor {error!r:.80} is referenced, but should be in {TENSORS}") from None
    require(used == set(tensors), f"unused tensors={sorted(set(tensors) - used)}, but should be none")
    return state


def decode(raw_meta: bytes, blob: bytes) -> dict:
    """The validated state stored in ``(meta.json bytes, safetensors bytes)``."""
    meta = decode_meta(raw_meta)
    check_digest(meta, hashlib.sha256(blob).hexdigest())
    return join_state(meta, load_blob(blob))
