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

import math
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

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
]


# --------------------------------------------------------------------------
# repro
# --------------------------------------------------------------------------


def _fmt_tensor(t: torch.Tensor, limit: int = 16) -> str:
    if t.numel() <= limit:
        body = repr(t.detach().cpu().tolist())
        return f"torch.tensor({body}, dtype=torch.{str(t.dtype).split('.')[-1]})"
    return f"<tensor shape={list(t.shape)} dtype={t.dtype} device={t.device}>"


def fmt(x: Any) -> str:
    """A short, mostly re-evaluable rendering of a value for messages."""
    if isinstance(x, torch.Tensor):
        return _fmt_tensor(x)
    if isinstance(x, TensorDictBase):
        keys = sorted(str(k) for k in x.keys(include_nested=True, leaves_only=True))
        return f"<TensorDict batch={list(x.batch_size)} keys={keys}>"
    if isinstance(x, float):
        return repr(x)
    return repr(x)


def loadable_name(adapter: Any) -> str:
    """The name ``load_adapter`` accepts for ``adapter``: the string it was
    loaded from (``Adapter.source``, e.g. ``"pkg.module:factory"``), else
    its own name."""
    if isinstance(adapter, str):
        return adapter
    return str(getattr(adapter, "source", "") or getattr(adapter, "name", adapter))


class Trace:
    """Records what a test did to a buffer so a failure can be replayed.

    ``Trace(adapter_name, spec)`` then ``trace.op("buf.extend(layout.batch(0, 3))")``
    after (or before) each call; ``trace.wrap(buf)`` returns a proxy that
    records every method call itself. ``trace.let("layout", layout)`` declares
    a helper variable the snippet needs.
    """

    def __init__(self, adapter: Any, spec: Any = None) -> None:
        self.adapter = loadable_name(adapter)
        self.spec = spec
        self.lets: list[str] = []
        self.imports: list[str] = []
        self.ops: list[str] = []
        self._names: dict[int, str] = {}

    # -- recording --------------------------------------------------------
    def let(self, name: str, value: Any, expr: str | None = None) -> Any:
        self.lets.append(f"{name} = {expr if expr is not None else repr(value)}")
        return value

    def need(self, statement: str) -> None:
        """An import the snippet needs (e.g. ``"from rbcheck.reference import ChainEnv"``)."""
        if statement not in self.imports:
            self.imports.append(statement)

    def name(self, obj: Any, expr: str) -> Any:
        """Render ``obj`` as ``expr`` when it is passed to a wrapped buffer."""
        self._names[id(obj)] = expr
        return obj

    def op(self, text: str) -> None:
        self.ops.append(text)

    def render(self, value: Any) -> str:
        return self._names.get(id(value)) or fmt(value)

    def wrap(self, buf: Any, var: str = "buf") -> Any:
        return _Traced(buf, self, var)

    # -- output ------------------------------------------------------------
    @property
    def last_call(self) -> str:
        return self.ops[-1] if self.ops else "make"

    def snippet(self) -> str:
        lines = [
            "from rbcheck.harness.adapters import load_adapter",
            "from rbcheck.harness.protocol import BufferSpec, Conventions",
            "from rbcheck.harness.strategies import *",
            "from math import inf, nan  # as repr() writes bad floats in a spec",
            "import torch",
            *self.imports,
            *self.lets,
            f"buf = load_adapter({self.adapter!r}).make({self.spec!r})",
            *self.ops,
        ]
        return "\n".join(lines)


class _Traced:
    """A proxy that records each method call on the wrapped buffer."""

    def __init__(self, inner: Any, trace: Trace, var: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "_var", var)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or name.startswith("_"):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            parts = [self._trace.render(a) for a in args]
            parts += [f"{k}={self._trace.render(v)}" for k, v in kwargs.items()]
            self._trace.op(f"{self._var}.{name}({', '.join(parts)})")
            return value(*args, **kwargs)

        return call

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def inner(self) -> Any:
        return self._inner


