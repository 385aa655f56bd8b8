"""The registry of judged third-party failures (docs/bugs.toml, tools/bugs.py):
every entry is sound, docs/findings.md is what it generates, and the checks
refuse what they should."""

from __future__ import annotations

import textwrap

import pytest

from tools import bugs

ENTRY = dict(id="Z1", library="zlib", versions="1.0", columns=["cpprb"], kind="bug", invariant="ring",
             properties=["test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"],
             summary="s", source="z.c:1", repro="tests/thirdparty/test_cpprb_bugs.py::test_capacity_zero_is_refused",
             upstream="", status="open")


def test_every_entry_of_the_registry_is_sound():
    entries = bugs.load()
    assert entries, "docs/bugs.toml holds no entry, but should hold the judged findings"
    assert bugs.problems(entries) == []


def test_findings_md_is_what_the_registry_generates():
    text = bugs.FINDINGS.read_text()
    assert bugs.findings_text(text, bugs.load()) == text, \
        "docs/findings.md differs from what docs/bugs.toml generates (python -m tools.bugs --write)"


def test_a_sound_entry_passes():
    assert bugs.problems([ENTRY]) == []


@pytest.mark.parametrize("change, says", [
    ({"invariant": "no_such_invariant"}, "invariant='no_such_invariant'"),
    ({"properties": ["test_ring_eviction::test_nothing"]}, "is no property id"),
    ({"columns": ["no-such-column"]}, "is no record name"),
    ({"kind": "rumour"}, "kind='rumour'"),
    ({"status": "closed"}, "status='closed'"),
    ({"upstream": "github.com/x/y/issues/1"}, "upstream="),
    ({"repro": ""}, "repro is empty"),
    ({"repro": "tests/thirdparty/test_cpprb_bugs.py::test_renamed"}, "has no test function test_renamed"),
    ({"repro": "tests/thirdparty/test_draw_repeats.py::test_sb3_repeat_is_sb3_own_draw"},
     "is not marked xfail(strict=True)"),
    ({"repro": "tests/unit/test_x.py::test_y"}, "should be tests/thirdparty/"),
    ({"source": ""}, "source is empty"),
    ({"columns": "cpprb"}, "columns='cpprb', but should be a list"),
    ({"extra": 1}, "unknown field 'extra'"),
])
def test_a_bad_entry_is_refused_naming_the_field(change, says):
    found = bugs.problems([{**ENTRY, **change}])
    assert any(says in line for line in found), f"problems={found}, but should say {says!r}"


def test_a_missing_field_and_a_repeated_id_are_refused():
    partial = {k: v for k, v in ENTRY.items() if k != "summary"}
    assert any("no 'summary' field" in line for line in bugs.problems([partial]))
    assert any("ids are unique" in line for line in bugs.problems([ENTRY, dict(ENTRY)]))


def test_conventions_need_no_repro_and_may_name_a_plain_test():
    conv = {**ENTRY, "kind": "convention", "status": "documented",
            "repro": "tests/thirdparty/test_draw_repeats.py::test_sb3_repeat_is_sb3_own_draw"}
    assert bugs.problems([conv]) == []
    assert bugs.problems([{**conv, "repro": ""}]) == []


def test_strict_xfails_are_read_from_decorators_helpers_and_pytestmark(tmp_path):
    path = tmp_path / "test_lib.py"
    path.write_text(textwrap.dedent('''
        import pytest

        def bug(reason):
            return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)

        @bug("x")
        def test_helper(): ...

        @pytest.mark.xfail(strict=True)
        def test_direct(): ...

        @pytest.mark.xfail(reason="not strict")
        def test_loose(): ...

        def test_plain(): ...
    '''))
    assert bugs.strict_xfails(path) == {"test_helper": True, "test_direct": True, "test_loose": False,
                                        "test_plain": False}
    path.write_text("import pytest\npytestmark = [pytest.mark.xfail(strict=True)]\ndef test_a(): ...\n")
    assert bugs.strict_xfails(path) == {"test_a": True}


def test_findings_text_needs_its_markers_and_keeps_the_hand_written_text():
    with pytest.raises(ValueError, match="markers"):
        bugs.findings_text("# no markers\n", [ENTRY])
    text = f"# Findings\n\nmethod\n\n{bugs.BEGIN}\nold\n{bugs.END}\n\ntail\n"
    out = bugs.findings_text(text, [ENTRY])
    assert out.startswith("# Findings\n\nmethod\n\n") and out.endswith(f"{bugs.END}\n\ntail\n")
    assert '<a id="z1"></a>Z1' in out and "| zlib | 1.0 | 1 | 1 | 0 | 0 |" in out


def test_compliance_registry_names_each_cell_by_its_finding():
    reg = bugs.compliance_registry([ENTRY])
    assert reg == {"cpprb": {"test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form":
                             {"id": "Z1", "url": "../findings.md#z1"}}}
