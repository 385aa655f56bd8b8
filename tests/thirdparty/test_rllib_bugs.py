"""Executed repros of the RLlib (ray 2.60.0) bugs in docs/findings.md: strict
xfails stating the spec's behaviour (see test_cpprb_bugs.py for the
pattern), plus the adapter's own checks. Skipped where RLlib is not
installed: ``nox -s thirdparty``.

Source lines are of ray 2.60.0: ``rllib/utils/replay_buffers/replay_buffer.py``
(rb.py), ``prioritized_replay_buffer.py`` (prb.py) and
``rllib/execution/segment_tree.py`` (st.py)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="RLlib is not installed (nox -s thirdparty installs it)")
from ray.rllib.policy.sample_batch import SampleBatch  # noqa: E402
from ray.rllib.utils.replay_buffers.prioritized_replay_buffer import PrioritizedReplayBuffer  # noqa: E402
from ray.rllib.utils.replay_buffers.replay_buffer import ReplayBuffer  # noqa: E402

VERSION = "ray 2.60.0"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def refuses(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


def rows(start: int, n: int = 1) -> SampleBatch:
    return SampleBatch({"x": np.arange(start, start + n, dtype=np.float32)})


def leaves(buf: PrioritizedReplayBuffer, n: int) -> list[float]:
    tree = buf.get_state()["sum_segment_tree"]
    return [float(v) for v in tree[len(tree) // 2: len(tree) // 2 + n]]


def filled_per(n: int = 4, capacity: int = 4, alpha: float = 1.0) -> PrioritizedReplayBuffer:
    buf = PrioritizedReplayBuffer(capacity=capacity, alpha=alpha)
    buf.add(rows(0, n))
    return buf


# --- refusals that change the buffer -------------------------------------------


@bug("update_priorities checks each entry inside its loop (assert priority > 0, assert 0 <= idx < "
     "len(storage), prb.py:183-191): the entries before a bad one are already stored when it raises")
@pytest.mark.parametrize("idx, pri", [([0, 1], [5.0, 0.0]), ([0, 9], [5.0, 1.0]), ([0, 1], [5.0, math.nan])],
                         ids=["zero_priority", "index_past_len", "nan_priority"])
def test_refused_update_leaves_the_priorities_unchanged(idx, pri):
    buf = filled_per()
    before = leaves(buf, 4)
    assert refuses(lambda: buf.update_priorities(np.array(idx), np.array(pri)))
    assert leaves(buf, 4) == before, leaves(buf, 4)


@bug("the add path takes any weight: _add_single_batch stores weight ** alpha without a check "
     "(prb.py:75-81), so a NaN, negative or zero weight goes into the sum tree (NaN: the total is NaN) "
     "while update_priorities refuses the same values (prb.py:184)")
@pytest.mark.parametrize("weight", [math.nan, -1.0, 0.0], ids=["nan", "negative", "zero"])
def test_bad_weight_on_add_is_refused(weight):
    buf = filled_per(3)
    assert refuses(lambda: buf.add(rows(3), weight=np.float64(weight)))


@bug("a weight given to add does not raise _max_priority (prb.py:75-81; only update_priorities "
     "does, prb.py:191): a row added next without a weight gets the older, lower max")
def test_weight_on_add_raises_the_new_row_priority():
    buf = PrioritizedReplayBuffer(capacity=4, alpha=1.0)
    buf.add(rows(0), weight=10.0)
    buf.add(rows(1))
    assert leaves(buf, 2) == [10.0, 10.0], leaves(buf, 2)


# --- bad arguments accepted ------------------------------------------------------


@bug("sample(0) and sample(-3) return an empty batch (rb.py:315, prb.py:86-87: a range over num_items)")
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("size", [0, -3])
def test_bad_batch_size_is_refused(cls, size):
    buf = cls(capacity=4)
    buf.add(rows(0, 4))
    assert refuses(lambda: buf.sample(size) if cls is ReplayBuffer else buf.sample(size, beta=0.4))


# --- the ring ------------------------------------------------------------------------


@bug("ray-project/ray #24393 (and #10958): with a storage unit other than timesteps the capacity "
     "counts timesteps but the ring wraps on the cumulative count and never drops list entries "
     "(rb.py:259-279): once batches grow, the items past the wrap point are never evicted and the "
     "buffer holds more timesteps than its capacity")
def test_capacity_bounds_the_stored_timesteps_for_growing_batches():
    buf = ReplayBuffer(capacity=10, storage_unit="fragments")
    for i in range(10):
        buf.add(rows(i, 1))
    for i in range(6):
        buf.add(rows(100 + 5 * i, 5))
    stored = buf.get_state()["_storage"]
    held = sum(item.count for item in stored)
    assert held <= 10, f"{held} timesteps held in {len(stored)} items, capacity 10"


# --- stale updates -------------------------------------------------------------------


@bug("ray-project/ray #6534 still open in the API: update_priorities(idxes, priorities) takes no "
     "write generation (prb.py:165), so an update computed for a row that was evicted since it was "
     "sampled lands on the row that replaced it")
def test_update_for_a_recycled_slot_leaves_the_new_row_alone():
    random.seed(0)
    buf = filled_per(4, capacity=4)
    batch = buf.sample(2, beta=0.4)
    sampled = [int(i) for i in batch["batch_indexes"]]
    buf.add(rows(10, 4))  # every slot rewritten
    new_row = leaves(buf, 4)
    buf.update_priorities(np.array(sampled), np.array([7.0, 7.0]))
    assert leaves(buf, 4) == new_row, (sampled, leaves(buf, 4))


# --- the segment tree ------------------------------------------------------------------


@bug("SumSegmentTree.find_prefixsum_idx (st.py:182-208) descends past the stored items into "
     "never-written leaves (0) for a mass within rounding of the total; its guard (st.py:195-198, "
     "ray-project/ray #54284) only catches a mass >= the root. random.random() = 1 - 2**-53, a value "
     "it returns, then draws slot 15 of 14 and sample() raises IndexError (prb.py:142)")
def test_every_draw_is_a_stored_slot_at_the_top_of_the_mass():
    from unittest import mock

    import ray.rllib.utils.replay_buffers.prioritized_replay_buffer as prb

    pri = [0.5, 1e-06, 0.5, 0.001, 1e-06, 1.0, 0.001, 0.5, 3.0, 1.0, 1.0, 0.5, 3.0, 1e-06]
    buf = PrioritizedReplayBuffer(capacity=14, alpha=1.0)
    buf.add(rows(0, 14))
    buf.update_priorities(np.arange(14), np.array(pri))
    with mock.patch.object(prb.random, "random", lambda: 1 - 2**-53):
        drawn = buf._sample_proportional(1)
        assert drawn[0] < len(buf), drawn
        batch = buf.sample(1, beta=0.4)
    assert int(batch["batch_indexes"][0]) < len(buf)


@bug("update_priorities takes inf (assert priority > 0 passes, prb.py:184) and a finite priority "
     "whose priority ** alpha overflows (1e200 ** 2, prb.py:188): the total mass becomes inf")
@pytest.mark.parametrize("pri, alpha", [(math.inf, 1.0), (1e200, 2.0)], ids=["inf", "overflow"])
def test_priority_with_an_infinite_transform_is_refused(pri, alpha):
    buf = filled_per(alpha=alpha)
    assert refuses(lambda: buf.update_priorities(np.array([0]), np.array([pri])))


@bug("alpha = inf is taken (assert alpha > 0 only, prb.py:49): every priority ** inf is 0 or inf")
def test_infinite_alpha_is_refused():
    assert refuses(lambda: PrioritizedReplayBuffer(capacity=4, alpha=math.inf))


@bug("a float32 priority is transformed in float32 (np.float32 ** alpha, prb.py:188; RLlib's own "
     "learners hand over float32 TD errors): the leaf is off by up to ~1e-7 relative while the "
     "tree sums in float64")
def test_float32_priority_is_transformed_in_float64():
    buf = filled_per(alpha=0.7)
    buf.update_priorities(np.array([0]), np.array([6.0], dtype=np.float32))
    assert leaves(buf, 1)[0] == 6.0 ** 0.7, leaves(buf, 1)[0]


@bug("a complex priority is taken: NumPy orders complex numbers, so assert priority > 0 passes "
     "(prb.py:184) and a complex ** alpha goes into the sum tree")
def test_complex_priority_is_refused():
    buf = filled_per()
    assert refuses(lambda: buf.update_priorities(np.array([0]), np.array([1 + 1j])))


@bug("no check of the rows: add takes a batch with missing, extra or renamed columns, other dtypes "
     "or row shapes (rb.py:193-212, the storage is a list of whatever SampleBatch it is handed); "
     "concat_samples then builds each sample from whichever rows were drawn, so a sample can "
     "silently lack a column or change its dtype")
def test_row_with_other_columns_is_refused():
    buf = ReplayBuffer(capacity=4)
    buf.add(SampleBatch({"x": np.arange(3, dtype=np.float32), "a": np.arange(3)}))
    assert refuses(lambda: buf.add(SampleBatch({"x": np.arange(1, dtype=np.float64)})))


@bug("a positive priority whose priority ** alpha underflows to 0 (1e-200 ** 2) is stored as 0: the "
     "min tree's minimum is then 0, max_weight = (0 * N) ** -beta is inf and every importance weight "
     "is 0 (prb.py:136-137, :152)")
def test_weights_stay_finite_and_positive_when_a_transform_underflows():
    random.seed(0)
    buf = filled_per(alpha=2.0)
    buf.update_priorities(np.array([0]), np.array([1e-200]))
    weights = buf.sample(8, beta=0.4)["weights"]
    assert np.all(weights > 0), weights


@bug("the buffer keeps the caller's arrays: SampleBatch stores the arrays it is given and "
     "timeslices(1) are views of them (rb.py:209-212, :259-266), so a caller that reuses its "
     "arrays after add changes the stored rows")
def test_stored_rows_do_not_change_when_the_caller_reuses_its_arrays():
    buf = ReplayBuffer(capacity=4)
    x = np.arange(3, dtype=np.float32)
    buf.add(SampleBatch({"x": x}))
    x[:] = -1.0  # the caller reuses its array
    stored = [float(item["x"][0]) for item in buf.get_state()["_storage"]]
    assert stored == [0.0, 1.0, 2.0], stored


# --- the new stack's episode buffers (columns rllib-episodes, rllib-episodes-per) ------------
# Lines of rllib/utils/replay_buffers/episode_replay_buffer.py (erb.py),
# prioritized_episode_buffer.py (perb.py), rllib/env/single_agent_episode.py (sae.py) and
# rllib/algorithms/dqn/torch/dqn_torch_learner.py (dqn_learner.py). Samples are taken with
# DQN's call: sample(num_items, n_step, gamma, sample_episodes=True).


class LoopedForever(Exception):
    pass


class DrawLimit:
    """A generator that raises after ``limit`` draws: a sample that would loop forever ends."""

    def __init__(self, seed: int, limit: int = 10_000):
        self.rng, self.calls, self.limit = np.random.default_rng(seed), 0, limit

    def random(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.limit:
            raise LoopedForever(f"{self.limit} draws")
        return self.rng.random(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.rng, name)


def episode(eid: str, length: int, terminated: bool = False, truncated: bool = False):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return SingleAgentEpisode(id_=eid, observations=[np.float32(i) for i in range(length + 1)], actions=[0] * length,
                              rewards=[1.0] * length, terminated=terminated, truncated=truncated,
                              len_lookback_buffer=0)


def episode_buffer(*episodes, prioritized: bool = False, capacity: int = 100):
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )

    buf = PrioritizedEpisodeReplayBuffer(capacity=capacity) if prioritized else EpisodeReplayBuffer(capacity=capacity)
    buf.rng = DrawLimit(0)
    for ep in episodes:
        buf.add(ep)
    return buf


def nstep_sample(buf, num_items: int, n_step: int):
    return buf.sample(num_items=num_items, n_step=n_step, gamma=0.5, batch_length_T=0, sample_episodes=True)


@bug("a window that runs past the end of a terminated episode is sliced with stop > len (erb.py:942-947) and "
     "SingleAgentEpisode.slice keeps the episode's terminated flag only when stop == len (sae.py:1484-1486, "
     ":1579): the last n-1 steps come back terminated=False, so DQN bootstraps them from the terminal "
     "observation (dqn_learner.py:203-213)")
def test_window_running_past_a_termination_is_terminated():
    buf = episode_buffer(episode("a", 3, terminated=True))
    last_step = [ep for ep in nstep_sample(buf, 64, n_step=2) if ep.t_started == 2]
    assert last_step and all(ep.is_terminated for ep in last_step), [ep.is_terminated for ep in last_step]


@bug("a window shortened at the end of what is held (here: a truncated episode) keeps n_step = n in its "
     "extra_model_outputs (erb.py:1006-1009): DQN discounts its bootstrap with gamma ** n instead of gamma ** m, "
     "m the steps actually summed (dqn_learner.py:213)")
def test_shortened_window_reports_the_steps_it_summed():
    buf = episode_buffer(episode("a", 3, truncated=True))
    last_step = [ep for ep in nstep_sample(buf, 64, n_step=3) if ep.t_started == 2]
    assert last_step
    assert all(int(ep.get_extra_model_outputs("n_step")[0]) == 1 for ep in last_step), \
        [int(ep.get_extra_model_outputs("n_step")[0]) for ep in last_step]


@bug("sample(num_items=b) counts a window shortened by more than one step as a negative number of items "
     "(B += (actual_length - episode_ts - (actual_n_step - 1) + 1) or 1, erb.py:1022): with n_step >= 4 it "
     "returns more than b items (thousands for b = 8)")
def test_sample_returns_the_number_of_items_asked():
    buf = episode_buffer(episode("a", 2, terminated=True))
    assert len(nstep_sample(buf, 8, n_step=4)) == 8


@bug("the prioritized buffer resamples every row whose n steps do not fit in its episode (perb.py:495-497): the "
     "last n-1 steps of every episode, its terminal step among them, are never sampled, though their windows are "
     "complete (they end the episode)")
def test_last_steps_of_an_episode_are_sampled():
    buf = episode_buffer(episode("a", 4, terminated=True), prioritized=True)
    steps = {ep.t_started for ep in nstep_sample(buf, 200, n_step=2)}
    assert steps == {0, 1, 2, 3}, steps


@bug("when no held row has n steps left in its episode, the prioritized sample resamples forever "
     "(perb.py:464-497: the loop only ends after num_items accepted draws): no error, no return")
def test_sample_with_no_full_window_returns_or_raises():
    buf = episode_buffer(episode("a", 2), prioritized=True)
    try:
        nstep_sample(buf, 1, n_step=3)
    except LoopedForever:
        raise AssertionError("sample still drawing after 10,000 draws") from None
    except Exception:  # noqa: BLE001 - a clear refusal would do
        pass


@bug("adding new episodes that alone exceed the capacity: the prioritized buffer evicts before adding and only "
     "from what it holds (perb.py:232-237), so with two or more new episodes it pops from an empty deque and "
     "raises IndexError: pop from an empty deque")
def test_adding_more_new_steps_than_capacity_evicts():
    buf = episode_buffer(prioritized=True, capacity=4)
    try:
        buf.add([episode("a", 3, terminated=True), episode("b", 3, terminated=True)])
    except IndexError as err:
        raise AssertionError(f"add raised IndexError: {err}") from None
