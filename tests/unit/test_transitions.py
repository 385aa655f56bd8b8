"""Unit tests of the transitions oracle (reference/transitions.py) on small
hand-checked streams."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.reference.transitions import Transitions, mark_slice_ends


def steps(ends: str) -> TensorDict:
    """One env; ``ends[t]`` is '.' (running), 'T' (terminated) or 't' (truncated)."""
    n = len(ends)
    ids = torch.arange(n)
    return TensorDict({
        "reward": torch.ones(n), "terminated": torch.tensor([c == "T" for c in ends]),
        "truncated": torch.tensor([c == "t" for c in ends]), "next_obs": (100 + ids).float()[:, None],
    }, batch_size=[n])


def test_windows_stop_at_an_episode_end_and_at_the_newest_row():
    tr = Transitions(steps("..T..t.."))
    assert tr.window(0, 4) == [0, 1, 2]  # stops after the termination
    assert tr.window(3, 4) == [3, 4, 5]  # stops after the truncation
    assert tr.window(6, 4) == [6, 7]  # the newest row: incomplete
    assert [tr.complete(t, 2) for t in range(8)] == [True] * 7 + [False]


def test_nstep_bootstraps_a_truncation_and_not_a_termination():
    tr = Transitions(steps("..T..t.."))
    cut = tr.nstep(1, 3, 0.5)  # rows 1, 2: ends terminated
    assert (cut.ret, cut.discount, cut.length) == (1.5, 0.0, 2)
    trunc = tr.nstep(4, 3, 0.5)  # rows 4, 5: ends truncated, bootstraps from row 5's final obs
    assert (trunc.ret, trunc.discount, float(trunc.obs[0])) == (1.5, 0.25, 105.0)
    assert tr.nstep(4, 3, 0.5, terminal="done").discount == 0.0


def test_slice_ends_are_marked_truncated_unless_terminated():
    rows = steps(".T..")
    end = torch.tensor([False, True, False, True])  # two slices of 2
    out = mark_slice_ends(rows, end)
    assert out["truncated"].tolist() == [False, False, False, True]  # row 1 is terminated: kept as it is
    assert out["terminated"].tolist() == [False, True, False, False]
    assert rows["truncated"].tolist() == [False] * 4  # the input is untouched
