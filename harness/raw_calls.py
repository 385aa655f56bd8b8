"""Raw calls: a library's own calls on one buffer, the optional face of an Adapter a benchmark times.

The conformance suite drives a library through :class:`~rbcheck.harness.buffer_protocol.BufferUnderTest`
(TensorDicts in and out, the spec's names). A benchmark must time what a user of the library
writes instead: cpprb's ``add(**arrays)``, tianshou's ``add(Batch)`` per transition, flashbax's
jitted ``add``, rlox's ``push``. ``Adapter.raw`` (None: the adapter has no raw face) is a
:class:`RawCalls` subclass (or a :class:`RawFace` naming one): ``Adapter.raw(spec)`` builds ONE empty buffer of the library from a
:class:`~rbcheck.harness.protocol.BufferSpec` and keeps it (``buffer``), and its methods are the
library's calls on it. The adapter module builds the library's objects once, for the suite and
the benchmark alike; ``bench/peers.py`` imports no library (docs/design.md, "Speed").

Rows (the benchmark's row stream, ``harness/raw_checks.py``): a dict of NumPy arrays, ``obs``
float32 ``[n, w]``, ``action`` float32 ``[n, 2]``, ``reward`` float32 ``[n]`` (``spec.layout`` gives
``w``: :func:`width`), and raw priorities float64 ``[n]`` (each a float32 value) for a prioritized
spec. The spec's ``sampler`` is ``"random"`` or ``"prioritized"`` (one of ``samplers``), with its
``alpha``/``beta``/``eps``/``seed``.

Untimed (preparation and read-back for the checks): ``prepare``, ``fill``, ``prepare_update``,
``rows_at``, ``priority_at``, ``loader``. Timed: ``add``, ``sample``, ``update_priorities``,
``save`` and what ``loader`` returns. Each timed method is the library's call and what a user
must do around it (e.g. wait for JAX), nothing else.

Class attributes say what the face has:

* ``samplers``: the spec samplers it builds (``"prioritized"`` absent: no prioritized buffer);
* ``extend_into``: which buffer the benchmark's extends are timed on (``"prioritized"`` where it
  has one, by default);
* ``unsupported``: operation (``save``, ``load``, ``update_priorities``, ...) -> why the library
  has no call for it;
* ``conventions``: how its prioritized answers read (weight normaliser, eps rule, priority
  dtype), as :class:`~rbcheck.harness.protocol.Conventions`; the checks compare them with
  :class:`~rbcheck.harness.oracle.PriorityOracle` under these.

:meth:`RawCalls.why_not` (a classmethod) may also say why an operation cannot run *here* (an
extension that does not load), :meth:`RawCalls.unavailable` why none can. Cost: whatever the library's calls cost; nothing is added.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rbcheck.harness.protocol import BufferSpec, Conventions

#: The row columns every raw face takes and returns.
COLUMNS = ("obs", "action", "reward")
#: The operations a raw face may lack (``RawCalls.unsupported``, ``RawCalls.why_not``).
OPERATIONS = ("add", "sample", "sample_prioritized", "update_priorities", "save", "load")
#: Rows written by one call of the default ``fill``.
FILL_CHUNK = 1 << 16


def width(spec: BufferSpec) -> int:
    """``w`` of the rows' ``obs`` float32 ``[w]`` (``spec.layout["obs"]``)."""
    layout = spec.layout or {}
    if "obs" not in layout or len(layout["obs"][0]) != 1:
        raise ValueError(f"spec.layout={layout!r}, but should give obs a shape (w,) (raw calls' rows)")
    return int(layout["obs"][0][0])


