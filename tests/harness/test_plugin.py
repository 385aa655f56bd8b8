"""The pytest plugin, run in subprocesses against a throw-away project: the
``--impl`` switch, the header, ``requires`` skips, known failures, profiles
and the results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_ADAPTER = '''
from rbcheck.harness.protocol import Adapter

def factory():
    return Adapter(
        name="fake", version="9.9", make=lambda spec: None,
        capabilities=frozenset({"random", "prioritized"}),
        unavailable={"prioritized": "ImportError: fake extension missing"},
    )

def not_an_adapter():
    return 42
'''

TESTS = '''
import pytest
from hypothesis import settings
from rbcheck.harness.protocol import BufferSpec

@pytest.mark.requires("random")
def test_declared(impl):
    assert impl.name == "fake"

@pytest.mark.requires("slice")
def test_not_declared():
    raise AssertionError("must not run")

@pytest.mark.requires("prioritized")
def test_unavailable():
    raise AssertionError("must not run")

def test_known_bad():
    assert 1 == 2, "one=1, but should be 2"

def test_known_but_new_cause():
    raise ValueError("size=-1, but should be >= 0")

def test_known_but_fixed():
    pass

def test_unlisted_bad():
    assert [1] == [2], "x=[1], but should be [2]"

def test_spec_needs_unavailable(make_buffer):
    make_buffer(BufferSpec(capacity=2, sampler="prioritized"))

def test_profile():
    print("MAX_EXAMPLES", settings.default.max_examples)

def test_known_only_in_repro(impl):
    from rbcheck.harness.assertions import Trace, fail
    trace = Trace(impl, BufferSpec(capacity=2))
    trace.wrap(object(), "buf")  # the snippet names the buffer, not the failure
    trace.op("buf.evict_everything()")
    trace.op("len(buf)")  # the last call is part of the message: "[len(buf)(<spec>)]"
    fail("len(buf)", 3, 2, trace)
'''


def run_pytest(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run pytest in ``tmp_path`` (which holds conftest, adapter and tests)."""
    (tmp_path / "conftest.py").write_text(
        "import sys\npytest_plugins = [] if 'rbcheck.harness.pytest_plugin' in sys.modules "
        "else ['rbcheck.harness.pytest_plugin']\n"
    )
    (tmp_path / "fake_adapter.py").write_text(textwrap.dedent(FAKE_ADAPTER))
    conformance = tmp_path / "tests" / "conformance"
    conformance.mkdir(parents=True, exist_ok=True)
    (conformance / "test_fake.py").write_text(textwrap.dedent(TESTS))
    full_env = dict(os.environ)
    full_env.pop("RBCHECK_IMPL", None)
    full_env.pop("RBCHECK_PROFILE", None)
    inherited = [full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []
    full_env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), *inherited])
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsxX", "-s", *args],
        cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake_project")
    known = tmp / "known.txt"
    known.write_text(
        "# comment lines are ignored\n"
        "test_fake.py::test_known_bad\n"
        "    message: ^AssertionError: one=1, but should be 2\n"
        "    reason: fails on purpose (no upstream issue found)\n"
        "\n"
        "test_fake.py::test_known_but_new_cause\n"
        "    message: TypeError: .*cannot pickle\n"
        "    reason: a deepcopy error (no upstream issue found)\n"
        "\n"
        "test_known_but_fixed\n"
        "    message: anything\n"
        "    reason: was broken once\n"
        "\n"
        "test_fake.py::test_known_only_in_repro\n"
        "    message: evict_everything\n"
        "    reason: a pattern that only the repro snippet matches\n"
        "\n"
        "tests/conformance/test_fake.py::test_renamed_long_ago\n"
        "    message: anything\n"
        "    reason: stale entry\n"
    )
    results = tmp / "results.json"
    proc = run_pytest(
        tmp, "tests/conformance", "--impl", "fake_adapter:factory",
        f"--rbcheck-known-failures={known}", f"--rbcheck-results={results}",
        "--rbcheck-profile", "ci",
    )
    return proc, json.loads(results.read_text())


def test_header_names_implementation_version_capabilities_and_unavailable(fake_run):
    proc, _ = fake_run
    out = proc.stdout
    assert "rbcheck implementation: fake 9.9 (--impl fake_adapter:factory)" in out, out
    assert "rbcheck capabilities: prioritized, random" in out, out
    assert "rbcheck unavailable: prioritized: ImportError: fake extension missing" in out, out
    assert "rbcheck hypothesis profile: ci" in out, out


