"""cpprb 11.0.0 transitions (invariant 10, docs/findings.md C7): a strict
xfail stating the spec's behaviour for the n-step flush at an episode's end,
and an executed check that ``next_of`` keeps an episode's final observation.
Skipped where cpprb is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import pytest

pytest.importorskip("cpprb", reason="cpprb is not installed (nox -s thirdparty installs it)")
from cpprb import ReplayBuffer  # noqa: E402

VERSION = "cpprb 11.0.0"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


@bug("Nstep: on_episode_end() flushes the last n-1 steps of an episode with the local buffer's stale "
     "next_obs (NstepBuffer.add never writes Nstep['next'] into the local buffer; NstepBuffer.on_episode_end "
     "returns it as it is, PyReplayBuffer.pyx), so a truncated episode's last steps bootstrap from the wrong "
     "observation")
def test_nstep_flush_bootstraps_from_the_final_observation():
    rb = ReplayBuffer(16, {"obs": {"shape": 1}, "next_obs": {"shape": 1}, "rew": {}, "done": {}},
                      Nstep={"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"})
    for t in range(5):  # one episode of 5 steps, truncated after step 4 (final observation 104)
        rb.add(obs=[t], next_obs=[104 if t == 4 else t + 1], rew=1.0, done=0.0)
    rb.on_episode_end()
    got = rb.get_all_transitions()
    assert got["obs"][:, 0].tolist() == [0, 1, 2, 3, 4]
    # windows: 0-2 -> obs 3, 1-3 -> 4, 2-4 -> 104, then 3-4 and 4 cut by the episode's end -> 104
    assert got["next_obs"][:, 0].tolist() == [3, 4, 104, 104, 104]


def test_next_of_keeps_the_final_observation():
    """next_of: an episode's final observation is cached at on_episode_end and
    returned for its last step, also once the ring has wrapped."""
    rb = ReplayBuffer(4, {"obs": {"shape": 1}, "rew": {}, "done": {}}, next_of=("obs",))
    for t in range(7):
        final = t in (2, 5)
        rb.add(obs=[t], next_obs=[100 + t if final else t + 1], rew=1.0, done=0.0)
        if final:
            rb.on_episode_end()
    got = rb.get_all_transitions()
    pairs = dict(zip(got["obs"][:, 0].tolist(), got["next_obs"][:, 0].tolist(), strict=True))
    assert pairs == {3.0: 4.0, 4.0: 5.0, 5.0: 105.0, 6.0: 7.0}
