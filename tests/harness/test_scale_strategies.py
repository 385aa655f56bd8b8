"""The scale helpers of harness/strategies.py (issue 39, item 5): the batch
schedule of the distributional checks, the capacities and batch sizes drawn
at a real run's sizes, and the adapters' cost hints."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.strategies import (
    LARGE_CAPACITIES,
    TRAINING_BATCHES,
    batch_schedule,
    capacities,
    scale_limit,
    training_batch_sizes,
)


@pytest.mark.parametrize("total,low,high", [(20_000, 32, 256), (20_000, 32, 32), (100, 32, 256), (5, 32, 256)])
def test_batch_schedule_draws_the_total_in_calls_of_low_to_high(total, low, high):
    sizes = batch_schedule(total, low, high, seed=3)
    assert sum(sizes) == total, f"sum of the calls={sum(sizes)}, but should be {total}"
    assert all(low <= b <= high for b in sizes[:-1]), f"calls={sizes[:-1]}, but should be in [{low}, {high}]"
    assert 1 <= sizes[-1] <= high, f"last call={sizes[-1]}, but should be in [1, {high}]"
    assert batch_schedule(total, low, high, seed=3) == sizes, "the schedule should be the same every run"
    if low < high and total >= 20 * high:
        assert len(set(sizes)) > 10, f"distinct sizes={len(set(sizes))}, but should be many (a mix of 32..256)"


def test_batch_schedule_refuses_an_empty_range():
    with pytest.raises(ValueError, match="but should have total >= 1 and 1 <= low <= high"):
        batch_schedule(100, 64, 32)


def test_large_draws_reach_the_capacities_and_batches_of_a_real_run():
    seen_caps, seen_batches = set(), set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(cap=capacities(1, 16, large=True), batch=training_batch_sizes())
    def collect(cap, batch):
        seen_caps.add(cap)
        seen_batches.add(batch)

    collect()
    assert set(LARGE_CAPACITIES) <= seen_caps, f"large capacities drawn={sorted(seen_caps & set(LARGE_CAPACITIES))}"
    assert any(c <= 16 for c in seen_caps), "small capacities should still be drawn"
    assert {32, 256, 4096} <= seen_batches, f"training batches drawn={sorted(seen_batches & set(TRAINING_BATCHES))}"
    assert max(seen_batches) <= 4096 and min(seen_batches) >= 1


def test_scale_limit_reads_the_adapters_cost_hint():
    impl = load_adapter("reference")
    assert scale_limit(impl, "prioritized_fill") is None, "the reference gives no cost hint"
    impl.scale_limits = {"prioritized_fill": (4097, "slow here")}
    assert scale_limit(impl, "prioritized_fill") == (4097, "slow here")
    assert scale_limit(impl, "sample_batch") is None
