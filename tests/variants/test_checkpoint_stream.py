"""The variant buffer's streamed checkpoints (``variants/checkpoint_stream.py``), exact:

* its files are the reference's, byte for byte, for every sampler and for
  columns of several dtypes, nested keys, interleaved rows and wrapped rings;
* its reader gives the reference reader's answer on hostile tensor files
  (the digest and meta.json re-signed, so only the safetensors header is
  checked): the same state, or the same ``CheckpointError`` message, and a
  refused load leaves the buffer unchanged;
* a load reads the tensor file once, straight into new interleaved rows, which the
  storage adopts (no staged clone, no repack), and still never writes into the live
  rows before the whole checkpoint is accepted;
* a schema 2 checkpoint (sha256) still loads; another version is refused saying so;
* the writer's generations filled by slices are the reference's arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck import variants
from rbcheck.reference import CheckpointError, checkpoint, checkpoint_format
from rbcheck.reference import PrioritizedSampler as ReferencePrioritized
from rbcheck.reference import ReplayBuffer as ReferenceBuffer
from rbcheck.reference.writer import ring_generation
from rbcheck.variants import checkpoint_stream
from rbcheck.variants.device_storage import ring_generations

from ..unit.test_buffer import same


def rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"obs": torch.stack([x.float(), x / 7], 1), "act": x, "done": x % 3 == 0,
                       "half": x.half()[:, None].expand(n, 3).clone(), "next": {"obs": x.double()}},
                      batch_size=[n])


def sampler(kind: str, capacity: int):
    if kind == "prioritized":
        return variants.PrioritizedSampler(capacity, 0.6, 0.4)
    if kind == "slice":
        return variants.SliceSampler(num_slices=2, episode_key="act")
    return None


def filled(kind: str = "prioritized", capacity: int = 6, n: int = 8, seed: int = 0):
    buf = variants.ReplayBuffer(capacity, sampler=sampler(kind, capacity), generator=seed, device="cpu")
    buf.extend(rows(n))
    if kind == "prioritized" and n > 3:
        buf.update_priority(torch.tensor([1, 3]), torch.tensor([4.0, 0.5]))
    return buf


def files(path: Path) -> dict:
    live = checkpoint.live_dir(path)
    return {f.name: f.read_bytes() for f in live.iterdir()}


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "slice"])
@pytest.mark.parametrize("n", [0, 5, 14])
def test_files_are_the_references_byte_for_byte(kind, n, tmp_path):
    """exact: the streamed save writes the bytes of the reference's encoder."""
    buf = filled(kind, n=n) if n else variants.ReplayBuffer(6, sampler=sampler(kind, 6), generator=0, device="cpu")
    if n:
        assert checkpoint_stream.state_view(buf)["storage"]["columns"][0].stride(0) > 2  # interleaved rows
    buf.dumps(tmp_path / "stream")
    checkpoint.save_checkpoint(buf, tmp_path / "reference")
    assert files(tmp_path / "stream") == files(tmp_path / "reference")


def test_large_columns_cross_chunks(tmp_path, monkeypatch):
    """exact: columns longer than a chunk (and than the staging buffers in turn) stream the same bytes."""
    monkeypatch.setattr(checkpoint_stream, "CHUNK", 64)
    monkeypatch.setattr(checkpoint_stream, "WRITEBACK", 128)
    buf = filled("prioritized", capacity=300, n=1000)
    buf.dumps(tmp_path / "stream")
    checkpoint.save_checkpoint(buf, tmp_path / "reference")
    assert files(tmp_path / "stream") == files(tmp_path / "reference")
    back = filled("prioritized", capacity=300, n=3, seed=4)
    back.loads(tmp_path / "stream")
    assert same(back.state_dict(), buf.state_dict())


def test_load_reads_into_new_rows_and_adopts_them(tmp_path, monkeypatch):
    """exact: a load reads the tensor file straight into NEW interleaved rows (the live
    rows untouched until the whole checkpoint is accepted), which the storage then keeps
    as its rows: nothing is moved after the read (no repack), and the state is the saved one."""
    from rbcheck.variants.device_storage import DeviceStorage

    src = filled("uniform", n=5)
    src.dumps(tmp_path / "ckpt")
    dst = filled("uniform", n=9, seed=3)
    old = dst.storage.data["obs"]
    state = checkpoint_stream.read(tmp_path / "ckpt", dst.capacity)
    assert state["storage"]["columns"].packed
    assert all(c.stride(0) * c.element_size() == 32 for c in state["storage"]["columns"])  # 32-byte rows

    def moved(self):
        raise AssertionError("the read rows were copied again")

    monkeypatch.setattr(DeviceStorage, "_pack", moved)
    dst.loads(tmp_path / "ckpt")
    assert same(dst.state_dict(), src.state_dict())
    assert dst.storage.data["obs"].untyped_storage().data_ptr() != old.untyped_storage().data_ptr()
    assert dst.storage._packed is dst.storage.data and dst.storage.data["obs"].stride(0) == 8


