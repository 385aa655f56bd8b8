"""A native (C) CPU path for the prioritized trees: descent and batched update.

``tree.c`` (next to this file) is compiled on first use with the system C
compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) with ``-O3
-ffp-contract=off`` and without ``-ffast-math``, so its float64 arithmetic is
the reference's operation for operation (bit-identical trees and indices).
The shared library is cached per user (``$RBCHECK_NATIVE_CACHE``, else
``$XDG_CACHE_HOME/rbcheck`` or ``~/.cache/rbcheck``) under a name keyed by
the hash of the source, compiler, flags and Python (``compile.py``), and
loaded with ``ctypes``. Where this Python's C headers are installed, the
build is ``calls.c`` (which includes tree.c), also loaded as an extension
module: the hot calls (``calls()``: an extend's, a sample's, an update's)
are then builtin calls, ~5-7 us cold against ctypes's 12-18 us (a cold
1-row extend went from 175 to 133 us, medians of 150, shuffled side by
side). Without the headers, or with ``RBCHECK_NATIVE_CALLS=0``, the same
calls go through ctypes (``CtypesCalls``, ``calls_reason()`` says why).

When there is no compiler, compilation fails, or ``RBCHECK_NATIVE=0`` is
set, ``lib()`` returns None, ``unavailable_reason()`` says why, a
``RuntimeWarning`` is issued once, and the callers use their torch path:
slower, never different.

What runs in C: the descent (``find_prefix``; for the sampler fused with
``mass = u * total`` and ``n * (leaf / total)`` in ``sample_prefix``), the
batched update of one or two trees (``update``), the weights' final division
and float32 conversion, a uniform sample's slots from its uniforms
(``uniform_slots``), the row gathers of a sample (``gather_rows``, from
row-major columns or fields of interleaved rows; ``GatherBlock`` keeps its
argument table per storage), a ring writer's
generations at sampled slots (``ring_generation``, arithmetic) and the
happy-path checks of indices and priorities (and, after the pow, that no
transform overflowed), torch's float64 ``pow`` with its bits (``pow.c``,
``torch_pow``: the vector pow torch's own kernel calls, then libm's, element
by element as that kernel assigns them; used where a probe agrees), and an
``extend``'s whole write (``rb_extend_prepare``
then ``rb_extend``, their arguments in one ``EXTEND_ARGS`` block: the
priorities' checks and transform, both trees' ranges, the max priority, the
rows into the storage's interleaved rows, the generations and the slots;
see ``extend_fast.py``), and a CPU sample's steps strung into two calls
(``rb_sample_descend``, ``rb_sample_rows``: ``SampleArgs``; see
``sample_fast.py``). The descent is level-synchronous
over the batch with software prefetch, three levels per pass; on the bottom
six levels a pass reads one cache line of eight nodes and recomputes the two
levels above them (bit-identical sums): bound by cache misses, not by
arithmetic (see ``tree.c``). ``empty_huge`` (no compiler needed) asks Linux
for transparent huge pages for large CPU tensors (trees, storage rows).

Contract of the calls (the caller guarantees it; ``vector_tree``,
``prioritized`` and ``device_storage`` do): the library is loaded
(``usable``), contiguous CPU tensors, float64 nodes and values, int64
indices, bool mask. Indices given to ``update`` and ``gather_rows`` are
bounds-checked in C (ValueError, nothing written).
``find_prefix`` O(B log size); ``update`` O(k log size) (levels with at most
k nodes recomputed whole); ``gather_rows`` O(B * row bytes).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
import warnings
from pathlib import Path

import torch

ABI_VERSION = 16


class SampleArgs(ctypes.Structure):
    """The argument block of ``rb_sample_descend`` / ``rb_sample_rows`` (sample.c's
    ``rb_sample_args``; see ``sample_fast.py``): addresses as ints (0 for NULL)."""

    _fields_ = [("n_cols", ctypes.c_int64), ("cols", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("u", ctypes.c_void_p), ("size", ctypes.c_int64), ("index", ctypes.c_void_p),
                ("nodes", ctypes.c_void_p), ("tree_size", ctypes.c_int64), ("total", ctypes.c_double),
                ("leaf", ctypes.c_void_p), ("divisor", ctypes.c_double), ("weight", ctypes.c_void_p),
                ("generation", ctypes.c_void_p), ("write_count", ctypes.c_int64),
                ("capacity", ctypes.c_int64), ("threads", ctypes.c_int64), ("do_pow", ctypes.c_int64),
                ("exponent", ctypes.c_double), ("vector_pow", ctypes.c_void_p)]


#: Trees at least this deep have shadow levels (``shadow_levels``; tree.c's RB_SHADOW_MIN_DEPTH).
SHADOW_MIN_DEPTH = 6

_state: dict = {}  # "lib": CDLL or None, "reason": str or None, "calls": see calls(), "calls_reason"

from rbcheck.variants.native.compile import (  # noqa: E402, F401 (the API)
    CALLS,
    FLAGS,
    LIBS,
    SOURCE,
    SOURCES,
    _compile,
    _compiler,
    cache_dir,
)
from rbcheck.variants.native.ctypes_calls import CtypesCalls  # noqa: E402, F401 (the API)
from rbcheck.variants.native.extend_args import EXTEND_ARGS  # noqa: E402, F401 (the API)
from rbcheck.variants.native.memory import empty_huge, moved, row_layout, watch  # noqa: E402, F401 (the API)


def python_include() -> str | None:
    """The folder of this Python's C headers when ``Python.h`` is there, else None (then
    the library is built without ``calls.c``: ``CtypesCalls`` makes its calls)."""
    folder = sysconfig.get_paths().get("include")
    return folder if folder and os.path.isfile(os.path.join(folder, "Python.h")) else None


def _with_calls(cc: list[str]) -> tuple[Path | None, object, str | None]:
    """``(build, module, None)``: the library built with ``calls.c`` and its module
    loaded; ``(None, None, reason)`` where that cannot be (no headers, a failed build)."""
    include = python_include()
    if include is None:
        return None, None, "Python's C headers (Python.h) are not installed"
    suffix = (importlib.machinery.EXTENSION_SUFFIXES or [".so"])[0]
    try:
        target = _compile(cc, CALLS, ("-I", include), suffix)
        loader = importlib.machinery.ExtensionFileLoader("_rbcheck_native", str(target))
        module = loader.create_module(importlib.util.spec_from_loader("_rbcheck_native", loader))
    except (RuntimeError, ImportError, OSError) as err:
        return None, None, f"calls.c not built or not loaded: {err}"
    if module.abi_version != ABI_VERSION:
        return None, None, f"calls.c abi version={module.abi_version}, but should be {ABI_VERSION}"
    return target, module, None


def _build() -> tuple[ctypes.CDLL, object, str | None]:
    """Compile (or reuse the cached build) and load: ``(library, calls module or None,
    why not)``; raises RuntimeError with the reason when the library itself cannot be had."""
    if os.environ.get("RBCHECK_NATIVE", "1").strip() in ("0", "false", "no", "off"):
        raise RuntimeError("RBCHECK_NATIVE=0 (native path switched off)")
    for path in (*SOURCES, CALLS):
        if not path.is_file():
            raise RuntimeError(f"source {path.name} is missing from the installed package")
    cc = _compiler()
    if cc is None:
        want = os.environ.get("CC") or "cc, gcc or clang"
        raise RuntimeError(f"no C compiler found ({want} not on PATH)")
    target, module, why = (None, None, "RBCHECK_NATIVE_CALLS=0") \
        if os.environ.get("RBCHECK_NATIVE_CALLS", "1").strip() in ("0", "false", "no", "off") else _with_calls(cc)
    if target is None:
        target = _compile(cc, SOURCE, (), ".so")
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as err:
        raise RuntimeError(f"cannot load {target.name}: {err}") from err
    lib.rb_abi_version.restype = ctypes.c_int64
    if lib.rb_abi_version() != ABI_VERSION:
        raise RuntimeError(f"abi version={lib.rb_abi_version()}, but should be {ABI_VERSION}")
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.rb_find_prefix.argtypes = [p, i64, p, i64, p, p]
    lib.rb_find_prefix.restype = None
    lib.rb_update.argtypes = [p, i64, p, i64, i64, i64, p, p, p, p, i64, i64]
    lib.rb_update.restype = i64
    lib.rb_update_range.argtypes = [p, i64, p, i64, i64, i64, i64, i64, p, i64]
    lib.rb_update_range.restype = i64
    lib.rb_materialize.argtypes = [p, i64, i64]
    lib.rb_materialize.restype = None
    lib.rb_shadow_min_depth.argtypes = []
    lib.rb_shadow_min_depth.restype = i64
    if lib.rb_shadow_min_depth() != SHADOW_MIN_DEPTH:
        raise RuntimeError(f"shadow min depth={lib.rb_shadow_min_depth()}, but should be {SHADOW_MIN_DEPTH}")
    lib.rb_sample_prefix.argtypes = [p, i64, p, i64, ctypes.c_double, ctypes.c_double, p, p, i64]
    lib.rb_sample_prefix.restype = None
    lib.rb_divide_to_float.argtypes = [p, i64, ctypes.c_double, p]
    lib.rb_divide_to_float.restype = None
    lib.rb_gather_rows.argtypes = [i64, p, p, p, p, p, i64, i64]
    lib.rb_gather_rows.restype = i64
    lib.rb_simd.argtypes = [i64]
    lib.rb_simd.restype = i64
    lib.rb_ring_generation.argtypes = [p, i64, i64, i64, p]
    lib.rb_ring_generation.restype = None
    lib.rb_uniform_slots.argtypes = [p, i64, i64, p]
    lib.rb_uniform_slots.restype = None
    lib.rb_index_in_range.argtypes = [p, i64, i64]
    lib.rb_index_in_range.restype = i64
    lib.rb_all_finite_nonneg.argtypes = [p, i64]
    lib.rb_all_finite_nonneg.restype = i64
    lib.rb_prepare_update.argtypes = [p, i64, i64, p, i64, ctypes.c_double, p, p, p]
    lib.rb_prepare_update.restype = i64
    lib.rb_finish_update.argtypes = [p, i64, p, p, ctypes.c_double, p, i64]
    lib.rb_finish_update.restype = i64
    lib.rb_update_whole.argtypes = [p, i64, i64, p, i64, ctypes.c_double, p, p, p, ctypes.c_double, p, p, p, i64]
    lib.rb_update_whole.restype = i64
    _check_block(lib.rb_extend_args_size, "extend's", EXTEND_ARGS.size)
    _check_block(lib.rb_sample_args_size, "sample's", ctypes.sizeof(SampleArgs))
    lib.rb_extend_prepare.argtypes = [p]
    lib.rb_extend_prepare.restype = i64
    lib.rb_extend.argtypes = [p]
    lib.rb_extend.restype = i64
    lib.rb_extend_whole.argtypes = [p]
    lib.rb_extend_whole.restype = i64
    lib.rb_sample_descend.argtypes = [p]
    lib.rb_sample_descend.restype = None
    lib.rb_sample_rows.argtypes = [p]
    lib.rb_sample_rows.restype = i64
    lib.rb_pow_like_torch.argtypes = [p, p, i64, ctypes.c_double, p]
    lib.rb_pow_like_torch.restype = None
    return lib, module, why


def _check_block(size_of, what: str, expected: int) -> None:
    """Refuse a build whose argument block (C's ``sizeof``, from ``size_of()``) is not the
    one Python packs: every field would be read from the wrong place."""
    size_of.argtypes, size_of.restype = [], ctypes.c_int64
    if size_of() != expected:
        raise RuntimeError(f"{what} argument block={size_of()} bytes, but should be {expected}")


def calls():
    """The hot calls (``extend``, ``sample``, ``prepare_update``, ``finish_update``): the
    ``calls.c`` module where it was built, else ``CtypesCalls``; None without the library.
    ``calls_reason()`` says why the module is not used."""
    lib()
    return _state["calls"]


def calls_reason() -> str | None:
    """Why the hot calls go through ctypes (None when ``calls.c``'s module makes them)."""
    lib()
    return _state["calls_reason"]


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None (then ``unavailable_reason()`` says why)."""
    try:
        return _state["lib"]
    except KeyError:
        pass
    try:
        built, module, why = _build()
        # one update (atomic under the GIL): another thread sees all four keys or none
        _state.update({"reason": None, "calls_reason": why,
                       "calls": module if module is not None else CtypesCalls(built), "lib": built})
    except Exception as err:  # noqa: BLE001 - any failure means: torch path, reason reported
        reason = str(err) if isinstance(err, RuntimeError) else f"{type(err).__name__}: {err}"
        _state.update({"reason": reason, "calls": None, "calls_reason": reason, "lib": None})
        warnings.warn(f"rbcheck native tree path unavailable, using the torch path: {reason}",
                      RuntimeWarning, stacklevel=2)
    return _state["lib"]


def available() -> bool:
    return lib() is not None


def unavailable_reason() -> str | None:
    """Why the native path is not used (None when it is); tries to load it first."""
    lib()
    return _state["reason"]


@contextlib.contextmanager
def suspended(reason: str = "suspended by variants.native.suspended()"):
    """Within the block the native path is off (``lib()`` is None, ``unavailable_reason()``
    is ``reason``): the torch path runs. For comparisons and tests."""
    saved = dict(_state)
    _state["lib"], _state["reason"], _state["calls"], _state["calls_reason"] = None, reason, None, reason
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)


def reset() -> None:
    """Forget the loaded state: the next ``lib()`` builds/loads again (for tests)."""
    _state.clear()


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the native path applies to these tensors (CPU, contiguous) and loads. A loop
    over ``is_cpu`` (a flag; ``device`` makes an object): this runs on every fast call,
    often with cold caches."""
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous()):
            return False
    return lib() is not None


def vector_descent(enabled: bool | None = None) -> bool:
    """Whether the descent uses its AVX2 line pass (x86-64 CPUs with AVX2);
    ``enabled=False`` turns it off, ``True`` back on where the CPU has it. The
    scalar code gives the same bits (tests run both)."""
    return bool(_state["lib"].rb_simd(-1 if enabled is None else int(enabled)))


def find_prefix(nodes: torch.Tensor, mass: torch.Tensor, size: int, index: torch.Tensor,
                leaf: torch.Tensor) -> None:
    """Descend ``mass`` (float64[B]) into ``index`` (int64[B]) / ``leaf`` (float64[B])."""
    _state["lib"].rb_find_prefix(nodes.data_ptr(), size, mass.data_ptr(), mass.shape[0],
                                 index.data_ptr(), leaf.data_ptr())


def shadow_levels(depth: int) -> tuple[int, ...]:
    """The levels of a tree of ``depth`` that ``update(..., shadow=True)`` leaves
    stale, bottom up: ``depth - 1, depth - 2, depth - 4, depth - 5``, the ones the
    descent's two bottom line passes recompute from the line below and never read
    (none below ``SHADOW_MIN_DEPTH``). ``materialize`` recomputes them."""
    if depth < SHADOW_MIN_DEPTH:
        return ()
    return (depth - 1, depth - 2, depth - 4, depth - 5)


def update(first: torch.Tensor, first_is_min: bool, second: torch.Tensor | None, second_is_min: bool,
           size: int, capacity: int, index: torch.Tensor, value: torch.Tensor,
           second_value: torch.Tensor | None, mask: torch.Tensor | None, shadow: bool = False) -> None:
    """Write leaves of one or two trees and refresh their ancestors (see ``tree.c``);
    ``second_value`` None: derived as ``value if value > 0 else inf``. ``shadow``:
    the trees' ``shadow_levels`` are left stale (the rest exact); without it they
    must be exact beforehand (``materialize``)."""
    code = _state["lib"].rb_update(
        first.data_ptr(), int(first_is_min), None if second is None else second.data_ptr(),
        int(second_is_min), size, capacity, index.data_ptr(), value.data_ptr(),
        None if second_value is None else second_value.data_ptr(),
        None if mask is None else mask.data_ptr(), index.shape[0], int(shadow))
    if code > 0:
        raise ValueError(f"index={int(index[code - 1])}, but should be in [0, {capacity})")
    if code < 0:
        raise MemoryError("native tree update: out of memory")


def update_range(first: torch.Tensor, first_is_min: bool, second: torch.Tensor | None,
                 second_is_min: bool, size: int, capacity: int, start: int, value: torch.Tensor,
                 shadow: bool = False) -> None:
    """``update`` of the contiguous leaves ``start .. start + len(value) - 1`` (no wrap),
    the second tree's values derived (``value if value > 0 else inf``): each ancestor
    recomputed once, the same bits (see ``tree.c``, ``rb_update_range``)."""
    code = _state["lib"].rb_update_range(
        first.data_ptr(), int(first_is_min), None if second is None else second.data_ptr(),
        int(second_is_min), size, capacity, start, value.shape[0], value.data_ptr(), int(shadow))
    if code:
        raise ValueError(f"slots {start} .. {start + value.shape[0] - 1}, but should be within "
                         f"[0, {capacity})")


def materialize(nodes: torch.Tensor, is_min: bool, size: int) -> None:
    """Recompute the ``shadow_levels`` of a tree whole (O(size)): afterwards every
    inner node is the combination of its children."""
    _state["lib"].rb_materialize(nodes.data_ptr(), int(is_min), size)


def sample_prefix(nodes: torch.Tensor, size: int, u: torch.Tensor, total: float, n_rows: int,
                  index: torch.Tensor, base: torch.Tensor, threads: int | None = None) -> None:
    """``index`` = the leaves of masses ``u * total``; ``base`` = ``n_rows * (leaf / total)``.
    ``threads`` (default ``torch.get_num_threads()``): batches of at least 16384
    draws per thread are split over that many threads (same results; smaller
    batches gained nothing from a second thread on the machines measured)."""
    threads = torch.get_num_threads() if threads is None else threads
    _state["lib"].rb_sample_prefix(nodes.data_ptr(), size, u.data_ptr(), u.shape[0], total,
                                   float(n_rows), index.data_ptr(), base.data_ptr(), threads)


def divide_to_float(w: torch.Tensor, c: float, out: torch.Tensor) -> torch.Tensor:
    """``out`` (float32) = ``(w / c)`` rounded to float32, like ``(w / c).to(torch.float32)``."""
    _state["lib"].rb_divide_to_float(w.data_ptr(), w.shape[0], c, out.data_ptr())
    return out


def gather_rows(columns, index: torch.Tensor, outs, layouts) -> None:
    """``outs[c][i] = columns[c][index[i]]`` for CPU tensors of equal first dimension
    whose rows are contiguous (``layouts``: their ``row_layout``s), ``outs``
    contiguous with ``len(index)`` rows; ValueError (nothing copied) for an index
    outside the columns. A table for one call (``GatherBlock`` keeps one per storage)."""
    GatherBlock(None, columns, layouts).gather(index, outs)


def _no_block() -> None:
    return None


class GatherBlock:
    """``gather_rows``'s argument table for one fixed list of columns, built once: the
    columns' addresses, row strides and row bytes (and the row count); a call writes
    only the outputs' addresses, under a lock (the C call releases the GIL, and
    concurrent samples share the table). Rebuilding the table per call (a ctypes array
    from four lists, the bounds and the checks of ``usable``) cost more than the
    copy of a small batch. ``usable``: False unless every column is a CPU tensor
    with contiguous rows (``row_layouts`` not None); then the caller gathers as before."""

    __slots__ = ("cols", "columns", "k", "rows", "ptrs", "base", "usable", "lock", "watched")

    def __init__(self, cols, columns, layouts):
        self.cols = cols  # the object the table was built from (compared by identity)
        self.columns = columns  # kept alive: the table holds their addresses
        self.k = k = len(columns)
        self.usable = bool(columns) and all(c.device.type == "cpu" for c in columns) \
            and all(layout is not None for layout in layouts)
        self.rows = min((c.shape[0] for c in columns), default=0)
        self.ptrs = (ctypes.c_int64 * (4 * k))(
            *[c.data_ptr() for c in columns], *[layout[0] if layout else 0 for layout in layouts],
            *[layout[1] if layout else 0 for layout in layouts], *[0] * k)
        self.base = ctypes.addressof(self.ptrs)
        self.lock = threading.Lock()
        self.watched = watch(columns)

    def moved(self) -> bool:
        """Whether a column's memory moved since the table was built (see ``moved``)."""
        return moved(self.watched)

    def __reduce__(self):
        """A copy or a pickle of the storage carries no table (its addresses are this
        storage's memory): the next gather builds its own."""
        return _no_block, ()

    def gather(self, index: torch.Tensor, outs) -> None:
        """``outs[c][i] = columns[c][index[i]]``: ``index`` a contiguous CPU int64 tensor,
        ``outs`` contiguous CPU tensors of ``len(index)`` rows (the caller's pool makes
        them so); ValueError (nothing copied) for an index outside the columns."""
        k, ptrs, base = self.k, self.ptrs, self.base
        with self.lock:
            for c, out in enumerate(outs):
                ptrs[3 * k + c] = out.data_ptr()
            code = _state["lib"].rb_gather_rows(k, base, base + 8 * k, base + 16 * k, base + 24 * k,
                                                index.data_ptr(), index.shape[0], self.rows)
        if code > 0:
            raise ValueError(f"index={int(index[code - 1])}, but should be in [0, {self.rows})")


def ring_generation(index: torch.Tensor, write_count: int, capacity: int,
                    out: torch.Tensor) -> torch.Tensor:
    """``out`` (int64) = generations of ring slots ``index`` (in ``[0, capacity)``)
    after ``write_count`` rows: ``rbcheck.reference.writer.ring_generation`` at ``index``."""
    _state["lib"].rb_ring_generation(index.data_ptr(), index.shape[0], write_count, capacity,
                                     out.data_ptr())
    return out


def uniform_slots(u: torch.Tensor, size: int, index: torch.Tensor) -> torch.Tensor:
    """``index`` (int64) = the slots of float64 uniforms ``u`` among ``size`` rows:
    ``rbcheck.reference.random_sampler``'s ``floor(u * size).long().clamp_(max=size - 1)``
    (the same bits, in one C pass)."""
    _state["lib"].rb_uniform_slots(u.data_ptr(), u.shape[0], size, index.data_ptr())
    return index


def index_in_range(index: torch.Tensor, high: int) -> bool:
    """Whether every entry of ``index`` (int64) is in ``[0, high)``."""
    return bool(_state["lib"].rb_index_in_range(index.data_ptr(), index.shape[0], high))


def all_finite_nonneg(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` (float64) is finite and ``>= 0``."""
    return bool(_state["lib"].rb_all_finite_nonneg(x.data_ptr(), x.shape[0]))


def prepare_update(index: torch.Tensor, capacity: int, priority: torch.Tensor, eps: float,
                   out: torch.Tensor, max_priority: torch.Tensor, high: torch.Tensor) -> bool:
    """One pass for ``update_priority``'s happy path: True when every ``index``
    (int64) is in ``[0, capacity)`` and every ``priority`` (float32 or float64)
    finite and ``>= 0``; then ``out`` (float64) holds ``priority + eps`` (as torch
    adds: the same bits) and ``high`` (a float64 tensor of one entry) the larger
    of ``max_priority`` (a float64 scalar tensor, only read) and the priorities'
    maximum. False: nothing promised of ``out`` and ``high``. Nothing changes
    ``max_priority``: ``finish_update`` commits ``high`` after the transform."""
    return bool(_state["calls"].prepare_update(
        index.data_ptr(), index.shape[0], capacity, priority.data_ptr(),
        int(priority.dtype == torch.float32), eps, out.data_ptr(), max_priority.data_ptr(), high.data_ptr()))


def update_whole(index: torch.Tensor, capacity: int, priority: torch.Tensor, eps: float, value: torch.Tensor,
                 max_priority: torch.Tensor, high: torch.Tensor, alpha: float, vector_pow: int | None,
                 sum_nodes: torch.Tensor, min_nodes: torch.Tensor, size: int) -> int:
    """``prepare_update``, the pow in C (only where ``torch_pow.in_c``), ``finish_update``'s
    check and ``update`` of both trees (shadow levels left stale) in ONE call: 0 done
    (the max priority committed last), 1 a check of the index or priorities failed, 2 a
    transform overflowed; nothing changed then. Raises MemoryError when out of memory
    (nothing changed)."""
    code = _state["calls"].update_whole(
        index.data_ptr(), index.shape[0], capacity, priority.data_ptr(), int(priority.dtype == torch.float32),
        eps, value.data_ptr(), max_priority.data_ptr(), high.data_ptr(), alpha, vector_pow or 0,
        sum_nodes.data_ptr(), min_nodes.data_ptr(), size)
    if code < 0:
        raise MemoryError("native tree update: out of memory")
    return code


def finish_update(value: torch.Tensor, high: torch.Tensor, max_priority: torch.Tensor,
                  alpha: float | None = None, vector_pow: int | None = None) -> bool:
    """After the transform ``value = (priority + eps) ** alpha`` (float64; with ``alpha``
    given, its pow is done here first, as torch's pow computes it with ``vector_pow``:
    ``torch_pow``, only where ``torch_pow.in_c``): True when every ``value`` is finite (no
    transform overflowed); then ``max_priority`` becomes ``high`` (``prepare_update``'s).
    False: ``max_priority`` unchanged."""
    return bool(_state["calls"].finish_update(value.data_ptr(), value.shape[0], high.data_ptr(),
                                              max_priority.data_ptr(), 0.0 if alpha is None else float(alpha),
                                              vector_pow or 0, int(alpha is not None)))
