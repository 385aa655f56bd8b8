"""Sampling contiguous slices of trajectories.

Contract
--------
* A trajectory is a maximal run of rows with equal ``episode_key`` value in WRITE ORDER: the
  ring is read from its oldest slot (slot 0 while not full, the writer's cursor once full), so a
  trajectory may wrap past the last slot. With ``done_key`` instead, a trajectory ends at each
  row whose done flag is True (and at the newest row).
* Exactly one of ``num_slices`` / ``slice_len`` is fixed; ``batch_size`` must be a multiple of
  it and the other is ``batch_size // it``.
* Eligible trajectories: length >= ``slice_len`` when ``strict_length``, otherwise all (a short
  one gives a shorter slice, so the batch may be smaller than ``batch_size``). Each slice picks
  an eligible trajectory uniformly with replacement, then a start uniformly in
  ``[0, max(length - slice_len, 0)]``.
* Returned ``index`` holds the physical slots of the slices, one after the other, each
  contiguous in write order and inside one trajectory; ``traj`` holds, per row, the trajectory's
  rank in write order (0 = oldest); ``slice_end`` is True at each slice's last row (the buffer
  marks it truncated, ``reference.transitions.mark_slice_ends``, and drops the key). No eligible
  trajectory -> ValueError.

Cost: O(len(storage)) per sample to find the trajectories, plus O(batch_size).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms


class SliceSampler:
    """Uniform trajectory slices (see module doc)."""

    def __init__(self, num_slices=None, slice_len=None, episode_key="episode", done_key=None,
                 strict_length=True):
        if (num_slices is None) == (slice_len is None):
            raise ValueError(f"num_slices={num_slices!r}, slice_len={slice_len!r}, but should be exactly one set")
        for name, value in (("num_slices", num_slices), ("slice_len", slice_len)):
            if value is not None:
                check_int(name, value)
        for name, value in (("episode_key", episode_key), ("done_key", done_key)):
            parts = value if isinstance(value, tuple) and value else (value,)  # a key: str or tuple
            if not (all(isinstance(p, str) and p for p in parts) or (name == "done_key" and value is None)):
                raise ValueError(f"{name}={value!r}, but should be a str or a tuple of str (a nested key)")
        if not isinstance(strict_length, bool):
            raise ValueError(f"strict_length={strict_length!r}, but should be a bool")
        self.num_slices, self.slice_len, self.strict_length = num_slices, slice_len, strict_length
        self.episode_key, self.done_key = episode_key, done_key

    def shape(self, batch_size: int) -> tuple[int, int]:
        """``(num_slices, slice_len)`` for a batch of ``batch_size`` rows."""
        fixed = self.num_slices or self.slice_len
        if check_int("batch_size", batch_size) % fixed:
            name = "num_slices" if self.num_slices else "slice_len"
            raise ValueError(f"batch_size={batch_size}, but should be a multiple of {name}={fixed}")
        return (fixed, batch_size // fixed) if self.num_slices else (batch_size // fixed, fixed)

    def trajectories(self, storage, cursor: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(order, start, length)``: slots oldest first, and each run's start/length in it."""
        size = len(storage)
        order = torch.arange(size) if size < storage.capacity else (cursor + torch.arange(size)) % size
        key = self.done_key or self.episode_key
        if key not in storage.data.keys(include_nested=True):
            raise ValueError(f"key={key!r}, but should be a key of the stored data")
        column = storage.data[key][:size].reshape(size, -1)[order]
        # new[i]: row i starts a trajectory: it follows a done row (done_key) or its episode id changes
        new = torch.ones(size, dtype=torch.bool)
        new[1:] = column[:-1].any(dim=1) if self.done_key else (column[1:] != column[:-1]).any(dim=1)
        start = torch.nonzero(new).flatten()
        length = torch.diff(start, append=torch.tensor([size]))
        return order, start, length

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        """``{"index": int64[rows], "traj": int64[rows], "slice_end": bool[rows]}``; ``cursor`` = the
        writer's next slot."""
        num_slices, slice_len = self.shape(batch_size)
        check_not_empty(storage)
        order, start, length = self.trajectories(storage, cursor)
        eligible = torch.nonzero(length >= slice_len if self.strict_length else length > 0).flatten()
        if len(eligible) == 0:
            raise ValueError(f"trajectories of length >= slice_len={slice_len}: 0, but should be >= 1 "
                             f"(longest is {int(length.max())}; try strict_length=False)")
        pick = draw_uniforms(num_slices, generator)
        traj = eligible[torch.floor(pick * len(eligible)).long().clamp_(max=len(eligible) - 1)]
        span = (length[traj] - slice_len).clamp(min=0) + 1  # number of possible starts
        offset = torch.floor(draw_uniforms(num_slices, generator) * span)
        first = start[traj] + offset.long().minimum(span - 1)
        rows = length[traj].clamp(max=slice_len)  # slice lengths (all slice_len when strict)
        pairs = zip(first.tolist(), rows.tolist(), strict=True)
        position = torch.cat([torch.arange(f, f + r) for f, r in pairs])  # in write order
        end = torch.zeros(len(position), dtype=torch.bool)
        end[rows.cumsum(0) - 1] = True
        return {"index": order[position], "traj": traj.repeat_interleave(rows), "slice_end": end}

    def on_write(self, index, priority=None) -> None:
        """Nothing to track: trajectories are read from the data at sample time."""

    params = ("num_slices", "slice_len", "episode_key", "done_key", "strict_length")  # the state

    def state_dict(self) -> dict:
        return {"type": "SliceSampler", **{k: getattr(self, k) for k in self.params}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "SliceSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'SliceSampler'")
        # a nested key comes back from JSON as a list; __init__ checks all before setting any
        self.__init__(**{k: tuple(state[k]) if isinstance(state[k], list) else state[k] for k in self.params})