def test_read_without_a_row_layout_gives_plain_columns(tmp_path):
    """exact: read without a capacity (a loader whose storage keeps no interleaved rows)
    gives each column in its own contiguous memory, the reference reader's state."""
    src = filled("prioritized", n=5)
    src.dumps(tmp_path / "ckpt")
    state = checkpoint_stream.read(tmp_path / "ckpt")
    assert not state["storage"]["columns"].packed
    assert all(c.is_contiguous() for c in state["storage"]["columns"])
    assert same(state, checkpoint.read_checkpoint(tmp_path / "ckpt"))


def schema_2(path: Path) -> None:
    """Rewrite the checkpoint at ``path`` as rbcheck before XXH3 wrote it (schema 2: sha256)."""
    import hashlib

    live = checkpoint.live_dir(path)
    meta = json.loads((live / "meta.json").read_text())
    del meta[checkpoint_format.DIGEST_KEY]
    meta["schema_version"] = 2
    meta["sha256"] = {"tensors.safetensors": hashlib.sha256((live / "tensors.safetensors").read_bytes()).hexdigest()}
    body = {k: v for k, v in meta.items() if k != "checksum"}
    meta["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()
    (live / "meta.json").write_text(json.dumps(meta, indent=1))


@pytest.mark.parametrize("make", ["reference", "variant"])
def test_a_schema_2_checkpoint_still_loads_bit_for_bit(tmp_path, make):
    """exact: a checkpoint of rbcheck before XXH3 (schema 2, sha256) loads into both
    buffers bit for bit; one with its tensor file changed is refused naming sha256."""
    src = filled("prioritized", n=8)
    src.dumps(tmp_path / "ckpt")
    schema_2(tmp_path / "ckpt")

    def new():
        if make == "reference":
            buf = ReferenceBuffer(6, sampler=ReferencePrioritized(6, 0.6, 0.4), generator=1)
            buf.extend(rows(2))
            return buf
        return filled("prioritized", n=2, seed=1)

    dst = new()
    dst.loads(tmp_path / "ckpt")
    assert same(dst.state_dict(), src.state_dict())
    tensors = checkpoint.live_dir(tmp_path / "ckpt") / "tensors.safetensors"
    blob = bytearray(tensors.read_bytes())
    blob[-1] ^= 1
    tensors.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=r"sha256\(tensors.safetensors\)=.*, but should be"):
        new().loads(tmp_path / "ckpt")


def test_another_schema_version_is_refused_saying_what_to_do(tmp_path):
    """exact: schema 1 (or a future one) is refused by both readers with the same message,
    naming the version and what to do."""
    filled("uniform", n=3).dumps(tmp_path / "ckpt")
    live = checkpoint.live_dir(tmp_path / "ckpt")
    meta = json.loads((live / "meta.json").read_text())
    meta["schema_version"] = 1
    (live / "meta.json").write_text(json.dumps(meta))
    assert agree(tmp_path / "ckpt") == "refused"
    with pytest.raises(CheckpointError, match=r"schema_version=1, but should be 3 \(or 2, still read\): "
                                              r"a checkpoint of another rbcheck version; load it with"):
        filled("uniform", n=1).loads(tmp_path / "ckpt")


def test_a_late_refusal_leaves_the_rows_unchanged(tmp_path):
    """exact: a prioritized checkpoint refused by a uniform buffer (the sampler is
    checked after the storage was staged from the adopted columns) changes nothing."""
    filled("prioritized", n=6).dumps(tmp_path / "ckpt")
    dst = filled("uniform", n=9, seed=3)
    before = dst.state_dict()
    with pytest.raises(CheckpointError, match="does not fit this buffer"):
        dst.loads(tmp_path / "ckpt")
    assert same(dst.state_dict(), before)


