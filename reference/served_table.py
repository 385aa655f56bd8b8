"""A served table (Reverb's model): items with priorities, a sampler, a
remover, ``max_times_sampled`` and a rate limiter, safe to share between threads.

Contract
--------
``ServedTable(max_size, sampler, remover, max_times_sampled, rate_limiter)``
holds at most ``max_size`` items (rows), each with a key (its insert number),
a priority and the times it was sampled.

* ``insert(row, priority, timeout)`` waits until the rate limiter admits one
  insert (``reference/rate_limiter.py``), then holds the row; if the table
  now holds more than ``max_size`` items, the remover's pick leaves (it may
  be the new one), then the insert is counted. Reverb's order
  (``reverb/cc/table.cc``, ``Table::InsertOrAssign``).
* ``sample(timeout)`` waits until the limiter admits one sample, then the
  sampler's pick is drawn: its times_sampled goes up by one and it is
  removed when that reaches ``max_times_sampled`` (0: never). Returns
  ``(key, row, times_sampled)``. Reverb's ``Table::SampleFlexibleBatch``.
* A call not admitted within ``timeout`` seconds (None: wait for ever; 0:
  do not wait) raises :class:`RateLimiterTimeout` (a ``TimeoutError``) and
  changes nothing; a call still waiting, unwoken, at its deadline fails. Admission is decided under the table's lock, so calls
  from many threads are admitted one at a time by the same rule; every
  change wakes the waiting calls.
* ``update_priority(key, p)`` moves the item in the heaps (a key no longer
  held is ignored, as Reverb's ``MutatePriorities`` ignores it).

Cost: O(n) a draw or a removal (the selectors' scan), O(1) otherwise; one
lock for the whole table.
"""

from __future__ import annotations

import threading
import time

import torch

from rbcheck.reference.rate_limiter import RateLimiter, min_size
from rbcheck.reference.selectors import Selector


class RateLimiterTimeout(TimeoutError):
    """A call the rate limiter did not admit within its timeout (Reverb: DeadlineExceeded)."""


class ServedTable:
    """One table of a served replay (module docstring)."""

    def __init__(self, max_size: int, sampler: str = "random", remover: str = "fifo",
                 max_times_sampled: int = 0, rate_limiter: RateLimiter | None = None,
                 alpha: float = 1.0, seed: int = 0):
        if not (isinstance(max_size, int) and max_size >= 1):
            raise ValueError(f"max_size={max_size!r}, but should be an int >= 1")
        if not (isinstance(max_times_sampled, int) and max_times_sampled >= 0):
            raise ValueError(f"max_times_sampled={max_times_sampled!r}, but should be an int >= 0 (0: unlimited)")
        generator = torch.Generator().manual_seed(seed)
        self.max_size, self.max_times_sampled = max_size, max_times_sampled
        self.sampler = Selector(sampler, alpha, generator)
        self.remover = Selector(remover, alpha, generator)
        self.limiter = rate_limiter or min_size(1)
        self.rows: dict[int, object] = {}
        self.times_sampled: dict[int, int] = {}
        self.inserts = self.samples = self.deletes = 0
        self.number = 0  # inserts and priority updates so far: the heaps' tie rule
        self.cond = threading.Condition()

    def __len__(self) -> int:
        with self.cond:
            return len(self.rows)

    def _wait(self, admitted, timeout: float | None, what: str) -> None:
        """Wait (holding the lock between checks) until ``admitted()``; else raise after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not admitted():
            left = None if deadline is None else deadline - time.monotonic()
            # a wait that reaches its deadline unwoken fails, as Reverb's (rate_limiter.cc,
            # AwaitCanInsert: WaitWithDeadline true -> RateLimiterTimeout)
            if (left is not None and left <= 0) or not self.cond.wait(left):
                raise RateLimiterTimeout(f"{what} not admitted within timeout={timeout}s by {self.limiter} "
                                         f"(inserts={self.inserts}, samples={self.samples}, "
                                         f"deletes={self.deletes})")

    def _delete(self, key: int) -> None:
        del self.rows[key], self.times_sampled[key]
        self.sampler.delete(key)
        self.remover.delete(key)
        self.deletes += 1

    def insert(self, row, priority: float = 1.0, timeout: float | None = None) -> int:
        """Hold ``row``; returns its key (module docstring)."""
        with self.cond:
            self._wait(lambda: self.limiter.can_insert(self.inserts, self.samples, self.deletes),
                       timeout, "insert")
            key = self.number  # unique: the counter grows with every insert and update
            self.rows[key], self.times_sampled[key] = row, 0
            self.sampler.insert(key, priority, self.number)
            self.remover.insert(key, priority, self.number)
            self.number += 1
            if len(self.rows) > self.max_size:
                self._delete(self.remover.select())
            self.inserts += 1
            self.cond.notify_all()
            return key

    def sample(self, timeout: float | None = None) -> tuple[int, object, int]:
        """Draw one item: ``(key, row, times_sampled)`` (module docstring)."""
        with self.cond:
            self._wait(lambda: self.limiter.can_sample(self.inserts, self.samples, self.deletes),
                       timeout, "sample")
            self.samples += 1
            key = self.sampler.select()
            self.times_sampled[key] += 1
            out = (key, self.rows[key], self.times_sampled[key])
            if self.times_sampled[key] == self.max_times_sampled:
                self._delete(key)
            self.cond.notify_all()
            return out

    def update_priority(self, key: int, priority: float) -> None:
        with self.cond:
            if key in self.rows:
                self.sampler.update(key, priority, self.number)
                self.remover.update(key, priority, self.number)
                self.number += 1
                self.cond.notify_all()

    def counts(self) -> dict[str, int]:
        """The limiter's counts: inserts, samples and deletes over the table's life."""
        with self.cond:
            return {"inserts": self.inserts, "samples": self.samples, "deletes": self.deletes}


__all__ = ["RateLimiterTimeout", "ServedTable"]
