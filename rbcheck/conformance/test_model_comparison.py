"""The stateful model comparison: random programs of extend / add / sample /
update_priority (with and without generations) / save + load run on the
implementation and on the reference; after every step their observable
state must agree (see harness/stateful.py)."""

from __future__ import annotations

import pytest

from rbcheck.harness.stateful import run_against_model


@pytest.mark.conventions("priority_dtype", "eps_rule", "new_priority", "weight_normaliser", "seedable",
                         "param_ranges")
def test_implementation_matches_reference_model(impl, reference_impl):
    """exact (contents, len, cursor, write count, extend/add slots, max
    priority, save->load next samples; indices under shared uniforms when
    "shared_rng") and tolerance (stored priorities to float64 pow rounding,
    float32 weights vs the float64 closed form over the whole buffer):
    capability-aware rule-based state machine with the reference as the model."""
    run_against_model(impl, reference_impl)