def test_requires_skips_with_the_reason(fake_run):
    proc, results = fake_run
    out = proc.stdout
    assert "not declared: slice" in out, out
    assert "unavailable: prioritized: ImportError: fake extension missing" in out, out
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    assert outcomes["test_declared"]["outcome"] == "pass"
    assert outcomes["test_not_declared"] == {**outcomes["test_not_declared"], "outcome": "skip",
                                             "message": "not declared: slice"}
    assert outcomes["test_unavailable"]["outcome"] == "unavailable"
    assert outcomes["test_unavailable"]["message"] == (
        "unavailable: prioritized: ImportError: fake extension missing"
    )
    # a spec that needs an unavailable capability is unavailable too, never a pass
    assert outcomes["test_spec_needs_unavailable"]["outcome"] == "unavailable"


def test_known_failures_xfail_with_reason_and_stale_ids_warn(fake_run):
    proc, results = fake_run
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    assert outcomes["test_known_bad"]["outcome"] == "xfail"
    assert "fails on purpose (no upstream issue found)" in outcomes["test_known_bad"]["message"]
    assert "test_renamed_long_ago" in proc.stdout and "matches no collected test" in proc.stdout
    assert any("test_renamed_long_ago" in w for w in results["warnings"]), results["warnings"]
    assert not any("test_known_bad" in w for w in results["warnings"])


def test_known_failure_with_another_message_fails_and_says_so(fake_run):
    proc, results = fake_run
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    new = outcomes["test_known_but_new_cause"]
    assert new["outcome"] == "fail", new
    assert "size=-1, but should be >= 0" in new["message"], new
    assert "a known failure hid something new" in new["message"], new
    assert "/TypeError: .*cannot pickle/" in new["message"], new
    assert any("test_known_but_new_cause" in h for h in results["known_failures_hid_new"])
    assert "a known failure hid something new" in proc.stdout  # in the terminal report too


def test_a_pattern_is_matched_in_the_message_not_in_the_repro(fake_run):
    """The repro snippet attached to a failure is not its message: a pattern
    found only there would hide any failure of the test."""
    _, results = fake_run
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    only_repro = outcomes["test_known_only_in_repro"]
    assert only_repro["outcome"] == "fail", only_repro
    assert "a known failure hid something new" in only_repro["message"], only_repro
    assert "evict_everything" in only_repro["repros"][0]  # the snippet is still reported


def test_exception_messages_leave_out_the_repro_snippet():
    import re

    from rbcheck.harness.assertions import Trace, fail
    from rbcheck.harness.plugin.known_failures import KnownFailure
    from rbcheck.harness.plugin.results import exception_messages

    trace = Trace("fake", None)
    trace.op("buf.extend(rows)")
    with pytest.raises(AssertionError) as caught:
        fail("len(buf)", 3, 2, trace, detail="after a wrap")
    assert "Repro (adapter 'fake'):" in str(caught.value)
    (message,) = exception_messages(caught.value)
    assert message == "AssertionError: len(buf)=3, but should be 2 [buf.extend(rows)(None)]\n  after a wrap"
    assert not KnownFailure("t", re.compile("load_adapter"), "r", 1).explains([message])


def test_known_failure_that_passes_is_xpass(fake_run):
    proc, results = fake_run
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    assert outcomes["test_known_but_fixed"]["outcome"] == "xpass"
    assert "was broken once" in outcomes["test_known_but_fixed"]["message"]
    assert "XPASS" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "text, expected",
    [
        ("test_fake.py::test_known_bad  # old style reason\n",
         "but should be a test id alone on its line"),
        ("test_fake.py::test_known_bad\n    reason: no pattern\n",
         "has no 'message:' line, but should name the pattern of its failure message"),
        ("test_fake.py::test_known_bad\n    message: (unclosed\n    reason: r\n",
         "is not a valid regex"),
        ("    message: orphan\n", "but should be an indented 'message: <regex>'"),
    ],
)
def test_bad_known_failures_file_is_a_usage_error(tmp_path, text, expected):
    known = tmp_path / "known.txt"
    known.write_text(text)
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory",
                      f"--rbcheck-known-failures={known}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr


@pytest.mark.parametrize("message", ["", "   ", ".*", "x?|y", "^"])
def test_a_pattern_that_matches_every_failure_is_refused(tmp_path, message):
    from rbcheck.harness.plugin.known_failures import KnownFailureError, parse_known_failures

    known = tmp_path / "known.txt"
    known.write_text(f"test_fake.py::test_known_bad\n    message:{message}\n    reason: r\n")
    with pytest.raises(KnownFailureError, match=r"known failure id='test_fake.py::test_known_bad' \(.*known.txt:1\): "
                       r"message='.*' matches an empty message, so every failure, but should be a regex"):
        parse_known_failures(known)


