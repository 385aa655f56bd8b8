"""``rbcheck.check_buffer`` and ``rbcheck.parametrize_with_checks`` from a
test suite (this one): pytest runs inside pytest, the outer session's state
(rbcheck's plugin, the Hypothesis profile) is left as it was."""

from __future__ import annotations

import pytest

import rbcheck
from tests.harness.test_cli import UNIFORM


def skips_last_slot():
    import types

    source = __import__("tests.harness.test_cli", fromlist=["MYMOD"]).MYMOD
    module = types.ModuleType("mymod_in_process")
    exec(compile(source, "mymod", "exec"), module.__dict__)
    return module.adapter()


def test_property_ids_are_file_stem_and_function():
    ids = rbcheck.properties()
    assert UNIFORM in ids and len(ids) == len(set(ids))
    assert all(p.count("::") == 1 and p.startswith("test_") for p in ids)


def test_check_buffer_passes_raises_and_honours_expected_failures():
    from hypothesis import settings

    before = settings._current_profile
    report = rbcheck.check_buffer("example", only=[UNIFORM])
    assert report["order"] == ["list-buffer"]
    assert settings._current_profile == before  # the enclosing session's profile is back
    with pytest.raises(rbcheck.ConformanceError, match="chi-square") as caught:
        rbcheck.check_buffer(skips_last_slot(), only=[UNIFORM])
    assert "problem(s) in skips-last" in str(caught.value)
    rbcheck.check_buffer(skips_last_slot(), {UNIFORM: "skips the last slot"}, only=[UNIFORM], strict=True)
    with pytest.raises(rbcheck.ConformanceError, match="expected to fail .* but passed"):
        rbcheck.check_buffer("example", {UNIFORM: "was broken once"}, only=[UNIFORM], strict=True)
    rbcheck.check_buffer("example", {UNIFORM: "was broken once"}, only=[UNIFORM])  # not strict: fine


def test_bad_expected_failures_name_what_is_allowed():
    with pytest.raises(ValueError, match="property='test_nope::x', but should be a property id"):
        rbcheck.check_buffer("example", {"test_nope::x": "why"})
    with pytest.raises(ValueError, match=r"expected_failures\[.*\]='', but should be a non-empty reason"):
        rbcheck.check_buffer("example", {UNIFORM: ""})


def test_parametrize_with_checks_gives_one_test_per_property():
    mark = rbcheck.parametrize_with_checks("example", {UNIFORM: "why"}, strict=True)
    (argname, params) = mark.args
    assert argname == "check"
    assert [p.id for p in params] == rbcheck.properties()
    (marked,) = [p for p in params if p.id == UNIFORM]
    assert marked.marks[0].kwargs == {"reason": "why", "strict": True}
    checks = {p.id: p.values[0] for p in params}
    checks[UNIFORM]()  # the example passes it
    with pytest.raises(pytest.skip.Exception, match="not declared: prioritized"):
        checks["test_sampling_distributions::test_prioritized_sampling_matches_closed_form"]()
