"""Repro snippets recorded as the calls are made, the way Hypothesis' stateful
testing prints its program: :meth:`Trace.wrap` / :meth:`Trace.make` give a
property a proxy of the buffer under test whose every method call is
appended to the trace, each argument rendered by :func:`render`.

Rendering is exact or it is a name, never a wrong literal:

* a value the property named (``trace.name``, or any result of a *source*:
  ``layout = trace.source("layout", layout)`` then ``layout.batch(0, 3)`` is
  written ``layout.batch(0, 3)``), or one bit for bit equal to a named
  TensorDict or to a contiguous run of its rows (``layout.batch(0, 9)[2:5]``);
* ``None``, bools, ints, floats (``inf``/``nan`` by name), strings, bytes,
  dtypes, devices, lists/tuples/dicts of renderable values, paths (under a
  directory the property declared with ``trace.directory``, relative to it);
* tensors of up to :data:`LITERAL_LIMIT` elements as ``torch.tensor([...],
  dtype=...)`` (``torch.arange(n)`` when they are one; ``torch.empty`` of their
  shape when they have no elements or no values, on the meta device), TensorDicts
  of such tensors as ``TensorDict({...}, batch_size=[...])``; objects of rbcheck's own classes
  (specs, layouts, transforms) by their ``repr``, which rebuilds them;
* anything else becomes a placeholder name declared at the top of the
  snippet (``arg1 = ...  # <what it was>: name it with trace.name``).

A call the property bound (``trace.bind("rows, info")`` before it) is
written ``rows, info = buf.sample(4)``, and its results are named so.
A call that raised is written so the snippet goes on as the property did
(``try: buf.load(path)`` / ``except Exception as err: print(repr(err))``), and
an iterator a call returned is written as far as it was consumed
(``list(itertools.islice(buf.iterate(), 3))``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import PurePath
from typing import Any

import torch
from tensordict import TensorDictBase

#: The most elements a tensor is written out with (a batch of indices a property
#: passes back, as the hand-written repros wrote them).
LITERAL_LIMIT = 1 << 16
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def _number(x: Any) -> str:
    return _float(x) if isinstance(x, float) else repr(x)


def _nested(x: Any) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_nested(v) for v in x) + "]"
    return _number(x)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.dtype in _BITS:
        a, b = a.contiguous().view(_BITS[a.dtype]), b.contiguous().view(_BITS[b.dtype])
    return bool(torch.equal(a, b))


def _dtype(d: torch.dtype) -> str:
    return f"torch.{str(d).split('.')[-1]}"


def render_tensor(t: torch.Tensor) -> str | None:
    """``t`` as an expression that rebuilds it exactly, or None (too large)."""
    t = t.detach()
    device = "" if t.device.type == "cpu" else f", device={str(t.device)!r}"
    if t.numel() == 0 or t.device.type == "meta":  # a meta tensor has a shape and a dtype, no values
        return f"torch.empty({list(t.shape)}, dtype={_dtype(t.dtype)}{device})"
    if t.dim() == 1 and t.dtype == torch.int64 and _same_bits(t.cpu(), torch.arange(len(t))):
        return f"torch.arange({len(t)}{device})"
    if t.numel() > LITERAL_LIMIT or t.is_complex() or t.dtype.is_floating_point and t.dtype not in _BITS:
        return None
    values = t.cpu().tolist()
    if t.dtype in _BITS and t.isnan().any():  # a NaN's payload would not survive tolist
        if not _same_bits(torch.tensor(values, dtype=t.dtype), t.cpu()):
            return None
    return f"torch.tensor({_nested(values)}, dtype={_dtype(t.dtype)}{device})"


def _render_td(td: TensorDictBase, trace: Any) -> str | None:
    parts = []
    for key in td.keys():
        value = td.get(key)
        text = _render_td(value, trace) if isinstance(value, TensorDictBase) else (
            render_tensor(value) if isinstance(value, torch.Tensor) else None)
        if text is None:
            return None
        parts.append(f"{key!r}: {text}")
    trace.need("from tensordict import TensorDict")
    device = "" if td.device is None else f", device={str(td.device)!r}"
    return f"TensorDict({{{', '.join(parts)}}}, batch_size={list(td.batch_size)}{device})"


def _leaves(td: TensorDictBase) -> dict:
    return {k: td.get(k) for k in td.keys(include_nested=True, leaves_only=True)}


def td_equal(a: TensorDictBase, b: TensorDictBase) -> bool:
    """Bit for bit the same TensorDict: keys, batch size, device, each leaf's
    dtype, shape and bits."""
    if a.batch_size != b.batch_size or a.device != b.device:
        return False
    la, lb = _leaves(a), _leaves(b)
    return la.keys() == lb.keys() and all(_same_bits(la[k], lb[k]) for k in la)


def _derived(td: TensorDictBase, trace: Any) -> str | None:
    """``td`` as a named TensorDict, a row of it or a run of its rows."""
    mine = _leaves(td)
    if not mine:
        return None
    first = next(iter(mine))
    for named, expr in trace.named_tensordicts():
        if td_equal(td, named):
            return expr
        if named.batch_dims != 1 or td.batch_dims not in (0, 1) or td.device != named.device:
            continue
        theirs = _leaves(named)
        if theirs.keys() != mine.keys():
            continue
        column, probe = theirs[first], mine[first]
        if td.batch_dims == 0:
            starts = [i for i in range(len(named)) if _same_bits(column[i], probe)]
            found = [f"{expr}[{i}]" for i in starts if td_equal(td, named[i])]
        else:
            m = td.batch_size[0]
            starts = [s for s in range(len(named) - m + 1) if _same_bits(column[s:s + m], probe)]
            found = [f"{expr}[{s}:{s + m}]" for s in starts if td_equal(td, named[s:s + m])]
        if found:
            return found[0]
    return None


def render(value: Any, trace: Any) -> str:
    """``value`` as the snippet should pass it (see the module docstring)."""
    named = trace.named(value)
    if named is not None:
        return named
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return repr(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, (torch.dtype, torch.device)):
        return _dtype(value) if isinstance(value, torch.dtype) else f"torch.device({str(value)!r})"
    if isinstance(value, PurePath):
        return trace.path(value)
    if isinstance(value, list):
        return "[" + ", ".join(render(v, trace) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(render(v, trace) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict) and all(isinstance(k, (str, int, tuple)) for k in value):
        return "{" + ", ".join(f"{k!r}: {render(v, trace)}" for k, v in value.items()) + "}"
    if isinstance(value, torch.Tensor):
        text = render_tensor(value)
        if text is not None:
            return text
    if isinstance(value, TensorDictBase):
        text = _derived(value, trace) or _render_td(value, trace)
        if text is not None:
            return text
    module = type(value).__module__ or ""
    if module.startswith("rbcheck.") and (dataclasses.is_dataclass(value) or "__repr__" in vars(type(value))):
        return repr(value)
    return trace.placeholder(value)


def describe(value: Any) -> str:
    """What a value was, for a placeholder's comment."""
    if isinstance(value, torch.Tensor):
        return f"tensor shape={list(value.shape)} dtype={value.dtype} device={value.device}"
    if isinstance(value, TensorDictBase):
        keys = sorted(str(k) for k in value.keys(include_nested=True, leaves_only=True))
        return f"TensorDict batch={list(value.batch_size)} keys={keys}"
    return f"{type(value).__name__} {str(value)[:80]!r}"


