"""Tolerance checks: :func:`assert_close` (float results against a float64
model) and the bounds tied to a dtype's own error (:func:`priority_tolerance`,
:func:`sum_tolerance`, :func:`weight_tolerance`), each carrying the text of
its derivation. Re-exported by :mod:`rbcheck.harness.assertions`, where the
kinds of check are described.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rbcheck.harness.failure import ModelError, Trace, fail, fmt

__all__ = ["Tolerance", "assert_close", "priority_tolerance", "sum_tolerance", "weight_tolerance"]


# --------------------------------------------------------------------------
# tolerances tied to a dtype's own error
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """A bound ``|got - expected| <= atol + rtol * |expected|`` and the text
    that derives it (stated in failure messages and property docs)."""

    rtol: float
    atol: float
    bound: str

    def __str__(self) -> str:
        return self.bound


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


#: ulps of the declared dtype a stored priority may be off: the sum p + eps
#: (1/2 ulp), pow (at most 2 ulps in common libms, times alpha's effect on the
#: input error) and the final rounding (1/2 ulp), with headroom.
PRIORITY_ULPS = 8


def priority_tolerance(dtype: torch.dtype, alpha: float = 1.0) -> Tolerance:
    """Stored priority ``(p + eps) ** alpha`` computed in ``dtype`` vs the
    float64 closed form from the same (already rounded) inputs:
    ``rtol = 8 * max(1, alpha) * eps(dtype)`` (alpha scales the input's
    relative error) and, for results in the subnormal range where the
    spacing is absolute, ``atol = 4`` subnormal ulps (``4 * tiny * eps``).
    float32: rtol 9.5e-07, atol 5.6e-45; float64: rtol 1.8e-15. A double
    transform is off by orders of magnitude more
    (tests/harness/test_tolerances.py)."""
    scale = max(1.0, float(alpha))
    rtol = PRIORITY_ULPS * scale * _eps(dtype)
    atol = 4 * float(torch.finfo(dtype).tiny) * _eps(dtype)
    factor = f"{PRIORITY_ULPS} * {scale:g}" if scale != 1.0 else f"{PRIORITY_ULPS}"
    return Tolerance(
        rtol, atol, f"rtol = {factor} * eps({_name(dtype)}) = {rtol:.2g}, atol = 4 subnormal ulps = {atol:.2g}"
    )


def sum_tolerance(dtype: torch.dtype, n: int) -> Tolerance:
    """A sum of ``n`` non-negative values kept in a tree of ``dtype``: each
    level rounds once, ``rtol = (ceil(log2 n) + 1) * eps(dtype)`` on top of
    the leaves' own :func:`priority_tolerance`."""
    levels = max(1, math.ceil(math.log2(max(n, 1)))) + 1
    rtol = levels * _eps(dtype) + priority_tolerance(dtype).rtol
    return Tolerance(
        rtol, 0.0, f"rtol = ({levels} levels + {PRIORITY_ULPS}) * eps({_name(dtype)}) = {rtol:.2g}"
    )


def weight_tolerance(
    dtype: torch.dtype, n: int, weight_dtype: torch.dtype = torch.float32
) -> Tolerance:
    """Importance weights ``(N P_i) ** -beta / norm`` from trees of ``dtype``
    with ``n`` slots, returned as ``weight_dtype``: two leaves and the total
    (:func:`sum_tolerance`) enter the ratio, beta <= 1 does not enlarge it,
    the pow and the division add a few ulps, and the result is rounded to
    ``weight_dtype``: ``rtol = 2 * rtol_sum(dtype, n) + 4 * eps(weight_dtype)``,
    ``atol = eps(weight_dtype) * 2**-10`` for weights near 0."""
    wd = weight_dtype if weight_dtype.is_floating_point else torch.float64
    rtol = 2 * sum_tolerance(dtype, n).rtol + 4 * _eps(wd)
    atol = _eps(wd) * 2.0**-10
    return Tolerance(
        rtol,
        atol,
        f"rtol = 2 * sum rtol({_name(dtype)}, N={n}) + 4 * eps({_name(wd)}) = {rtol:.2g}, "
        f"atol = eps({_name(wd)}) / 1024 = {atol:.2g}",
    )


