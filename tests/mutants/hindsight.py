"""Hindsight relabelling and offline-to-online mixing (issue 42). Each mutant
is the reference's HindsightReplayBuffer or MixingReplayBuffer with one bug;
the reference is the control.
"""

from __future__ import annotations

import torch

from rbcheck.reference.her import Episodes, HindsightReplayBuffer
from rbcheck.reference.mixing import MixingReplayBuffer
from tests.mutants.base import adapter, historic
from tests.mutants.registry import mutant

GOALS = "test_hindsight::test_relabelled_goals_come_from_the_strategys_steps_of_the_same_episode"
SHARE = "test_hindsight::test_relabelled_share_follows_the_declared_ratio"
RELOAD = "test_hindsight::test_episode_bookkeeping_survives_save_and_load"
MIX = "test_mixing::test_batches_mix_the_sources_in_the_declared_proportion"
KEPT = "test_mixing::test_offline_data_is_never_overwritten"


def her(name: str, cls: type, **kwargs):
    return adapter(name, HindsightReplayBuffer=cls, **kwargs)


class GoalBeforeTheStep(HindsightReplayBuffer):
    """Takes the goal the chosen step *starts* in (its achieved_goal), not the one reached after it."""

    def episodes(self):
        eps = super().episodes()
        eps.tr.rows.set("next_achieved_goal", eps.tr.rows.get("achieved_goal"))
        return eps


@mutant(in_process=True, bug="the relabelled goal is the state a step starts in, not the one it reaches",
        catches=(GOALS,))
def her_goal_before_the_step():
    return her("her-goal-before-the-step", GoalBeforeTheStep)


class FutureFromTheWholeEpisode(HindsightReplayBuffer):
    """"future" draws over the whole episode (earlier steps included)."""

    def __init__(self, *args, her_strategy="future", **kwargs):
        super().__init__(*args, her_strategy="episode" if her_strategy == "future" else her_strategy, **kwargs)


@mutant(in_process=True, bug="'future' relabels with goals of earlier steps of the episode", catches=(GOALS,))
def her_future_reads_the_past():
    return her("her-future-reads-the-past", FutureFromTheWholeEpisode)


class SlotOrderEpisodes(Episodes):
    """Links rows in slot order, ignoring the wrap: the newest row runs on into the oldest."""

    def __init__(self, rows, cursor, capacity):
        super().__init__(rows, 0, rows.shape[0] + 1)  # "never wrapped": slot order is taken as write order


class AcrossTheWrap(HindsightReplayBuffer):
    def episodes(self):
        return SlotOrderEpisodes(self.storage.get(torch.arange(len(self), dtype=torch.long)), self.cursor,
                                 self.capacity)


@mutant(in_process=True, bug="episodes read in slot order: a goal from across the ring's wrap", catches=(GOALS,))
def her_goal_across_the_wrap():
    return her("her-goal-across-the-wrap", AcrossTheWrap)


class UnfinishedAsFinished(Episodes):
    def steps(self, slot):
        steps, _ = super().steps(slot)
        return steps, True


class RelabelsUnfinished(HindsightReplayBuffer):
    """Takes the newest row as the end of the episode in progress."""

    def episodes(self):
        eps = super().episodes()
        eps.__class__ = UnfinishedAsFinished
        return eps


@mutant(in_process=True, bug="rows of an unfinished episode are relabelled (its newest row taken as its end)",
        catches=(GOALS,))
def her_relabels_unfinished_episodes():
    return her("her-relabels-unfinished-episodes", RelabelsUnfinished)


class RewardKept(HindsightReplayBuffer):
    def sample(self, batch_size=None):
        rows, info = super().sample(batch_size)
        stored = self.storage.get(info["index"])["reward"]
        rows.set("reward", stored)
        return rows, info


@mutant(in_process=True, bug="a relabelled row keeps its stored reward", catches=(GOALS,))
def her_reward_not_recomputed():
    return her("her-reward-not-recomputed", RewardKept)


