"""What a distributional check saw, kept small for the report: observed and
expected counts in at most :data:`MAX_BINS` bins, each bin's acceptance band,
the p-value and the false-alarm rate (``harness.assertions``' chi-square and
binomial checks call :func:`observe`).

A check run inside a test appends its observation to a short per-process list
(the last :data:`KEEP` of them); the plugin takes the list when the test's
call ends (``plugin/results.py``) and stores it in the test's record as
``distributions``, the failing one first. A failing check also leaves its
observation on the exception (``frequencies``), so the record of a failure
always holds the draws that failed.

The band of a bin is the range of counts a correct implementation shows in
that bin with probability at least ``1 - false_alarm / bins`` (binomial
quantiles, Bonferroni over the bins): a picture of where the counts should
fall. The verdict is the chi-square (or binomial) p-value, not the band.
Cost: O(cells) per check, plus one vectorised quantile call over the bins.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["MAX_BINS", "KEEP", "bins", "binned", "observe", "take", "clear"]

#: At most this many bins per observation (cells beyond are summed in runs of neighbours).
MAX_BINS = 40
#: Observations kept per test (the last ones).
KEEP = 3

_seen: deque[dict[str, Any]] = deque(maxlen=KEEP)


def bins(cells: int) -> tuple[list[str], list[tuple[int, int]]]:
    """``(labels, [(lo, hi), ...])``: the cells as they are when at most
    :data:`MAX_BINS`, else runs of neighbouring cells (``"lo-hi"``, cell
    numbers in the flattened order), at most :data:`MAX_BINS` of them."""
    width = max(1, -(-cells // MAX_BINS))
    edges = [(lo, min(lo + width, cells) - 1) for lo in range(0, cells, width)]
    return [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in edges], edges


def binned(observed: list[float], expected: list[float]) -> tuple[list[str], list[float], list[float]]:
    """:func:`bins` applied to plain lists: ``(labels, observed, expected)``."""
    labels, edges = bins(len(observed))
    return (labels, [sum(observed[lo:hi + 1]) for lo, hi in edges],
            [sum(expected[lo:hi + 1]) for lo, hi in edges])


def _band(n: int, expected: list[float], false_alarm: float) -> tuple[list[float], list[float]]:
    from scipy import stats

    if n <= 0:
        return [0.0] * len(expected), [0.0] * len(expected)
    alpha = false_alarm / max(len(expected), 1)
    probs = [min(max(e / n, 0.0), 1.0) for e in expected]
    low = stats.binom.ppf(alpha / 2, n, probs)
    high = stats.binom.isf(alpha / 2, n, probs)
    return [float(x) for x in low], [float(x) for x in high]


def observe(what: str, kind: str, observed: list[float], expected: list[float], *, false_alarm: float,
            p_value: float | None, passed: bool, statistic: str = "",
            labels: list[str] | None = None, cells: int | None = None) -> dict[str, Any]:
    """Record one distributional check (module doc) and return the record:
    ``{"what", "kind", "labels", "observed", "expected", "low", "high", "n",
    "cells", "p_value", "false_alarm", "passed", "statistic"}``; ``labels``
    names the bins ``observed`` already is in, ``cells`` how many cells they came from."""
    if labels is not None and len(labels) == len(observed) and len(observed) <= MAX_BINS:
        names, obs, exp = list(labels), list(observed), list(expected)
    else:
        names, obs, exp = binned(observed, expected)
    n = int(round(sum(observed)))
    low, high = _band(n, exp, false_alarm)
    record = {
        "what": what, "kind": kind, "labels": names,
        "observed": [round(float(x), 3) for x in obs], "expected": [round(float(x), 3) for x in exp],
        "low": low, "high": high, "n": n, "cells": len(observed) if cells is None else int(cells),
        "p_value": None if p_value is None else float(f"{p_value:.4g}"),
        "false_alarm": false_alarm, "passed": bool(passed), "statistic": statistic,
    }
    _seen.append(record)
    return record


def take() -> list[dict[str, Any]]:
    """The observations recorded since the last :func:`take` or :func:`clear`, failing first."""
    out = sorted(_seen, key=lambda r: r["passed"])
    _seen.clear()
    return out


def clear() -> None:
    _seen.clear()