def test_no_entry_may_hide_a_seed_bug(tmp_path):
    """An entry naming a test of a seed invariant is refused, whatever its pattern."""
    conformance = tmp_path / "tests" / "conformance"
    conformance.mkdir(parents=True)
    (conformance / "test_priority_transform.py").write_text(
        "def test_updated_priority_is_transformed_once():\n    assert False, 'twice'\n")
    known = tmp_path / "known.txt"
    known.write_text("test_priority_transform.py::test_updated_priority_is_transformed_once\n"
                     "    message: twice\n    reason: upstream knows\n")
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory",
                      f"--rbcheck-known-failures={known}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "a test of seed invariant 2" in proc.stderr and "no entry may hide a seed bug" in proc.stderr


@pytest.mark.parametrize(
    "nodeid, seed",
    [
        ("rbcheck/conformance/test_checkpoint_roundtrip.py::test_checkpoint_holds_no_pickle", "1"),
        ("rbcheck/conformance/test_pin_memory.py::test_returned_sample_is_pinned_on_cuda", "3"),
        ("rbcheck/conformance/test_policy_placement.py::test_x[a]", "4"),
        ("rbcheck/conformance/test_trajectory_slices.py::test_trajectory_example_runs_as_written", "5"),
        ("rbcheck/conformance/test_trajectory_slices.py::test_slices_run_across_the_ring_wrap", None),
        ("rbcheck/conformance/test_bad_input.py::test_bad_input_is_refused_and_nothing_changes[x]", None),
    ],
)
def test_seed_invariant_tests_are_recognised(nodeid, seed):
    from rbcheck.harness.plugin.known_failures import seed_invariant_of

    got = seed_invariant_of(nodeid)
    assert (got.split(" ", 1)[0] if got else None) == seed


def test_every_leaf_of_an_exception_group_must_match():
    import builtins
    import re

    from rbcheck.harness.plugin.known_failures import KnownFailure
    from rbcheck.harness.plugin.results import exception_messages

    group_type = getattr(builtins, "ExceptionGroup", None) or __import__("exceptiongroup").ExceptionGroup
    group = group_type("Hypothesis found 2 distinct failures.", [
        ValueError("prefetch.pkl, but should be JSON"), TypeError("Object of type Tensor")])
    entry = KnownFailure("t", re.compile(r"prefetch\.pkl"), "r", 1)
    assert exception_messages(group) == ["ValueError: prefetch.pkl, but should be JSON",
                                         "TypeError: Object of type Tensor"]
    assert not entry.explains(exception_messages(group))  # the second leaf is new
    assert entry.explains(exception_messages(ValueError("prefetch.pkl, but should be JSON")))
    assert not entry.explains([])


def test_results_file_has_one_line_failure_messages(fake_run):
    proc, results = fake_run
    assert proc.returncode == 1, proc.stdout  # test_unlisted_bad fails
    outcomes = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    bad = outcomes["test_unlisted_bad"]
    assert bad["outcome"] == "fail"
    assert "x=[1], but should be [2]" in bad["message"] and "\n" not in bad["message"]
    assert bad["property"] == "test_fake::test_unlisted_bad"
    assert results["implementation"] == "fake" and results["version"] == "9.9"
    assert results["unavailable"] == {"prioritized": "ImportError: fake extension missing"}
    assert "MAX_EXAMPLES 20" in proc.stdout  # the ci profile


def test_a_long_failure_message_keeps_its_expectation():
    """exact: a one-line message cut to its limit keeps ", but should be <expected>": the
    observation is shortened first (five torn rows once pushed the expectation out of
    the results file, and a meta test read the failure as unexplained). Short messages
    are unchanged; text without an expectation is cut at its end."""
    from rbcheck.harness.plugin.results import one_line

    rows = [f"row {i}: writer=2 seq={i} checksum={10**11 + i} (checksum mismatch)" for i in range(5)]
    message = (f"AssertionError: rows held after the writers finished: torn or unwritten rows={rows}, "
               "but should be none [state = State.of(buf, capacity)(BufferSpec(capacity=64))]")
    assert len(message) > 400
    cut = one_line(message)
    assert len(cut) <= 400 and ", but should be none [state = State.of(" in cut
    assert cut.startswith("AssertionError: rows held after the writers finished: torn or unwritten rows=[")
    long_tail = "AssertionError: x=1, but should be " + "y" * 1000
    assert len(one_line(long_tail)) == 400 and ", but should be yyy" in one_line(long_tail)  # tail uses the room
    assert one_line("short, but should be fine") == "short, but should be fine"
    assert one_line("z" * 500) == "z" * 397 + "..."
    assert one_line("a\n  b", 10) == "a b"


