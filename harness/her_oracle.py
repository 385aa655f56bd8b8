"""The oracle of the hindsight properties (``rbcheck/conformance/
test_hindsight.py``): goal-conditioned rows of a stream of env steps, and what
each sampled row may read as (the spec is ``reference/her.py``).

Rows are :class:`~rbcheck.harness.transition_streams.Stream` rows of one env
with three goal keys, each goal naming the state it is:

* ``achieved_goal = obs[:2] = [id, episode]`` (the state the step starts in);
* ``next_achieved_goal = next_obs[:2]``: ``[id + 1, episode]`` inside an
  episode, ``[-(id + 1), episode]`` after its last step, so every state
  reached after a step is a distinct goal, and names that step;
* ``desired_goal = [1000 + episode, -1]``: the episode's goal, equal to no
  achieved goal, so a relabelled row is seen at once.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, assert_same, fail
from rbcheck.harness.transition_streams import LAYOUT as STEP_LAYOUT
from rbcheck.harness.transition_streams import Stream
from rbcheck.reference.her import goal_reward

LAYOUT = {**STEP_LAYOUT, **{k: ((2,), torch.float32) for k in ("achieved_goal", "next_achieved_goal", "desired_goal")}}


def goal_rows(stream: Stream) -> TensorDict:
    """Every row of ``stream`` (one env) with the goal keys (module doc)."""
    if stream.num_envs != 1:
        raise ValueError(f"stream.num_envs={stream.num_envs}, but should be 1 (hindsight rows are one env's)")
    rows = stream.rows()
    rows.set("achieved_goal", rows["obs"][:, :2].clone())
    rows.set("next_achieved_goal", rows["next_obs"][:, :2].clone())
    rows.set("desired_goal", torch.stack([1000.0 + rows["episode"].float(), -torch.ones(len(rows))], 1))
    return rows


def write(buf, rows: TensorDict, start: int, stop: int) -> None:
    """Write rows ``start .. stop-1``, one ``extend`` of one row per env step
    (a recorded buffer writes each call in the repro: ``buf.extend(rows[3:4])``
    when the trace names ``rows``)."""
    for s in range(start, stop):
        buf.extend(rows[s:s + 1])


class HindsightOracle:
    """What a sample of a ring of ``capacity`` that was written ``rows[:written]`` may hold."""

    def __init__(self, rows: TensorDict, written: int, capacity: int, strategy: str, reward: str = "goal_reward",
                 unfinished: str = "kept"):
        self.rows, self.written, self.strategy, self.reward = rows[:written], written, strategy, reward
        self.unfinished = unfinished
        self.first_held = max(0, written - capacity)
        ends = (self.rows["terminated"] | self.rows["truncated"]).tolist()
        episode = self.rows["episode"].tolist()
        self.episode_end = {episode[r]: r for r in range(written) if ends[r]}
        self.source = {tuple(g): r for r, g in enumerate(self.rows["next_achieved_goal"].tolist())}

    def finished(self, row_id: int) -> bool:
        return int(self.rows["episode"][row_id]) in self.episode_end

    def held_finished(self, whole: bool = False) -> bool:
        """Whether a finished episode has a held row (else nothing can be relabelled); ``whole``: whether
        one is held whole (none of its rows overwritten: Conventions.hindsight["episodes"] = "whole_only")."""
        episode = self.rows["episode"].tolist()
        lost = set(episode[:self.first_held])
        return any(self.finished(r) and not (whole and episode[r] in lost) for r in range(self.first_held, self.written))

    def relabelled_reward(self, t: int, goal: torch.Tensor) -> float:
        """The reward of row ``t`` relabelled with ``goal``, under the declared reward rule (her_laws.REWARDS)."""
        spec = float(goal_reward(self.rows[t]["next_achieved_goal"], goal))
        return spec if self.reward == "goal_reward" else (0.0 if spec == 0.0 else -1.0)

    def check(self, sample: TensorDict, trace: Trace, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Check every sampled row; return (relabelled, finished) masks over the batch."""
        ids = sample["id"].cpu().reshape(-1).long()
        goals = sample["desired_goal"].cpu().reshape(len(ids), -1).float()
        reward = sample["reward"].cpu().reshape(-1).float()
        relabelled, finished = torch.zeros(len(ids), dtype=torch.bool), torch.zeros(len(ids), dtype=torch.bool)
        for k, t in enumerate(ids.tolist()):
            at = f"{what}, row {k} (id {t})"
            if not self.first_held <= t < self.written:
                fail(f"sampled row id {at}", t, f"a held row, in [{self.first_held}, {self.written})", trace)
            row, finished[k] = self.rows[t], self.finished(t)
            if torch.equal(goals[k], row["desired_goal"]):
                assert_same(f"reward of the row kept with its goal ({at})", float(reward[k]), float(row["reward"]),
                            trace)
                continue
            relabelled[k] = True
            self.check_goal(t, goals[k], at, trace)
            rule = "" if self.reward == "goal_reward" else f", reward={self.reward!r}"
            assert_same(f"reward of the relabelled row ({at}, goal {goals[k].tolist()}{rule})", float(reward[k]),
                        self.relabelled_reward(t, goals[k]), trace)
        return relabelled, finished

    def check_goal(self, t: int, goal: torch.Tensor, at: str, trace: Trace) -> None:
        ep = int(self.rows["episode"][t])
        r = self.source.get(tuple(goal.tolist()))
        got = f"goal {goal.tolist()}" + ("" if r is None else f" (reached after row {r}, episode "
                                                              f"{int(self.rows['episode'][r])})")
        if ep not in self.episode_end and self.unfinished == "kept":
            fail(f"relabelled row of an unfinished episode ({at})", got,
                 f"its goal kept ({self.rows[t]['desired_goal'].tolist()}): episode {ep} has not ended yet, "
                 "so no relabelling may read it", trace)
        end = self.episode_end.get(ep, self.written - 1)  # unfinished="relabelled": the newest row ends it
        steps = [s for s in range(self.first_held, end + 1) if int(self.rows["episode"][s]) == ep]
        want = {"future": [s for s in steps if s >= t], "final": [end], "episode": steps}[self.strategy]
        expected = f"the state reached after one of rows {want} (strategy {self.strategy!r}, episode {ep})"
        if r is None or r not in want:
            fail(f"relabelled goal ({at})", got, expected, trace)
