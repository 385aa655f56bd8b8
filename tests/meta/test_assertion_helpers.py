"""Meta tests: every assertion helper fails on a wrong input (so no check
built on it can pass by construction), with a self-explaining message.

Each helper of ``rbcheck.harness.assertions`` whose name starts with
``assert_`` (and ``fail``), and the checking helpers of the conformance files
listed in HELPERS, get a wrong input here; a helper added later without a
case here fails ``test_every_assertion_helper_has_a_wrong_input_case``. The
same helpers are also given a right input, which must pass (the control).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness import assertions, failure, tolerance

T = torch.tensor
INF, NAN = float("inf"), float("nan")


def _td(x):
    return TensorDict({"x": T(x)}, batch_size=[len(x)])


#: helper name -> (call with a WRONG input, call with a right input)
CASES = {
    "fail": (lambda: assertions.fail("x", 1, 2), None),
    "assert_same": (lambda: assertions.assert_same("x", 1, 1.0),
                    lambda: assertions.assert_same("x", 1.0, 1.0)),
    "assert_tensor_equal": (lambda: assertions.assert_tensor_equal("x", T([1.0, float("nan")]),
                                                                   T([1.0, float("nan")])),
                            lambda: assertions.assert_tensor_equal("x", T([1.0, 2.0]), T([1.0, 2.0]))),
    "assert_td_equal": (lambda: assertions.assert_td_equal("x", _td([1, 2]), _td([1, 3])),
                        lambda: assertions.assert_td_equal("x", _td([1, 2]), _td([1, 2]))),
    "assert_close": (lambda: assertions.assert_close("x", T([1.0, 2.1]), T([1.0, 2.0]), rtol=1e-3),
                     lambda: assertions.assert_close("x", T([1.0, 2.0001]), T([1.0, 2.0]), rtol=1e-3)),
    # a draw of a probability-0 cell, and a lopsided two-cell count
    "assert_chi_square": (lambda: assertions.assert_chi_square(
                              "x", T([500.0, 500.0, 1.0]), T([0.5, 0.5, 0.0]), false_alarm=1e-4),
                          lambda: assertions.assert_chi_square(
                              "x", T([5010.0, 4990.0]), T([0.5, 0.5]), false_alarm=1e-4)),
    "assert_binomial": (lambda: assertions.assert_binomial("x", 900, 1000, 0.5, false_alarm=1e-4),
                        lambda: assertions.assert_binomial("x", 505, 1000, 0.5, false_alarm=1e-4)),
}

#: more wrong inputs for helpers whose failure has several branches
MORE_WRONG = {
    "assert_tensor_equal dtype": lambda: assertions.assert_tensor_equal("x", T([1]), T([1.0])),
    "assert_tensor_equal shape": lambda: assertions.assert_tensor_equal("x", T([1.0]), T([1.0, 1.0])),
    "assert_tensor_equal -0.0": lambda: assertions.assert_tensor_equal("x", T([-0.0]), T([0.0])),
    "assert_td_equal keys": lambda: assertions.assert_td_equal(
        "x", _td([1]), TensorDict({"y": T([1])}, batch_size=[1])),
    "assert_close nan": lambda: assertions.assert_close("x", T([float("nan")]), T([1.0]), rtol=1.0),
    # an expected infinity is matched by the same infinity only, and a finite
    # expected value never by an infinity (a bound of rtol * inf is inf)
    "assert_close finite for +inf": lambda: assertions.assert_close("x", T([1.0]), T([INF]), rtol=1e-3),
    "assert_close finite for -inf": lambda: assertions.assert_close("x", T([1.0]), T([-INF]), rtol=1e-3),
    "assert_close -inf for +inf": lambda: assertions.assert_close("x", T([-INF]), T([INF]), rtol=1e-3),
    "assert_close +inf for -inf": lambda: assertions.assert_close("x", T([INF]), T([-INF]), rtol=1e-3),
    "assert_close +inf for finite": lambda: assertions.assert_close("x", T([INF]), T([1.0]), rtol=1e-3),
    "assert_chi_square lopsided": lambda: assertions.assert_chi_square(
        "x", T([9000.0, 1000.0]), T([0.5, 0.5]), false_alarm=1e-4),
    "assert_binomial impossible": lambda: assertions.assert_binomial("x", 1, 1000, 0.0, false_alarm=1e-4),
}


#: more right inputs (controls) for helpers with several branches
MORE_RIGHT = {
    "assert_close same infinities": lambda: assertions.assert_close(
        "x", T([INF, -INF, 1.0]), T([INF, -INF, 1.0]), rtol=1e-3),
}

#: inputs a helper refuses as a harness error (a ValueError in the
#: ``... but should be ...`` form), never as a pass: the check cannot decide
REFUSED = {
    # a model without an answer (NaN) cannot decide a comparison; NaN "matching"
    # NaN would let a buffer's NaN pass wherever the model overflows too
    "assert_close expected nan": lambda: assertions.assert_close("x", T([1.0]), T([NAN]), rtol=1e-3),
    "assert_close nan for nan": lambda: assertions.assert_close("x", T([NAN]), T([NAN]), rtol=1.0),
    "assert_close expected nan, got inf": lambda: assertions.assert_close(
        "x", T([INF, 1.0]), T([1.0, NAN]), rtol=1e-3),
    # a bound that is infinite (or negative, or NaN) accepts anything (or nothing)
    "assert_close atol inf": lambda: assertions.assert_close("x", T([INF]), T([1.0]), rtol=0.0, atol=INF),
    "assert_close rtol inf": lambda: assertions.assert_close("x", T([5.0]), T([1.0]), rtol=INF),
    "assert_close rtol nan": lambda: assertions.assert_close("x", T([5.0]), T([1.0]), rtol=NAN),
    "assert_close atol negative": lambda: assertions.assert_close("x", T([1.0]), T([1.0]), rtol=0.0, atol=-1.0),
}


def _checkpoint_guard():
    from rbcheck.conformance.test_checkpoint_faults import differs_in_every_slot

    return differs_in_every_slot


HELPERS = {
    # conformance-file helpers that decide pass / fail on their own
    "test_checkpoint_faults.differs_in_every_slot": (
        lambda: _checkpoint_guard()(_td([1, 2]), _td([5, 2]), "x", None),
        lambda: _checkpoint_guard()(_td([1, 2]), _td([5, 6]), "x", None),
    ),
}


def test_every_assertion_helper_has_a_wrong_input_case():
    """No assertion helper goes untested: each ``assert_*`` of
    rbcheck.harness.assertions (and ``fail``) has a case here."""
    # assertions re-exports the helpers of its split-off modules (failure, tolerance)
    homes = {assertions.__name__, failure.__name__, tolerance.__name__}
    names = {n for n, f in inspect.getmembers(assertions, inspect.isfunction)
             if (n.startswith("assert_") or n == "fail") and f.__module__ in homes}
    missing = sorted(names - set(CASES))
    assert not missing, f"assertion helpers without a wrong-input case={missing}, but should be none"


@pytest.mark.parametrize("name", sorted(CASES) + sorted(MORE_WRONG) + sorted(HELPERS))
def test_helper_fails_on_a_wrong_input(name):
    """The helper raises AssertionError, in the ``... but should be ...`` form."""
    wrong = MORE_WRONG.get(name) or (CASES.get(name) or HELPERS[name])[0]
    with pytest.raises(AssertionError) as info:
        wrong()
    assert "but should be" in str(info.value), f"message={str(info.value)!r}, but should explain itself"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_helper_refuses_an_input_it_cannot_decide(name):
    """A harness error naming the argument, never a pass."""
    with pytest.raises(ValueError, match="but should be") as info:
        REFUSED[name]()
    assert not isinstance(info.value, AssertionError)


@pytest.mark.parametrize(
    "name", sorted(n for n, (_, right) in {**CASES, **HELPERS}.items() if right) + sorted(MORE_RIGHT))
def test_helper_passes_a_right_input(name):
    """The control: the same helper accepts a right input."""
    right = MORE_RIGHT.get(name) or (CASES.get(name) or HELPERS[name])[1]
    right()