# --------------------------------------------------------------------------
# failures
# --------------------------------------------------------------------------


class PropertyFailure(AssertionError):
    """A property's verdict on an implementation: ``<what>=<got>, but should
    be <expected>``, the call that showed it, and a snippet that replays it.
    The fields reach the report and the results JSON as they are (the plugin
    reads them from the exception); ``str()`` is the whole message, repro
    included, as pytest prints it. Reports name it by its builtin base
    (``reported_as``), so a known-failure pattern ``^AssertionError: ...``
    matches it as it always has."""

    reported_as = "AssertionError"

    def __init__(self, what: str, got: str, expected: str, call: str = "", detail: str = "",
                 repro: str = "", adapter: str = ""):
        self.what, self.got, self.expected, self.call = what, got, expected, call
        self.detail, self.repro, self.adapter = detail, repro, adapter
        super().__init__(self.own_message + self.repro_text)

    @property
    def own_message(self) -> str:
        """The message without the repro snippet (what known failures match)."""
        msg = f"{self.what}={self.got}, but should be {self.expected}"
        if self.call:
            msg += f" [{self.call}]"
        if self.detail:
            msg += f"\n  {self.detail}"
        return msg

    @property
    def repro_text(self) -> str:
        return f"\nRepro (adapter {self.adapter!r}):\n" + _indent(self.repro) if self.repro else ""


class ModelError(ValueError):
    """The model has no answer for a check (a harness bug, not a verdict);
    carries the call and the repro snippet as :class:`PropertyFailure` does."""

    reported_as = "ValueError"

    def __init__(self, message: str, call: str = "", repro: str = "", adapter: str = ""):
        self.message, self.call, self.repro, self.adapter = message, call, repro, adapter
        self.own_message = message + (f" [{call}]" if call else "")
        tail = f"\nRepro (adapter {adapter!r}):\n" + _indent(repro) if repro else ""
        super().__init__(self.own_message + tail)


def fail(what: str, got: Any, expected: Any, trace: Trace | None = None, detail: str = "") -> None:
    """Raise :class:`PropertyFailure` (``"<what>=<got>, but should be <expected> [<call>(<spec>)]"``)."""
    got_s = got if isinstance(got, str) and got.startswith("<") else fmt(got)
    exp_s = expected if isinstance(expected, str) else fmt(expected)
    if trace is None:
        raise PropertyFailure(what, got_s, exp_s, detail=detail)
    raise PropertyFailure(what, got_s, exp_s, f"{trace.last_call}({trace.spec!r})", detail,
                          trace.snippet(), trace.adapter)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


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
    n = counts.sum().item()
    zero = probs <= 0
    if bool((counts[zero] > 0).any()):
        cells = torch.nonzero(zero & (counts > 0)).reshape(-1)[:8].tolist()
        fail(f"{what}: draws of probability-0 cells {cells}", counts[zero].sum().item(), 0, trace)
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
    if p < false_alarm:
        worst = max(
            range(len(exp_cells)), key=lambda j: (obs_cells[j] - exp_cells[j]) ** 2 / exp_cells[j]
        )
        fail(
            f"{what}: chi-square p-value",
            f"<{p:.3g} (stat {stat:.1f}, {len(exp_cells) - 1} dof, n={int(n)})>",
            f">= {false_alarm:g} (the stated false-alarm rate)",
            trace,
            f"worst cell: observed {obs_cells[worst]:.0f}, expected {exp_cells[worst]:.1f}",
        )
    return float(p)


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

    if p <= 0.0 or p >= 1.0:
        exact = 0 if p <= 0.0 else n
        if k != exact:
            fail(what, k, exact, trace, f"probability is exactly {p}")
        return 1.0
    pv = stats.binomtest(int(k), int(n), float(p)).pvalue
    if pv < false_alarm:
        fail(
            what,
            f"<{k} of {n}>",
            f"about {p * n:.1f} of {n} (binomial p-value {pv:.3g} < false-alarm rate {false_alarm:g})",
            trace,
        )
    return float(pv)
