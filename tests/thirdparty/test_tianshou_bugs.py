"""Executed repros of the tianshou 2.0.1 bugs in docs/findings.md (strict
xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern). Skipped where tianshou is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tianshou", reason="tianshou is not installed (nox -s thirdparty installs it)")
from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer  # noqa: E402

VERSION = "tianshou 2.0.1"
FEPS = float(np.finfo(np.float32).eps)


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def refuses(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


def row(x) -> Batch:
    return Batch(obs={"x": np.asarray(x)}, act=np.zeros(()), rew=0.0, terminated=False, truncated=False)


def filled(buf, n: int = 8):
    for i in range(n):
        buf.add(row(i))
    return buf


@bug("PrioritizedReplayBuffer ignores random_seed: sample_indices draws np.random.rand "
     "(buffer/prio.py:65), not the seeded self._random_state the uniform buffer uses "
     "(buffer/buffer_base.py:98, :517)")
def test_same_random_seed_gives_same_prioritized_draws():
    a = filled(PrioritizedReplayBuffer(8, alpha=0.6, beta=0.4, random_seed=1))
    b = filled(PrioritizedReplayBuffer(8, alpha=0.6, beta=0.4, random_seed=1))
    assert np.array_equal(a.sample(16)[1], b.sample(16)[1])


@bug("weight_norm=False divides each transformed priority (p + eps) ** alpha by _min_prio, "
     "the smallest RAW p + eps ever seen (not raised to alpha, not over the held rows): "
     "buffer/prio.py:79, :90")
def test_unnormalised_weights_follow_the_closed_form():
    buf = filled(PrioritizedReplayBuffer(4, alpha=0.5, beta=1.0, weight_norm=False), 4)
    raw = np.array([0.25, 1.0, 4.0, 9.0])
    buf.update_weight(np.arange(4), raw)
    leaf = (raw + FEPS) ** 0.5
    probs = leaf / leaf.sum()
    want = (4 * probs) ** -1.0 / (4 * probs.min()) ** -1.0  # the spec's buffer-min normaliser
    assert np.allclose(buf[np.arange(4)].weight, want, rtol=1e-6), buf[np.arange(4)].weight


@bug("a row that cannot be stored still moves the ring: add advances _insertion_idx and _size "
     "(buffer/buffer_base.py:378-380) before the write that fails (:489-500)")
def test_refused_row_leaves_the_buffer_unchanged():
    buf = filled(ReplayBuffer(8), 5)
    assert refuses(lambda: buf.add(row(np.zeros(3))))
    assert len(buf) == 5


@bug("sample(0) returns every row and sample(-3) an empty batch, as its docstring says "
     "(buffer/buffer_base.py:503-531, with the maintainers' own TODOs), instead of refusing")
@pytest.mark.parametrize("size", [0, -3])
def test_bad_batch_size_is_refused(size):
    buf = filled(ReplayBuffer(8), 5)
    assert refuses(lambda: buf.sample(size))


@bug("capacity 0 and negative capacities are accepted (ReplayBuffer.__init__, buffer/buffer_base.py:89)")
@pytest.mark.parametrize("capacity", [0, -4])
def test_bad_capacity_is_refused(capacity):
    assert refuses(lambda: ReplayBuffer(capacity))


@bug("a negative priority is silently replaced by its absolute value (np.abs, buffer/prio.py:87); "
     "NaN and inf are stored as they are")
@pytest.mark.parametrize("bad", [-0.5, np.nan, np.inf])
def test_bad_priority_is_refused(bad):
    buf = filled(PrioritizedReplayBuffer(8, alpha=0.6, beta=0.4))
    assert refuses(lambda: buf.update_weight(np.array([0, 1]), np.array([1.0, bad])))


@bug("save_hdf5 truncates and rewrites the file in place (h5py.File(path, 'w'), "
     "buffer/buffer_base.py:254): a save that dies part way leaves neither the old nor the new buffer")
def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from tianshou.data.buffer import buffer_base

    path = str(tmp_path / "buffer.hdf5")
    filled(ReplayBuffer(8), 6).save_hdf5(path)

    def dies(*args, **kwargs):
        raise OSError("killed part way")

    monkeypatch.setattr(buffer_base, "to_hdf5", dies)
    assert refuses(lambda: filled(ReplayBuffer(8), 3).save_hdf5(path))
    monkeypatch.undo()
    try:
        held = len(ReplayBuffer.load_hdf5(path))
    except Exception as err:  # noqa: BLE001 - the truncated file does not load at all
        held = f"load_hdf5 raised {type(err).__name__}"
    assert held == 6, held


@bug("save_hdf5 pickles what HDF5 cannot hold -- the buffer's RandomState and, for the "
     "prioritized buffer, its SegmentTree (utils/converter.py:140-146) -- and load_hdf5 unpickles "
     "them (from_hdf5): loading a checkpoint runs whatever code it names")
def test_checkpoint_holds_no_pickle(tmp_path):
    import pickle

    import h5py

    path = str(tmp_path / "buffer.hdf5")
    filled(PrioritizedReplayBuffer(8, alpha=0.6, beta=0.4)).save_hdf5(path)
    unpickled = []
    with h5py.File(path, "r") as f:
        for name in f:
            if f[name].attrs.get("__data_type__") not in (None, "ndarray", "Tensor", "Batch"):
                unpickled.append(type(pickle.loads(f[name][()].tobytes())).__name__)
    assert unpickled == [], unpickled


@bug("a uniform buffer's checkpoint loads as a PrioritizedReplayBuffer without a word, and the "
     "object has no priority tree: its first sample raises AttributeError "
     "(load_hdf5 is cls.__new__ + __setstate__, buffer/buffer_base.py:258-262)")
def test_checkpoint_of_another_buffer_class_is_refused(tmp_path):
    path = str(tmp_path / "buffer.hdf5")
    filled(ReplayBuffer(8)).save_hdf5(path)
    assert refuses(lambda: PrioritizedReplayBuffer.load_hdf5(path))


@bug("load_hdf5 opens the path it is given and follows a symlink out of the checkpoint "
     "directory (h5py.File(path, 'r'), buffer/buffer_base.py:260)")
def test_checkpoint_file_that_is_a_symlink_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.hdf5"
    filled(ReplayBuffer(8)).save_hdf5(str(elsewhere))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "buffer.hdf5").symlink_to(elsewhere)
    assert refuses(lambda: ReplayBuffer.load_hdf5(str(ckpt / "buffer.hdf5")))


@bug("load_hdf5 takes the saved state as it finds it: HDF5 keeps no checksum and tianshou checks "
     "nothing (buffer/buffer_base.py:258-262), so a damaged attribute loads as another state "
     "(here a size larger than the capacity)")
def test_damaged_checkpoint_is_refused(tmp_path):
    import h5py

    path = str(tmp_path / "buffer.hdf5")
    filled(ReplayBuffer(8), 5).save_hdf5(path)
    with h5py.File(path, "r+") as f:
        f.attrs["_size"] = 999
    assert refuses(lambda: ReplayBuffer.load_hdf5(path))
