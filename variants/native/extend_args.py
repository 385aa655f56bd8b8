"""The argument block of ``rb_extend_prepare`` / ``rb_extend`` (tree_update.c's
``rb_extend_args``), in one place for Python: ``extend_fast`` packs it, ``calls.c``'s
``extend`` and ``CtypesCalls.extend`` set its per-call fields.

Fields, 8 bytes each: n_cols, cols, capacity, first, n, write_count, generation,
index_out, sum, min, size, value, shadow, high, max_priority, priority, is_float32
(an int64 or an address each; 0 for NULL), eps (a double), do_pow (an int64), alpha
(a double), vector_pow (an address).
"""

from __future__ import annotations

import struct

EXTEND_ARGS = struct.Struct("=17qdqdq")

#: Each field's position in the block.
(N_COLS, COLS, CAPACITY, FIRST, N, COUNT, GENERATION, INDEX, SUM, MIN, SIZE, VALUE, SHADOW,
 HIGH, MAX, PRIORITY, IS_FLOAT32, EPS, DO_POW, ALPHA, VECTOR_POW) = range(21)
FIELDS = 21
#: The fields ``extend`` sets on every call, in its arguments' order (calls.c's py_extend).
PER_CALL = (FIRST, N, COUNT, INDEX)
#: ``extend``'s modes: ``rb_extend``, ``rb_extend_whole``, ``rb_extend_prepare``.
EXTEND, WHOLE, PREPARE = 0, 1, 2
