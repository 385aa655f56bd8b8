"""Reverb's rate limiter: which inserts and samples a served table admits.

Contract
--------
A :class:`RateLimiter` holds four numbers, ``samples_per_insert`` (spi),
``min_size_to_sample``, ``min_diff`` and ``max_diff``, and three counts kept
by its table: ``inserts``, ``samples`` and ``deletes`` over the table's life.
With ``size = inserts - deletes`` and ``diff = inserts * spi - samples``:

* a sample is admitted only while ``size >= min_size_to_sample`` and the
  diff *after* it stays ``>= min_diff`` (``diff - 1 >= min_diff``);
* an insert is admitted freely while the size after it is
  ``<= min_size_to_sample``, otherwise only while the diff after it stays
  ``<= max_diff`` (``diff + spi <= max_diff``).

That is DeepMind Reverb's rule, copied from ``reverb/cc/rate_limiter.cc``
(``RateLimiter::CanSample`` and ``RateLimiter::CanInsert``, deepmind/reverb
at fbfbbc5613f3, lines 150-157 and 171-180). The limiter only answers; the
table (``reference/served_table.py``) waits on a condition variable until it
admits, or the call's timeout passes. The constructors are Reverb's Python
ones (``reverb/rate_limiters.py``): :func:`min_size`,
:func:`sample_to_insert_ratio` (its ``error_buffer`` offset by
``min_size_to_sample * spi``), :func:`queue` and :func:`stack`.

Cost: O(1) a question; the numbers are Python floats (Reverb's doubles).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

#: Reverb's "no bound" (MinSize's diffs): sys.float_info.max, as in reverb/rate_limiters.py.
NO_BOUND = sys.float_info.max


@dataclass(frozen=True)
class RateLimiter:
    """The four numbers of a Reverb rate limiter; the counts live in the table."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    def __post_init__(self) -> None:
        if not (isinstance(self.min_size_to_sample, int) and self.min_size_to_sample >= 1):
            raise ValueError(f"min_size_to_sample={self.min_size_to_sample!r}, but should be an int >= 1")
        if not self.samples_per_insert > 0:
            raise ValueError(f"samples_per_insert={self.samples_per_insert!r}, but should be > 0")
        if not self.min_diff <= self.max_diff:
            raise ValueError(f"min_diff={self.min_diff!r}, max_diff={self.max_diff!r}, but should have "
                             f"min_diff <= max_diff")

    def can_sample(self, inserts: int, samples: int, deletes: int) -> bool:
        """Whether one more sample is admitted (rate_limiter.cc, CanSample)."""
        if inserts - deletes < self.min_size_to_sample:
            return False
        return inserts * self.samples_per_insert - samples - 1 >= self.min_diff

    def can_insert(self, inserts: int, samples: int, deletes: int) -> bool:
        """Whether one more insert is admitted (rate_limiter.cc, CanInsert)."""
        if inserts + 1 - deletes <= self.min_size_to_sample:
            return True  # until the min size is reached inserts are free
        return (inserts + 1) * self.samples_per_insert - samples <= self.max_diff

    def as_tuple(self) -> tuple[float, int, float, float]:
        return (self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)


def min_size(min_size_to_sample: int) -> RateLimiter:
    """Reverb's ``MinSize``: no sample before ``min_size_to_sample`` items, no other bound."""
    return RateLimiter(1.0, min_size_to_sample, -NO_BOUND, NO_BOUND)


def sample_to_insert_ratio(samples_per_insert: float, min_size_to_sample: int,
                           error_buffer: float | tuple[float, float]) -> RateLimiter:
    """Reverb's ``SampleToInsertRatio``: a number ``error_buffer`` is the band
    ``min_size_to_sample * spi -/+ error_buffer``; a pair is ``(min_diff, max_diff)``
    as given. Refused as Reverb refuses it: a band narrower than
    ``2 * max(1, spi)``, or one whose low end is above ``min_size_to_sample * spi``."""
    if not (isinstance(min_size_to_sample, int) and min_size_to_sample >= 1):
        raise ValueError(f"min_size_to_sample={min_size_to_sample!r}, but should be an int >= 1")
    if isinstance(error_buffer, (int, float)):
        offset = samples_per_insert * min_size_to_sample
        low, high = offset - error_buffer, offset + error_buffer
    else:
        low, high = error_buffer
    if high - low < 2 * max(1.0, samples_per_insert):
        raise ValueError(f"error_buffer={error_buffer!r}, but should span >= 2 * max(1, samples_per_insert)="
                         f"{2 * max(1.0, samples_per_insert)} (a narrower band can block every call)")
    if low > samples_per_insert * min_size_to_sample:
        raise ValueError(f"error_buffer={error_buffer!r} puts min_diff={low} above min_size_to_sample * "
                         f"samples_per_insert={samples_per_insert * min_size_to_sample}, but should not "
                         f"(a deadlock once min_size_to_sample items are in)")
    return RateLimiter(float(samples_per_insert), min_size_to_sample, float(low), float(high))


def queue(size: int) -> RateLimiter:
    """Reverb's ``Queue(size)``: each item sampled once, at most ``size`` waiting (Fifo selectors)."""
    return RateLimiter(1.0, 1, 0.0, float(size))


def stack(size: int) -> RateLimiter:
    """Reverb's ``Stack(size)``: the numbers of :func:`queue` (used with Lifo selectors)."""
    return RateLimiter(1.0, 1, 0.0, float(size))


__all__ = ["NO_BOUND", "RateLimiter", "min_size", "queue", "sample_to_insert_ratio", "stack"]
