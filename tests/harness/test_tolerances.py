"""Tolerances tied to the declared dtype (issue 10, item 2): a float32 tree
passes the transform-once property within float32's own error, while a
double transform misses it by orders of magnitude more than the tolerance.
Shown twice: on the arithmetic itself, and on the float32-tree buffers of
``tests/mutants/conventions.py`` (the correct control and the twice-transforming
mutant) run through the conformance property."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbcheck.conformance import test_priority_transform as transform_property
from rbcheck.harness.assertions import priority_tolerance, sum_tolerance, weight_tolerance
from rbcheck.harness.oracle import transform
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout
from tests.mutants.conventions import float32_tree, float32_tree_transformed_twice

F32 = torch.float32


def test_bounds_are_stated_with_their_derivation():
    assert str(priority_tolerance(F32)).startswith("rtol = 8 * eps(float32) = 9.5e-07")
    assert str(priority_tolerance(torch.float64)).startswith("rtol = 8 * eps(float64) = 1.8e-15")
    assert "* 2 * eps(float32)" in str(priority_tolerance(F32, alpha=2.0))
    # the sum's bound grows with log2 N
    assert sum_tolerance(F32, 2**20).rtol > sum_tolerance(F32, 2**4).rtol
    assert "N=64" in str(weight_tolerance(F32, 64))


def _float32_once(p, eps, alpha):
    return (torch.tensor(p, dtype=F32) + eps) ** alpha


def _float32_twice(p, eps, alpha):
    return (_float32_once(p, eps, alpha) + eps) ** alpha


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got.double() - want) / want).abs().max())


@settings(max_examples=200, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.lists(st.floats(1e-3, 100.0), min_size=1, max_size=8),
    eps=st.sampled_from([0.0, 1e-8, 1e-6, 1e-3, 0.01, 0.5]),
    alpha=st.floats(0.05, 3.0),
)
def test_a_float32_transform_is_within_the_float32_tolerance(p, eps, alpha):
    """Computed once in float32 arithmetic, from the rounded inputs, the stored
    value is within rtol = 8 * max(1, alpha) * eps(float32) of the float64
    closed form."""
    rounded = torch.tensor(p, dtype=F32).double()
    eps32 = float(torch.tensor(eps, dtype=F32))
    want = transform(rounded, eps32, alpha)
    tol = priority_tolerance(F32, alpha)
    err = _relative_error(_float32_once(p, eps, alpha), want)
    assert err <= tol.rtol, f"relative error={err:.3g}, but should be <= {tol}"


# (p, eps, alpha): the usual PER settings and a few others
DOUBLE_CASES = [
    ([2.0, 0.5, 7.25], 1e-6, 0.6),
    ([0.0, 1.0, 3.0], 1e-3, 0.5),
    ([10.0, 0.1], 1e-8, 0.7),
    ([100.0], 0.01, 2.0),
]


@pytest.mark.parametrize("p, eps, alpha", DOUBLE_CASES)
def test_a_double_transform_misses_by_orders_of_magnitude_more(p, eps, alpha):
    """The same float32 tree transforming twice is off by at least 10**4 times
    the float32 tolerance (the float64 tolerance: 10**12 times)."""
    rounded = torch.tensor(p, dtype=F32).double()
    eps32 = float(torch.tensor(eps, dtype=F32))
    want = transform(rounded, eps32, alpha)
    tol = priority_tolerance(F32, alpha)
    once = _relative_error(_float32_once(p, eps, alpha), want)
    twice = _relative_error(_float32_twice(p, eps, alpha), want)
    assert once <= tol.rtol
    assert twice >= 1e4 * tol.rtol, f"double transform error={twice:.3g} vs {tol}"


def test_the_float32_tree_passes_the_property_and_the_double_transform_fails_it():
    """The conformance property itself, run on two buffers with float32 trees
    that declare priority_dtype=float32: the correct one passes (the old
    rtol=1e-13 would have failed it), the twice-transforming one fails with
    the bound in the message and an error many times that bound."""
    prop = transform_property.test_updated_priority_is_transformed_once
    prop(impl=float32_tree())  # passes (Hypothesis draws the rest)
    with pytest.raises(AssertionError) as failure:
        prop(impl=float32_tree_transformed_twice())
    message = str(failure.value)
    assert "rtol = " in message and "eps(float32)" in message
    assert "but should be" in message


def test_the_old_float64_tolerance_would_fail_a_correct_float32_tree():
    """Why the tolerance must follow the declared dtype: a correct float32
    tree is off by far more than the float64 bound."""
    buf = float32_tree().make(BufferSpec(capacity=3, sampler="prioritized", alpha=0.6, eps=1e-6))
    buf.extend(Layout((Field(("obs",), (), "float32"),)).batch(0, 3))
    raw = torch.tensor([0.3, 2.7, 11.1], dtype=F32)
    buf.update_priority(torch.arange(3), raw)
    want = transform(raw.double(), float(torch.tensor(1e-6, dtype=F32)), 0.6)
    err = _relative_error(buf.stored_priority(torch.arange(3)), want)
    assert priority_tolerance(torch.float64).rtol < err <= priority_tolerance(F32, 0.6).rtol
