"""Trajectory slices without replacement, in epochs of slice starts.

Contract
--------
* Trajectories, ``num_slices`` / ``slice_len`` and ``strict_length`` are the slice sampler's
  (``slice_sampler.py``): a trajectory is a run of equal ``episode_key`` in write order, read
  from the oldest slot, so no slice crosses the write cursor.
* A VALID START (for a slice length ``L``) is a write-order position ``p`` whose slice lies in
  one trajectory: ``p .. p+L-1`` inside it; without ``strict_length`` a trajectory shorter than
  ``L`` also has one start, its first row (its slice is the whole trajectory).
* An EPOCH is a permutation of the valid starts when it begins (slot order of the start's row
  with ``shuffle=False``, else ``argsort(draw_uniforms(n, generator))``); each batch takes the
  next ``num_slices`` of it, so every valid start is drawn exactly once per epoch (the tail of
  fewer than ``num_slices`` dropped with ``drop_last``, returned short otherwise).
* The declared rule for writes: a write ends the epoch in progress (its starts may no longer be
  valid), and so does a sample of another slice length; the next sample begins a new one.
  No valid start -> ValueError; ``drop_last`` with fewer valid starts than ``num_slices`` too.
* Returns the slice sampler's keys (``index``, ``traj``, ``slice_end``). The state is the
  parameters, the epoch (write-order start positions, fixed until the next write) and the position in it.

Replacement law: without (slice starts), within and across the batches of an epoch.

Cost: O(len(storage)) per sample (trajectories), plus O(batch_size); O(n) when an epoch begins.
"""

from __future__ import annotations

import torch

from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms
from rbcheck.reference.slice_sampler import SliceSampler
from rbcheck.reference.without_replacement_sampler import check_flag


def per_row(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Each slice's value repeated over its ``rows`` (``repeat_interleave``, without its cost)."""
    return torch.tensor([v for v, r in zip(values.tolist(), rows.tolist(), strict=True) for _ in range(r)],
                        dtype=values.dtype)


class SliceWithoutReplacementSampler(SliceSampler):
    """Epochs over the valid slice starts (see module doc)."""

    replacement = "without"

    def __init__(self, num_slices=None, slice_len=None, episode_key="episode", strict_length=True,
                 drop_last=False, shuffle=True):
        super().__init__(num_slices=num_slices, slice_len=slice_len, episode_key=episode_key,
                         strict_length=strict_length)
        self.drop_last, self.shuffle = check_flag("drop_last", drop_last), check_flag("shuffle", shuffle)
        self.epoch = torch.zeros(0, dtype=torch.long)  # start positions (write order) of the epoch
        self.position, self.epoch_len = 0, 0  # starts drawn; the slice length it was made for

    def valid_starts(self, start: torch.Tensor, length: torch.Tensor, slice_len: int) -> torch.Tensor:
        """Write-order positions where a slice of ``slice_len`` rows starts inside one trajectory."""
        parts = [torch.arange(s, s + n - slice_len + 1) for s, n in zip(start.tolist(), length.tolist())
                 if n >= slice_len]
        if not self.strict_length:
            parts += [torch.tensor([s]) for s, n in zip(start.tolist(), length.tolist()) if n < slice_len]
        return torch.sort(torch.cat(parts)).values if parts else torch.zeros(0, dtype=torch.long)

    def left(self, num_slices: int) -> int:
        rest = len(self.epoch) - self.position
        return 0 if self.drop_last and rest < num_slices else rest

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        check_not_empty(storage)
        order, start, length = self.trajectories(storage, cursor)
        if self.left(num_slices) == 0 or self.epoch_len != slice_len:  # a new epoch
            valid = self.valid_starts(start, length, slice_len)
            if len(valid) == 0 or (self.drop_last and len(valid) < num_slices):
                raise ValueError(f"valid slice starts (length {slice_len}, strict_length={self.strict_length})"
                                 f"={len(valid)}, but should be >= {num_slices if self.drop_last else 1} "
                                 f"(longest trajectory is {int(length.max())})")
            self.epoch = valid[torch.argsort(draw_uniforms(len(valid), generator), stable=True)] if self.shuffle \
                else valid
            self.position, self.epoch_len = 0, slice_len
        first = self.epoch[self.position:self.position + num_slices]
        self.position += len(first)
        traj = torch.searchsorted(start, first, right=True) - 1  # the trajectory of each start
        rows = (start[traj] + length[traj] - first).clamp(max=slice_len)
        position = torch.cat([torch.arange(f, f + r) for f, r in zip(first.tolist(), rows.tolist(), strict=True)])
        end = torch.zeros(len(position), dtype=torch.bool)
        end[rows.cumsum(0) - 1] = True
        return {"index": order[position], "traj": per_row(traj, rows), "slice_end": end}

    def on_write(self, index, priority=None) -> None:
        """A write ends the epoch in progress (module doc)."""
        self.epoch, self.position = torch.zeros(0, dtype=torch.long), 0

    params = SliceSampler.params[:2] + ("episode_key", "strict_length", "drop_last", "shuffle")

    def state_dict(self) -> dict:
        return {"type": "SliceWithoutReplacementSampler", **{k: getattr(self, k) for k in self.params},
                "epoch": self.epoch.clone(), "position": self.position, "epoch_len": self.epoch_len}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != "SliceWithoutReplacementSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'SliceWithoutReplacementSampler'")
        epoch = state["epoch"]
        if not (isinstance(epoch, torch.Tensor) and epoch.dtype == torch.long and epoch.dim() == 1):
            raise ValueError(f"epoch={epoch!r:.80}, but should be a 1-D int64 tensor")
        position, epoch_len = state["position"], state["epoch_len"]
        if not (isinstance(position, int) and 0 <= position <= len(epoch) and isinstance(epoch_len, int)):
            raise ValueError(f"position={position!r}, epoch_len={epoch_len!r}, but should be ints, "
                             f"0 <= position <= {len(epoch)}")
        self.__init__(**{k: tuple(state[k]) if isinstance(state[k], list) else state[k] for k in self.params})
        self.epoch, self.position, self.epoch_len = epoch.clone(), position, epoch_len
