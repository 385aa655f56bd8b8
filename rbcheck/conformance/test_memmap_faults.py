"""A disk-backed storage's faults are clear errors that change nothing (exact).

Under a buffer on ``storage="memmap"``: one of its files removed or truncated
(by another process, a cleanup job), its directory without write permission,
or the disk full (simulated: a file-size limit on this process, so no file
may grow). The next write raises an error naming the file or the directory,
and the buffer's length, cursor, write count and (when it can still read
them) contents are as they were; no entry outside the declared directory,
nor any of the user's files, is touched. Where the fault can be lifted (the
permission, the limit) the buffer then takes the same write as a new one.
Where this machine cannot make a fault (root ignores permission bits), the
property is skipped with that reason, never passed.
"""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, fail
from rbcheck.harness.disk_checks import (
    USER_FILES,
    bookkeeping,
    disk_full_reason,
    entries,
    file_size_limit,
    permission_bits_stop_writes,
    touched,
    user_files,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout

pytestmark = pytest.mark.requires("memmap")
SCRATCH = "scratch"
LAYOUT = Layout((Field(("obs",), (3,), "float32"), Field(("next", "done"), (), "bool")))
#: Rows of 16 KiB: a 16-row storage needs 256 KiB in one file, four times the limit.
BIG = Layout((Field(("obs",), (4096,), "float32"),))
LIMIT = 64 * 1024


def refused(buf, what: str, call, names: list[str], trace, taken_if=None) -> bool:
    """``call()`` must raise an error whose message names one of ``names``; or, where
    ``taken_if()`` says the write needed nothing the fault takes away (every file was
    made whole before it, and none grew or appeared), it may be taken: True then."""
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the error is checked below
        message = f"{type(err).__name__}: {err}"
        if not any(name in message for name in names):
            fail(f"error of {what}", f"<{message[:300]}>", f"an error naming one of {names}", trace)
        return False
    if taken_if is not None and taken_if():
        return True
    fail(what, "<returned>", "an error: the storage's disk is faulty", trace)


def sizes(files: list) -> dict:
    return {f: f.stat().st_size for f in files}


def storage_files(root, user) -> list:
    """The files the buffer made in its directory (not the user's)."""
    return sorted(p for p in (root / SCRATCH).rglob("*") if p.is_file() and p.relative_to(root / SCRATCH).as_posix()
                  not in user)


@given(data=st.data())
@pytest.mark.parametrize("fault", ["file_removed", "file_truncated"])
def test_a_file_removed_or_truncated_under_the_storage_is_a_clear_error(impl, fault, tmp_path_factory, data):
    """exact: after drawn writes, one of the storage's files (drawn) removed
    or truncated to half its size (at least 1 byte: the files here fit in one
    page, so a storage that reads on does not crash the run) makes the next write (extend, add, or an
    edit with "edit") raise an error naming the file or the directory; len,
    cursor and write count stay; contents, if still readable, are as before;
    nothing outside the directory nor any of the user's files is touched."""
    root = tmp_path_factory.mktemp("fault")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    spec = BufferSpec(capacity=capacity, seed=3, layout=LAYOUT.spec_layout(), storage="memmap",
                      scratch_dir=str(root / SCRATCH))
    user_files(root)
    user_files(root / SCRATCH)
    snapshot = entries(root)  # the user's
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    n = data.draw(st.integers(1, 2 * capacity), label="rows written first")
    buf.extend(layout.batch(0, n))
    files = [f for f in storage_files(root, USER_FILES) if fault == "file_removed" or f.stat().st_size >= 2]
    if not files:
        fail(f"files in {spec.scratch_dir!r} after a write", "<none>", "the storage's files", trace)
    victim = data.draw(st.sampled_from(files), label="file")
    before, contents = bookkeeping(buf), buf.contents()
    if fault == "file_removed":
        victim.unlink()
        trace.op(f"import os; os.unlink({str(victim)!r})")
    else:
        os.truncate(victim, max(1, victim.stat().st_size // 2))  # one page stays backed: no SIGBUS
        trace.op(f"import os; os.truncate({str(victim)!r}, {victim.stat().st_size})")
    kind = data.draw(st.sampled_from(["extend", "add", "edit"] if impl.has("edit") else ["extend", "add"]),
                     label="next write")
    calls = {"extend": ("buf.extend(layout.batch(100, 2))", lambda: buf.extend(layout.batch(100, 2))),
             "add": ("buf.add(layout.row(100))", lambda: buf.add(layout.row(100))),
             "edit": ("buf.set([0], layout.batch(100, 1))", lambda: buf.set([0], layout.batch(100, 1)))}
    what, call = calls[kind]
    refused(buf, what, call, [victim.name, str(root / SCRATCH)], trace)
    assert_same(f"(len, cursor, write_count) after the refused {kind}", bookkeeping(buf), before, trace)
    try:
        now = buf.contents()
    except Exception:  # noqa: BLE001 - refusing to read a faulty file is allowed
        now = None
    if now is not None:
        assert_td_equal(f"buf.contents() after the refused {kind}", now, contents, trace, check_device=False)
    changed = touched(snapshot, entries(root), SCRATCH)
    if changed:
        fail("entries touched outside the scratch directory or of the user's", changed, "none", trace)


def memmap_case(impl, root, capacity: int, rows: Layout):
    """``(spec, trace, layout)`` of a fault case: a memory-mapped spec of ``rows`` whose scratch directory
    is under ``root``, its trace, and the layout as the trace's source."""
    spec = BufferSpec(capacity=capacity, seed=3, layout=rows.spec_layout(), storage="memmap",
                      scratch_dir=str(root / SCRATCH))
    trace = Trace(impl, spec)
    return spec, trace, trace.source("layout", rows)


def check_fault_then_retry(impl, root, spec, layout, make_fault, lift_fault, trace, under: str = "") -> None:
    """Under ``make_fault`` the first write raises naming the directory and changes
    nothing; once lifted the same write gives the rows. The fault lasts for the
    refused write alone, as a ``with`` block would (``make_fault`` and
    ``lift_fault`` write their own lines into the trace, so the snippet lifts
    it too). ``under``: the failure message's ``with ...:`` around the refused write."""
    user_files(root)
    before_entries = entries(root)
    (root / SCRATCH).mkdir()
    buf = trace.wrap(impl.make(spec))
    made = sizes(storage_files(root, USER_FILES))  # files allocated whole at make() need no new space

    def write_under_the_fault() -> None:
        make_fault()
        try:
            buf.extend(layout.batch(0, spec.capacity))
        finally:
            lift_fault()

    taken = refused(buf, f"{under}buf.extend(layout.batch(0, {spec.capacity}))", write_under_the_fault,
                    [str(root / SCRATCH), SCRATCH], trace,
                    taken_if=lambda: bool(made) and sizes(storage_files(root, USER_FILES)) == made)
    if not taken:
        assert_same("(len, cursor, write_count) after the refused write", bookkeeping(buf), (0, 0, 0), trace)
    if taken:  # written into files made whole before the fault: nothing could fail, the rows must be there
        assert_same("(len, cursor, write_count) after a write into files made before the fault", bookkeeping(buf),
                    (spec.capacity, 0, spec.capacity), trace)
    else:
        buf.extend(layout.batch(0, spec.capacity))
    assert_td_equal("buf.contents() once the fault is lifted", buf.contents(), layout.batch(0, spec.capacity),
                    trace, check_device=False)
    changed = touched(before_entries, entries(root), SCRATCH)
    if changed:
        fail("entries touched outside the scratch directory or of the user's", changed, "none", trace)


def test_a_directory_without_write_permission_is_a_clear_error(impl, tmp_path):
    """exact: a buffer whose scratch directory has no write permission refuses
    its first write with an error naming the directory, and holds nothing;
    with the permission back, the same write gives the rows. Skipped, saying
    why, where permission bits do not stop this process (root)."""
    reason = permission_bits_stop_writes(tmp_path)
    if reason:
        pytest.skip(reason)
    root = tmp_path / "readonly"
    spec, trace, layout = memmap_case(impl, root, 4, LAYOUT)
    scratch = root / SCRATCH

    def fault() -> None:
        scratch.chmod(stat.S_IRUSR | stat.S_IXUSR)
        trace.op(f"import os; os.chmod({str(scratch)!r}, 0o500)")

    def lift() -> None:
        scratch.chmod(stat.S_IRWXU)
        trace.op(f"os.chmod({str(scratch)!r}, 0o700)")

    check_fault_then_retry(impl, root, spec, layout, fault, lift, trace)


def test_a_full_disk_is_a_clear_error(impl, tmp_path):
    """exact: with no file allowed past 64 KiB (RLIMIT_FSIZE: a full disk for
    this process) a buffer whose first write needs 256 KiB refuses it with an
    error naming the directory, and holds nothing; with the limit lifted, the
    same write gives the rows. A storage whose files were all made whole before
    the limit (cpprb's, at construction) needs no new space: it may take the
    write, no file growing, and must then hold the rows."""
    reason = disk_full_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "full"
    spec, trace, layout = memmap_case(impl, root, 16, BIG)
    trace.need("from rbcheck.harness.disk_checks import file_size_limit")
    limit = file_size_limit(LIMIT)

    def fault() -> None:
        limit.__enter__()
        trace.op(f"limit = file_size_limit({LIMIT}); limit.__enter__()  # no file may grow past it: a full disk")

    def lift() -> None:
        limit.__exit__(None, None, None)
        trace.op("limit.__exit__(None, None, None)  # the limit lifted")

    check_fault_then_retry(impl, root, spec, layout, fault, lift, trace, under=f"with file_size_limit({LIMIT}): ")
