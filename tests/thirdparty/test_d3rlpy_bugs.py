"""Executed repros of the d3rlpy 2.8.1 bugs in docs/findings.md (strict
xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern), and a check that the adapter's repeat of d3rlpy's draw is d3rlpy's
own. Skipped where d3rlpy is not installed: ``nox -s thirdparty`` runs them
in d3rlpy's own environment (it pins gymnasium==1.0.0)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("d3rlpy", reason="d3rlpy is not installed (nox -s thirdparty installs it in its own environment)")
from d3rlpy.constants import ActionSpace  # noqa: E402
from d3rlpy.dataset import Episode, FIFOBuffer, ReplayBuffer, Signature  # noqa: E402

VERSION = "d3rlpy 2.8.1"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def error_of(call) -> BaseException | None:
    try:
        call()
    except Exception as err:  # noqa: BLE001
        return err
    return None


def episode(steps: int, obs_shape=(3,), dtype=np.float32) -> Episode:
    """``steps`` transitions (terminated: every step is one, components.py:384-386)."""
    obs = np.arange(steps * int(np.prod(obs_shape)), dtype=dtype).reshape(steps, *obs_shape)
    zeros = np.zeros((steps, 1), np.float32)
    return Episode(observations=obs, actions=zeros, rewards=zeros.copy(), terminated=True)


def replay_buffer(limit: int) -> ReplayBuffer:
    return ReplayBuffer(
        FIFOBuffer(limit=limit),
        observation_signature=Signature(dtype=[np.dtype(np.float32)], shape=[(3,)]),
        action_signature=Signature(dtype=[np.dtype(np.float32)], shape=[(1,)]),
        reward_signature=Signature(dtype=[np.dtype(np.float32)], shape=[(1,)]),
        action_space=ActionSpace.CONTINUOUS,
        action_size=1,
    )


@bug("FIFOBuffer(limit=1) cannot take a second transition: a full buffer checks whether the dropped "
     "transition ends its episode by reading self._transitions[1], which a deque of one does not have "
     "(IndexError, dataset/buffers.py:93)")
def test_fifo_of_one_keeps_the_newest_transition():
    buffer = FIFOBuffer(limit=1)
    ep = episode(3)
    error = error_of(lambda: [buffer.append(ep, i) for i in range(3)])
    assert error is None, f"append raised {type(error).__name__}: {error}"
    assert buffer.transition_count == 1 and buffer[0][1] == 2


@bug("FIFOBuffer(limit=0) is accepted (dataset/buffers.py:85-88: deque(maxlen=0)); its first append "
     "then raises IndexError (buffers.py:91-93)")
def test_fifo_of_zero_is_refused():
    assert error_of(lambda: FIFOBuffer(limit=0)) is not None, "FIFOBuffer(limit=0) was built"


@bug("append_episode takes an episode of any observation shape or dtype: nothing compares it with the "
     "buffer's signatures (dataset/replay_buffer.py:464-466); a later batch holding both fails far from "
     "the cause in np.stack when the shapes differ (mini_batch.py:74) and is cast to float32 without a "
     "word when only the dtype does (mini_batch.py:98)")
@pytest.mark.parametrize("obs_shape, dtype", [((2,), np.float32), ((3,), np.float64), ((3, 2), np.float32)])
def test_episode_of_another_signature_is_refused(obs_shape, dtype):
    rb = replay_buffer(16)
    rb.append_episode(episode(2))
    before = rb.transition_count
    error = error_of(lambda: rb.append_episode(episode(2, obs_shape, dtype)))
    assert error is not None, (f"an episode of observations {obs_shape} {np.dtype(dtype)} was taken by a "
                               f"buffer of (3,) float32 (transition_count {before} -> {rb.transition_count})")


@pytest.mark.parametrize("rows", [3, 11])  # not full, and wrapped round the FIFO
def test_d3rlpy_repeat_is_d3rlpy_own_draw(rows):
    """The adapter names the slots d3rlpy drew by repeating its draws
    (``np.random.randint(transition_count)`` per row, replay_buffer.py:472):
    the rows it returns are d3rlpy's own ``sample_transition_batch``'s, and
    NumPy's generator ends where d3rlpy's call leaves it."""
    import torch

    from rbcheck.harness.adapters.d3rlpy import D3rlpyBuffer
    from rbcheck.harness.protocol import BufferSpec
    from rbcheck.harness.strategies import Field, Layout

    layout = Layout((Field(("obs",), (2,), "float32"), Field(("next", "done"), (), "bool")))
    buf = D3rlpyBuffer(BufferSpec(capacity=7, sampler="random", seed=5, layout=layout.spec_layout()))
    buf.extend(layout.batch(0, rows))
    np.random.set_state(buf.stream.state)
    own = buf.rb.sample_transition_batch(64)  # d3rlpy's own: indices are not returned
    after_own = np.random.get_state()[1].copy()
    got, info = buf.sample(64)
    own_rows = buf._rows([t.observation for t in own.transitions])
    assert torch.equal(got["id"], own_rows["id"])
    assert torch.equal(got["id"] % 7, info["index"])
    assert np.array_equal(buf.stream.state[1], after_own)


@bug("clip_episode returns at once when the active episode has no transition yet "
     "(dataset/writers.py:380-381), which is the case after its first step (an unterminated episode of "
     "one step has size() - 1 = 0 transitions, writers.py:236-238): a one-step episode that terminates "
     "or is truncated is not ended, its step takes the next episode's first observation as its "
     "next_observation, terminal 0, and the two episodes are one")
@pytest.mark.parametrize("terminated", [True, False])
def test_one_step_episode_ends_at_clip_episode(terminated):
    rb = replay_buffer(16)
    zero = np.zeros(1, np.float32)
    rb.append(np.full(3, 0.0, np.float32), zero, 1.0)
    rb.clip_episode(terminated)  # d3rlpy's fit_online does this when the env ends the episode
    for k in (1.0, 2.0):
        rb.append(np.full(3, k, np.float32), zero, k)
    rb.clip_episode(True)
    picked = [rb.transition_picker(*rb.buffer[i]) for i in range(rb.transition_count)]
    seen = [(float(t.observation[0]), float(t.next_observation[0]), float(t.terminal)) for t in picked]
    # never linked to the next episode; a termination is its own terminal transition (a truncated
    # step has no next observation in d3rlpy's online path, so it is no transition at all)
    assert not any(o == 0.0 and n == 1.0 for o, n, _ in seen), f"(obs, next obs, terminal) = {seen}"
    assert not terminated or (0.0, 0.0, 1.0) in seen, f"(obs, next obs, terminal) = {seen}"


def test_trajectory_slices_pad_the_front_and_read_steps_the_fifo_evicted():
    """Why d3rlpy's ``BasicTrajectorySlicer`` is no ``slice`` column (docs/findings.md, d3rlpy): a slice ends at
    a transition drawn from the FIFO, covers the steps before it from the episode's own arrays, held or
    evicted, and pads the missing front with zeros (``masks`` 0), trajectory_slicers.py:48-98."""
    from d3rlpy.dataset import BasicTrajectorySlicer

    buffer = replay_buffer(limit=3)
    buffer.append_episode(episode(5))  # transitions 0..4; the FIFO keeps 2, 3, 4
    assert [buffer.buffer[i][1] for i in range(buffer.transition_count)] == [2, 3, 4]
    ep = buffer.buffer[0][0]
    held = BasicTrajectorySlicer()(ep, 2, 4)  # ends at the oldest held transition
    assert held.observations[:, 0].tolist() == [0.0, 0.0, 3.0, 6.0]  # padding, then steps 0 and 1 (evicted), 2
    assert held.masks.tolist() == [0.0, 1.0, 1.0, 1.0]