class InvertedRatio(HindsightReplayBuffer):
    """Relabels with probability 1 / (k + 1) instead of k / (k + 1) (k virtual goals per real one)."""

    def __init__(self, *args, her_ratio=0.8, **kwargs):
        super().__init__(*args, her_ratio=1.0 - her_ratio if her_ratio != 0.5 else 0.4, **kwargs)


@mutant(in_process=True, bug="the relabelled share is 1 - ratio", catches=(SHARE,))
def her_ratio_inverted():
    return her("her-ratio-inverted", InvertedRatio)


class EpisodeStartNotSaved(HindsightReplayBuffer):
    """Keeps each row's episode start (a write count) in the row, like stable-baselines3's ep_start, and
    the start of the episode in progress in an attribute the checkpoint does not hold: after a load it is
    0, so the episode in progress at the save reaches back over every older row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.current_start = 0

    def extend(self, data):
        starts = []
        for k in range(data.shape[0]):
            starts.append(self.current_start)
            if bool(data["terminated"][k]) or bool(data["truncated"][k]):
                self.current_start = self.write_count + k + 1
        data = data.clone()
        data.set("ep_start", torch.tensor(starts, dtype=torch.long))
        return super().extend(data)

    def episodes(self):
        eps = super().episodes()
        rows = eps.tr.rows
        ids, start = rows["id"].tolist(), rows["ep_start"].tolist()
        ends = [eps.tr.ends_episode(p) for p in range(len(ids))]

        def steps(slot, eps=eps):  # the held rows from the row's recorded start to its episode's end
            p = int(eps.position[slot])
            first = next(q for q in range(len(ids)) if ids[q] >= start[p])
            end = next((q for q in range(p, len(ids)) if ends[q]), None)
            return list(range(first, (len(ids) - 1 if end is None else end) + 1)), end is not None

        eps.steps = steps
        return eps


@mutant(bug="the episode in progress at a save loses its start on load (it reaches over older episodes)",
        catches=(RELOAD,), reproduces="DLR-RM/stable-baselines3 #1542")
def her_episode_start_lost_on_load():
    return historic("her-episode-start-lost-on-load", HindsightReplayBuffer=EpisodeStartNotSaved)


# -- mixing -------------------------------------------------------------------------


class BatchWideSource(MixingReplayBuffer):
    """Draws one uniform per batch: the whole batch is offline or online."""

    def sample(self, batch_size=None):
        keep = self.offline_fraction
        u = float(torch.rand((), dtype=torch.float64, generator=self.generator))
        self.offline_fraction = 1.0 if u < keep else 0.0
        try:
            return super().sample(batch_size)
        finally:
            self.offline_fraction = keep


@mutant(in_process=True, bug="each batch comes from one source only (the share holds only on average)",
        catches=(MIX,))
def mixing_one_source_per_batch():
    return adapter("mixing-one-source-per-batch", MixingReplayBuffer=BatchWideSource)


class SwappedFraction(MixingReplayBuffer):
    def __init__(self, *args, offline_fraction=0.5, **kwargs):
        super().__init__(*args, offline_fraction=1.0 - offline_fraction if offline_fraction != 0.5 else 0.3,
                         **kwargs)


@mutant(in_process=True, bug="the offline share is the online one", catches=(MIX,))
def mixing_fraction_swapped():
    return adapter("mixing-fraction-swapped", MixingReplayBuffer=SwappedFraction)


class OnlineOverwritesOffline(MixingReplayBuffer):
    """Once the ring is full, each write also lands on an offline row (one ring over both)."""

    def extend(self, data):
        index = super().extend(data)
        for k in range(data.shape[0]):
            n = self.write_count - data.shape[0] + k - self.capacity
            if n >= 0:
                self.offline[n % len(self.offline)] = data[k]
        return index


@mutant(in_process=True, bug="online writes overwrite the offline dataset once the ring is full",
        catches=(KEPT,))
def mixing_overwrites_offline():
    return adapter("mixing-overwrites-offline", MixingReplayBuffer=OnlineOverwritesOffline)

