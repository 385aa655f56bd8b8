"""The catalogue of invariants (rbcheck.harness.invariants) against the code:
every property it names exists, every conformance property belongs to an
invariant, every mutant it names exists and targets one of its invariant's
properties, and the seed rule reads it."""

from __future__ import annotations

import pytest

from rbcheck.checks import properties
from rbcheck.harness import invariants
from rbcheck.harness.invariants import CATALOGUE, base_id, seed_invariant_of
from tests.mutants.registry import all_mutants

MUTANTS = all_mutants()


def test_ids_are_unique_and_entries_say_what_they_cover():
    ids = [inv.id for inv in CATALOGUE]
    assert len(ids) == len(set(ids)), f"catalogue ids={ids}, but should be unique"
    numbers = [inv.number for inv in CATALOGUE if inv.number]
    assert len(numbers) == len(set(numbers)), f"numbers={numbers}, but should be unique"
    assert sorted(inv.seed for inv in CATALOGUE if inv.seed) == [1, 2, 3, 4, 5]
    for inv in CATALOGUE:
        assert inv.properties or inv.why_uncovered, f"{inv.id}: no properties, but should say why"


def test_every_named_property_exists_and_every_property_is_catalogued():
    known = set(properties())
    named = {base_id(p) for inv in CATALOGUE for p in inv.properties}
    assert named - known == set(), f"catalogued properties {sorted(named - known)} do not exist"
    assert known - named == set(), f"properties {sorted(known - named)} belong to no invariant"


def test_every_named_mutant_exists_and_targets_its_invariant():
    by_name = {m.factory: m for m in MUTANTS}
    for inv in CATALOGUE:
        tests = {base_id(p).split("::", 1)[1] for p in inv.properties}
        for name in inv.mutants:
            assert name in by_name, f"{inv.id}: mutant {name!r} does not exist"
            mutant = by_name[name]
            assert set(mutant.targets) & tests, (
                f"{inv.id}: mutant {name} targets {mutant.targets}, but should target one of {sorted(tests)}")
            assert mutant.reproduces, f"{inv.id}: mutant {name} names no issue it reproduces"


def test_every_historic_mutant_is_catalogued():
    catalogued = {m for inv in CATALOGUE for m in inv.mutants}
    historic = {m.factory for m in MUTANTS if m.reproduces}
    assert historic - catalogued == set(), f"historic mutants {sorted(historic - catalogued)} are in no invariant"


@pytest.mark.parametrize("prop, seed", [
    ("test_priority_transform::test_updated_priority_is_transformed_once", 2),
    ("test_checkpoint_roundtrip::test_checkpoint_holds_no_pickle", 1),
    ("test_trajectory_slices::test_trajectory_example_runs_as_written[x]", 5),
    ("test_trajectory_slices::test_slices_run_across_the_ring_wrap", None),
    ("test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form", None),
])
def test_seed_invariant_of(prop, seed):
    found = seed_invariant_of(prop)
    assert (found.seed if found else None) == seed, f"seed_invariant_of({prop!r})={found}, but should be {seed}"


def test_generated_texts_name_every_seed_invariant():
    text = invariants.seed_list_markdown()
    assert [line.split(".", 1)[0] for line in text.splitlines() if not line.startswith(" ")] == ["1", "2", "3", "4", "5"]
    table = invariants.coverage_table_markdown()
    assert all(f"| {inv.number} |" in table for inv in CATALOGUE if inv.number)


def test_generated_blocks_of_the_docs_are_current():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert invariants.main(["--check", str(root)]) == 0, (
        "README.md or docs/coverage.md is out of date: run python -m rbcheck.harness.invariants")


def test_replace_generated_needs_both_markers():
    mark = invariants.GENERATED_MARK.format("x")
    assert invariants.replace_generated(f"a\n{mark}\nold\n{mark}\nb", "x", "new") == f"a\n{mark}\nnew\n{mark}\nb"
    with pytest.raises(ValueError, match="two markers"):
        invariants.replace_generated(f"a {mark} b", "x", "new")
