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


#: Reads a property makes to check the buffer, not steps of the program:
#: a recorded buffer leaves them out of the snippet unless they raised.
OBSERVERS = frozenset({"contents", "stored_priority", "max_priority"})


class Trace:
    """Records what a test did to a buffer so a failure can be replayed.

    ``buf = trace.wrap(impl.make(spec))`` (or ``trace.make(spec, "twin")`` for
    a further buffer) returns a proxy that records each method call on the
    buffer with its arguments (:mod:`rbcheck.harness.repro` renders them);
    ``layout = trace.source("layout", layout)`` declares a helper whose
    results are named by the call that made them; ``trace.let`` declares a
    value the snippet needs, ``trace.need`` an import, ``trace.directory`` a
    scratch directory, ``trace.note`` a comment and ``trace.op`` a line of
    setup that is not a call on a buffer (``os.truncate(...)``).
    """

    def __init__(self, adapter: Any, spec: Any = None) -> None:
        self.adapter = loadable_name(adapter)
        self.impl = None if isinstance(adapter, str) else adapter
        self.spec = spec
        self.lets: list[str] = []
        self.imports: list[str] = []
        self.ops: list[Any] = []
        self._names: dict[int, tuple[Any, Any, str]] = {}  # id -> (object, snapshot, expr)
        self._dirs: list[tuple[str, str]] = []
        self._placeholders = 0
        self._bind: str | None = None

    # -- recording --------------------------------------------------------
    def let(self, name: str, value: Any, expr: str | None = None) -> Any:
        self.lets.append(f"{name} = {expr if expr is not None else repr(value)}")
        if expr is not None or not isinstance(value, (int, float, str, bool, type(None), tuple)):
            self.name(value, name)
        return value

    def need(self, statement: str) -> None:
        """An import the snippet needs (e.g. ``"from rbcheck.reference import ChainEnv"``)."""
        if statement not in self.imports:
            self.imports.append(statement)

    def name(self, obj: Any, expr: str) -> Any:
        """Render ``obj`` as ``expr`` when it is passed to a recorded buffer
        (while it still holds the values it had when named)."""
        if obj is None or isinstance(obj, (int, float, str, bool, bytes, tuple, frozenset)):
            return obj
        snapshot = _snapshot(obj)
        self._names[id(obj)] = (obj, snapshot, expr)
        return obj

    def named(self, obj: Any) -> str | None:
        """The name ``obj`` was given, if it still holds the values it had then."""
        entry = self._names.get(id(obj))
        if entry is None or entry[0] is not obj:
            return None
        return entry[2] if _unchanged(obj, entry[1]) else None

    def named_tensordicts(self) -> list[tuple[Any, str]]:
        return [(obj, expr) for obj, snap, expr in self._names.values()
                if isinstance(obj, TensorDictBase) and _unchanged(obj, snap)]

    def source(self, name: str, value: Any, expr: str | None = None) -> Any:
        """Declare ``name = <repr of value>`` and return a maker whose results
        are named by the call that made them (``layout.batch(0, 3)``)."""
        from rbcheck.harness.repro import Source

        self.lets.append(f"{name} = {expr if expr is not None else repr(value)}")
        return Source(value, self, name)

    def directory(self, path: Any, name: str = "tmp") -> Any:
        """A scratch directory: paths under it are written ``name / '...'``,
        and the snippet makes its own (``tempfile.mkdtemp()``)."""
        self.need("import tempfile")
        self.need("from pathlib import Path")
        self.lets.append(f"{name} = Path(tempfile.mkdtemp())")
        self._dirs.append((str(path), name))
        return path

    def path(self, path: Any) -> str:
        """A path as the snippet writes it (under a declared directory if it is)."""
        text = str(path)
        for root, name in sorted(self._dirs, key=lambda d: -len(d[0])):
            if text == root:
                return name
            if text.startswith(root.rstrip("/") + "/"):
                return f"{name} / {text[len(root.rstrip('/')) + 1:]!r}"
        self.need("from pathlib import Path")
        return f"Path({text!r})"

    def placeholder(self, value: Any) -> str:
        from rbcheck.harness.repro import describe

        self._placeholders += 1
        name = f"arg{self._placeholders}"
        self.lets.append(f"{name} = ...  # <{describe(value)}>: not written out; name it with trace.name")
        self._names[id(value)] = (value, _snapshot(value), name)
        return name

    def op(self, text: str) -> None:
        """A line of setup that is not a call on a buffer (a buffer's calls are
        recorded by :meth:`wrap`)."""
        self.ops.append(text)

    def note(self, text: str) -> None:
        """A comment in the snippet."""
        self.ops.append("\n".join("# " + line for line in str(text).splitlines()))

    def bind(self, target: str = "") -> None:
        """Write the next recorded call (an observer such as ``contents()``
        too) as ``<target> = <call>``, and name its result so later calls
        render it by that name: ``trace.bind("rows, info")`` then
        ``buf.sample(4)`` is written ``rows, info = buf.sample(4)``;
        ``trace.bind()`` writes the next call without binding it (an
        observer the snippet should show)."""
        self._bind = target

    def _bound(self, out: Any, target: str) -> None:
        names = [n.strip() for n in target.split(",") if n.strip()]
        if len(names) == 1 and "," not in target:
            self.name(out, names[0])
        elif isinstance(out, (tuple, list)) and len(out) == len(names):
            for value, name in zip(out, names, strict=True):
                self.name(value, name)

    def render(self, value: Any) -> str:
        from rbcheck.harness.repro import render

        return render(value, self)

    def call(self, var: str, method: str, fn: Any, args: tuple, kwargs: dict) -> Any:
        """Record ``var.method(*args, **kwargs)``, then make the call."""
        from rbcheck.harness.repro import Call, _Iterator

        parts = [self.render(a) for a in args] + [f"{k}={self.render(v)}" for k, v in kwargs.items()]
        if method == "iterate":
            self.need("import itertools")
        entry = Call(f"{var}.{method}({', '.join(parts)})")
        target, self._bind = self._bind, None
        # written: a bound call (or one asked for), or any call but a read the property checks
        # (an observer), which is written only if it raised
        written = target is not None or method not in OBSERVERS
        if target is not None:
            entry.bound = target
        if written:
            self.ops.append(entry)
        try:
            out = fn(*args, **kwargs)
        except Exception as err:
            entry.raised = type(err).__name__
            if not written:
                self.ops.append(entry)
            raise
        if target:
            self._bound(out, target)
        if target is not None or not written:
            return out
        if method == "iterate" or type(out).__name__ == "generator":
            self.need("import itertools")
            return _Iterator(out, entry)
        return out

    def wrap(self, buf: Any, var: str = "buf") -> Any:
        """A recording proxy of ``buf`` (made by the snippet's header when
        ``var`` is ``"buf"``; see :meth:`make` for any other)."""
        from rbcheck.harness.repro import Recorded

        return Recorded(buf, self, var)

    def make(self, spec: Any = None, var: str = "buf", impl: Any = None) -> Any:
        """``var = load_adapter(...).make(spec)``, recorded, as a recording proxy."""
        spec = self.spec if spec is None else spec
        impl = impl if impl is not None else self.impl
        if impl is None:
            from rbcheck.harness.adapters import load_adapter

            impl = load_adapter(self.adapter)
        self.ops.append(f"{var} = load_adapter({self.adapter!r}).make({spec!r})")
        return self.wrap(impl.make(spec), var)

    # -- output ------------------------------------------------------------
    @property
    def last_call(self) -> str:
        if not self.ops:
            return "make"
        last = self.ops[-1]
        return last.text if hasattr(last, "text") else str(last)

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
            *_runs([str(op) for op in self.ops]),
        ]
        return "\n".join(lines)


