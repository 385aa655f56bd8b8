"""Each third party's own save, twice, into a run directory that holds the
user's files (the entries of
``rbcheck.conformance.test_checkpoint_user_files``): the user's files stay
byte-identical (docs/findings.md, "Saves beside the user's files"). Not bugs:
these back the verdicts there, and fail if a library starts deleting what it
did not write. cpprb and SB3 declare no ``save_load``, so the conformance
property never reaches their saves; TorchRL's ``dumps`` is checked by the
property itself (``nox -s validate``). Skipped where a library is not
installed: ``nox -s thirdparty``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rbcheck.conformance.test_checkpoint_user_files import (
    changed,
    user_entries,
    users_run_directory,
)


def saved_twice(tmp_path: Path, save, target) -> tuple[Path, str | None]:
    """Save twice at ``target(run directory)``; the run directory and what changed."""
    path = tmp_path / "runs" / "exp1"
    user = users_run_directory(path)
    for _ in range(2):
        save(target(path))
    return path, changed(user_entries(path), user)


@pytest.mark.parametrize("per", [False, True], ids=["uniform", "prioritized"])
def test_cpprb_save_transitions_writes_one_npz_file(tmp_path, per):
    cpprb = pytest.importorskip("cpprb", reason="cpprb is not installed (nox -s thirdparty installs it)")
    rb = (cpprb.PrioritizedReplayBuffer if per else cpprb.ReplayBuffer)(4, {"obs": {"shape": 1}})
    rb.add(obs=np.arange(3.0).reshape(3, 1))
    path, problem = saved_twice(tmp_path, lambda p: rb.save_transitions(str(p)), lambda p: p / "transitions")
    assert problem is None and (path / "transitions.npz").is_file(), problem
    path, problem = saved_twice(tmp_path / "whole", lambda p: rb.save_transitions(str(p)), lambda p: p)
    assert problem is None and (path.parent / "exp1.npz").is_file(), problem  # beside the directory


def test_tianshou_save_hdf5_writes_one_file_and_refuses_a_directory(tmp_path):
    pytest.importorskip("tianshou", reason="tianshou is not installed (nox -s thirdparty installs it)")
    from tianshou.data import Batch, ReplayBuffer

    rb = ReplayBuffer(8)
    for i in range(3):
        rb.add(Batch(obs=np.full(2, i), act=0, rew=0.0, terminated=False, truncated=False,
                     obs_next=np.full(2, i + 1), info={}))
    path, problem = saved_twice(tmp_path, lambda p: rb.save_hdf5(str(p)), lambda p: p / "buffer.hdf5")
    assert problem is None and (path / "buffer.hdf5").is_file(), problem
    whole = tmp_path / "whole"
    user = users_run_directory(whole)
    with pytest.raises(IsADirectoryError):  # h5py.File(path, "w") on the directory itself
        rb.save_hdf5(str(whole))
    assert changed(user_entries(whole), user) is None


def test_sb3_save_to_pkl_writes_one_file_beside_a_directory(tmp_path):
    pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (nox -s thirdparty installs it)")
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.save_util import save_to_pkl

    rb = ReplayBuffer(8, spaces.Box(0, 1, (3,), np.float32), spaces.Box(-1, 1, (1,), np.float32), device="cpu")
    path, problem = saved_twice(tmp_path, lambda p: save_to_pkl(p, rb), lambda p: p / "replay_buffer")
    assert problem is None and (path / "replay_buffer.pkl").is_file(), problem
    # a path without a suffix gets ".pkl" first (save_util.py:275-276), so a directory's name is
    # never opened: the file goes beside it
    path, problem = saved_twice(tmp_path / "whole", lambda p: save_to_pkl(p, rb), lambda p: p)
    assert problem is None and (path.parent / "exp1.pkl").is_file(), problem
    path, problem = saved_twice(tmp_path / "named", lambda p: save_to_pkl(p, rb), lambda p: p / "ckpt-best")
    assert problem is None and (path / "ckpt-best.pkl").is_file(), problem
