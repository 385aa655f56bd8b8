"""Slice sampling with trajectory bookkeeping kept up to date on every write.

Contract: the reference's (``reference/slice_sampler.py``): same trajectories
(runs of equal episode id, or ended by done, in write order from the oldest
slot), same eligibility, same draws from the generator in the same order,
hence the same ``index`` and ``traj`` for the same seed. What differs is the
cost: instead of scanning the storage on every sample, the sampler keeps

* ``slot_run[slot]``: the trajectory ("run") id of the row in each slot;
* ``starts[id]``: the life-time row number where run ``id`` began (ids grow
  by one per new run; the live ones are ``head .. tail-1``; the head run may
  have lost its first rows to the ring);
* for the threshold ``L`` last sampled with, the ids of the runs with
  length >= L, oldest first (a FIFO: only the newest run grows and only the
  oldest shrinks, so eligibility changes only at the two ends).

``observe(storage, n)`` (called by the buffer after each write) compares the
new rows' keys with their predecessors on the device, copies one bool per
row to the host and updates the three structures at both ends. A write the
sampler did not see (``storage.version`` moved), a batch of ``capacity`` rows
or more, a load, or a storage without ``version`` make the next sample
rebuild everything from the storage with the reference's scan.

Cost: ``observe`` O(n) per write; ``sample`` O(batch_size) (plus
O(number of trajectories) the first time a slice length is used);
memory O(capacity) int64 on the host.
"""

from __future__ import annotations

import torch

from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms
from rbcheck.reference.slice_sampler import SliceSampler as ReferenceSliceSampler
from rbcheck.variants.device_storage import ring_slices


