"""Comparison helpers whose failures explain themselves.

Every failure reads ``<what>=<got>, but should be <expected> [<call>(<spec>)]``
followed by a repro snippet: the adapter, the :class:`BufferSpec` and the
operations the test performed, as Python you can paste (after
``from harness.strategies import *``).

Kinds of check (DESIGN.md):

* exact -- :func:`assert_tensor_equal`, :func:`assert_td_equal`,
  :func:`assert_same` (values, dtype, device, shape; bit-identical; NaN is a
  failure, never "equal").
* tolerance -- :func:`assert_close` (float32 results vs a float64 model).
* distributional -- :func:`assert_chi_square`, :func:`assert_binomial`: the
  test states its false-alarm rate (probability of failing on a correct
  implementation) and the bound is derived from it; a cell with probability
  0 that is ever hit fails outright.
"""

from __future__ import annotations

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
    """The name ``load_adapter`` accepts for ``adapter``: the ``--impl``
    argument of this pytest run when it selected this adapter (e.g.
    ``"pkg.module:factory"``), else the adapter's own name."""
    try:
        from rbcheck.harness import pytest_plugin

        state = getattr(pytest_plugin, "_current", None)
        if state is not None and state.adapter is adapter:
            return str(state.impl_name)
    except Exception:  # noqa: BLE001 - the name is only used in messages
        pass
    return str(getattr(adapter, "name", adapter))


class Trace:
    """Records what a test did to a buffer so a failure can be replayed.

    ``Trace(adapter_name, spec)`` then ``trace.op("buf.extend(layout.batch(0, 3))")``
    after (or before) each call; ``trace.wrap(buf)`` returns a proxy that
    records every method call itself. ``trace.let("layout", layout)`` declares
    a helper variable the snippet needs.
    """

    def __init__(self, adapter: Any, spec: Any = None) -> None:
        self.adapter = adapter if isinstance(adapter, str) else loadable_name(adapter)
        self.spec = spec
        self.lets: list[str] = []
        self.ops: list[str] = []
        self._names: dict[int, str] = {}

    # -- recording --------------------------------------------------------
    def let(self, name: str, value: Any, expr: str | None = None) -> Any:
        self.lets.append(f"{name} = {expr if expr is not None else repr(value)}")
        return value

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
            "from harness.adapters import load_adapter",
            "from harness.protocol import BufferSpec",
            "from harness.strategies import *",
            "import torch",
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


def fail(what: str, got: Any, expected: Any, trace: Trace | None = None, detail: str = "") -> None:
    """Raise ``AssertionError("<what>=<got>, but should be <expected> [<call>(<spec>)]")``."""
    got_s = got if isinstance(got, str) and got.startswith("<") else fmt(got)
    exp_s = expected if isinstance(expected, str) else fmt(expected)
    msg = f"{what}={got_s}, but should be {exp_s}"
    if trace is not None:
        msg += f" [{trace.last_call}({trace.spec!r})]"
    if detail:
        msg += f"\n  {detail}"
    if trace is not None:
        msg += f"\nRepro (adapter {trace.adapter!r}):\n" + _indent(trace.snippet())
    raise AssertionError(msg)


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


def assert_close(
    what: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    trace: Trace | None = None,
    *,
    rtol: float,
    atol: float = 0.0,
) -> None:
    """Tolerance: ``|got - expected| <= atol + rtol * |expected|`` elementwise,
    compared in float64; shapes must match, NaN fails."""
    g = torch.as_tensor(got).detach().cpu().to(torch.float64)
    e = torch.as_tensor(expected).detach().cpu().to(torch.float64)
    if g.shape != e.shape:
        fail(f"{what}.shape", list(g.shape), str(list(e.shape)), trace)
    if bool(torch.isnan(g).any()):
        fail(f"{what} (contains NaN)", g, e, trace)
    err = (g - e).abs()
    bound = atol + rtol * e.abs()
    bad = err > bound
    # inf == inf is fine
    bad &= ~((g == e) & torch.isinf(e))
    if bool(bad.any()):
        i = torch.nonzero(bad)[0].tolist()
        pos = tuple(i)
        fail(
            what,
            g,
            e,
            trace,
            f"tolerance rtol={rtol:g} atol={atol:g}; worst |err|={err[bad].max().item():.3g}; "
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
    count below ``min_expected`` are pooled. Returns the p-value."""
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
        return 1.0  # one cell: nothing to test beyond the zero cells
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
