"""A save never touches the user's files (exact).

Users save a buffer into a run directory that already holds their own
files: a note at the top level, a model checkpoint in ``ckpt-1000/``, an
empty ``ckpt-best/``, a nested directory, a ``latest`` symlink. Names
like ``ckpt-*`` and ``CURRENT.tmp`` are what a save's cleanup is most
likely to take for its own (rbcheck's did, issue 17: ``rmtree`` on every
``ckpt-*``). After a save, and after a second save over the first, every
one of them is still there, byte-identical (a symlink points where it did),
and the directory loads exactly as the last save. A save may instead refuse
the directory, with an error and nothing written. A ``CURRENT`` naming the
user's ``ckpt-best/`` (a copy of a checkpoint) never gets it deleted: rbcheck
took any ``ckpt-*`` pointer for its own and did (issue 39).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.checkpoint_state import (
    difference,
    snapshot,
    source,
    spec_for,
    target,
)

pytestmark = pytest.mark.requires("save_load")

#: The user's files: relative path -> bytes.
USER_FILES = {
    "notes.txt": b"lr=3e-4, seed=0\n",
    "ckpt-1000/model.pt": b"PK\x03\x04 the user's weights",
    "ckpt-1000/optim.pt": bytes(range(256)),
    "ckpt-abcd1234/meta.json": b'{"step": 1000}',
    "ckpt-best-2/nested/deep/events.out": b"\x00\x01\x02 tensorboard",
    "CURRENT.tmp": b"the user's own file\n",
}
#: The user's empty directories.
USER_DIRS = ("ckpt-best", "ckpt-empty", "logs")
#: The user's symlinks: name -> target (relative, inside the directory).
USER_LINKS = {"latest": "ckpt-1000"}


def users_run_directory(path: Path) -> dict[str, object]:
    """Create the user's entries in ``path`` (made if missing); return :func:`user_entries`."""
    path.mkdir(parents=True, exist_ok=True)
    for name, data in USER_FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    for name in USER_DIRS:
        (path / name).mkdir()
    if hasattr(os, "symlink"):
        for name, to in USER_LINKS.items():
            (path / name).symlink_to(to, target_is_directory=(path / to).is_dir())
    return user_entries(path)


def user_entries(path: Path) -> dict[str, object]:
    """What is under ``path`` at the user's names: for each entry below a
    top-level name of the user's, its bytes (a file), ``"<dir>"`` or
    ``"-> target"`` (a symlink, not followed)."""
    tops = {name.split("/")[0] for name in (*USER_FILES, *USER_DIRS, *USER_LINKS)}
    found: dict[str, object] = {}
    for top in sorted(tops):
        stack = [path / top]
        while stack:
            item = stack.pop()
            name = item.relative_to(path).as_posix()
            if item.is_symlink():
                found[name] = f"-> {os.readlink(item)}"
            elif item.is_dir():
                found[name] = "<dir>"
                stack.extend(item.iterdir())
            elif item.exists():
                found[name] = item.read_bytes()
    return found


def changed(got: dict[str, object], want: dict[str, object]) -> str | None:
    """The user's entries that are gone, changed or new, or None."""
    gone = sorted(set(want) - set(got))
    altered = sorted(name for name in set(want) & set(got) if got[name] != want[name])
    added = sorted(set(got) - set(want))
    parts = [f"{label} {names[:6]}" for label, names in
             (("removed", gone), ("changed", altered), ("added inside them", added)) if names]
    return "; ".join(parts) or None


def test_saving_into_a_directory_with_the_users_files_leaves_them_byte_identical(impl, tmp_path):
    """exact: ``save(path)`` where ``path`` holds the user's files (a file at
    the top level, ``ckpt-1000/model.pt``, an empty ``ckpt-best/``, a nested
    directory, a ``CURRENT.tmp``, a ``latest`` symlink) leaves every one of
    them there and byte-identical, after one save and after a second save
    over it; the directory then loads exactly as the last save. A save may
    refuse such a directory instead: it raises and writes nothing."""
    spec = spec_for(impl)
    trace = Trace(impl, spec)
    probe = tmp_path / "probe"
    source(impl, spec).save(probe)
    written = {p.name for p in probe.iterdir()}
    clash = written & {name.split("/")[0] for name in (*USER_FILES, *USER_DIRS, *USER_LINKS)}
    if clash:
        fail("the user's names", sorted(clash), "names that differ from what a save into an empty directory "
             "writes (harness bug: pick other names)", trace)
    trace.need("from rbcheck.conformance.test_checkpoint_user_files import changed, user_entries, "
               "users_run_directory")
    trace.directory(tmp_path)
    path = trace.let("path", tmp_path / "runs" / "exp1", "tmp / 'runs' / 'exp1'")
    user = users_run_directory(path)
    trace.op("user = users_run_directory(path)  # notes.txt, ckpt-1000/model.pt, ckpt-best/, ...")
    for count, extra in enumerate((0, 3), start=1):
        trace.note(f"save {count}")
        buf = source(impl, spec, extra=extra, trace=trace, var=None if count == 1 else "buf")
        # the snapshot samples (it moves the generator): take it of an untouched twin
        saved = snapshot(source(impl, spec, extra=extra), spec, impl)
        before = {p.name for p in path.iterdir()}
        try:
            buf.save(path)
        except Exception as err:  # noqa: BLE001 - a refusal is allowed if it wrote nothing
            after = {p.name for p in path.iterdir()}
            problem = changed(user_entries(path), user)
            if problem or after != before:
                fail(f"a refused save {count} ({type(err).__name__}: {str(err)[:100]})",
                     f"<{problem or f'new entries {sorted(after - before)}'}>",
                     "a refusal that writes nothing", trace)
            return
        trace.op("assert user_entries(path) == user, changed(user_entries(path), user)")
        problem = changed(user_entries(path), user)
        if problem:
            fail(f"the user's files after save {count}", f"<{problem}>", "all there, byte-identical", trace)
        loaded = target(impl, spec, trace, "loaded")
        try:
            loaded.load(path)
        except Exception as err:  # noqa: BLE001
            fail(f"load after save {count} beside the user's files", f"<{type(err).__name__}: {err}>",
                 "the saved state", trace)
        diff = difference(snapshot(loaded, spec, impl), saved)
        if diff:
            fail(f"load after save {count} beside the user's files", diff, "the saved state", trace)