class SliceSampler(ReferenceSliceSampler):
    """Reference slice sampler with incremental trajectory bookkeeping."""

    def __init__(self, num_slices=None, slice_len=None, episode_key="episode", done_key=None,
                 strict_length=True):
        super().__init__(num_slices, slice_len, episode_key, done_key, strict_length)
        self._seen = None  # storage.version the bookkeeping matches; None: rebuild first

    # -- bookkeeping ---------------------------------------------------------
    def _rebuild(self, storage, cursor: int) -> None:
        order, start, length = self.trajectories(storage, cursor)  # the reference's scan
        cap, size = storage.capacity, len(storage)
        self._cap = cap
        self._rows = size if size < cap else cap + cursor  # == write count modulo capacity
        oldest = self._rows - size
        self._slot_run = torch.zeros(cap, dtype=torch.long)
        self._slot_run[order] = torch.repeat_interleave(torch.arange(len(start)), length)
        self._starts = torch.zeros(2 * cap + 2, dtype=torch.long)
        self._starts[: len(start)] = oldest + start
        self._base, self._head, self._tail = 0, 0, len(start)
        self._elig_len = None
        self._seen = getattr(storage, "version", None)

    def _oldest(self) -> int:
        return self._rows - min(self._rows, self._cap)

    def _bounds(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first live row, length) of the live runs ``ids``."""
        start = self._starts[ids - self._base].clamp(min=self._oldest())
        after = ids + 1
        end = torch.where(after < self._tail,
                          self._starts[(after - self._base).clamp(max=self._tail - 1 - self._base)],
                          self._rows)
        return start, end - start

    def _set_eligible(self, threshold: int) -> None:
        ids = torch.arange(self._head, self._tail)
        self._elig = torch.zeros(2 * self._cap + 2, dtype=torch.long)
        ok = ids[self._bounds(ids)[1] >= threshold]
        self._elig[: len(ok)] = ok
        self._e_lo, self._e_hi, self._elig_len = 0, len(ok), threshold

    def observe(self, storage, n: int) -> None:
        """Account for the ``n`` rows just written after the previous ones."""
        version = getattr(storage, "version", None)
        stale = self._seen is None or version is None or version != self._seen + 1
        key = self.done_key or self.episode_key
        if stale or n >= self._cap or key not in storage.data.keys(include_nested=True):
            self._seen = None
            return
        self._seen = version
        cap, w0 = self._cap, self._rows
        slots = (w0 - 1 + torch.arange(n + 1, device=storage.device)) % cap  # previous row first
        values = storage.data.get(key)[slots].reshape(n + 1, -1)
        if self.done_key:  # a row after a done row starts a new trajectory
            new = values[:-1].any(dim=1)
        else:
            new = (values[1:] != values[:-1]).any(dim=1)
        new = new.cpu()
        if w0 == 0:
            new[0] = True
        first_rows = w0 + torch.nonzero(new).flatten()
        ids = self._tail - 1 + torch.cumsum(new, 0)
        for s0, s1, r0, r1 in ring_slices(w0 % cap, n, cap):
            self._slot_run[s0:s1] = ids[r0:r1]
        count = len(first_rows)
        if self._tail - self._base + count > len(self._starts):  # compact: keep live runs
            live = self._starts[self._head - self._base: self._tail - self._base].clone()
            self._starts[: len(live)] = live
            self._base = self._head
        self._starts[self._tail - self._base: self._tail - self._base + count] = first_rows
        old_tail, self._tail, self._rows = self._tail, self._tail + count, w0 + n
        self._head = int(self._slot_run[self._oldest() % cap])
        if self._elig_len is not None:
            self._update_eligible(max(old_tail - 1, self._head))

    def _update_eligible(self, first_candidate: int) -> None:
        elig, threshold = self._elig, self._elig_len
        lo, hi = self._e_lo, self._e_hi
        lo += int(torch.searchsorted(elig[lo:hi], self._head))  # runs that left the ring
        candidates = torch.arange(first_candidate, self._tail)
        add = candidates[self._bounds(candidates)[1] >= threshold]
        if len(add) and hi > lo and int(elig[hi - 1]) == int(add[0]):  # already listed
            add = add[1:]
        if hi + len(add) > len(elig):  # compact
            elig[: hi - lo] = elig[lo:hi].clone()
            lo, hi = 0, hi - lo
        elig[hi: hi + len(add)] = add
        hi += len(add)
        if hi > lo and int(elig[lo]) == self._head:  # the oldest run may have shrunk
            if int(self._bounds(elig[lo: lo + 1])[1]) < threshold:
                lo += 1
        self._e_lo, self._e_hi = lo, hi

    # -- sampling ------------------------------------------------------------
    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        num_slices, slice_len = self.shape(batch_size)
        check_not_empty(storage)
        if self._seen is None or self._seen != getattr(storage, "version", None) \
                or self._rows % self._cap != cursor % self._cap:
            self._rebuild(storage, cursor)
        threshold = slice_len if self.strict_length else 1
        if self._elig_len != threshold:
            self._set_eligible(threshold)
        count = self._e_hi - self._e_lo
        if count == 0:
            longest = int(self._bounds(torch.arange(self._head, self._tail))[1].max())
            raise ValueError(
                f"trajectories of length >= slice_len={slice_len}: 0, but should be >= 1 "
                f"(longest is {longest}; try strict_length=False)"
            )
        pick = draw_uniforms(num_slices, generator)
        run = self._elig[self._e_lo + torch.floor(pick * count).long().clamp_(max=count - 1)]
        start, length = self._bounds(run)
        span = (length - slice_len).clamp(min=0) + 1  # number of possible starts
        offset = torch.floor(draw_uniforms(num_slices, generator) * span)
        first = start + offset.long().minimum(span - 1)
        rows = length.clamp(max=slice_len)
        total = int(rows.sum())
        shift = torch.repeat_interleave(first - (torch.cumsum(rows, 0) - rows), rows, output_size=total)
        position = shift + torch.arange(total)
        traj = torch.repeat_interleave(run - self._head, rows, output_size=total)
        device = storage.device
        return {"index": (position % self._cap).to(device), "traj": traj.to(device)}
