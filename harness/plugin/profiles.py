"""Hypothesis settings of a run: the profiles (ci, dev, thorough) and the
budget for shrinking one failing property."""

from __future__ import annotations

import os

import pytest

from rbcheck.harness.adapters import is_first_party

#: seconds Hypothesis may shrink one failing property of a third party
THIRD_PARTY_SHRINK_SECONDS = 1.0


def register_profiles() -> None:
    """ci: few examples, derandomized, no database (reproducible and fast on
    2 cores); dev: the default; thorough: many examples, for a nightly run."""
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile(
        "ci",
        max_examples=20,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=quiet,
    )
    settings.register_profile(
        "dev", max_examples=50, deadline=None, print_blob=True, suppress_health_check=quiet
    )
    settings.register_profile(
        "thorough", max_examples=1000, deadline=None, print_blob=True, suppress_health_check=quiet
    )



def shrink_budget(config: pytest.Config, impl_name: str) -> float | None:
    """Seconds of shrinking per failing property: ``--rbcheck-shrink-seconds``
    / ``RBCHECK_SHRINK_SECONDS``, else None (Hypothesis' own limit) for
    rbcheck's own implementations and THIRD_PARTY_SHRINK_SECONDS for others:
    a buffer that fails much would otherwise spend minutes minimising
    counterexamples (each failing property may shrink for up to 5 minutes)."""
    raw = config.getoption("rbcheck_shrink_seconds", default=None) or os.environ.get("RBCHECK_SHRINK_SECONDS")
    if raw is None or raw == "":
        return None if is_first_party(impl_name) else THIRD_PARTY_SHRINK_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise pytest.UsageError(f"rbcheck shrink seconds={raw!r}, but should be a number >= 0")
    return value


def apply_shrink_budget(seconds: float | None) -> None:
    """Bound Hypothesis' shrinking of one failing test to ``seconds`` (its
    engine's per-test shrink deadline); 0 drops the shrink phase from the
    loaded profile. None leaves Hypothesis' defaults."""
    if seconds is None:
        return
    from hypothesis import Phase, settings
    from hypothesis.internal.conjecture import engine

    if seconds == 0 or not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        phases = tuple(p for p in settings().phases if p is not Phase.shrink)
        settings.register_profile("rbcheck-no-shrink", settings(settings(), phases=phases))
        settings.load_profile("rbcheck-no-shrink")
        return
    engine.MAX_SHRINKING_SECONDS = seconds
    report = getattr(engine, "report", None)
    if callable(report) and not getattr(report, "rbcheck", False):
        def budget_report(text, *args, **kwargs):  # Hypothesis' note says "five minutes"
            if isinstance(text, str) and text.startswith("WARNING: Hypothesis has spent more than five"):
                text = (f"rbcheck: shrinking stopped after its budget of {engine.MAX_SHRINKING_SECONDS:g} s "
                        "(--rbcheck-shrink-seconds): the counterexample below may not be minimal")
            return report(text, *args, **kwargs)

        budget_report.rbcheck = True
        engine.report = budget_report
