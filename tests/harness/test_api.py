"""``rbcheck.check_buffer`` and ``rbcheck.parametrize_with_checks`` from a
test suite (this one): pytest runs inside pytest, the outer session's state
(rbcheck's plugin, the Hypothesis profile) is left as it was. Expected
failures are the known-failures file's entries (id, message, reason), matched
by the same code."""

from __future__ import annotations

import pytest

import rbcheck
from tests.harness.test_cli import UNIFORM

#: The message of the skips-last-slot buffer's failures, and the parametrizations that fail.
SKIPS = r"^AssertionError: slot frequencies: chi-square p-value"
FAILING = [f"{UNIFORM}[{case}]" for case in ("7-5", "10-23", "33-33")]
SEED = "test_priority_transform::test_updated_priority_is_transformed_once"
RING = "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"


def skips_last_slot():
    import types

    source = __import__("tests.harness.test_cli", fromlist=["MYMOD"]).MYMOD
    module = types.ModuleType("mymod_in_process")
    exec(compile(source, "mymod", "exec"), module.__dict__)
    return module.adapter()


def expected(ids, message=SKIPS, reason="skips the last slot (our issue 7)"):
    return [rbcheck.ExpectedFailure(test_id, message, reason) for test_id in ids]


def outcomes(report, name):
    return {row["id"].split("::", 1)[1]: row["cells"][name]["outcome"] for row in report["rows"]}


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
    report = rbcheck.check_buffer(skips_last_slot(), expected(FAILING), only=[UNIFORM], strict=True)
    assert outcomes(report, "skips-last") == {
        "test_uniform_sampling_matches_closed_form[1-3]": "pass",
        **{f.split("::")[1]: "xfail" for f in FAILING}}
    # an entry covers each test it names: capacity 1 has no last slot to skip, and passes
    with pytest.raises(rbcheck.ConformanceError, match=r"\[1-3\]: XPASS \(known failure: skips the last"):
        rbcheck.check_buffer(skips_last_slot(), expected([UNIFORM]), only=[UNIFORM], strict=True)
    rbcheck.check_buffer(skips_last_slot(), expected([UNIFORM]), only=[UNIFORM], strict=False)  # reported
    with pytest.raises(rbcheck.ConformanceError, match=r"\[7-5\]: XPASS"):
        rbcheck.check_buffer("example", expected(FAILING), only=[UNIFORM], strict=True)


def test_an_expected_failure_with_another_message_stays_a_failure():
    with pytest.raises(rbcheck.ConformanceError, match="a known failure hid something new") as caught:
        rbcheck.check_buffer(skips_last_slot(), expected(FAILING, message="^ValueError: the buffer is on fire"), only=[UNIFORM])
    assert "3 problem(s)" in str(caught.value)


def test_a_setup_error_is_never_an_expected_failure(monkeypatch):
    """An expected failure covers the test's own failure (its call), not an
    error in its setup, whatever the message."""
    from rbcheck.harness import pytest_plugin

    loader = pytest_plugin.load_adapter

    def no_reference(name):
        if name == "reference":
            raise RuntimeError("no reference model here")
        return loader(name)

    monkeypatch.setattr(pytest_plugin, "load_adapter", no_reference)
    example = rbcheck.harness.adapters.load_adapter("example")
    with pytest.raises(rbcheck.ConformanceError, match=r"FAIL \(in setup: RuntimeError: no reference model"):
        rbcheck.check_buffer(example, expected([RING], message="RuntimeError: no reference model here"), only=[RING])


def entry(test_id=UNIFORM, message=SKIPS, reason="why"):
    return [rbcheck.ExpectedFailure(test_id, message, reason)]


@pytest.mark.parametrize("entries, error, match", [
    ({UNIFORM: "why"}, TypeError, r"expected_failures=\{'test_sampling.*'why'\} \(the old \{id: reason\} form\), "
     r"but should be a list of rbcheck.ExpectedFailure\(id, message, reason\)"),
    ([UNIFORM], TypeError, r"expected_failures\[0\]='test_sampling.*', but should be an rbcheck.ExpectedFailure"),
    (entry("test_nope::x"), ValueError, r"expected_failures\[0\]: property='test_nope::x', but should be a property id"),
    (entry(UNIFORM + "[7-5"), ValueError, r"expected_failures\[0\]: property='.*\[7-5', but should be a property id"),
    (entry(message=""), ValueError, r"message='' matches an empty message, so every failure, but should be a regex"),
    (entry(message="   "), ValueError, r"message='   ' matches an empty message"),
    (entry(message=".*"), ValueError, r"message='\.\*' matches an empty message"),
    (entry(message="(unclosed"), ValueError, r"message='\(unclosed' is not a valid regex"),
    (entry(reason=" "), ValueError, r"reason=' ', but should be a non-empty reason"),
    (entry(SEED), ValueError, r"names a test of seed invariant 2 .*, but no entry may hide a seed bug"),
    (entry(SEED + "[x]"), ValueError, r"seed invariant 2"),
    (entry() + entry(message="no reference model"), ValueError, r"expected_failures\[1\]\.id='.*' repeats expected_failures\[0\]"),
])
def test_bad_expected_failures_name_what_is_allowed(entries, error, match):
    with pytest.raises(error, match=match):
        rbcheck.check_buffer("example", entries, only=[UNIFORM])
    with pytest.raises(error, match=match):
        rbcheck.parametrize_with_checks("example", entries)


