"""Served tables (issue 42, Reverb's model): selectors, removers,
``max_times_sampled`` and the rate limiter. Each mutant is the reference's
``ServedTable`` with one of these broken; the reference is the control.
"""

from __future__ import annotations

from rbcheck.reference.rate_limiter import RateLimiter
from rbcheck.reference.selectors import Selector
from rbcheck.reference.served_table import ServedTable
from tests.mutants.base import adapter
from tests.mutants.registry import control, mutant

ORDER = "test_served_selection::test_selectors_draw_in_declared_order"
TIMES = "test_served_selection::test_an_item_leaves_after_max_times_sampled_draws"
RULE = "test_rate_limiter::test_calls_are_admitted_by_the_rule"
THREADS = "test_rate_limiter::test_threads_are_admitted_within_the_rule"
WOKEN = "test_rate_limiter::test_a_waiting_call_is_admitted_when_room_is_made"


def table_with(name: str, **changes) -> type:
    """``ServedTable`` whose sampler/remover/limiter are rebuilt by ``changes``' callables."""

    class Table(ServedTable):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for attr, make in changes.items():
                setattr(self, attr, make(getattr(self, attr)))

    Table.__qualname__ = Table.__name__ = name
    return Table


class FifoDrawsNewest(Selector):
    def select(self):
        if self.kind == "fifo" and self.items:
            return max(self.items.items(), key=lambda kv: kv[1][2])[0]
        return super().select()


class HeapTiesToNewest(Selector):
    def select(self):
        if self.kind in ("min_heap", "max_heap") and self.items:
            sign = 1 if self.kind == "min_heap" else -1
            return min(self.items.items(), key=lambda kv: (sign * kv[1][0], -kv[1][1]))[0]
        return super().select()


def recast(cls):
    def make(old: Selector) -> Selector:
        new = cls(old.kind, old.alpha, old.generator)
        new.items = old.items
        return new
    return make


@mutant(in_process=True, bug="a fifo selector that draws the newest item", catches=(ORDER, TIMES))
def fifo_draws_newest():
    return adapter("fifo-draws-newest", ServedTable=table_with("FifoDrawsNewest", sampler=recast(FifoDrawsNewest)))


@mutant(in_process=True, bug="heap ties broken to the most recently inserted item", catches=(ORDER,))
def heap_ties_to_newest():
    return adapter("heap-ties-to-newest", ServedTable=table_with("HeapTiesToNewest", sampler=recast(HeapTiesToNewest)))


class NewestRemoved(Selector):
    """As a remover: always the item just inserted (the newest), whatever its kind."""

    def select(self):
        return max(self.items.items(), key=lambda kv: kv[1][2])[0]


@mutant(in_process=True, bug="a full table drops the newly inserted item instead of the remover's pick",
        catches=(ORDER,))
def full_table_drops_new_item():
    return adapter("full-table-drops-new-item", ServedTable=table_with("NewestRemoved", remover=recast(NewestRemoved)))


class OneDrawTooMany(ServedTable):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.max_times_sampled:
            self.max_times_sampled += 1


@mutant(in_process=True, bug="an item leaves after max_times_sampled + 1 draws", catches=(TIMES, RULE))
def max_times_sampled_off_by_one():
    return adapter("max-times-sampled-off-by-one", ServedTable=OneDrawTooMany)


class SampleDiffOffByOne(RateLimiter):
    def can_sample(self, inserts, samples, deletes):
        return inserts - deletes >= self.min_size_to_sample and \
            inserts * self.samples_per_insert - samples >= self.min_diff


class MinSizeOffByOne(RateLimiter):
    def can_sample(self, inserts, samples, deletes):
        return super().can_sample(inserts + 1, samples + self.samples_per_insert, deletes)


class FreeInsertsPastMinSize(RateLimiter):
    def can_insert(self, inserts, samples, deletes):
        return inserts - deletes <= self.min_size_to_sample or super().can_insert(inserts, samples, deletes)


def limiter(cls):
    return lambda old: cls(*old.as_tuple())


