"""The protocol's conventions: validation, how deviations render, the one
priority conversion, parameter ranges and their strategies, the independent
oracle's closed forms, and the report showing the deviations next to the
results they affect."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from rbcheck.harness import report
from rbcheck.harness.oracle import PriorityOracle, stratified_probabilities
from rbcheck.harness.protocol import (
    SPEC_PARAM_RANGES,
    Adapter,
    BufferSpec,
    Conventions,
    ParamRange,
)
from rbcheck.harness.strategies import Field, Layout, param_values, priorities

TIANSHOU_LIKE = Conventions(
    priority_dtype=torch.float32,
    eps_rule="finfo_on_update",
    weight_normaliser="batch_max",
    param_ranges={"alpha": ParamRange(0.0, math.inf, low_closed=False)},
    notes={"weight_normaliser": "tianshou prio.py: weight / weight.max()"},
)


def test_the_default_is_the_spec_and_has_no_deviations():
    assert Conventions().deviations() == {}
    assert Conventions().describe() == "spec (no deviations)"
    assert Adapter("x", "0", make=lambda spec: None).conventions == Conventions()


def test_deviations_name_each_field_that_differs_with_its_note():
    assert TIANSHOU_LIKE.deviations() == {
        "priority_dtype": "float32",
        "eps_rule": "finfo_on_update",
        "weight_normaliser": "batch_max (tianshou prio.py: weight / weight.max())",
        "param_ranges.alpha": "(0, inf)",
    }
    assert TIANSHOU_LIKE.deviations(notes=False)["weight_normaliser"] == "batch_max"
    assert Conventions(new_priority="constant", new_priority_value=2.0).deviations() == {
        "new_priority": "constant 2"
    }
    assert Conventions(seedable=False).deviations() == {"seedable": "False"}


def test_a_range_note_annotates_its_own_range_only():
    conv = Conventions(
        param_ranges={"beta": ParamRange(0.0, 5.0), "eps": ParamRange(0.0, 1.0, low_closed=False)},
        notes={"param_ranges.eps": "eps > 0 (lib.py:9)", "param_ranges": "checked at construction"},
    )
    assert conv.deviations() == {
        "param_ranges.beta": "[0, 5] (checked at construction)",
        "param_ranges.eps": "(0, 1] (eps > 0 (lib.py:9))",
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eps_rule": "mul"}, r"Conventions.eps_rule='mul', but should be one of"),
        ({"priority_dtype": torch.float16}, r"Conventions.priority_dtype=torch.float16, but should be"),
        ({"weight_normaliser": "max"}, r"weight_normaliser='max', but should be one of"),
        ({"sampling": "sorted"}, r"sampling='sorted', but should be one of"),
        ({"param_ranges": {"gamma": ParamRange(0, 1)}}, r"param_ranges keys=\['gamma'\], but should be"),
        ({"param_ranges": {"alpha": (0, 1)}}, r"param_ranges\['alpha'\]=\(0, 1\), but should be a ParamRange"),
        ({"new_priority_value": -1.0}, r"new_priority_value=-1.0, but should be a finite number >= 0"),
        ({"notes": {"colour": "x"}}, r"notes keys=\['colour'\], but should name Conventions fields"),
        ({"notes": {"param_ranges.eps": "x"}}, r"notes keys=\['param_ranges.eps'\], but should name"),
        ({"nstep_ring": "windows"}, r"Conventions.nstep_ring='windows', but should be one of"),
        ({"nstep_ring": "completed_windows"},
         r"incomplete_windows='shorten' with nstep_ring='completed_windows', but should be 'exclude'"),
        ({"capacity_counts": "episodes"}, r"capacity_counts='episodes', but should be one of"),
        ({"terminal_next_obs": "nan"}, r"terminal_next_obs='nan', but should be one of"),
    ],
)
def test_bad_conventions_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Conventions(**kwargs)


def test_an_adapter_refuses_conventions_of_another_type():
    with pytest.raises(ValueError, match=r"conventions=\{\}, but should be a harness.protocol.Conventions"):
        Adapter("x", "0", make=lambda spec: None, conventions={})


def test_priorities_are_handed_over_in_the_declared_dtype():
    assert TIANSHOU_LIKE.priorities([0.1, 2.0]).dtype == torch.float32
    assert Conventions().priorities([0.1]).dtype == torch.float64
    # the oracle starts from the rounded inputs
    oracle = PriorityOracle(BufferSpec(capacity=2, sampler="prioritized", alpha=1.0, eps=0.0), TIANSHOU_LIKE)
    assert oracle.rounded([0.1]).item() == float(torch.tensor(0.1, dtype=torch.float32))
    assert oracle.eps == float(torch.finfo(torch.float32).eps)  # finfo_on_update ignores spec.eps


def test_param_range_contains_and_describe():
    open_low = ParamRange(0.0, math.inf, low_closed=False)
    assert not open_low.contains(0.0) and open_low.contains(1e-300) and not open_low.contains(math.inf)
    assert open_low.describe() == "(0, inf)"
    assert SPEC_PARAM_RANGES["beta"].describe() == "[0, 1]"
    assert SPEC_PARAM_RANGES["beta"].contains(1.0) and not SPEC_PARAM_RANGES["beta"].contains(1.0 + 1e-12)
    assert not SPEC_PARAM_RANGES["eps"].contains(math.nan)
    with pytest.raises(ValueError, match="but should have low <= high"):
        ParamRange(1.0, 0.0)


@pytest.mark.parametrize("name", ["alpha", "beta", "eps"])
@pytest.mark.parametrize("conventions", [Conventions(), TIANSHOU_LIKE], ids=["spec", "tianshou-like"])
def test_param_values_stay_in_the_declared_range_and_reach_its_closed_ends(name, conventions):
    rng = conventions.param_range(name)
    seen: list[float] = []

    @settings(max_examples=300, database=None, derandomize=True)
    @given(param_values(name, conventions))
    def collect(x):
        assert rng.contains(x), f"{name}={x}, but should be in {rng.describe()}"
        seen.append(x)

    collect()
    if rng.low_closed:
        assert rng.low in seen, f"{name}: the closed end {rng.low} was never drawn"
    else:
        assert rng.low not in seen
    assert max(seen) >= min(rng.high, 1.0)


def test_eps_zero_is_drawn_where_allowed():
    seen = []

    @settings(max_examples=200, database=None, derandomize=True)
    @given(param_values("eps"))
    def collect(x):
        seen.append(x)

    collect()
    assert 0.0 in seen


def test_layout_describes_rows_for_the_spec():
    layout = Layout((Field(("obs",), (2,), "float32"), Field(("next", "obs"), (2,), "uint8")))
    assert layout.spec_layout() == {
        "id": ((), torch.int64),
        "obs": ((2,), torch.float32),
        ("next", "obs"): ((2,), torch.uint8),
    }
    spec = BufferSpec(capacity=2, layout=layout.spec_layout())
    assert "layout={'id': ((), torch.int64)" in repr(spec)  # the repro snippet rebuilds it


def test_stratified_closed_form():
    # masses 0.5, 0.25, 0.25 and 4 draws: segments [0,.25) [.25,.5) -> slot 0, then slot 1, slot 2
    probs = stratified_probabilities(torch.tensor([2.0, 1.0, 1.0]), 4)
    assert torch.allclose(probs, torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1.0]], dtype=torch.float64))
    # the per-draw rows average to the independent probabilities
    p = torch.tensor([0.1, 0.3, 0.05, 0.55], dtype=torch.float64)
    assert torch.allclose(stratified_probabilities(p, 7).mean(0), p)


def test_oracle_weights_follow_the_declared_normaliser():
    spec = BufferSpec(capacity=4, sampler="prioritized", alpha=1.0, beta=1.0, eps=0.0)
    raw = [1.0, 2.0, 4.0, 8.0]
    for rule, first in [("buffer_min", 1.0), ("batch_max", 1.0), ("none", 15 / 4)]:
        oracle = PriorityOracle(spec, Conventions(weight_normaliser=rule))
        oracle.write(4, raw)
        w = oracle.weights(torch.tensor([0, 3]))
        assert w[0].item() == pytest.approx(first), rule
        assert w[1].item() == pytest.approx(first / 8), rule
    oracle = PriorityOracle(spec, Conventions(weight_normaliser="batch_max"))
    oracle.write(4, raw)
    assert oracle.weights(torch.tensor([2, 3])).tolist() == pytest.approx([1.0, 0.5])


def test_oracle_new_row_priority_rules():
    spec = BufferSpec(capacity=2, sampler="prioritized", alpha=1.0, eps=0.0)
    for rule, want in [("max_seen", 5.0), ("max_held", 3.0), ("constant", 1.5)]:
        oracle = PriorityOracle(spec, Conventions(new_priority=rule, new_priority_value=1.5))
        oracle.write(2, [5.0, 3.0])
        oracle.write(1, [2.0])  # evicts the 5.0
        assert oracle.new_row_priority() == want, rule


def test_oracle_skips_stale_updates():
    spec = BufferSpec(capacity=2, sampler="prioritized", alpha=1.0, eps=0.0)
    oracle = PriorityOracle(spec)
    oracle.write(2)
    serials = oracle.serials([0, 1])
    oracle.write(1)  # overwrites slot 0
    keep = oracle.update([0, 1], [7.0, 9.0], serials)
    assert keep.tolist() == [False, True]
    assert oracle.leaves().tolist() == [1.0, 9.0]
    assert oracle.max_seen == 9.0


def _payload(conventions: dict, tests: list[dict]) -> dict:
    return {"schema": 1, "implementation": "x", "version": "1", "capabilities": ["prioritized"],
            "unavailable": {}, "conventions": conventions, "warnings": [], "exitstatus": 1, "tests": tests}


def test_report_shows_declared_conventions_next_to_the_results_they_affect():
    tests = [
        {"nodeid": "rbcheck/conformance/test_w.py::test_weights", "property": "test_w.py::test_weights",
         "doc": "", "outcome": "fail", "message": "info['weight']=1.0, but should be 0.5",
         "conventions": {"weight_normaliser": "batch_max"}},
        {"nodeid": "rbcheck/conformance/test_w.py::test_rows", "property": "test_w.py::test_rows",
         "doc": "", "outcome": "pass", "message": "", "conventions": {}},
    ]
    declared = {"weight_normaliser": "batch_max (tianshou prio.py)"}
    data = report.build([report.ImplResult.from_results("lib", _payload(declared, tests))])
    cells = {row["id"]: row["cells"]["lib"]["text"] for row in data["rows"]}
    assert cells["test_w.py::test_weights"] == (
        "FAIL [convention: weight_normaliser=batch_max] (info['weight']=1.0, but should be 0.5)"
    )
    assert cells["test_w.py::test_rows"] == "pass"
    assert data["implementations"]["lib"]["conventions"] == declared
    assert data["implementations"]["lib"]["under_convention"] == 1
    markdown = report.render_markdown(data)
    assert "- declared conventions (1 results checked under them" in markdown
    assert "  - weight_normaliser = batch_max (tianshou prio.py)" in markdown
    assert "convention: weight_normaliser = batch_max" in report.render_text(data)


def test_an_unseedable_adapter_skips_exact_replay_with_the_reason_and_shows_the_convention():
    """seedable=False: a property replaying draws exactly is skipped with
    "convention: not seedable", and a property run under the convention says
    so in its cell."""
    import dataclasses

    import rbcheck
    from rbcheck.harness.adapters import load_adapter

    unseedable = dataclasses.replace(load_adapter("reference"), name="unseedable",
                                     conventions=Conventions(seedable=False))
    report_data = rbcheck.check_buffer(unseedable, only=[
        "test_sampling_distributions::test_same_uniforms_give_same_indices_as_reference",
        "test_bad_input::test_parameters_outside_the_declared_range_are_refused",
    ])
    cells = {row["id"]: row["cells"]["unseedable"]["text"] for row in report_data["rows"]}
    uniforms = cells["test_sampling_distributions.py::test_same_uniforms_give_same_indices_as_reference"]
    assert uniforms.startswith("skipped (convention: not seedable"), uniforms
    assert cells["test_bad_input.py::test_parameters_outside_the_declared_range_are_refused[alpha]"] == "pass"


# --- eps_rule="none" and positive_priorities ---------------------------------


def test_eps_rule_none_stores_raw_to_the_alpha_without_eps():
    conv = Conventions(eps_rule="none")
    assert conv.effective_eps(0.5) == 0.0
    assert conv.deviations() == {"eps_rule": "none"}
    oracle = PriorityOracle(BufferSpec(capacity=3, sampler="prioritized", alpha=0.5, eps=0.25), conv)
    oracle.write(3, [4.0, 0.0, 9.0])
    assert oracle.leaves().tolist() == [2.0, 0.0, 3.0]  # p ** alpha, a 0 stays 0
    assert oracle.probabilities().tolist() == [0.4, 0.0, 0.6]


def test_positive_priorities_admits_only_positive_and_the_oracle_refuses_zero():
    conv = Conventions(positive_priorities=True)
    assert conv.deviations() == {"positive_priorities": "True"}
    assert conv.admits(1e-300) and not conv.admits(0.0)
    assert Conventions().admits(0.0)
    oracle = PriorityOracle(BufferSpec(capacity=2, sampler="prioritized"), conv)
    oracle.write(2, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"should be > 0 for a buffer declaring positive_priorities"):
        oracle.update([0], [0.0])
    with pytest.raises(ValueError, match=r"positive_priorities=1, but should be True or False"):
        Conventions(positive_priorities=1)


@settings(max_examples=200, deadline=None)
@given(p=priorities(conventions=Conventions(priority_dtype=torch.float32, positive_priorities=True)))
def test_priorities_drawn_for_a_buffer_refusing_zero_stay_positive_in_its_dtype(p):
    assert float(torch.tensor(p, dtype=torch.float32)) > 0
