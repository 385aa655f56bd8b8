"""The reference's checkpoint format against damaged and hostile directories (exact).

A load either raises ``CheckpointError`` and leaves the buffer's whole state
(``state_dict``: storage, writer with generations, trees, max priority,
generator) bit-identical, or loads exactly the saved state. No other
exception escapes, nothing is unpickled, no symlink is followed. Hypothesis
fuzzes the bytes of every file (flips, truncations, appended bytes), the JSON
values of ``meta.json`` (with and without a recomputed checksum, i.e. a
hostile writer who knows the format) and the pointer file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.reference import (
    CheckpointError,
    PrioritizedSampler,
    ReplayBuffer,
    checkpoint,
    checkpoint_format,
)

from ..unit.test_buffer import same

FILES = ("CURRENT", "meta.json", "tensors.safetensors")
HYPOTHESIS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                      deadline=None)


def rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"obs": torch.stack([x.float(), x / 7], 1), "act": x, "done": x % 3 == 0,
                       "next": {"obs": x.double()}}, batch_size=[n])


def buffer(seed: int = 0, capacity: int = 6) -> ReplayBuffer:
    return ReplayBuffer(capacity, sampler=PrioritizedSampler(capacity, 0.6, 0.4), generator=seed)


def source() -> ReplayBuffer:
    rb = buffer()
    rb.extend(rows(8))
    rb.sample(3)
    rb.update_priority(torch.tensor([1, 3]), torch.tensor([4.0, 0.0]))
    return rb


def other() -> ReplayBuffer:
    rb = buffer(seed=5)
    rb.extend(rows(2, 100))
    return rb


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A saved checkpoint (never modified) and the state it holds."""
    rb, path = source(), tmp_path_factory.mktemp("pristine") / "ckpt"
    rb.dumps(path)
    return path, rb.state_dict()


def copy(pristine, tmp_path: Path) -> Path:
    path = tmp_path / f"ckpt-copy-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(pristine[0], path, symlinks=True)
    return path


def live(path: Path) -> Path:
    return path / (path / "CURRENT").read_text().strip()


def file_of(path: Path, name: str) -> Path:
    return path / name if name == "CURRENT" else live(path) / name


def load_into_other(path: Path):
    """A buffer holding other rows after ``loads(path)``, or None when the load
    was refused, with a clear message and the buffer unchanged."""
    rb = other()
    before = rb.state_dict()
    try:
        rb.loads(path)
    except CheckpointError as error:
        assert "but should" in str(error), f"unclear message: {error}"
        assert same(rb.state_dict(), before), f"state changed by a refused load ({error})"
        return None
    return rb


def load_outcome(path: Path, saved: dict) -> str:
    """Load into a buffer holding other rows: "refused" (state unchanged) or
    "loaded" (exactly the saved state); anything else fails the test."""
    rb = load_into_other(path)
    if rb is None:
        return "refused"
    assert same(rb.state_dict(), saved), "a damaged checkpoint loaded a different state"
    return "loaded"


# --- bytes ------------------------------------------------------------------


@HYPOTHESIS
@given(name=st.sampled_from(FILES), data=st.data())
def test_byte_damage_is_refused_or_harmless(pristine, tmp_path, name, data):
    """exact: a flipped byte, a truncation or appended bytes in any file."""
    path = copy(pristine, tmp_path)
    file = file_of(path, name)
    raw = bytearray(file.read_bytes())
    how = data.draw(st.sampled_from(["flip", "truncate", "append"]), label="how")
    if how == "flip":
        at = data.draw(st.integers(0, len(raw) - 1), label="position")
        raw[at] ^= data.draw(st.integers(1, 255), label="xor")
    elif how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="keep")]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=64), label="appended")
    file.write_bytes(bytes(raw))
    outcome = load_outcome(path, pristine[1])
    if name == "tensors.safetensors":
        assert outcome == "refused"  # its digest is checked


# --- JSON values ------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.just("tensor") | st.just({"tensor": "state.storage.columns.0"}),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def nodes(obj, where=()):
    """Every (path, value) of a JSON tree."""
    yield where, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from nodes(value, (*where, key))


