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


@bug("Nstep: the done of the row whose full n-step window ends on the terminal step misses that step "
     "(PyReplayBuffer.pyx:780-787, NstepBuffer.add sums done over range(1, buffer_size), one step short), "
     "so that row bootstraps from the terminal observation")
def test_nstep_window_ending_on_a_termination_is_done():
    rb = ReplayBuffer(16, {"obs": {"shape": 1}, "next_obs": {"shape": 1}, "rew": {}, "done": {}},
                      Nstep={"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"})
    for t in range(3):  # one episode of 3 steps, terminated at step 2
        rb.add(obs=[t], next_obs=[100 + t if t == 2 else t + 1], rew=1.0, done=float(t == 2))
    rb.on_episode_end()
    got = rb.get_all_transitions()
    assert got["obs"][:, 0].tolist() == [0, 1, 2]
    # windows: 0-1 (not done), 1-2 (ends on the termination), 2 (the termination)
    assert got["done"][:, 0].tolist() == [0, 1, 1]


@bug("Nstep: done is summed over the window in place (PyReplayBuffer.pyx:826-830, NstepBuffer.on_episode_end, "
     "and :784), so with Nstep size >= 5 a flushed row's done is 2 and 1 - done bootstraps with a negative sign")
def test_nstep_done_stays_a_flag():
    rb = ReplayBuffer(16, {"obs": {"shape": 1}, "next_obs": {"shape": 1}, "rew": {}, "done": {}},
                      Nstep={"size": 5, "gamma": 0.5, "rew": "rew", "next": "next_obs"})
    for t in range(4):  # one episode of 4 steps, terminated at step 3
        rb.add(obs=[t], next_obs=[100 + t if t == 3 else t + 1], rew=1.0, done=float(t == 3))
    rb.on_episode_end()
    assert rb.get_all_transitions()["done"][:, 0].tolist() == [1, 1, 1, 1]


@bug("Nstep size 1 (documented as 'identical with ordinary replay buffer') raises ValueError on the first add: "
     "the local buffer has n - 1 = 0 rows (PyReplayBuffer.pyx:632) and _roll's copy_ext[-0:] is the whole "
     "array (:802)")
def test_nstep_of_one_step_stores_the_step():
    rb = ReplayBuffer(4, {"obs": {"shape": 1}, "rew": {}, "done": {}}, Nstep={"size": 1, "gamma": 0.5, "rew": "rew"})
    try:
        rb.add(obs=[0], rew=1.0, done=0.0)
    except ValueError as err:
        raise AssertionError(f"add with Nstep size 1 raised ValueError: {err}") from err
    assert rb.get_stored_size() == 1
