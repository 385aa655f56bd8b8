"""Checkpoints (exact): plain-JSON metadata, no pickle, atomic pointer swap,
validation before mutation, bit-exact round trip and identical next samples."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rbcheck.reference import (
    CheckpointError,
    PrioritizedSampler,
    ReplayBuffer,
    SliceSampler,
    checkpoint,
)

from .test_buffer import same


def data(n, start=0):
    x = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": x.float()[:, None].expand(n, 3).clone(),
            "act": x,
            "done": x % 3 == 2,
            "pixels": (x % 256).to(torch.uint8)[:, None],
            "episode": x // 3,
            "next": {"obs": x.double()},
        },
        batch_size=[n],
    )


def prioritized(alpha=0.6, beta=0.4, seed=0):
    return ReplayBuffer(6, sampler=PrioritizedSampler(6, alpha, beta), generator=seed)


@pytest.fixture
def saved(tmp_path):
    """A wrapped prioritized buffer with a raised max priority, saved to tmp_path/ckpt."""
    rb = prioritized()
    rb.extend(data(8))
    rb.sample(4)  # moves the generator
    rb.update_priority(torch.tensor([1, 2]), torch.tensor([3, 0]))  # int priorities: max stays a float
    rb.dumps(tmp_path / "ckpt")
    return rb, tmp_path / "ckpt"


def current(path):
    return path / (path / "CURRENT").read_text().strip()


def test_round_trip_is_bit_exact_and_next_samples_identical(saved):
    rb, path = saved
    other = prioritized(alpha=1.0, beta=1.0, seed=99)
    other.loads(path)
    assert same(other.state_dict(), rb.state_dict())
    assert (other.storage.data == rb.storage.data).all()
    assert {k: v.dtype for k, v in other.storage.data.items(True, True)} == {
        k: v.dtype for k, v in rb.storage.data.items(True, True)}
    assert (other.cursor, other.write_count, len(other)) == (2, 8, 6)
    assert (other.sampler.alpha, other.sampler.beta, other.sampler.eps) == (0.6, 0.4, 1e-8)
    assert type(other.sampler.max_priority) is float and other.sampler.max_priority == 3.0
    assert torch.equal(other.sampler.sum_tree.nodes, rb.sampler.sum_tree.nodes)
    assert torch.equal(other.sampler.min_tree.nodes, rb.sampler.min_tree.nodes)
    for _ in range(3):
        (s1, i1), (s2, i2) = rb.sample(5), other.sample(5)
        assert (s1 == s2).all() and same(i1, i2)


def test_meta_is_plain_json_and_nothing_is_pickled(saved, monkeypatch):
    rb, path = saved
    files = sorted(p.name for p in current(path).iterdir())
    assert files == ["meta.json", "tensors.safetensors"]
    meta = json.loads((current(path) / "meta.json").read_text())

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(map(plain, x))
        return x is None or isinstance(x, (bool, int, float, str))

    assert plain(meta) and meta["schema_version"] == 3
    # only what cannot be derived: no generations, no inner nodes, no min tree
    assert meta["state"]["writer"] == {"write_count": meta["state"]["writer"]["write_count"]}
    assert set(meta["state"]["sampler"]) == {"type", "alpha", "beta", "eps", "max_priority", "sum_tree"}
    assert set(meta["state"]["sampler"]["sum_tree"]) == {"leaves"}
    assert meta["state"]["sampler"]["max_priority"] == 3.0
    for file in [path / "CURRENT", *current(path).iterdir()]:
        raw = file.read_bytes()
        if file.name == "tensors.safetensors":  # 8 bytes of header length (any value), then JSON
            raw = raw[8:]
            assert raw.startswith(b"{"), raw[:20]
        assert not raw.startswith(b"\x80") and b"PK\x03\x04" not in raw  # pickle / torch.save zip
        assert b"\x80\x02" not in raw[:2] and pickle.PROTO[0:1] not in raw[:1]
    raw = (current(path) / "tensors.safetensors").read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    assert "state.storage.columns.0" in json.loads(raw[8: 8 + header_len])  # a safetensors header

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling is not allowed")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    other = prioritized()
    other.loads(path)
    assert same(other.state_dict(), rb.state_dict())


def test_save_swaps_pointer_and_removes_the_old_subdirectory(saved):
    rb, path = saved
    first = current(path)
    rb.add(data(1, 50)[0])
    rb.dumps(path)
    assert current(path) != first and not first.exists()
    assert sorted(p.name for p in path.iterdir()) == sorted(["CURRENT", current(path).name])


def test_save_to_a_relative_path_keeps_the_new_checkpoint(tmp_path, monkeypatch):
    """A relative path: the cleanup of older sub-directories must not take
    the one just written for an old one (it did when ``tempfile.mkdtemp``
    returned an absolute name, found on Python 3.12)."""
    monkeypatch.chdir(tmp_path)
    rb = prioritized()
    rb.extend(data(5))
    rb.dumps("relative")
    rb.dumps("relative")  # a second save replaces the first
    fresh = prioritized(seed=9)
    fresh.loads("relative")
    assert same(fresh.state_dict()["storage"], rb.state_dict()["storage"])
    assert sorted(p.name for p in Path("relative").iterdir()) == sorted(["CURRENT", current(Path("relative")).name])


def test_crash_before_pointer_swap_keeps_previous_checkpoint(saved, monkeypatch):
    rb, path = saved
    expected = rb.state_dict()
    rb.add(data(1, 50)[0])

    def crash(*args):
        raise OSError("power cut")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        rb.dumps(path)
    monkeypatch.undo()
    assert len(list(path.glob("ckpt-*"))) == 2  # the half-written one is left over
    other = prioritized()
    other.loads(path)
    assert same(other.state_dict(), expected)
    rb.dumps(path)  # the next save cleans up the leftover
    assert len(list(path.glob("ckpt-*"))) == 1


def corrupt_tensors(path):
    file = current(path) / "tensors.safetensors"
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 0xFF
    file.write_bytes(bytes(raw))


def edit_meta(**changes):
    def edit(path):
        file = current(path) / "meta.json"
        meta = json.loads(file.read_text())
        meta.update(changes)
        file.write_text(json.dumps(meta))
    return edit


@pytest.mark.parametrize(
    "damage, message",
    [
        (corrupt_tensors, r"xxh3_128\(tensors.safetensors\)=.*, but should be"),
        (edit_meta(schema_version=1), r"schema_version=1, but should be 3 \(or 2, still read\)"),
        (lambda p: (current(p) / "meta.json").write_text("{not json"), "meta.json unreadable"),
        (lambda p: (p / "CURRENT").unlink(), "has no CURRENT file"),
        (lambda p: (p / "CURRENT").write_text("../elsewhere"), "CURRENT='../elsewhere', but should name"),
    ],
)
def test_damaged_checkpoint_is_rejected_and_buffer_unchanged(saved, damage, message):
    _, path = saved
    damage(path)
    rb = prioritized()
    rb.extend(data(2))
    before = rb.state_dict()
    with pytest.raises(CheckpointError, match=message):
        rb.loads(path)
    assert same(rb.state_dict(), before)


def allocated_with_other_fields():
    rb = prioritized()
    rb.extend(TensorDict({"obs": torch.ones(1)}, batch_size=[1]))
    return rb


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ReplayBuffer(7, sampler=PrioritizedSampler(7, 0.6, 0.4)), "capacity=6, but should be 7"),
        (lambda: ReplayBuffer(6), "sampler type='PrioritizedSampler', but should be 'RandomSampler'"),
        (allocated_with_other_fields, "field layout="),
    ],
)
def test_checkpoint_that_does_not_fit_the_buffer(saved, make, message):
    _, path = saved
    rb = make()
    before = rb.state_dict()
    with pytest.raises(CheckpointError, match=message):
        rb.loads(path)
    assert same(rb.state_dict(), before)


def test_empty_and_slice_buffers_round_trip(tmp_path):
    empty = ReplayBuffer(4, generator=5)
    empty.dumps(tmp_path / "empty")
    other = ReplayBuffer(4)
    other.loads(tmp_path / "empty")
    assert same(other.state_dict(), empty.state_dict()) and other.storage.data is None

    rb = ReplayBuffer(9, sampler=SliceSampler(slice_len=2, episode_key=("next", "obs"), strict_length=False))
    rb.extend(data(5))
    rb.dumps(tmp_path / "slice")
    other = ReplayBuffer(9, sampler=SliceSampler(num_slices=3))
    other.loads(tmp_path / "slice")
    assert (other.sampler.slice_len, other.sampler.num_slices) == (2, None)
    assert other.sampler.episode_key == ("next", "obs") and other.sampler.strict_length is False
    assert same(rb.sample(4)[1], other.sample(4)[1])


# ------------------------------------------- the user's files next to a checkpoint

#: What a user keeps in a run directory, names like rbcheck's included: a
#: model checkpoint in ``ckpt-1000/``, an empty ``ckpt-best/``, a directory
#: named as an old mkdtemp name, a file named as the old temporary pointer.
USER_FILES = {
    "notes.txt": b"lr=3e-4\n",
    "ckpt-1000/model.pt": b"\x80\x04weights",
    "ckpt-abcd1234/meta.json": b"{}",
    "ckpt-best/nested/deep/opt.bin": bytes(range(256)),
    "CURRENT.tmp": b"mine\n",
}
USER_DIRS = ("ckpt-best", "ckpt-empty", "ckpt-rbcheck_mine")


def users_run_directory(path: Path) -> dict[str, bytes]:
    for name, data in USER_FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    for name in USER_DIRS:
        (path / name).mkdir(exist_ok=True)
    tops = {name.split("/")[0] for name in (*USER_FILES, *USER_DIRS)}
    return {name: data for name, data in tree(path).items() if name.split("/")[0] in tops}


def tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under ``path``: a file's bytes, None for a directory."""
    return {p.relative_to(path).as_posix(): None if p.is_dir() else p.read_bytes() for p in path.rglob("*")}