def everything(path: Path) -> dict[str, object]:
    """Every entry under ``path``: a file's bytes, ``"<dir>"`` or ``"-> target"``."""
    found: dict[str, object] = {}
    for item in sorted(path.rglob("*")):
        name = item.relative_to(path).as_posix()
        found[name] = (f"-> {os.readlink(item)}" if item.is_symlink() else "<dir>" if item.is_dir()
                       else item.read_bytes())
    return found


def users_copy_of_a_checkpoint(probe: Path, best: Path) -> None:
    """``best``: the user's copy of the checkpoint at ``probe`` -- the
    sub-directory its ``CURRENT`` names (rbcheck's format), else every file
    the save wrote, side by side."""
    best.mkdir(parents=True)
    pointer = probe / "CURRENT"
    live = probe / pointer.read_text().strip() if pointer.is_file() else None
    if live is not None and live.is_dir() and not live.is_symlink() and live.parent == probe:
        shutil.copytree(live, best, dirs_exist_ok=True)
        return
    for file in sorted(p for p in probe.rglob("*") if p.is_file() and not p.is_symlink()):
        shutil.copyfile(file, best / file.relative_to(probe).as_posix().replace("/", "_"))


def test_saving_never_deletes_the_directory_a_pointer_names(impl, tmp_path):
    """exact: ``path`` holds a ``CURRENT`` naming ``ckpt-best/``, the user's
    copy of a checkpoint the implementation wrote (its files and nothing
    else, as a save's own sub-directory would be). A save leaves
    ``ckpt-best/`` byte-identical: it refuses, writing nothing (the pointer
    names a directory the save did not create: rbcheck's refuse, issue 39),
    or saves and the directory then loads exactly as saved."""
    spec = spec_for(impl)
    trace = Trace(impl, spec)
    trace.need("from rbcheck.conformance.test_checkpoint_user_files import users_copy_of_a_checkpoint")
    trace.directory(tmp_path)
    probe = trace.let("probe", tmp_path / "probe", "tmp / 'probe'")
    path = trace.let("path", tmp_path / "runs" / "exp1", "tmp / 'runs' / 'exp1'")
    source(impl, spec, trace=trace).save(probe)
    users_copy_of_a_checkpoint(probe, path / "ckpt-best")
    trace.op("users_copy_of_a_checkpoint(probe, path / 'ckpt-best')")
    (path / "CURRENT").write_text("ckpt-best\n")
    trace.op("(path / 'CURRENT').write_text('ckpt-best\\n')  # the user's pointer to it")
    before, best = everything(path), everything(path / "ckpt-best")
    buf = source(impl, spec, extra=3, trace=trace, var="buf")
    saved = snapshot(source(impl, spec, extra=3), spec, impl)
    try:
        buf.save(path)
    except Exception as err:  # noqa: BLE001 - a refusal is allowed if it wrote nothing
        problem = changed(everything(path), before)
        if problem:
            fail(f"a refused save ({type(err).__name__}: {str(err)[:100]})", f"<{problem}>",
                 "a refusal that writes and deletes nothing", trace)
        return
    trace.op("assert (path / 'ckpt-best').is_dir()")
    problem = changed(everything(path / "ckpt-best"), best)
    if problem:
        fail("ckpt-best/, which CURRENT named, after the save", f"<{problem}>",
             "byte-identical (the save did not create it: it is the user's)", trace)
    loaded = target(impl, spec, trace, "loaded")
    try:
        loaded.load(path)
    except Exception as err:  # noqa: BLE001
        fail("load after a save over the user's pointer", f"<{type(err).__name__}: {err}>",
             "the saved state", trace)
    diff = difference(snapshot(loaded, spec, impl), saved)
    if diff:
        fail("load after a save over the user's pointer", diff, "the saved state", trace)