def test_generations_by_slices_are_the_reference_arithmetic():
    """exact: ``ring_generations`` equals ``ring_generation`` over every slot."""
    for capacity in (1, 2, 5, 7):
        for count in [*range(30), 2**62 - 3, 2**62 - 1, 2**62]:
            assert torch.equal(ring_generations(count, capacity, "cpu"),
                               ring_generation(torch.arange(capacity), count, capacity)), (capacity, count)


# --- hostile tensor files: the stream reader answers as the reference's ---------------------


def resigned(path: Path, blob: bytes) -> None:
    """Replace the tensor file by ``blob`` with meta.json's digest and checksum updated."""
    live = checkpoint.live_dir(path)
    (live / "tensors.safetensors").write_bytes(blob)
    meta = json.loads((live / "meta.json").read_text())
    meta[checkpoint_format.DIGEST_KEY]["tensors.safetensors"] = checkpoint_format.digest(blob)
    meta["checksum"] = checkpoint_format._checksum(meta)
    (live / "meta.json").write_text(json.dumps(meta))


def outcome(make, path: Path):
    buf = make()
    before = buf.state_dict()
    try:
        buf.loads(path)
    except CheckpointError as error:
        assert same(buf.state_dict(), before), f"a refused load changed the buffer ({error})"
        return "refused", str(error)
    return "loaded", buf.state_dict()


def agree(path: Path) -> str:
    """Both readers give the same answer; which one."""
    def reference():
        buf = ReferenceBuffer(6, sampler=ReferencePrioritized(6, 0.6, 0.4), generator=5)
        buf.extend(rows(2))
        return buf

    ref = outcome(reference, path)
    var = outcome(lambda: filled("prioritized", n=2, seed=5), path)
    assert ref[0] == var[0], f"reference {ref[0]}, variant {var[0]}: {ref[1] if ref[0] == 'refused' else var[1]}"
    if ref[0] == "refused":
        assert ref[1] == var[1]
    else:
        assert same(var[1], ref[1])
    return ref[0]


def header_of(blob: bytes):
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def with_header(entries: dict, data: bytes, pad: int = 0) -> bytes:
    text = json.dumps(entries, separators=(",", ":")).encode() + b" " * pad
    return len(text).to_bytes(8, "little") + text + data


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "ckpt"
    filled("prioritized").dumps(path)
    return path, files(path)["tensors.safetensors"]


def copy_of(saved, tmp_path: Path) -> Path:
    import shutil

    path = tmp_path / f"ckpt-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(saved[0], path)
    return path


def edits(blob: bytes):
    entries, data = header_of(blob)
    first = next(iter(entries))
    yield "metadata", with_header({"__metadata__": {"a": "b"}, **entries}, data)
    yield "misaligned", with_header(entries, data, pad=3)
    yield "unpadded", with_header(entries, data, pad=0)
    shifted = {k: {**v, "data_offsets": [v["data_offsets"][0] + 8, v["data_offsets"][1] + 8]} for k, v in entries.items()}
    yield "gap", with_header(shifted, bytes(8) + data)
    yield "extra bytes", with_header(entries, data + bytes(8))
    yield "wrong dtype", with_header({**entries, first: {**entries[first], "dtype": "C64"}}, data)
    yield "wrong shape", with_header({**entries, first: {**entries[first], "shape": [1]}}, data)
    reordered = dict(reversed(list(entries.items())))
    yield "keys reordered", with_header(reordered, data)
    yield "short header", blob[:4]
    yield "header past the end", (len(blob)).to_bytes(8, "little") + blob[8:]
    yield "not an object", with_header([1, 2], b"")  # type: ignore[arg-type]
    yield "data cut short", blob[:-5]
    yield "header only", with_header(entries, b"")


def test_hostile_headers_get_the_references_answer(saved, tmp_path):
    """exact: each edit of a re-signed tensor file: same outcome for both readers."""
    seen = {}
    for name, blob in edits(saved[1]):
        path = copy_of(saved, tmp_path)
        resigned(path, blob)
        seen[name] = agree(path)
    assert seen["keys reordered"] == "loaded" and seen["wrong shape"] == "refused", seen


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_flipped_header_bytes_get_the_references_answer(saved, tmp_path, data):
    """exact: a byte of the safetensors header changed and the files re-signed."""
    blob = bytearray(saved[1])
    n = int.from_bytes(blob[:8], "little")
    at = data.draw(st.integers(0, 8 + n - 1), label="position")
    blob[at] = data.draw(st.integers(0, 255).filter(lambda b: b != blob[at]), label="byte")
    path = copy_of(saved, tmp_path)
    resigned(path, bytes(blob))
    agree(path)
