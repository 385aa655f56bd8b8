"""A memory-mapped storage holds what the in-memory one holds (exact).

Rows kept on disk (TorchRL's ``LazyMemmapStorage(scratch_dir=...)``, cpprb's
``mmap_prefix``) must not change what a buffer is: after every call of a
drawn sequence (extends across the ring's wrap, adds, samples, in-place
edits, a close and a reopen) the buffer under test, on ``storage="memmap"``,
has the in-memory reference's length, cursor, write count and contents, and
every sampled row is the held row of its slot. It writes only into its
declared directory and leaves the user's files there alone. A directory
reused from an earlier buffer (closed, alive or dropped) gives a new buffer
that holds nothing it was not given (pytorch/rl #2437: a reused scratch
directory leaked the previous run's rows).
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, fail
from rbcheck.harness.disk_checks import bookkeeping, entries, touched, user_files
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import layouts

pytestmark = pytest.mark.requires("memmap")
SCRATCH = "scratch"


def attempt(what, call, expected, trace):
    """``call()``, or a failure saying what it raised."""
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - the buffer's error is the verdict
        fail(what, f"<raised {type(err).__name__}: {err}>", expected, trace)


def disk_spec(root, capacity: int, seed: int, layout) -> BufferSpec:
    return BufferSpec(capacity=capacity, sampler="random", seed=seed, layout=layout.spec_layout(),
                      storage="memmap", scratch_dir=str(root / SCRATCH))


def check_same(buf, model, trace, when: str) -> None:
    assert_same(f"(len, cursor, write_count) {when}", bookkeeping(buf), bookkeeping(model), trace)
    if len(model):
        assert_td_equal(f"buf.contents() {when}", buf.contents(), model.contents(), trace, check_device=False)


@st.composite
def disk_operations(draw, capacity: int, edits: bool) -> list[tuple]:
    """extend (up to 2x capacity), add, sample, edit (with ``edits``) and reopen, after a first extend."""
    kinds = ["extend", "add", "sample", "reopen"] + (["edit"] if edits else [])
    ops = [("extend", draw(st.integers(1, 2 * capacity)))]
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(kinds))
        if kind == "extend":
            ops.append(("extend", draw(st.integers(1, 2 * capacity))))
        elif kind == "sample":
            ops.append(("sample", draw(st.integers(1, 4))))
        elif kind == "edit":
            ops.append(("edit", draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=3))))
        else:
            ops.append((kind,))
    return ops


@given(data=st.data())
def test_memmap_storage_matches_the_memory_reference_call_for_call(impl, reference_impl, tmp_path_factory, data):
    """exact: after every call of a drawn sequence (extends of up to 2x the
    capacity, so the ring wraps; adds; samples; edits with capability "edit";
    close() and a reopen from the files) the memmap buffer's length, cursor,
    write count and contents equal the in-memory reference's, every sampled
    row equals the held row of its slot, and no entry outside the scratch
    directory nor any of the user's files in it was touched."""
    root = tmp_path_factory.mktemp("memmap")
    layout = data.draw(layouts(max_fields=3), label="layout")
    spec = disk_spec(root, data.draw(st.integers(1, 6), label="capacity"), data.draw(st.integers(0, 99)), layout)
    ops = data.draw(disk_operations(spec.capacity, impl.has("edit")), label="operations")
    user_files(root)
    user_files(root / SCRATCH)
    before = entries(root)
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = attempt("make(spec)", lambda: trace.wrap(impl.make(spec)), "a new buffer", trace)
    model = reference_impl.make(spec.but(storage="memory", scratch_dir=None))
    written, edited = 0, 0
    for op in ops:
        if op[0] == "extend":
            for b in (buf, model):
                b.extend(layout.batch(written, op[1]))
            written += op[1]
        elif op[0] == "add":
            for b in (buf, model):
                b.add(layout.row(written))
            written += 1
        elif op[0] == "sample":
            rows, info = buf.sample(op[1])
            index = info["index"].cpu()
            assert_td_equal("sampled rows (vs buf.contents()[info['index']])", rows.cpu(),
                            buf.contents()[index], trace, check_device=False)
        elif op[0] == "edit":
            index = [i % len(model) for i in op[1]]
            for b in (buf, model):
                b.set(index, layout.batch(10**6 + edited, len(index)))
            edited += len(index)
        else:
            again = spec.but(reopen=True)
            attempt("buf.close()", buf.close, "a clean close", trace)
            buf = attempt("make(spec.but(reopen=True))", lambda s=again: trace.make(s, "buf"),
                          "the buffer as it was closed", trace)
        check_same(buf, model, trace, f"after {op[0]}")
    changed = touched(before, entries(root), SCRATCH)
    if changed:
        fail("entries touched outside the scratch directory or of the user's", changed, "none", trace)


@given(data=st.data())
def test_reused_scratch_dir_starts_empty_and_keeps_the_users_files(impl, tmp_path_factory, data):
    """exact: in a scratch directory an earlier buffer wrote rows to (then
    closed it, kept it alive or dropped it), a new buffer has len, cursor and
    write count 0, refuses to sample, after k rows holds exactly those k rows,
    and after close() and a reopen holds them again; the user's files in the
    directory and around it are byte-identical."""
    root = tmp_path_factory.mktemp("reused")
    layout = data.draw(layouts(max_fields=3), label="layout")
    spec = disk_spec(root, data.draw(st.integers(1, 6), label="capacity"), 0, layout)
    old_rows = data.draw(st.integers(1, 3 * spec.capacity), label="rows the earlier buffer wrote")
    ending = data.draw(st.sampled_from(["closed", "alive", "dropped"]), label="the earlier buffer")
    k = data.draw(st.integers(1, spec.capacity), label="rows the new buffer writes")
    user_files(root)
    user_files(root / SCRATCH)
    before = entries(root)
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    trace.note("the earlier buffer")
    old = trace.wrap(impl.make(spec))  # the snippet's buf
    old.extend(layout.batch(1000, old_rows))
    if ending == "closed":
        old.close()
    elif ending == "dropped":
        del old
        gc.collect()
        trace.need("import gc")
        trace.op("del buf; gc.collect()  # dropped")
    else:
        trace.op("old = buf  # kept alive")
    trace.note("a new buffer in the same directory")
    buf = attempt("make(spec) in a reused directory", lambda: trace.make(spec, "buf"), "a new, empty buffer", trace)
    assert_same("(len, cursor, write_count) of a new buffer", bookkeeping(buf), (0, 0, 0), trace)
    try:
        buf.sample(2)
    except Exception:  # noqa: BLE001 - an empty buffer must refuse
        pass
    else:
        fail("buf.sample(2) on a new buffer in a reused directory", "<returned a batch>",
             "an error: the buffer is empty", trace)
    buf.extend(layout.batch(0, k))
    assert_td_equal("buf.contents()", buf.contents(), layout.batch(0, k), trace, check_device=False)
    again = spec.but(reopen=True)
    attempt("buf.close()", buf.close, "a clean close", trace)
    buf = attempt("make(spec.but(reopen=True))", lambda: trace.make(again, "buf"), "the buffer as it was closed",
                  trace)
    assert_same("(len, cursor, write_count) after the reopen", bookkeeping(buf), (k, k % spec.capacity, k), trace)
    assert_td_equal("buf.contents() after the reopen", buf.contents(), layout.batch(0, k), trace, check_device=False)
    changed = touched(before, entries(root), SCRATCH)
    if changed:
        fail("entries touched outside the scratch directory or of the user's", changed, "none", trace)
