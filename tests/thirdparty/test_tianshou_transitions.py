"""tianshou 2.0.1 transitions (invariant 10, docs/findings.md T8): strict
xfails stating the spec's behaviour for ``ignore_obs_next=True``.
Skipped where tianshou is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tianshou", reason="tianshou is not installed (nox -s thirdparty installs it)")
from tianshou.data import Batch, ReplayBuffer  # noqa: E402

VERSION = "tianshou 2.0.1"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def step(rb, obs, obs_next, truncated=False):
    rb.add(Batch(obs=np.array([obs], np.float32), act=np.zeros(1, np.float32), rew=0.0, terminated=False,
                 truncated=truncated, obs_next=np.array([obs_next], np.float32), info={}))


@bug("ignore_obs_next=True: a truncated step's obs_next is its own obs (next(i) = i at an episode's end, "
     "data/buffer/buffer_base.py:333-334, read at :629), so it bootstraps from the wrong observation")
def test_truncated_step_keeps_its_final_observation():
    rb = ReplayBuffer(8, ignore_obs_next=True)
    step(rb, 0.0, 1.0)
    step(rb, 1.0, 99.0, truncated=True)  # final observation 99
    step(rb, 2.0, 3.0)  # the next episode
    assert float(rb[np.array([1])].obs_next[0, 0]) == 99.0


@bug("ignore_obs_next=True: the newest row's obs_next is its own obs until the next add "
     "(index == last_index, data/buffer/buffer_base.py:333)")
def test_newest_row_has_its_next_observation():
    rb = ReplayBuffer(8, ignore_obs_next=True)
    step(rb, 0.0, 1.0)
    assert float(rb[np.array([0])].obs_next[0, 0]) == 1.0
