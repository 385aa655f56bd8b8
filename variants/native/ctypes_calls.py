"""``calls.c``'s module, made through ctypes (``native.calls()`` where it is not built)."""

from __future__ import annotations

import ctypes
import operator

from rbcheck.variants.native.extend_args import COLS, FIELDS, N_COLS, PER_CALL, PREPARE, WHOLE


class CtypesCalls:
    """``calls.c``'s module, made through ctypes (where the library was built without
    Python's headers, or for a test's stand-in library): the same calls, the same
    results, ~10 us more per call when cold."""

    __slots__ = ("lib",)

    def __init__(self, library):
        self.lib = library

    def extend(self, block: int, mode: int, first: int, n: int, write_count: int, index_out: int,
               *sources: int) -> int:
        """Set the per-call fields of the EXTEND_ARGS block at ``block`` and the columns'
        source addresses, then mode 0 ``rb_extend``, 1 ``rb_extend_whole``, 2 ``rb_extend_prepare``."""
        if type(mode) is not int:
            raise TypeError(f"mode={mode!r}, but should be an int")
        if not 0 <= mode <= PREPARE:
            raise ValueError(f"mode={mode}, but should be 0, 1 or 2")
        per_call = [_int64(value) for value in (first, n, write_count, index_out)]  # all read before
        addresses = [_int64(source) for source in sources]  # anything is written, as the module does
        fields = (ctypes.c_int64 * FIELDS).from_address(_int64(block))
        if len(sources) != fields[N_COLS]:
            raise TypeError(f"sources={len(sources)}, but should be the block's {fields[N_COLS]} columns")
        table = (ctypes.c_int64 * (4 * len(sources))).from_address(fields[COLS])
        table[0::4] = addresses
        for field, value in zip(PER_CALL, per_call, strict=True):
            fields[field] = value
        call = self.lib.rb_extend_whole if mode == WHOLE else \
            self.lib.rb_extend_prepare if mode == PREPARE else self.lib.rb_extend
        return call(block)

    def sample(self, block: int, step: int) -> int:
        """Step 0 ``rb_sample_descend`` (returns 0), 1 ``rb_sample_rows`` on the SampleArgs at ``block``."""
        block, step = _int64(block), _int64(step)  # ctypes would take a str or bytes as an address
        if step == 0:
            self.lib.rb_sample_descend(block)
            return 0
        return self.lib.rb_sample_rows(block)

    def prepare_update(self, *args) -> int:
        """``rb_prepare_update(index, n, capacity, priority, is_float32, eps, out, max_priority, high)``."""
        return self.lib.rb_prepare_update(*_numbers("prepare_update", args, 9, floats=(5,)))

    def finish_update(self, *args) -> int:
        """``rb_finish_update(value, n, high, max_priority, alpha, vector_pow, do_pow)``."""
        return self.lib.rb_finish_update(*_numbers("finish_update", args, 7, floats=(4,)))

    def update_whole(self, *args) -> int:
        """``rb_update_whole(index, n, capacity, priority, is_float32, eps, value, max_priority, high,
        alpha, vector_pow, sum_nodes, min_nodes, size)``."""
        return self.lib.rb_update_whole(*_numbers("update_whole", args, 14, floats=(5, 9)))


def _numbers(name: str, args: tuple, count: int, floats: tuple) -> list:
    """``args`` as the module reads them (ints, floats at ``floats``), else TypeError as it
    raises: ctypes itself takes a str or bytes for an address and raises its own
    ``ArgumentError`` for other kinds."""
    if len(args) != count:
        raise TypeError(f"{name} takes {count} arguments")
    return [_double(a) if i in floats else _int64(a) for i, a in enumerate(args)]


def _int64(x) -> int:
    """``x`` as the module's ``PyLong_AsLongLong`` reads it: an int (``__index__``) within
    int64, else TypeError or OverflowError (ctypes would wrap it)."""
    x = operator.index(x)
    if not -(1 << 63) <= x < (1 << 63):
        raise OverflowError(f"{x} does not fit in int64")
    return x


def _double(x) -> float:
    """``x`` as the module's ``PyFloat_AsDouble`` reads it (``__float__`` or ``__index__``;
    ``float()`` would also parse a str)."""
    if isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"must be a real number, not {type(x).__name__}")
    return float(x)
