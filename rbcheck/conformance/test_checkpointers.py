"""A checkpoint is a value: exact for every dtype, and independent of the buffer
loaded from it (exact).

TorchRL's storages are saved by checkpointers (flat, nested, H5, compressed),
and a storage loaded from a memory-mapped checkpoint may keep its rows mapped
onto the checkpoint's files (what TorchRL's ``_detach_from_load_path`` is
for): a later write would then change the checkpoint on disk. So, for rows
using every bit of every dtype (``harness/bit_layout.py``):

* save -> load gives the saved buffer's length, cursor, write count and
  contents, bit for bit, dtype and row shape included;
* writing to the loaded buffer (extend, add, an edit with "edit") leaves
  every file of the checkpoint byte-identical, and a new load of it still
  gives the state as saved;
* saving the loaded buffer over the checkpoint it was loaded from, then
  loading, saving at a new path and loading again (checkpoint, restore,
  checkpoint, restore) gives the loaded buffer's current state each time.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, fail
from rbcheck.harness.bit_layout import bit_layouts
from rbcheck.harness.disk_checks import bookkeeping, entries
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("save_load")


def _call(what: str, call, expected: str, trace):
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - a save or load that raises is the failure
        fail(what, f"<raised {type(err).__name__}: {err}>", expected, trace)


def _same_state(what: str, got, want: tuple, trace) -> None:
    assert_same(f"(len, cursor, write_count) of {what}", bookkeeping(got), want[0], trace)
    if want[1] is not None:
        assert_td_equal(f"{what}.contents()", got.contents(), want[1], trace, check_device=False)


def _state(buf) -> tuple:
    return bookkeeping(buf), (buf.contents() if len(buf) else None)


@given(data=st.data())
def test_a_checkpoint_round_trips_every_dtype_and_stays_as_saved(impl, tmp_path_factory, data):
    """exact: save(A) -> load(A) gives the saved state for every dtype and row
    shape; writes to the loaded buffer leave A's files byte-identical and a new
    load of A the saved state; the loaded buffer saved over A, loaded, saved
    at B and loaded again gives its current state each time."""
    sampler = "random" if impl.has("random") else "prioritized"
    if not impl.has(sampler):
        pytest.skip("not declared: random or prioritized")
    root = tmp_path_factory.mktemp("checkpointers")
    layout = data.draw(bit_layouts(max_fields=3), label="layout")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    spec = BufferSpec(capacity=capacity, sampler=sampler, seed=7, layout=layout.spec_layout())
    trace = Trace(impl, spec)
    trace.need("from rbcheck.harness.bit_layout import BitField, BitLayout")
    layout = trace.source("layout", layout)
    trace.directory(root, "root")
    a, b = trace.let("A", root / "A", "root / 'A'"), trace.let("B", root / "B", "root / 'B'")
    make = lambda var: _call("make(spec)", lambda: trace.make(spec, var), "a new buffer", trace)  # noqa: E731
    buf = _call("make(spec)", lambda: trace.wrap(impl.make(spec)), "a new buffer", trace)
    n = data.draw(st.integers(1, 2 * capacity), label="rows before the save")
    buf.extend(layout.batch(0, n))
    _call("buf.save(A)", lambda: buf.save(a), "a checkpoint at A", trace)
    saved, files = _state(buf), entries(a)

    buf2 = make("buf2")
    _call("buf2.load(A)", lambda: buf2.load(a), "the checkpoint loaded", trace)
    _same_state("the buffer loaded from A", buf2, saved, trace)

    m = data.draw(st.integers(1, 2 * capacity), label="rows written after the load")
    buf2.extend(layout.batch(1000, m))
    buf2.add(layout.row(2000))
    if impl.has("edit"):
        buf2.set([0], layout.batch(3000, 1))
    now = entries(a)
    changed = sorted(k for k in set(files) | set(now) if files.get(k) != now.get(k))
    if changed:
        fail("files of checkpoint A changed by writes to the buffer loaded from it", changed[:8],
             "none: a checkpoint is as it was saved", trace)
    buf3 = make("buf3")
    _call("buf3.load(A) after writes to buf2", lambda: buf3.load(a), "the checkpoint loaded", trace)
    _same_state("a new load of A after writes to the buffer loaded from it", buf3, saved, trace)

    current = _state(buf2)
    holder = buf2
    for step, (where, path) in enumerate([("A", a), ("B", b)], start=1):  # A: over the one it was loaded from
        name = "buf2" if step == 1 else "buf4"
        _call(f"{name}.save({where}) (round {step})", lambda h=holder, p=path: h.save(p), f"a checkpoint at {where}",
              trace)
        holder = make("buf4")  # round 2 saves this round's buf4, then loads into a new one
        _call(f"buf4.load({where}) (round {step})", lambda h=holder, p=path: h.load(p), "the checkpoint loaded",
              trace)
        _same_state(f"the buffer restored from {where} (checkpoint/restore round {step})", holder, current, trace)
