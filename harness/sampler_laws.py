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
    "slice_without_replacement": "without",  # slice starts (reference/slice_without_replacement_sampler.py)
    "prioritized_slice": "with",
    "staleness": "with",
}


#: Rules of a sampler a library may declare otherwise (``Conventions.sampler_rules``): rule ->
#: its values, the spec's first. ``slice_epoch``: what a slice epoch without replacement
#: covers once: every valid slice start (spec), or every eligible trajectory once (one slice
#: each, its start drawn within it). ``epoch_on_growth``: a write that adds rows mid-epoch
#: (without_replacement): the epoch keeps its permutation (spec) or the next sample begins a
#: new one over the rows held then. ``prefetch_batches``: a prefetching buffer samples batches
#: of any size (spec), or only of its constructor's ``batch_size``.
SAMPLER_RULES: Mapping[str, tuple[str, ...]] = {
    "slice_epoch": ("starts", "trajectories"),
    "epoch_on_growth": ("keep", "restart"),
    "prefetch_batches": ("any_size", "constructor_size"),
    # served tables (issue 42, capability rate_limiter): a timed-out insert changed nothing (spec), or
    # is not withdrawn and lands once the limiter admits it (Reverb's flush); test_rate_limiter
    "timed_out_insert": ("unchanged", "lands_later"),
}


def check_sampler_rules(declared: Mapping[str, str]) -> None:
    """ValueError unless ``declared`` maps rules of :data:`SAMPLER_RULES` to their values."""
    bad = ({k: v for k, v in declared.items() if v not in SAMPLER_RULES.get(k, ())}
           if isinstance(declared, Mapping) else declared)
    if bad:
        raise ValueError(f"Conventions.sampler_rules={bad!r}, but should map rules to values among "
                         f"{ {k: list(v) for k, v in SAMPLER_RULES.items()} }")


def sampler_rule(conventions, rule: str) -> str:
    """The value of ``rule`` under ``conventions``: the declared one, else the spec's."""
    return conventions.sampler_rules.get(rule, SAMPLER_RULES[rule][0])


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