class Call:
    """One recorded call: its text, and how it ended (raised, or an iterator
    consumed so far)."""

    def __init__(self, text: str) -> None:
        self.text, self.raised, self.consumed, self.bound = text, "", None, ""

    def __str__(self) -> str:
        text = self.text
        if self.consumed is not None:
            text = f"list(itertools.islice({text}, {self.consumed}))"
        if self.bound:
            text = f"{self.bound} = {text}"
        if self.raised:
            return f"try: {text}\nexcept Exception as err: print(repr(err))  # raised {self.raised}"
        return text


class _Iterator:
    """An iterator a recorded call returned: counts what the property took."""

    def __init__(self, inner: Any, call: Call) -> None:
        self._inner, self._call = iter(inner), call
        call.consumed = 0

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        value = next(self._inner)
        self._call.consumed += 1
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Wrapped:
    """What ``Recorded`` and ``Source`` share: the object they stand for
    (``inner``), the trace and the snippet's name for it; its attributes pass
    through, and each public method is handed to ``_wrap``."""

    def __init__(self, inner: Any, trace: Any, var: str) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "_var", var)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or name.startswith("_"):
            return value
        return self._wrap(name, value)

    @property
    def inner(self) -> Any:
        """The object itself, for calls that are not part of the repro."""
        return self._inner


class Recorded(_Wrapped):
    """A proxy of a buffer (or of another object the snippet calls): each
    public method call is recorded as ``<var>.<method>(<args>)`` before it is
    made; attributes, ``len`` and indexing pass through."""

    def _wrap(self, name: str, value: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._trace.call(self._var, name, value, args, kwargs)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __len__(self) -> int:
        return len(self._inner)

    def __getitem__(self, key: Any) -> Any:
        return self._inner[key]

    def __repr__(self) -> str:
        return f"Recorded({self._var}: {self._inner!r})"


class Source(_Wrapped):
    """A maker of values (a layout, an episode layout): not recorded itself,
    but each value its methods return is named by the call that made it."""

    def _wrap(self, name: str, value: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            out = value(*args, **kwargs)
            parts = [render(a, self._trace) for a in args] + [f"{k}={render(v, self._trace)}"
                                                              for k, v in kwargs.items()]
            return self._trace.name(out, f"{self._var}.{name}({', '.join(parts)})")

        return make

    def __repr__(self) -> str:
        return repr(self._inner)