def mutated(value, data):
    """A value near ``value`` (or anything at all)."""
    if isinstance(value, bool) or value is None:
        return data.draw(json_values, label="replacement")
    if isinstance(value, int):
        return data.draw(st.sampled_from([value + 1, value - 1, -value, 2 * value, float(value), str(value),
                                          True, 2**63, -1]), label="replacement")
    if isinstance(value, float):
        return data.draw(st.sampled_from([value * 2, -value, value + 1e-12, int(value), 0.0]), label="replacement")
    if isinstance(value, str):
        return data.draw(st.sampled_from([value + "x", value[:-1], "", "torch.Tensor", "../" + value]),
                         label="replacement")
    return data.draw(json_values, label="replacement")


@HYPOTHESIS
@given(data=st.data(), resign=st.booleans())
def test_json_mutations_are_refused_or_give_a_consistent_buffer(pristine, tmp_path, data, resign):
    """exact: a changed, removed or added JSON value in meta.json. Without a
    recomputed checksum it is always refused; with one (a hostile writer who
    knows the format) it is refused, or the buffer it loads is consistent:
    it saves, loads again, and samples or refuses with a clear error."""
    path = copy(pristine, tmp_path)
    file = live(path) / "meta.json"
    meta = json.loads(file.read_text())
    candidates = [p for p, _ in nodes(meta) if p]
    where = data.draw(st.sampled_from(candidates), label="where")
    parent = meta
    for key in where[:-1]:
        parent = parent[key]
    how = data.draw(st.sampled_from(["change", "delete", "add"]), label="how")
    if how == "change":
        parent[where[-1]] = mutated(parent[where[-1]], data)
    elif how == "delete":
        del parent[where[-1]]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=6), label="new key")] = data.draw(json_values)
    else:
        parent.append(data.draw(json_values, label="appended"))
    if resign and isinstance(meta, dict):
        meta["checksum"] = checkpoint_format._checksum(meta)
    file.write_text(json.dumps(meta))
    rb = load_into_other(path)
    if rb is None:
        return
    if not resign:
        assert same(rb.state_dict(), pristine[1]), "a change without a new checksum was accepted"
    again = buffer(seed=9)
    rb.dumps(tmp_path / "again")
    again.loads(tmp_path / "again")
    assert same(again.state_dict(), rb.state_dict())
    assert len(rb) == min(rb.write_count, rb.capacity) and rb.cursor == rb.write_count % rb.capacity
    try:
        rb.sample(4)
    except ValueError as error:
        assert "but should be" in str(error)


# --- the pointer file and paths ---------------------------------------------------


@HYPOTHESIS
@given(pointer=st.one_of(
    st.sampled_from(["../ckpt-x", "/etc", "ckpt-../../etc", "ckpt-a/../../b", "..", "", ".", "ckpt-",
                     "ckpt-x\x00", "ckpt-" + "a" * 300, "CURRENT", "ckpt-*", "~/ckpt-a", "ckpt-a\\..\\b"]),
    st.text(max_size=40)))
def test_pointer_cannot_lead_outside(pristine, tmp_path, pointer):
    """exact: whatever ``CURRENT`` says, only a ``ckpt-*`` sub-directory of the
    checkpoint is read: path traversal and absolute paths are refused."""
    path = copy(pristine, tmp_path)
    true_name = live(path).name
    (path / "CURRENT").write_bytes(pointer.encode("utf-8", "surrogatepass"))
    outcome = load_outcome(path, pristine[1])
    assert outcome == "refused" or pointer.strip() == true_name


def outside_copy(item: Path, tmp_path: Path) -> Path:
    target = tmp_path / f"outside-{item.name}"
    (shutil.copytree if item.is_dir() else shutil.copyfile)(item, target)
    return target


