"""Executed repros of the stable-baselines3 2.9.2 bugs in docs/findings.md
(strict xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern). Skipped where SB3 is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (nox -s thirdparty installs it)")
from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402

VERSION = "stable-baselines3 2.9.2"
OBS = spaces.Box(0, 255, (3,), np.uint8)
ACT = spaces.Box(-1.0, 1.0, (1,), np.float32)


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def refuses(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


@bug("a capacity of 0 or below silently becomes 1: buffer_size = max(buffer_size // n_envs, 1) "
     "(common/buffers.py:198)")
@pytest.mark.parametrize("capacity", [0, -4])
def test_bad_capacity_is_refused(capacity):
    assert refuses(lambda: ReplayBuffer(capacity, OBS, ACT, device="cpu"))


@bug("sample(0) returns an empty batch (np.random.randint(0, n, size=0), common/buffers.py:114)")
def test_batch_size_zero_is_refused():
    buf = ReplayBuffer(8, OBS, ACT, device="cpu")
    zero = np.zeros((1, 3), np.uint8)
    buf.add(zero, zero, np.zeros((1, 1), np.float32), np.zeros(1), np.zeros(1), [{}])
    assert refuses(lambda: buf.sample(0))