def written_by_the_save(path: Path, user: dict) -> list[str]:
    """The top-level entries of ``path`` that are not the user's."""
    return sorted(set(os.listdir(path)) - {name.split("/")[0] for name in user})


def test_save_leaves_the_users_files_byte_identical(tmp_path):
    """A save into a run directory changes none of the user's files and
    directories, whatever their names; after each save there is exactly the
    pointer and one checkpoint besides them, and it loads."""
    path = tmp_path / "runs" / "exp1"
    path.mkdir(parents=True)
    user = users_run_directory(path)
    rb = prioritized()
    rb.extend(data(8))
    for round_ in range(3):
        rb.add(data(1, 40 + round_)[0])
        rb.dumps(path)
        after = {name: data for name, data in tree(path).items() if name in user}
        assert after == user, f"save {round_ + 1}: the user's entries changed"
        assert written_by_the_save(path, user) == sorted(["CURRENT", current(path).name])
        other = prioritized(seed=7)
        other.loads(path)
        assert same(other.state_dict(), rb.state_dict())


def test_save_refuses_a_directory_whose_pointer_file_is_not_rbchecks(tmp_path):
    """A ``CURRENT`` that is not an rbcheck pointer (here LevelDB's) is the
    user's: the save raises, naming it, and writes nothing."""
    (tmp_path / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    before = tree(tmp_path)
    rb = prioritized()
    rb.extend(data(3))
    with pytest.raises(CheckpointError, match=r"CURRENT=.*MANIFEST-000001.*but should be"):
        rb.dumps(tmp_path)
    assert tree(tmp_path) == before


def test_save_removes_the_previous_checkpoint_and_its_own_leftovers_only(saved, monkeypatch):
    """The next save removes the checkpoint ``CURRENT`` named (by the name
    rbcheck's save generates) and what crashed saves left, never the user's
    entries. A ``CURRENT`` naming anything else (an older rbcheck's
    ``ckpt-xxxxxxxx`` too) is refused, nothing deleted (issue 39, item 7:
    tests/faults/test_pointer_to_a_users_directory.py)."""
    rb, path = saved
    user = users_run_directory(path)
    rb.add(data(1, 50)[0])

    def crash(*args):
        raise OSError("power cut")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        rb.dumps(path)  # leaves a new sub-directory and a temporary pointer
    monkeypatch.undo()
    assert len(written_by_the_save(path, user)) == 4  # CURRENT, the previous one, the crashed save's two
    rb.dumps(path)
    assert written_by_the_save(path, user) == sorted(["CURRENT", current(path).name])
    assert {name: data for name, data in tree(path).items() if name in user} == user