@pytest.mark.parametrize("which", ["CURRENT", "subdirectory", "meta.json", "tensors.safetensors"])
def test_symlinks_are_refused(pristine, tmp_path, which):
    """exact: a symlink anywhere in the checkpoint, even to an identical copy
    outside it, is refused (a checkpoint must not read other files)."""
    path = copy(pristine, tmp_path)
    item = live(path) if which == "subdirectory" else file_of(path, which)
    target = outside_copy(item, tmp_path)
    (shutil.rmtree if item.is_dir() else os.unlink)(item)
    item.symlink_to(target, target_is_directory=target.is_dir())
    assert load_outcome(path, pristine[1]) == "refused"


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not hasattr(signal, "SIGALRM"), reason="POSIX only")
def test_pointer_to_a_device_or_fifo_is_refused(pristine, tmp_path):
    """exact: a special file where a regular one belongs is refused without
    blocking or reading it."""
    path = copy(pristine, tmp_path)
    meta = live(path) / "meta.json"
    meta.unlink()
    os.mkfifo(meta)

    def hung(signum, frame):
        raise AssertionError("load blocked on a FIFO, but should refuse it without reading")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        assert load_outcome(path, pristine[1]) == "refused"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("damage", ["extra_file_in_checkpoint", "meta.json_missing", "tensors_missing",
                                    "subdirectory_missing", "CURRENT_missing", "schema_version_2",
                                    "unused_tensor", "deeply_nested_json", "meta_too_large"])
def test_missing_extra_and_wrong_version(pristine, tmp_path, damage, monkeypatch):
    """exact: each is refused with a clear error and the buffer unchanged."""
    path = copy(pristine, tmp_path)
    sub = live(path)
    meta = json.loads((sub / "meta.json").read_text())
    if damage == "extra_file_in_checkpoint":
        (sub / "prefetch.pkl").write_bytes(pickle.dumps({"a": 1}))
    elif damage == "meta.json_missing":
        (sub / "meta.json").unlink()
    elif damage == "tensors_missing":
        (sub / "tensors.safetensors").unlink()
    elif damage == "subdirectory_missing":
        shutil.rmtree(sub)
    elif damage == "CURRENT_missing":
        (path / "CURRENT").unlink()
    elif damage == "schema_version_2":
        meta["schema_version"] = checkpoint_format.SCHEMA_VERSION + 1
        meta["checksum"] = checkpoint_format._checksum(meta)
    elif damage == "unused_tensor":  # a tensor nobody refers to: the state was edited
        meta["state"]["storage"]["columns"].pop()
        meta["state"]["storage"]["keys"].pop()
        meta["checksum"] = checkpoint_format._checksum(meta)
    elif damage == "deeply_nested_json":
        (sub / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "meta_too_large":
        monkeypatch.setattr(checkpoint, "MAX_META_BYTES", 100)
    if damage in ("schema_version_2", "unused_tensor"):
        (sub / "meta.json").write_text(json.dumps(meta))
    assert load_outcome(path, pristine[1]) == "refused"


def test_extra_files_next_to_the_checkpoint_are_ignored(pristine, tmp_path):
    """exact: leftovers of a crashed save (an old ckpt-* directory, a
    CURRENT.tmp) beside the live checkpoint do not stop it loading."""
    path = copy(pristine, tmp_path)
    (path / "ckpt-leftover").mkdir()
    (path / "ckpt-leftover" / "tensors.safetensors").write_bytes(b"half")
    (path / "CURRENT.tmp").write_text("ckpt-leftover\n")
    assert load_outcome(path, pristine[1]) == "loaded"


# --- no unpickling --------------------------------------------------------------------


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_a_pickle_in_place_of_the_tensors_never_runs(pristine, tmp_path, kind, monkeypatch):
    """exact: a tensor file replaced by a pickle that runs code -- with its
    digest and the meta checksum recomputed, so only the format can refuse
    it -- is refused, and nothing is unpickled (pickle and torch.load are
    made to fail loudly during the load)."""
    path = copy(pristine, tmp_path)
    marker, file = tmp_path / "PWNED", live(path) / "tensors.safetensors"
    if kind == "pickle":
        file.write_bytes(pickle.dumps(Payload(marker)))
    else:
        torch.save({"x": Payload(marker)}, file)
    meta = json.loads((live(path) / "meta.json").read_text())
    meta[checkpoint_format.DIGEST_KEY]["tensors.safetensors"] = checkpoint_format.digest(file.read_bytes())
    meta["checksum"] = checkpoint_format._checksum(meta)
    (live(path) / "meta.json").write_text(json.dumps(meta))

    def forbidden(*args, **kwargs):
        raise AssertionError("the loader unpickled something")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    assert load_outcome(path, pristine[1]) == "refused"
    assert not marker.exists()
