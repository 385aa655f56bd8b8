"""What a checkpoint holds, in bytes: a state dict <-> plain JSON + safetensors.

Contract
--------
* ``encode(state) -> (meta bytes, tensor bytes)``: every tensor of the (nested dict / list)
  state goes into one safetensors blob; the rest, with ``{"tensor": name}`` in each tensor's
  place, into ``meta.json``: plain JSON with ``schema_version`` (3), ``format``, the XXH3-128
  digest of the blob (``"xxh3_128": {"tensors.safetensors": <32 hex>}``) and a checksum of
  itself (XXH3-128 of its canonical JSON). Non-finite numbers or other objects in the state
  raise CheckpointError. XXH3-128 detects damage, not forgery (nor did sha256: anyone can
  recompute either; hence ``checkpoint_meaning``).
* ``decode(meta bytes, tensor bytes) -> state``: the inverse, never unpickling, after checking
  the schema version, the keys, the checksum, the blob's digest and that every tensor is used.
  Schema 2 (rbcheck before XXH3: the same state, its digests sha256 under the key ``sha256``)
  is still read; any other version is refused naming it. Any problem raises
  ``CheckpointError`` saying what is wrong (``require``, the one check).
* Both are compositions of steps (``split_state``/``encode_meta``; ``decode_meta``,
  ``hasher``, ``check_digest``, ``load_blob``, ``join_state``) that a faster writer or reader
  of the same bytes reuses (``rbcheck.variants.checkpoint_stream``, hashing as it goes).

Cost: O(size of the state) time (XXH3 hashes at memory speed) and one extra copy of the
tensors in memory.
"""

from __future__ import annotations

import hashlib
import json

import torch
import xxhash
from safetensors.torch import load as load_tensors
from safetensors.torch import save as dump_tensors

SCHEMA_VERSION = 3  # 2: no derived state (generations, storage size, inner tree nodes, min tree); 3: XXH3-128
FORMAT = "rbcheck.ReplayBuffer"
META, TENSORS = "meta.json", "tensors.safetensors"
HASHES = {3: ("xxh3_128", xxhash.xxh3_128), 2: ("sha256", hashlib.sha256)}  # version: (meta key, hasher)
DIGEST_KEY = HASHES[SCHEMA_VERSION][0]


def hasher(version: int = SCHEMA_VERSION):
    """A new streaming hash (``update(bytes-like)``, ``hexdigest()``) of schema ``version``."""
    return HASHES[version][1]()


def digest(data, version: int = SCHEMA_VERSION) -> str:
    """The hex digest of the bytes-like ``data`` as schema ``version`` records it."""
    h = hasher(version)
    h.update(data)
    return h.hexdigest()


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


def _checksum(meta: dict, version: int = SCHEMA_VERSION) -> str:
    """The digest of ``meta`` without its checksum, as canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return digest(json.dumps(body, sort_keys=True, allow_nan=False).encode(), version)


def split_state(state: dict, contiguous: bool = True) -> tuple:
    """``(plain, tensors)``: the JSON-able state with ``{"tensor": name}`` in each tensor's
    place, and ``{name: CPU tensor}`` (made contiguous unless ``contiguous=False``)."""
    tensors: dict = {}
    return _split(state, "state", tensors, contiguous), tensors


def encode_meta(plain, digest: str) -> bytes:
    """``meta.json``'s bytes for the split state ``plain`` and the blob's ``digest``."""
    meta = {"schema_version": SCHEMA_VERSION, "format": FORMAT, DIGEST_KEY: {TENSORS: digest}, "state": plain}
    try:
        meta["checksum"] = _checksum(meta)
        return json.dumps(meta, allow_nan=False, indent=1).encode()
    except ValueError as error:
        raise CheckpointError(f"state={error}, but should hold only finite numbers") from error


def encode(state: dict) -> tuple[bytes, bytes]:
    """``(meta.json bytes, safetensors bytes)`` for ``state``."""
    plain, tensors = split_state(state)
    blob = dump_tensors(tensors)
    return encode_meta(plain, digest(blob)), blob


def decode_meta(raw_meta: bytes) -> dict:
    """The checked contents of ``meta.json`` (JSON, schema version, keys, checksum)."""
    try:  # NaN or infinity in meta.json: ValueError from _checksum's allow_nan=False
        meta = json.loads(raw_meta.decode("utf-8"))
        version = meta.get("schema_version") if isinstance(meta, dict) else meta
        checksum = _checksum(meta, version) if type(version) is int and version in HASHES else None
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{META} unreadable ({error}), but should be valid JSON") from None
    require(checksum is not None, f"schema_version={version!r:.40}, but should be {SCHEMA_VERSION} (or 2, "
            "still read): a checkpoint of another rbcheck version; load it with an rbcheck that reads "
            "it (a newer one for a higher version), or save the buffer again from the run that made it")
    keys = {"schema_version", "format", "checksum", HASHES[version][0], "state"}
    require(set(meta) == keys and meta["format"] == FORMAT and isinstance(meta[HASHES[version][0]], dict),
            f"{META} keys={sorted(meta)}, format={meta.get('format')!r:.40}, but should be "
            f"{sorted(keys)}, {FORMAT!r}")
    require(meta["checksum"] == checksum, f"{META} checksum={meta['checksum']!r:.80}, but should be "
            f"{checksum} (the file was changed after it was written)")
    return meta


def check_digest(meta: dict, got: str) -> None:
    """The tensor file's digest ``got`` (of ``hasher(meta["schema_version"])``) is the one
    ``meta`` records."""
    key = HASHES[meta["schema_version"]][0]
    want = meta[key].get(TENSORS)
    require(got == want, f"{key}({TENSORS})={got}, but should be {want!r:.80}")


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
    check_digest(meta, digest(blob, meta["schema_version"]))
    return join_state(meta, load_blob(blob))
