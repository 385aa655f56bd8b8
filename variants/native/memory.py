"""Tables of addresses over torch tensors, kept between native calls: the rows' layout
(``row_layout``), whether memory moved in place under a table (``watch``, ``moved``), and
CPU tensors backed by transparent huge pages (``empty_huge``). No compiler needed; the
package re-exports each (``rbcheck.variants.native.row_layout``, ...).

Cost: ``row_layout`` O(dims); ``watch`` O(tensors); ``moved`` one ``data_ptr`` per
distinct memory watched; ``empty_huge`` one allocation and one ``madvise``.
"""

from __future__ import annotations

import ctypes
import sys

import torch


def row_layout(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``(stride, row_bytes)`` in bytes when each row ``tensor[i]`` is contiguous
    (a row-major tensor, or a field of interleaved rows), else None."""
    if tensor.dim() == 0:
        return None
    expected = 1
    for size, step in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:]), strict=True):
        if size != 1 and step != expected:
            return None
        expected *= size
    size = tensor.element_size()
    return tensor.stride(0) * size, expected * size


def watch(tensors) -> tuple:
    """``((tensor, address), ...)`` for ``moved``: one tensor per distinct memory among
    ``tensors`` (the fields of one array of interleaved rows share theirs: one check for
    all), with its address now; tensors of no bytes are left out (nothing is read or
    written there)."""
    seen, out = set(), []
    for t in tensors:
        if t.numel() == 0:
            continue
        memory = t.untyped_storage().data_ptr()
        if memory not in seen:
            seen.add(memory)
            out.append((t, t.data_ptr()))
    return tuple(out)


def moved(watched: tuple) -> bool:
    """Whether a tensor of ``watch(...)`` no longer lies where it did: its memory was moved
    in place (``share_memory_()``, a pickle through torch.multiprocessing, which moves a CPU
    tensor to shared memory, ``resize_``). A table of addresses built before then would
    read or write freed memory: its owner rebuilds it. A loop, not a generator: this runs
    on every fast call, often with cold caches."""
    for t, address in watched:
        if t.data_ptr() != address:
            return True
    return False


_HUGE = 2 << 20  # transparent huge page size on x86-64 / arm64 Linux (4 KiB base pages)
_MADV_HUGEPAGE = 14
_libc: dict = {}


def empty_huge(shape, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype)`` on the CPU, asking Linux (``madvise``) to back
    its aligned interior with transparent huge pages when it spans several:
    random row and node reads then miss the TLB far less (gathers ~1.5x faster
    here). Best effort: anywhere else, or if the call fails, a plain tensor.
    Independent of the C compiler."""
    out = torch.empty(shape, dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if nbytes >= 4 * _HUGE and sys.platform.startswith("linux"):
        start = (out.data_ptr() + _HUGE - 1) // _HUGE * _HUGE
        end = (out.data_ptr() + nbytes) // _HUGE * _HUGE
        try:
            libc = _libc.get("libc") or ctypes.CDLL(None, use_errno=True)
            _libc["libc"] = libc
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise(start, end - start, _MADV_HUGEPAGE)
        except (OSError, AttributeError):  # pragma: no cover - no libc madvise
            pass
    return out
