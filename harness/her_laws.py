"""Hindsight relabelling and offline-to-online mixing (issue 42): the
declared rules a buffer may follow instead of the spec's, and their checks
(``Conventions.hindsight``: ``strategies``, ``her_count``, ``mix_count``,
``reward``, ``episodes``, ``unfinished``).

How many sampled rows are relabelled (:data:`HER_COUNTS`; rows of finished
episodes only, ``spec.her_ratio = r``):

* ``"per_draw"`` (spec, ``reference/her.py``): each row independently, with
  probability ``r``: a batch's count is Binomial(B, r);
* ``"floor"``: exactly ``floor(r * B)`` rows of each batch of ``B``
  (stable-baselines3 ``nb_virtual = int(self.her_ratio * batch_size)``,
  TorchRL ``n_her = int(n * self.her_ratio)``);
* ``"floor_episodes"``: whole episodes: of the ``E`` distinct episodes a
  batch draws from, exactly ``floor(r * E)`` have every sampled row
  relabelled, the others none (tianshou ``size=int(len(unique_ep_open_indices)
  * self.future_p)``);
* ``"ceil"``: exactly ``ceil(r * B)`` rows of each batch (rlox
  ``n_relabeled = ((batch_size as f32) * her_ratio).ceil()``).

A relabelled row's reward (:data:`REWARDS`, key ``reward``):

* ``"goal_reward"`` (spec): ``reference.her.goal_reward(next_achieved_goal,
  new goal)``, the function the suite hands the buffer;
* ``"sparse"``: ``0.0`` where the next achieved goal equals the new goal,
  else ``-1.0`` (a buffer with a fixed sparse reward and a tolerance below
  the suite's goal spacing of 1: rlox ``sparse_goal_reward``).

Which finished episodes may be relabelled (:data:`EPISODES`, key
``episodes``):

* ``"held"`` (spec): every finished episode with a held row, its oldest
  rows possibly overwritten;
* ``"whole_only"``: the buffer may leave out an episode whose rows were
  partly overwritten (never relabel it, or never sample it), and may refuse
  to sample while no finished episode is held whole (stable-baselines3's
  ``ep_length``, rlox's ``invalidate_overwritten``). A refusal while one is
  held still fails, and every relabelled goal is still checked.

The episode in progress (:data:`UNFINISHED`, key ``unfinished``):

* ``"kept"`` (spec): its rows keep their goal;
* ``"relabelled"``: its rows may be relabelled as if its newest written
  row ended it: a goal reached after one of its held steps up to that row,
  as the strategy allows (tianshou follows ``next()``, which stops at the
  newest row, ``buffer_base.py:333``). Never across the write cursor.

How many rows of a batch come from the offline dataset (:data:`MIX_COUNTS`;
``spec.offline_fraction = f``, the online ring not empty):

* ``"per_draw"`` (spec, ``reference/mixing.py``): each row independently,
  with probability ``f``: Binomial(B, f);
* ``"round"``: exactly ``round(f * B)`` (Python's round, half to even;
  TorchRL ``n_offline = round(self._offline_fraction * batch_size)``).

With the online ring empty every row comes from the offline dataset, under
every rule.
"""

from __future__ import annotations

import math

HER_STRATEGIES = ("future", "final", "episode")
HER_COUNTS = ("per_draw", "floor", "floor_episodes", "ceil")
REWARDS = ("goal_reward", "sparse")
EPISODES = ("held", "whole_only")
UNFINISHED = ("kept", "relabelled")
MIX_COUNTS = ("per_draw", "round")


#: ``Conventions.hindsight`` keys and their spec values ("strategies": the ones the buffer has, comma-separated).
SPEC_HINDSIGHT = {"strategies": ",".join(HER_STRATEGIES), "her_count": "per_draw", "mix_count": "per_draw",
                  "reward": "goal_reward", "episodes": "held", "unfinished": "kept"}


def check_hindsight(declared) -> None:
    """Refuse a ``Conventions.hindsight`` outside the allowed values (ValueError naming it)."""
    unknown = set(declared) - set(SPEC_HINDSIGHT)
    if unknown:
        raise ValueError(f"Conventions.hindsight keys={sorted(unknown)}, but should be among {sorted(SPEC_HINDSIGHT)}")
    strategies = str(declared.get("strategies", SPEC_HINDSIGHT["strategies"])).split(",")
    if any(s not in HER_STRATEGIES for s in strategies):
        raise ValueError(f"Conventions.hindsight['strategies']={declared['strategies']!r}, but should be "
                         f"comma-separated names among {list(HER_STRATEGIES)}")
    for key, allowed in (("her_count", HER_COUNTS), ("mix_count", MIX_COUNTS), ("reward", REWARDS),
                         ("episodes", EPISODES), ("unfinished", UNFINISHED)):
        if declared.get(key, allowed[0]) not in allowed:
            raise ValueError(f"Conventions.hindsight[{key!r}]={declared[key]!r}, but should be one of {list(allowed)}")


def hindsight(conventions, key: str):
    """The declared value of ``key`` (the spec's where undeclared); "strategies" as a tuple."""
    value = conventions.hindsight.get(key, SPEC_HINDSIGHT[key])
    return tuple(value.split(",")) if key == "strategies" else value


def exact_count(rule: str, share: float, n: int) -> int | None:
    """The exact count of a batch of ``n`` under a per-batch ``rule`` (None: ``"per_draw"``)."""
    if rule == "per_draw":
        return None
    if rule in ("floor", "floor_episodes"):
        return int(share * n)
    if rule == "round":
        return round(share * n)
    if rule == "ceil":
        return math.ceil(share * n)
    raise ValueError(f"rule={rule!r}, but should be one of {list(HER_COUNTS + MIX_COUNTS)}")


__all__ = ["EPISODES", "HER_COUNTS", "HER_STRATEGIES", "MIX_COUNTS", "REWARDS", "UNFINISHED", "SPEC_HINDSIGHT", "check_hindsight", "exact_count",
           "hindsight"]