def test_parametrize_with_checks_gives_one_test_per_property():
    mark = rbcheck.parametrize_with_checks("example", expected(FAILING[:1]), strict=True)
    (argname, params) = mark.args
    assert argname == "check"
    assert [p.id for p in params] == rbcheck.properties()
    assert all(not p.marks for p in params)  # no blanket xfail: each check judges its own
    checks = {p.id: p.values[0] for p in params}
    with pytest.raises(rbcheck.ConformanceError, match=r"\[7-5\]: XPASS"):
        checks[UNIFORM]()  # the example passes what the entry expects to fail
    with pytest.raises(pytest.skip.Exception, match="not declared: prioritized"):
        checks["test_sampling_distributions::test_prioritized_sampling_matches_closed_form"]()
    broken = rbcheck.parametrize_with_checks(skips_last_slot, expected(FAILING), strict=True)
    (check,) = [p.values[0] for p in broken.args[1] if p.id == UNIFORM]
    with pytest.raises(pytest.xfail.Exception, match="skips the last slot"):
        check()  # each failing parametrization failed as declared, the rest passed


def with_own_known_failures(tmp_path, text):
    from dataclasses import replace

    from rbcheck.harness.adapters import load_adapter

    known = tmp_path / "own.txt"
    known.write_text(text)
    return replace(load_adapter("example"), known_failures=known)


def test_a_run_that_did_not_complete_raises_and_says_why(tmp_path):
    """The adapter's own known-failures file names a seed invariant: pytest
    stops with a usage error, and check_buffer says so instead of passing."""
    adapter = with_own_known_failures(tmp_path, f"{SEED}\n    message: twice\n    reason: upstream knows\n")
    with pytest.raises(rbcheck.RunAbortedError, match="did not complete") as caught:
        rbcheck.check_buffer(adapter, only=[SEED])
    message = str(caught.value)
    assert "pytest exit status 4 (usage error)" in message, message
    assert "no entry may hide a seed bug" in message, message
    assert isinstance(caught.value, rbcheck.ConformanceError)  # one except clause catches both
    (check,) = [p.values[0] for p in rbcheck.parametrize_with_checks(adapter).args[1] if p.id == SEED]
    with pytest.raises(rbcheck.RunAbortedError, match="no entry may hide a seed bug"):
        check()


def test_an_interrupted_run_raises_naming_the_tests_not_run():
    from dataclasses import replace

    from rbcheck.harness.adapters import load_adapter

    def interrupted(spec):
        raise KeyboardInterrupt

    adapter = replace(load_adapter("example"), make=interrupted)
    with pytest.raises(rbcheck.RunAbortedError, match=r"pytest exit status 2 \(interrupted") as caught:
        rbcheck.check_buffer(adapter, only=[UNIFORM])
    assert "test(s) not run" in str(caught.value)


def test_each_call_runs_the_profile_it_asks_for():
    """A second check_buffer in the same process (the suite's modules already
    imported under the first call's profile) runs its own profile: the "dev"
    profile's 50 examples after the "ci" profile's 20, counted as buffers built."""
    from dataclasses import replace

    from rbcheck.harness.examples.list_buffer import adapter as example

    made = []

    def counting():
        base = example()
        return replace(base, name="counting", make=lambda spec: made.append(spec) or base.make(spec))

    counts = {}
    for profile in ("ci", "dev", "ci"):
        made.clear()
        rbcheck.check_buffer(counting(), only=[RING], profile=profile)
        counts.setdefault(profile, []).append(len(made))
    assert counts["ci"][0] == counts["ci"][1], f"buffers built under ci={counts['ci']}, but should be equal (derandomised)"
    assert counts["dev"][0] > 2 * counts["ci"][0], (
        f"buffers built under dev={counts['dev'][0]}, under ci={counts['ci'][0]}, but dev should run 50 "
        f"examples to ci's 20")
