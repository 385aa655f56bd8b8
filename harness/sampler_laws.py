"""How each sampler draws: with or without replacement, within a batch and
across batches (issue 40). The spec's law of every sampler a
:class:`~rbcheck.harness.protocol.BufferSpec` names, and the check of a
declared deviation (``Conventions.replacement``).

Laws (:data:`REPLACEMENTS`):

* ``"with"``: every draw may repeat any slot, within a batch and across
  batches: the draws are independent (uniform: ``1 / N**2`` for each ordered
  pair of slots);
* ``"without_in_batch"``: no slot twice in one batch; each batch is drawn
  afresh, independently of the others;
* ``"without"``: no slot twice until every held slot was drawn (an epoch),
  within and across batches.

``test_replacement::test_samplers_draw_with_or_without_replacement_as_declared``
checks each declared sampler's law in its own terms.
"""

from __future__ import annotations

from collections.abc import Mapping

REPLACEMENTS = ("with", "without_in_batch", "without")
#: The spec's law of each sampler (reference/*_sampler.py say the same in their docstrings).
SPEC_REPLACEMENT: Mapping[str, str] = {
    "random": "with",
    "prioritized": "with",
    "slice": "with",
    "without_replacement": "without",
    "consuming": "without_in_batch",
}


def check_replacement(declared: Mapping[str, str]) -> None:
    """ValueError unless ``declared`` maps sampler names to laws."""
    if not isinstance(declared, Mapping):
        raise ValueError(f"Conventions.replacement={declared!r}, but should be a mapping sampler -> law")
    bad = {k: v for k, v in declared.items() if k not in SPEC_REPLACEMENT or v not in REPLACEMENTS}
    if bad:
        raise ValueError(f"Conventions.replacement={bad!r}, but should map samplers among "
                         f"{sorted(SPEC_REPLACEMENT)} to one of {list(REPLACEMENTS)}")


def replacement_of(conventions, sampler: str) -> str:
    """How ``sampler`` draws under ``conventions``: the declared law, else the spec's."""
    if sampler not in SPEC_REPLACEMENT:
        raise ValueError(f"sampler={sampler!r}, but should be one of {sorted(SPEC_REPLACEMENT)}")
    return conventions.replacement.get(sampler, SPEC_REPLACEMENT[sampler])
