"""Iterating a buffer, and prefetching its samples.

Contract
--------
* ``iterate(buffer, batch_size)`` yields ``buffer.sample(batch_size)`` again and again: the same
  batches, in the same order, as calling ``sample`` from the same state. With a sampler that
  counts epochs (``batches_left``: the without-replacement sampler) it stops when the epoch in
  progress at the first batch ends (a new epoch if none is in progress); with any other sampler
  it never stops.
* ``Prefetch(depth)`` is a buffer's queue of up to ``depth`` draws made ahead (0: none).
  ``take(buffer, batch_size)`` returns the oldest queued draw (a fresh one when the queue is
  empty or holds another batch size) and tops the queue up to ``depth``; a draw ahead that raises
  is not queued (when its turn comes the fresh draw raises it).
* The declared rule: prefetching never changes what ``sample`` returns. Before anything changes
  the buffer (a write, a priority update, a load) or its state is read (``state_dict``),
  ``rewind`` takes the queued draws back: the generator and the sampler return to where they
  were before the first of them. So a stream with depth N is the stream without prefetching,
  whatever the interleaving of writes and samples, and every index is a held slot. The rows are
  gathered when a batch is returned, so they are never stale.

Cost: ``take`` one draw per call plus a copy of the sampler's state per draw ahead (memory
O(depth * sampler state)); ``rewind`` O(sampler state).
"""

from __future__ import annotations

import copy
from collections import deque

from rbcheck.reference.arguments import check_int


def iterate(buffer, batch_size: int | None = None):
    """Batches ``(rows, info)`` of ``batch_size`` (the buffer's own when None); see module doc."""
    batch_size = buffer.batch_size if batch_size is None else batch_size
    if batch_size is None:
        raise ValueError("batch_size=None, but should be an int >= 1 (here or in the constructor)")
    buffer.prefetch.rewind(buffer)  # the sampler's true state: no draw ahead
    counts = getattr(buffer.sampler, "batches_left", None)
    left = counts(len(buffer), batch_size) if counts is not None else None
    while left is None or left > 0:
        yield buffer.sample(batch_size)
        left = None if left is None else left - 1


class Prefetch:
    """A queue of draws made ahead, taken back before any change (see module doc)."""

    def __init__(self, depth: int = 0):
        self.depth = check_int("prefetch", depth, 0)
        self.queue: deque = deque()  # (batch_size, (generator state, sampler state) before it, info)

    @staticmethod
    def snapshot(buffer) -> tuple:
        return buffer.generator.get_state(), copy.deepcopy(buffer.sampler.state_dict())

    @staticmethod
    def restore(buffer, snapshot: tuple) -> None:
        generator_state, sampler_state = snapshot
        buffer.generator.set_state(generator_state)
        buffer.sampler.load_state_dict(sampler_state)

    def take(self, buffer, batch_size: int) -> dict:
        """The next draw's info for ``batch_size``; the queue topped up after it."""
        if self.queue and self.queue[0][0] != batch_size:
            self.rewind(buffer)
        info = self.queue.popleft()[2] if self.queue else buffer.draw(batch_size)
        while len(self.queue) < self.depth:
            before = self.snapshot(buffer)
            try:
                ahead = buffer.draw(batch_size)
            except ValueError:  # not queued: the fresh draw raises it in its turn
                self.restore(buffer, before)
                break
            self.queue.append((batch_size, before, ahead))
        return info

    def rewind(self, buffer) -> None:
        """Take the queued draws back (nothing to do when none is queued)."""
        if self.queue:
            self.restore(buffer, self.queue[0][1])
            self.queue.clear()