def _check_bound(name: str, value: Any) -> None:
    """A tolerance must be finite and >= 0: ``inf`` (or NaN) accepts anything."""
    t = torch.as_tensor(value, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(
            f"assert_close: {name}={value!r}, but should be finite and >= 0 "
            f"(an infinite or NaN bound accepts anything: a harness bug)"
        )


def assert_close(
    what: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    trace: Trace | None = None,
    *,
    rtol: float | None = None,
    atol: float = 0.0,
    tol: Tolerance | None = None,
) -> None:
    """Tolerance: ``|got - expected| <= atol + rtol * |expected|`` elementwise,
    compared in float64; shapes must match. Pass ``tol`` (a
    :class:`Tolerance`) to state the bound's derivation in the message.

    Non-finite values, so that nothing passes by construction:

    * ``got`` NaN fails;
    * an expected ``+inf`` / ``-inf`` is matched by the same infinity only
      (``rtol * inf`` is an infinite bound, which would accept anything);
    * a finite expected value is never matched by an infinity;
    * an expected NaN is refused with a ``ValueError`` (a harness error, not a
      verdict): a model without an answer cannot decide the check, and letting
      NaN match NaN would pass a buffer's NaN wherever the model breaks too;
    * ``rtol`` / ``atol`` must be finite and ``>= 0`` (``ValueError``)."""
    if tol is not None:
        rtol, atol = tol.rtol, tol.atol
        if isinstance(rtol, torch.Tensor):
            rtol = rtol.detach().cpu().to(torch.float64)
    if rtol is None:
        raise ValueError("assert_close: rtol=None, but should be given (or tol=Tolerance(...))")
    _check_bound("rtol", rtol)
    _check_bound("atol", atol)
    g = torch.as_tensor(got).detach().cpu().to(torch.float64)
    e = torch.as_tensor(expected).detach().cpu().to(torch.float64)
    if g.shape != e.shape:
        fail(f"{what}.shape", list(g.shape), str(list(e.shape)), trace)
    if bool(torch.isnan(e).any()):
        where = torch.nonzero(torch.isnan(e))[:4].tolist()
        msg = (
            f"assert_close: expected {what} (NaN at {where})={fmt(e)}, but should be finite or "
            f"+-inf: the model has no answer there, so the check cannot decide (a harness bug)"
        )
        if trace is None:
            raise ModelError(msg)
        raise ModelError(msg, f"{trace.last_call}({trace.spec!r})", trace.snippet(), trace.adapter)
    if bool(torch.isnan(g).any()):
        fail(f"{what} (contains NaN)", g, e, trace)
    inf_g, inf_e = torch.isinf(g), torch.isinf(e)
    # an infinity is matched by the same infinity only, on either side
    wrong_inf = (inf_g | inf_e) & ~(g == e)
    if bool(wrong_inf.any()):
        i = torch.nonzero(wrong_inf)[0].tolist()
        pos = tuple(i)
        fail(what, g, e, trace,
             f"an infinity is matched by the same infinity only; at {i}: got {g[pos].item()!r}, "
             f"expected {e[pos].item()!r}")
    finite = ~inf_e
    err = torch.where(finite, (g - e).abs(), torch.zeros_like(e))
    bound = atol + rtol * torch.where(finite, e.abs(), torch.zeros_like(e))
    if bound.shape != e.shape:
        bound = bound.expand(e.shape)
    bad = err > bound
    if bool(bad.any()):
        i = torch.nonzero(bad)[0].tolist()
        pos = tuple(i)
        fail(
            what,
            g,
            e,
            trace,
            f"tolerance {tol.bound if tol is not None else f'rtol={rtol:g} atol={atol:g}'}; "
            f"worst |err|={err[bad].max().item():.3g} "
            f"(relative {(err[bad] / e.abs()[bad].clamp_min(1e-300)).max().item():.3g}); "
            f"at {i}: got {g[pos].item()!r}, expected {e[pos].item()!r}",
        )