def test_env_selects_impl_and_profile_and_subset_runs_do_not_warn(tmp_path):
    known = tmp_path / "known.txt"
    known.write_text("test_fake.py::test_known_bad\n    message: xyzzy frobnicated\n    reason: listed, but not part of this run\n")
    proc = run_pytest(
        tmp_path, "tests/conformance/test_fake.py", "-k", "test_profile or test_declared",
        f"--rbcheck-known-failures={known}",
        env={"RBCHECK_IMPL": "fake_adapter:factory", "RBCHECK_PROFILE": "thorough"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rbcheck implementation: fake 9.9" in proc.stdout
    assert "MAX_EXAMPLES 1000" in proc.stdout
    assert "matches no collected test" not in proc.stdout  # deselected, not stale


@pytest.mark.parametrize(
    "impl, expected",
    [
        ("no_such_builtin", "impl='no_such_builtin', but should be a built-in name (reference, device, triton, torchrl"),
        ("fake_adapter:not_an_adapter", "not_an_adapter() returned a int, but should return a harness.protocol.Adapter"),
    ],
)
def test_bad_impl_is_a_usage_error_naming_it(tmp_path, impl, expected):
    # (every loader message is checked in-process in test_adapters.py)
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", impl)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert expected in proc.stderr, proc.stderr


def test_bad_profile_is_a_usage_error(tmp_path):
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory",
                      "--rbcheck-profile", "fast")
    assert proc.returncode == 4
    assert "profile='fast', but should be one of ci, dev, thorough" in proc.stderr


# ------------------------------------------------------- in-process helpers


@pytest.mark.parametrize(
    "test_id, nodeid, expected",
    [
        ("tests/conformance/test_a.py::test_x[1]", "tests/conformance/test_a.py::test_x[1]", True),
        ("test_a.py::test_x", "tests/conformance/test_a.py::test_x[1]", True),  # every parametrization
        ("test_a.py::test_x[2]", "tests/conformance/test_a.py::test_x[1]", False),
        ("test_x", "tests/conformance/test_a.py::test_x", True),
        ("test_a.py::test_x", "tests/conformance/test_a.py::test_xy", False),
        ("a.py::test_x", "tests/conformance/test_a.py::test_x", False),
    ],
)
def test_known_failure_ids_match_node_ids(test_id, nodeid, expected):
    from rbcheck.harness.plugin.known_failures import id_matches

    assert id_matches(test_id, nodeid) is expected


def test_failure_fields_come_from_the_exception_not_the_printed_text():
    """The record's message, failures and repros are read from the exception:
    the first explained leaf of a group with the group's summary and that
    leaf's falsifying example (Hypothesis' note), and every repro snippet a
    property failure carries."""
    import builtins

    from rbcheck.harness.assertions import PropertyFailure
    from rbcheck.harness.plugin.results import failure_fields

    group_type = getattr(builtins, "ExceptionGroup", None) or __import__("exceptiongroup").ExceptionGroup
    plain = TypeError("buffer crashed")
    explained = PropertyFailure("m", "-6", ">= -5", call="sample(2)", repro="buf.sample(2)", adapter="fake")
    explained.add_note("Falsifying example: test_two(\n    n=-6,\n)")
    group = group_type("Hypothesis found 2 distinct failures.", [plain, explained])
    fields = failure_fields(group)
    assert fields["message"] == (
        "AssertionError: m=-6, but should be >= -5 [sample(2)] (ExceptionGroup: Hypothesis found 2 distinct "
        "failures. (2 sub-exceptions)) | Falsifying example: test_two( n=-6, )"
    )
    assert fields["failures"] == ["AssertionError: m=-6, but should be >= -5 [sample(2)]"]
    assert fields["repros"] == ["buf.sample(2)"]
    assert "Repro (adapter 'fake'):\n    buf.sample(2)" in str(explained)
    assert failure_fields(plain)["message"] == "TypeError: buffer crashed"


def test_bad_device_is_a_usage_error(tmp_path):
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory",
                      "--rbcheck-device", "gpu0")
    assert proc.returncode == 4
    assert "rbcheck device='gpu0', but should be a torch device such as 'cpu' or 'cuda'" in proc.stderr


def test_a_device_the_adapter_does_not_declare_or_lacks_is_a_usage_error(tmp_path):
    """``--rbcheck-device cuda`` (or ``RBCHECK_DEVICE=cuda``) for an adapter
    that does not declare "cuda", or on a machine without CUDA, stops the run
    with a usage error naming the device and where it came from: a run on it
    would skip every test and pass."""
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory", "--rbcheck-device", "cuda")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "rbcheck device='cuda', but the adapter 'fake' does not declare 'cuda'" in proc.stderr, proc.stderr
    proc = run_pytest(tmp_path, "tests/conformance", "--impl", "fake_adapter:factory",
                      env={"RBCHECK_DEVICE": "cuda"})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "(from the environment variable RBCHECK_DEVICE)" in proc.stderr, proc.stderr
    import torch

    if not torch.cuda.is_available():
        proc = run_pytest(tmp_path, "tests/conformance", "--impl", "rbcheck.harness.adapters.variants:device",
                          "--rbcheck-device", "cuda")
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "this machine has no CUDA device" in proc.stderr or "cuda is unavailable here" in proc.stderr, \
            proc.stderr
