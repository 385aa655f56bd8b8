"""What TorchRL 0.14.1's ``dumps``/``loads`` guarantee, executed (docs/findings.md,
"Checkpoint guarantees side by side"): the guarantees rbcheck's save and load keep
and TorchRL's do not, so the speed comparison of bench/peers.py is read honestly.

These state TorchRL's documented-by-behaviour conventions (it promises none of
them), so they are plain tests of what it does, not xfails: a TorchRL that starts
to refuse damaged files or to fsync fails them, and the finding must be updated.
Skipped (with the reason) where TorchRL is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

torchrl_data = pytest.importorskip("torchrl.data", reason="torchrl is not installed (nox -s thirdparty)")

CAPACITY = 64


def buffer():
    return torchrl_data.TensorDictReplayBuffer(storage=torchrl_data.LazyTensorStorage(CAPACITY), batch_size=4)


def saved(tmp_path: Path):
    rb = buffer()
    rb.extend(TensorDict({"obs": torch.arange(CAPACITY * 4, dtype=torch.float32).reshape(CAPACITY, 4)},
                         batch_size=[CAPACITY]))
    rb.dumps(tmp_path / "ckpt")
    return rb, tmp_path / "ckpt" / "storage" / "obs.memmap"


def test_a_flipped_byte_loads_as_other_data_without_a_word(tmp_path):
    rb, obs = saved(tmp_path)
    with open(obs, "r+b") as f:
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 0xFF]))
    target = buffer()
    target.loads(tmp_path / "ckpt")  # no checksum: accepted
    assert not torch.equal(target[:]["obs"], rb[:]["obs"])


def test_a_truncated_memmap_loads_without_a_word(tmp_path):
    rb, obs = saved(tmp_path)
    os.truncate(obs, obs.stat().st_size // 2)
    target = buffer()
    target.loads(tmp_path / "ckpt")  # the size is not checked against the metadata
    assert len(target) == CAPACITY
    assert not torch.equal(target[:]["obs"], rb[:]["obs"])


def test_dumps_neither_fsyncs_nor_commits_atomically(tmp_path, monkeypatch):
    """No ``fsync`` (the data may still be in the page cache after ``dumps`` returns) and
    no write-then-rename: the files are written in place under ``path``, so a save that
    dies part way leaves a mix of the old and the new checkpoint."""
    calls = []
    for name in ("fsync", "fdatasync", "replace", "rename"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    rb, _ = saved(tmp_path)
    rb.dumps(tmp_path / "ckpt")  # the second save writes over the first, in place
    assert calls == []
    assert (tmp_path / "ckpt" / "storage" / "obs.memmap").is_file()


def test_loads_unpickles(tmp_path, monkeypatch):
    """``loads`` reads ``prefetch.pkl`` with ``pickle.load`` (replay_buffers/base.py,
    ``_load_prefetch_state``): loading a checkpoint runs the code a pickle names."""
    import pickle

    saved(tmp_path)
    assert (tmp_path / "ckpt" / "prefetch.pkl").is_file()
    loads = []
    real = pickle.load
    monkeypatch.setattr(pickle, "load", lambda *a, **k: loads.append(1) or real(*a, **k))
    buffer().loads(tmp_path / "ckpt")
    assert loads
