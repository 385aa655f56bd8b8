"""Reading the whole buffer at once (reference/sample_all.py; skrl's
``Memory.sample_all``).

After a drawn stream of writes (extends of 1 to ``capacity`` rows, the ring
wrapped or not), ``sample_all(k)`` for a drawn ``k`` in ``[1, len]`` returns
``k`` batches of ``len // k`` rows each which together are the held rows in
slot order (slot 0 first), each exactly once, never a slot not written yet;
the last ``len % k`` rows (the tail) are dropped. Each row is checked by its
``id`` (the number of its write; the ids start at ``ID0`` so a slot never
written, zero-filled or NaN-filled, is never taken for a row) against an
oracle of which write each slot holds. Nothing is drawn: the length is the
same afterwards.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, assert_same, fail
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("sample_all")
ID0 = 1000  # the first write's id: far from a fresh slot's 0
LAYOUT = {"id": ((), torch.int64)}


def rows(first: int, n: int) -> TensorDict:
    return TensorDict({"id": torch.arange(ID0 + first, ID0 + first + n, dtype=torch.int64)}, batch_size=[n])


def held_ids(capacity: int, written: int) -> list[int]:
    """The oracle: slot s holds the last write w < written with w % capacity == s (a ring from slot 0)."""
    return [ID0 + max(w for w in range(s, written, capacity)) for s in range(min(written, capacity))]


@given(data=st.data())
def test_sample_all_gives_every_held_row_once_in_slot_order(impl, data):
    """exact: ``sample_all(k)`` gives ``k`` batches of ``len // k`` rows, the
    held rows in slot order, each once, never an unwritten slot, the tail of
    ``len % k`` rows dropped; the buffer is unchanged."""
    capacity = data.draw(st.integers(1, 40), label="capacity")
    spec = BufferSpec(capacity=capacity, sampler="random", layout=LAYOUT,
                      seed=data.draw(st.integers(0, 2**16), label="seed"))
    trace = Trace(impl, spec)
    buf = trace.wrap(impl.make(spec))
    total = data.draw(st.integers(1, 3 * capacity), label="rows written")
    written = 0
    while written < total:
        n = data.draw(st.integers(1, min(capacity, total - written)), label=f"extend after {written}")
        buf.extend(rows(written, n))
        written += n
    held = held_ids(capacity, written)
    assert_same(f"len(buf) after {written} rows", len(buf), len(held), trace)
    k = data.draw(st.integers(1, len(held)), label="mini_batches")
    batches = buf.sample_all(mini_batches=k)
    size = len(held) // k
    assert_same(f"number of batches of sample_all(mini_batches={k})", len(batches), k, trace)
    got = []
    for i, batch in enumerate(batches):
        assert_same(f"rows in batch {i} of sample_all(mini_batches={k}) (len(buf) is {len(held)})",
                    int(batch.batch_size[0]), size, trace)
        got += batch["id"].reshape(-1).tolist()
    want = held[: size * k]
    if got != want:
        unwritten = [v for v in got if not ID0 <= v < ID0 + written]
        fail(f"ids of sample_all(mini_batches={k}), batch after batch", got[:48],
             f"{want[:48]} (the held rows in slot order, the last {len(held) - size * k} dropped)", trace,
             f"never-written slots returned: {unwritten[:8]}" if unwritten else
             f"missing: {sorted(set(want) - set(got))[:8]}, extra: {sorted(set(got) - set(want))[:8]}")
    assert_same(f"len(buf) after sample_all(mini_batches={k})", len(buf), len(held), trace)
