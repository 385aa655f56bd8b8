"""The mutant registry refuses declarations that would make a meta test
vacuous: a target that names no property, no target, an unmarked control,
a name declared twice."""

from __future__ import annotations

import pytest

from tests.mutants import registry
from tests.mutants.registry import all_mutants, control, mutant

PROPERTY = "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form"


def test_an_unknown_property_is_refused():
    with pytest.raises(ValueError, match=r"catches=\['test_ring_eviction::test_gone'\], but should name"):
        mutant(bug="x", catches=("test_ring_eviction::test_gone",))


def test_no_target_is_refused():
    with pytest.raises(ValueError, match=r"catches=\(\), but should be a non-empty tuple"):
        mutant(bug="x", catches=())


def test_an_unmarked_control_is_refused():
    def not_a_control():
        return None

    with pytest.raises(ValueError, match="but should be 'reference' or a factory marked @control"):
        mutant(bug="x", catches=(PROPERTY,), control=not_a_control)


def test_a_declaration_records_files_targets_and_control(monkeypatch):
    monkeypatch.setattr(registry, "MUTANTS", [])

    @control
    def good():
        return None

    @mutant(bug="an off-by-one eviction", catches=(PROPERTY,), control=good, reproduces="x #1")
    def broken():
        return None

    (m,) = registry.MUTANTS
    assert (m.files, m.targets) == (("test_ring_eviction.py",), ("test_ring_eviction_matches_reference_and_closed_form",))
    assert m.impl == f"{__name__}:broken" and m.control == f"{__name__}:good" and m.reproduces == "x #1"
    with pytest.raises(ValueError, match="'broken' is declared twice"):
        mutant(bug="again", catches=(PROPERTY,))(broken)


def test_mutant_names_are_unique_across_the_harness_and_the_package():
    names = [m.factory for m in all_mutants()]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