class RawCalls:
    """The library's calls on one buffer it built from ``spec`` (see the module docstring)."""

    samplers: ClassVar[tuple[str, ...]] = ("random", "prioritized")
    extend_into: ClassVar[str] = "prioritized"
    unsupported: ClassVar[Mapping[str, str]] = {}
    conventions: ClassVar[Conventions] = Conventions()

    def __init__(self, spec: BufferSpec):
        if spec.sampler not in self.samplers:
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be one of {self.samplers} "
                             f"({type(self).__name__})")
        self.spec, self.prioritized, self.width = spec, spec.sampler == "prioritized", width(spec)
        self.buffer: Any = None  # the library's own buffer object

    @classmethod
    def unavailable(cls) -> str | None:
        """Why no buffer of this face can run here (say, JAX on another backend), or None."""
        return None

    @classmethod
    def why_not(cls, op: str) -> str | None:
        """Why ``op`` cannot run (no such call, or not here), or None."""
        if op in ("sample_prioritized", "update_priorities") and "prioritized" not in cls.samplers:
            return "no prioritized buffer"
        return cls.unsupported.get(op)

    @classmethod
    def extends_prioritized(cls) -> bool:
        """Whether the benchmark's extends are timed on the prioritized buffer."""
        return cls.extend_into == "prioritized" and cls.why_not("sample_prioritized") is None

    # writing
    def prepare(self, rows: Mapping[str, np.ndarray], priority: np.ndarray | None) -> Any:
        """``rows`` (and, prioritized, their raw priorities) in the library's own input format."""
        raise NotImplementedError

    def add(self, prepared: Any) -> None:
        """The library's write of prepared rows (timed)."""
        raise NotImplementedError

    def fill(self, rows: Mapping[str, np.ndarray], priority: np.ndarray | None) -> None:
        """Write ``rows`` into the empty buffer, however is fastest (checked afterwards, untimed):
        by default ``add`` of chunks of :data:`FILL_CHUNK` rows."""
        n = len(rows["obs"])
        for start in range(0, n, FILL_CHUNK):
            part = {k: v[start:start + FILL_CHUNK] for k, v in rows.items()}
            self.add(self.prepare(part, None if priority is None else priority[start:start + FILL_CHUNK]))

    # reading
    def sample(self, batch: int) -> Mapping[str, Any]:
        """The library's sample (timed): ``obs``/``action``/``reward`` (anything ``np.asarray``
        takes), ``index`` (the slots, or None where the library returns none) and ``weight``
        (prioritized, or None)."""
        raise NotImplementedError

    def rows_at(self, slots: np.ndarray) -> Mapping[str, np.ndarray] | None:
        """The rows held at ``slots`` (untimed), or None where the library has no read of its rows
        (the checks then read them through a sample)."""
        return None

    def priority_at(self, slots: np.ndarray) -> np.ndarray | None:
        """The stored (transformed) priorities of ``slots``, or None where they cannot be read."""
        return None

    # priorities
    def prepare_update(self, index: np.ndarray, raw: np.ndarray) -> tuple:
        """``index`` (int64 slots) and ``raw`` (float64) as the library takes them."""
        return index, raw

    def update_priorities(self, *prepared: Any) -> None:
        """The library's priority update (timed)."""
        raise NotImplementedError

    # checkpoints
    def save(self, path: Path) -> None:
        """The library's save of the whole buffer into the directory ``path`` (timed)."""
        raise NotImplementedError

    def loader(self, path: Path) -> Callable[[], RawCalls]:
        """A call (timed) that loads what ``save`` wrote at ``path`` into a buffer made now
        (untimed, where the library loads into an existing buffer) and returns its raw calls."""
        raise NotImplementedError

    def _loaded(self, buffer: Any) -> RawCalls:
        """A face of the same class over ``buffer`` (a loaded one), for ``loader``."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.buffer = buffer
        return other


class RawFace:
    """``Adapter.raw`` named by ``"module:Class"`` (a :class:`RawCalls` subclass), imported on first
    use: the adapter module names its raw face without importing it, so the raw face's module may
    import the adapter's own pieces (its constructors, its ``Conventions``) with no import cycle.
    Calling it builds the buffer; its other attributes are the class's."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> type[RawCalls]:
        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, spec: BufferSpec) -> RawCalls:
        return self.load()(spec)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "path":
            raise AttributeError(name)
        return getattr(self.load(), name)

    def __repr__(self) -> str:
        return f"RawFace({self.path!r})"


__all__ = ["COLUMNS", "FILL_CHUNK", "OPERATIONS", "RawCalls", "RawFace", "width"]
