"""A check of a check: the sampling properties' count helper fails on an
index outside the held slots instead of letting it vanish from the counts
(it was a conformance property; it checks the harness, not a buffer)."""

from __future__ import annotations

import pytest
import torch

from rbcheck.conformance.test_sampling_distributions import _draw_counts
from rbcheck.harness.assertions import Trace


def test_a_dead_index_fails_before_it_is_counted():
    """exact (a check of the check): an index outside the held slots fails
    the count helper instead of vanishing from the counts."""

    class OutOfRange:
        def sample(self, batch):
            return None, {"index": torch.full((batch,), 3, dtype=torch.int64)}

    with pytest.raises(AssertionError, match=r"info\['index'\]=.*but should be held slots in \[0, 3\)"):
        _draw_counts(OutOfRange(), 3, Trace("none"), draws=10, batch=10)
