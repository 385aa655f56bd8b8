"""torch's CPU ``pow`` of a float64 tensor by a float exponent, done in C with the
same bits, where that is known to hold (``agrees``).

A prioritized extend transforms its priorities with ``(p + eps) ** alpha`` and a
prioritized sample raises its weights' bases to ``-beta``: the reference's bits are
torch's ``pow``. Called on its own, torch's ``pow`` costs 8-25 us warm and 60-120 us
with cold caches, more than the C calls around it. Below its parallel grain
(``GRAIN`` elements, or on one thread) torch's CPU kernel runs ONE loop over a
contiguous tensor: pairs of vectors through its vector pow (with AVX2, SLEEF's
``Sleef_powd4_u10``, up to ``n - n % 8``; with AVX512, ``Sleef_powd8_u10``, up to
``n - n % 16``), then the rest through ``std::pow``. ``rb_pow_like_torch`` (pow.c)
calls the same two functions in the same order.

* ``vector_pow()``: the address of a ``VectorPow`` pair: the vector pow torch's
  kernel calls (looked up in torch's own library, ``VECTOR_POWS``) and its doubles
  per vector; 0 where the kernel has none to call (capability ``DEFAULT``: ``std::pow``
  throughout), None where rbcheck does not know which one it calls (other
  capabilities): then torch's ``pow`` is used.
* ``agrees(exponent)``: whether the C pow equals torch's ``x.pow(exponent)`` bit for
  bit on probe tensors of many lengths (every position of the vector loop and its
  tail, values over 600 orders of magnitude, zero and subnormals). Exponents torch
  special-cases (``SPECIAL``) never take the C path. Cached per exponent; False
  without the native library. A probe cannot prove equality for every input; the
  construction (the same functions on the same elements) is the argument, the probe
  guards it against another torch, another capability or another loop.

Cost: ``agrees`` ~2 ms once per exponent; the C pow O(n).
"""

from __future__ import annotations

import ctypes
import math
import os

import torch

#: torch's ``at::internal::GRAIN_SIZE``: a pointwise kernel over fewer elements runs
#: one loop on one thread (with more, chunks split the loop at other places).
GRAIN = 32768
#: Exponents torch's CPU ``pow`` special-cases (fill, copy, sqrt, rsqrt, reciprocal,
#: products): never the C pow there.
SPECIAL = (0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0)
#: Tensor lengths the probe compares: below one vector pair, around each step of the
#: vector loop, and long ones (every position of the loop's tail and body).
LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49,
           255, 256, 4099)

#: torch's CPU capability -> (the vector pow its float64 kernels call, doubles per vector).
VECTOR_POWS = {"AVX2": ("Sleef_powd4_u10", 4), "AVX512": ("Sleef_powd8_u10", 8)}

_state: dict = {}


def vector_pow() -> int | None:
    """The address of the ``VectorPow`` (``pair``) for the float64 vector pow torch's CPU
    kernels call (module doc), 0 for none, None when unknown."""
    if "vector" not in _state:
        found = _find_vector_pow()
        if found:  # what pow.c is given: the function and its doubles per vector
            found = ctypes.addressof(pair(found, VECTOR_POWS[torch.backends.cpu.get_cpu_capability()][1]))
        _state["vector"] = found
    return _state["vector"]


class VectorPow(ctypes.Structure):
    """pow.c's ``rb_vector_pow``: torch's vector pow and its doubles per vector (4 or 8)."""

    _fields_ = [("fn", ctypes.c_void_p), ("lanes", ctypes.c_int64)]


#: Every pair ever made, never freed: their addresses live on in argument blocks (an extend
#: plan keeps one for its buffer's life), whatever happens to ``_state``.
_PAIRS: dict = {}


def pair(fn: int, lanes: int) -> VectorPow:
    """The one ``VectorPow`` of ``(fn, lanes)`` (made once; threads racing to make it get the
    same one: ``dict.setdefault`` is atomic)."""
    made = _PAIRS.get((fn, lanes))
    return made if made is not None else _PAIRS.setdefault((fn, lanes), VectorPow(fn, lanes))


def _find_vector_pow() -> int | None:
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    if capability == "DEFAULT":
        return 0
    name, _ = VECTOR_POWS.get(capability, (None, None))
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or None
    except (OSError, AttributeError):
        return None


def probe_values() -> torch.Tensor:
    """float64 bases for the probe: 0, subnormals, and values from 1e-300 to 1e300."""
    g = torch.Generator().manual_seed(0)
    spread = torch.exp(torch.randn(600, generator=g, dtype=torch.float64) * 60).clamp(1e-300, 1e300)
    near_one = 1.0 + torch.randn(200, generator=g, dtype=torch.float64) * 1e-3
    special = torch.tensor([0.0, 5e-324, 1e-310, 1.0, 2.0, 0.5, 1e300], dtype=torch.float64)
    return torch.cat([special, spread, torch.rand(200, generator=g, dtype=torch.float64) * 5, near_one])


def agrees(exponent: float) -> bool:
    """Whether ``rb_pow_like_torch`` with ``vector_pow()`` is torch's ``pow`` by
    ``exponent`` bit for bit on the probe (module doc)."""
    key = float(exponent)
    found = _state.setdefault("agrees", {}).get(key)
    if found is None:
        found = _state["agrees"][key] = _probe(key)
    return found


def _probe(exponent: float) -> bool:
    """Torch's pow and the C pow on: every probe value (one long tensor, then its tail
    lengths), and for each of ``LENGTHS`` a tensor whose every element is a witness,
    a value whose vector and libm powers differ, so an element taken by the wrong one
    of the two shows."""
    from rbcheck.variants import native

    lib = native.lib()
    vector = vector_pow()
    if lib is None or vector is None or exponent in SPECIAL or not math.isfinite(exponent):
        return False

    def same(x: torch.Tensor, vec: int) -> tuple[bool, torch.Tensor]:
        got = torch.empty_like(x)
        lib.rb_pow_like_torch(x.data_ptr(), got.data_ptr(), len(x), exponent, vec)
        return torch.equal(got.view(torch.int64), x.pow(exponent).view(torch.int64)), got

    values = probe_values()
    values = values[:len(values) - len(values) % 16]  # every element in the vector loop (8 or 16 a step)
    ok, vectored = same(values, vector)
    if not ok:
        return False
    scalar = torch.empty_like(values)
    lib.rb_pow_like_torch(values.data_ptr(), scalar.data_ptr(), len(values), exponent, 0)
    witnesses = values[vectored.view(torch.int64) != scalar.view(torch.int64)]
    if not len(witnesses):
        witnesses = values
    for n in LENGTHS:
        if not same(witnesses.repeat(n // len(witnesses) + 1)[:n].contiguous(), vector)[0]:
            return False
    return True


def in_c(n: int, exponent: float) -> bool:
    """Whether a pow of ``n`` float64 elements by ``exponent`` may run in C with torch's
    bits: below ``GRAIN`` (one loop in torch's kernel) and ``agrees(exponent)``."""
    return n < GRAIN and agrees(exponent)


def pow_(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """``x.pow_(exponent)`` for a contiguous float64 CPU tensor ``x``: in C where ``in_c``
    (one native call), else torch's."""
    from rbcheck.variants import native

    if x.dtype == torch.float64 and x.is_cpu and x.is_contiguous() and in_c(x.numel(), exponent):
        native.lib().rb_pow_like_torch(x.data_ptr(), x.data_ptr(), x.numel(), exponent, vector_pow() or None)
        return x
    return x.pow_(exponent)