def _runs(ops: list[str]) -> list[str]:
    """The ops, each run of one line repeated written as a loop."""
    out: list[str] = []
    i = 0
    while i < len(ops):
        j = i
        while j + 1 < len(ops) and ops[j + 1] == ops[i]:
            j += 1
        count = j - i + 1
        single = "\n" not in ops[i] and not ops[i].startswith("#")
        out.append(f"for _ in range({count}): {ops[i]}" if count > 2 and single else ops[i])
        if not (count > 2 and single):
            out.extend(ops[i + 1:j + 1])
        i = j + 1
    return out


def _snapshot(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, TensorDictBase):
        return {k: v.detach().clone() for k, v in
                ((k, obj.get(k)) for k in obj.keys(include_nested=True, leaves_only=True))
                if isinstance(v, torch.Tensor)}
    return None


def _unchanged(obj: Any, snapshot: Any) -> bool:
    from rbcheck.harness.repro import _same_bits

    if isinstance(obj, torch.Tensor):
        return _same_bits(obj.detach(), snapshot)
    if isinstance(obj, TensorDictBase):
        leaves = {k: obj.get(k) for k in obj.keys(include_nested=True, leaves_only=True)}
        return leaves.keys() == snapshot.keys() and all(_same_bits(leaves[k].detach(), snapshot[k]) for k in leaves)
    return True


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
