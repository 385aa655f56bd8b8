"""Comparison helpers whose failures explain themselves.

Every failure reads ``<what>=<got>, but should be <expected> [<call>(<spec>)]``
followed by a repro snippet: the adapter (the ``--impl`` string the run was
given), the :class:`BufferSpec` and the operations the test performed, as
Python that runs as pasted in a fresh interpreter (tests/meta runs each one).

Kinds of check (docs/design.md):

* exact -- :func:`assert_tensor_equal`, :func:`assert_td_equal`,
  :func:`assert_same` (values, dtype, device, shape; bit-identical; NaN is a
  failure, never "equal").
* tolerance -- :func:`assert_close` (float32 results vs a float64 model;
  an infinity matches only the same infinity, an expected NaN is refused as
  a harness error).
  Tolerances tied to a dtype's own error come from one place:
  :func:`priority_tolerance` (stored priorities, max priority),
  :func:`sum_tolerance` (tree sums, grows with log2 N) and
  :func:`weight_tolerance` (importance weights); each carries the text of
  its bound (``"rtol = 8 * eps(float32) = 9.5e-07"``), which the failure
  message and the property's doc state.
* distributional -- :func:`assert_chi_square`, :func:`assert_binomial`: the
  test states its false-alarm rate (probability of failing on a correct
  implementation) and the bound is derived from it; a cell with probability
  0 that is ever hit fails outright.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

# the failure core and the tolerance checks live in their own modules; this
# module is where properties import every check from
from rbcheck.harness.failure import ModelError, PropertyFailure, Trace, fail, fmt, loadable_name
from rbcheck.harness.frequencies import bins, observe
from rbcheck.harness.tolerance import (
    Tolerance,
    assert_close,
    priority_tolerance,
    sum_tolerance,
    weight_tolerance,
)

__all__ = [
    "Trace",
    "fail",
    "assert_same",
    "assert_tensor_equal",
    "assert_td_equal",
    "assert_close",
    "Tolerance",
    "priority_tolerance",
    "sum_tolerance",
    "weight_tolerance",
    "assert_chi_square",
    "assert_binomial",
    "fmt",
    "PropertyFailure",
    "ModelError",
    "loadable_name",
]


# --------------------------------------------------------------------------
# exact
# --------------------------------------------------------------------------


def assert_same(what: str, got: Any, expected: Any, trace: Trace | None = None) -> None:
    """Exact equality of plain values, type included (``1.0`` is not ``1``)."""
    if type(got) is not type(expected):
        fail(f"type({what})", type(got).__name__, type(expected).__name__, trace, f"{what}={got!r}")
    if got != expected:
        fail(what, got, expected, trace)


def assert_tensor_equal(
    what: str,
    got: Any,
    expected: torch.Tensor,
    trace: Trace | None = None,
    *,
    check_device: bool = True,
) -> None:
    """Exact: same dtype, device, shape, bit-identical values, no NaN."""
    if not isinstance(got, torch.Tensor):
        fail(f"type({what})", type(got).__name__, "torch.Tensor", trace)
    if got.dtype != expected.dtype:
        fail(f"{what}.dtype", str(got.dtype), str(expected.dtype), trace)
    if check_device and got.device != expected.device:
        fail(f"{what}.device", str(got.device), str(expected.device), trace)
    if got.shape != expected.shape:
        fail(f"{what}.shape", list(got.shape), str(list(expected.shape)), trace)
    g, e = got.detach().cpu(), expected.detach().cpu()
    if g.is_floating_point() and bool(torch.isnan(g).any()):
        where = torch.nonzero(torch.isnan(g))[:4].tolist()
        fail(f"{what} (NaN at {where})", g, expected, trace)
    if g.dtype is torch.bool or g.numel() == 0:
        same = torch.equal(g, e)
    else:
        gb = g.contiguous().reshape(-1).view(torch.uint8)
        eb = e.contiguous().reshape(-1).view(torch.uint8)
        same = torch.equal(gb, eb)
    if not same:
        diff = (
            g != e
            if not g.is_floating_point()
            else ~((g == e) & (torch.signbit(g) == torch.signbit(e)))
        )
        where = torch.nonzero(diff.reshape(g.shape) if g.dim() else diff.reshape(()))
        first = where[:4].tolist()
        detail = f"first differing positions {first}" if first else "differs bitwise"
        if g.dim() and len(first):
            pos = tuple(first[0])
            detail += f"; at {list(pos)}: got {g[pos].item()!r}, expected {e[pos].item()!r}"
        fail(what, g, expected, trace, detail)


def _leaves(td: TensorDictBase) -> dict:
    return {k: v for k, v in td.items(include_nested=True, leaves_only=True)}


def assert_td_equal(
    what: str,
    got: Any,
    expected: TensorDictBase,
    trace: Trace | None = None,
    *,
    check_device: bool = True,
) -> None:
    """Exact: same batch size, same leaf keys (nested included), every leaf
    bit-identical with the same dtype and device."""
    if not isinstance(got, TensorDictBase):
        fail(f"type({what})", type(got).__name__, "TensorDictBase", trace)
    if got.batch_size != expected.batch_size:
        fail(f"{what}.batch_size", list(got.batch_size), str(list(expected.batch_size)), trace)
    gl, el = _leaves(got), _leaves(expected)
    if set(gl) != set(el):
        fail(
            f"{what}.keys()",
            str(sorted(map(str, gl))),
            str(sorted(map(str, el))),
            trace,
        )
    for key in sorted(el, key=str):
        assert_tensor_equal(f"{what}[{key!r}]", gl[key], el[key], trace, check_device=check_device)


# --------------------------------------------------------------------------
# distributional
# --------------------------------------------------------------------------


def assert_chi_square(
    what: str,
    counts: torch.Tensor,
    probs: torch.Tensor,
    trace: Trace | None = None,
    *,
    false_alarm: float,
    min_expected: float = 5.0,
) -> float:
    """Distributional: Pearson chi-square goodness of fit of ``counts`` to
    ``probs``. Fails when the p-value is below ``false_alarm`` (so a correct
    implementation fails with probability ``false_alarm``). Cells with
    probability 0 must have count 0 (an exact check); cells with an expected
    count below ``min_expected`` are pooled. A test of fewer than two cells
    (after pooling) cannot fail, so it is refused with a ValueError (a
    harness bug: check what such a case can check, exactly, instead).
    Returns the p-value."""
    from scipy import stats

    counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1)
    probs = torch.as_tensor(probs, dtype=torch.float64).reshape(-1)
    if counts.shape != probs.shape:
        fail(f"{what}: number of cells", counts.numel(), probs.numel(), trace)
    n, cells = counts.sum().item(), counts.numel()
    zero = probs <= 0
    seen = _small(counts, probs / probs.sum() * n if bool(probs.sum() > 0) else torch.zeros_like(probs))
    if bool((counts[zero] > 0).any()):
        drawn = torch.nonzero(zero & (counts > 0)).reshape(-1)[:8].tolist()
        freq = observe(what, "chi-square", *seen[1:], false_alarm=false_alarm, p_value=0.0, passed=False,
                       statistic="draws of probability-0 cells", labels=seen[0], cells=cells)
        _with_frequencies(freq, fail, f"{what}: draws of probability-0 cells {drawn}", counts[zero].sum().item(),
                          0, trace)
    probs = probs[~zero] / probs[~zero].sum()
    counts = counts[~zero]
    expected = probs * n
    order = torch.argsort(expected)
    obs_cells, exp_cells = [], []
    acc_o = acc_e = 0.0
    for i in order.tolist():
        acc_o += counts[i].item()
        acc_e += expected[i].item()
        if acc_e >= min_expected:
            obs_cells.append(acc_o)
            exp_cells.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if exp_cells:
            obs_cells[-1] += acc_o
            exp_cells[-1] += acc_e
        else:
            obs_cells.append(acc_o)
            exp_cells.append(acc_e)
    if len(exp_cells) < 2:
        raise ValueError(
            f"{what}: chi-square cells={len(exp_cells)} after pooling (n={int(n)}), but should be "
            f">= 2: a one-cell test always passes (check the draws exactly instead)"
        )
    stat, p = stats.chisquare(obs_cells, exp_cells)
    freq = observe(what, "chi-square", *seen[1:], false_alarm=false_alarm, p_value=float(p), passed=p >= false_alarm,
                   statistic=f"chi-square {stat:.1f}, {len(exp_cells) - 1} dof", labels=seen[0], cells=cells)
    if p < false_alarm:
        worst = max(
            range(len(exp_cells)), key=lambda j: (obs_cells[j] - exp_cells[j]) ** 2 / exp_cells[j]
        )
        _with_frequencies(
            freq, fail,
            f"{what}: chi-square p-value",
            f"<{p:.3g} (stat {stat:.1f}, {len(exp_cells) - 1} dof, n={int(n)})>",
            f">= {false_alarm:g} (the stated false-alarm rate)",
            trace,
            f"worst cell: observed {obs_cells[worst]:.0f}, expected {exp_cells[worst]:.1f}",
        )
    return float(p)


def _small(counts: torch.Tensor, expected: torch.Tensor) -> tuple[list[str], list[float], list[float]]:
    """The cells in at most ``frequencies.MAX_BINS`` bins of neighbours (what the report draws)."""
    labels, edges = bins(counts.numel())
    if len(edges) == counts.numel():
        return labels, counts.tolist(), expected.tolist()
    sums = []
    for values in (counts, expected):
        total = torch.cat([values.new_zeros(1), values.cumsum(0)])
        sums.append([(total[hi + 1] - total[lo]).item() for lo, hi in edges])
    return labels, sums[0], sums[1]


def _with_frequencies(freq: dict, check: Any, *args: Any) -> None:
    """Run ``check(*args)`` (a :func:`fail`), leaving the observed and
    expected frequencies ``freq`` on the failure it raises (the report draws them)."""
    try:
        check(*args)
    except PropertyFailure as err:
        err.frequencies = freq
        raise


def assert_binomial(
    what: str,
    k: int,
    n: int,
    p: float,
    trace: Trace | None = None,
    *,
    false_alarm: float,
) -> float:
    """Distributional: ``k`` successes in ``n`` draws is consistent with
    probability ``p`` (two-sided exact binomial test at ``false_alarm``)."""
    from scipy import stats

    def seen(pvalue: float | None, passed: bool) -> dict:
        return observe(what, "binomial", [float(k), float(n - k)], [p * n, (1 - p) * n], false_alarm=false_alarm,
                       p_value=pvalue, passed=passed, labels=["successes", "failures"])

    if p <= 0.0 or p >= 1.0:
        exact = 0 if p <= 0.0 else n
        freq = seen(None, k == exact)
        if k != exact:
            _with_frequencies(freq, fail, what, k, exact, trace, f"probability is exactly {p}")
        return 1.0
    pv = stats.binomtest(int(k), int(n), float(p)).pvalue
    freq = seen(float(pv), pv >= false_alarm)
    if pv < false_alarm:
        _with_frequencies(
            freq, fail,
            what,
            f"<{k} of {n}>",
            f"about {p * n:.1f} of {n} (binomial p-value {pv:.3g} < false-alarm rate {false_alarm:g})",
            trace,
        )
    return float(pv)
