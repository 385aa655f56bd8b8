"""How a property's failure explains itself: :func:`fail` raises
:class:`PropertyFailure` (``<what>=<got>, but should be <expected> [<call>(<spec>)]``
plus a repro snippet recorded by :class:`Trace`). The checks built on it are
in :mod:`rbcheck.harness.assertions` (exact, distributional) and
:mod:`rbcheck.harness.tolerance` (float results against a float64 model);
import them from ``assertions``, which re-exports this module's names.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["Trace", "PropertyFailure", "ModelError", "fail", "fmt", "loadable_name"]


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


def fail(what: str, got: Any, expected: Any, trace: Trace | None = None, detail: str = "", *,
         call: str = "") -> None:
    """Raise :class:`PropertyFailure` (``"<what>=<got>, but should be <expected> [<call>(<spec>)]"``).
    Without a ``trace``, ``call`` names where it happened (e.g. a benchmark's
    ``"Sample(torchrl)"``)."""
    got_s = got if isinstance(got, str) and got.startswith("<") else fmt(got)
    exp_s = expected if isinstance(expected, str) else fmt(expected)
    if trace is None:
        raise PropertyFailure(what, got_s, exp_s, call, detail=detail)
    raise PropertyFailure(what, got_s, exp_s, f"{trace.last_call}({trace.spec!r})", detail,
                          trace.snippet(), trace.adapter)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