@mutant(in_process=True, bug="a sample admitted while the diff before it (not after) is >= min_diff",
        catches=(RULE, THREADS))
def sample_rule_off_by_one():
    return adapter("sample-rule-off-by-one", ServedTable=table_with("SampleDiffOffByOne",
                                                                    limiter=limiter(SampleDiffOffByOne)))


@mutant(in_process=True, bug="sampling starts one item before min_size_to_sample", catches=(RULE, THREADS))
def sampling_before_min_size():
    return adapter("sampling-before-min-size", ServedTable=table_with("MinSizeOffByOne",
                                                                      limiter=limiter(MinSizeOffByOne)))


@mutant(in_process=True, bug="an insert is free up to min_size_to_sample + 1 items, past max_diff",
        catches=(RULE,))
def free_inserts_past_min_size():
    return adapter("free-inserts-past-min-size", ServedTable=table_with("FreeInsertsPastMinSize",
                                                                        limiter=limiter(FreeInsertsPastMinSize)))


class TimedOutInsertLands(ServedTable):
    """A timed-out insert stays queued and lands as soon as the limiter admits it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending = []

    def insert(self, row, priority=1.0, timeout=None):
        try:
            return super().insert(row, priority, timeout)
        except TimeoutError:
            self.pending.append((row, priority))
            raise

    def sample(self, timeout=None):
        out = super().sample(timeout)
        while self.pending and self.limiter.can_insert(self.inserts, self.samples, self.deletes):
            super().insert(*self.pending.pop(0), 0)
        return out


@mutant(in_process=True, bug="a timed-out insert is kept and lands later", catches=(RULE, THREADS))
def timed_out_insert_lands_later():
    return adapter("timed-out-insert-lands-later", ServedTable=TimedOutInsertLands)


class LandsLater(ServedTable):
    """Reverb's documented rule (sampler_rules timed_out_insert="lands_later"): a
    timed-out insert is kept and lands, under the table's lock, as soon as the
    limiter admits it (checked after every call that can make room)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending = []

    def _land(self) -> None:
        with self.cond:  # a re-entrant lock: insert() takes it again
            while self.pending and self.limiter.can_insert(self.inserts, self.samples, self.deletes):
                ServedTable.insert(self, *self.pending.pop(0), 0)

    def insert(self, row, priority=1.0, timeout=None):
        try:
            return super().insert(row, priority, timeout)
        except TimeoutError:
            with self.cond:
                self.pending.append((row, priority))
            self._land()
            raise

    def sample(self, timeout=None):
        out = super().sample(timeout)
        self._land()
        return out


class LandsLaterSamplingBeforeMinSize(LandsLater):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limiter = MinSizeOffByOne(*self.limiter.as_tuple())


def lands_later_conventions():
    from rbcheck.harness.protocol import Conventions

    return Conventions(sampler_rules={"timed_out_insert": "lands_later"},
                       notes={"sampler_rules": "a timed-out insert lands once admitted (Reverb's flush)"})


@control
def timed_out_insert_lands_later_declared():
    """The control of the convention: a table whose timed-out inserts land later, declaring it."""
    return adapter("timed-out-insert-lands-later-declared", ServedTable=LandsLater,
                   conventions=lands_later_conventions())


@mutant(in_process=True, bug="under timed_out_insert='lands_later', sampling starts one item before "
        "min_size_to_sample", catches=(RULE, THREADS), control=timed_out_insert_lands_later_declared)
def lands_later_sampling_before_min_size():
    return adapter("lands-later-sampling-before-min-size", ServedTable=LandsLaterSamplingBeforeMinSize,
                   conventions=lands_later_conventions())


class NeverWakes(ServedTable):
    """Changes never wake a waiting call: it sees room only when its timeout ends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cond.notify_all = lambda: None


@mutant(in_process=True, bug="a waiting call is never woken when room is made", catches=(WOKEN,))
def waiting_call_never_woken():
    return adapter("waiting-call-never-woken", ServedTable=NeverWakes)
