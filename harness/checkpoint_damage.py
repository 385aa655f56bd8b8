"""The damage of the checkpoint-fault properties
(``rbcheck/conformance/test_checkpoint_faults.py``): :data:`FAULTS`, each a
format-independent way to damage a checkpoint directory one file or folder
at a time; :data:`CONTRADICTIONS`, each an edit of the state in an rbcheck
checkpoint that makes it contradict itself, re-sealed (:func:`reseal`: the
checksum and the tensor file's digest recomputed, as anyone can) so that only the state's
meaning can refuse it; and :func:`interrupted_save`, a save in a forked
child killed (or failing) at its k-th filesystem operation
(:data:`FS_EVENTS`).
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["FS_EVENTS", "FAULTS", "CONTRADICTIONS", "Contradiction", "reseal", "files_under", "dirs_under", "count_items", "outside_state",
           "interrupted_save", "interrupted_save_here"]

#: Audit events that change (or open) files: the "filesystem operations" of a save.
FS_EVENTS = frozenset({
    "open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.link",
    "os.symlink", "shutil.rmtree", "shutil.move", "shutil.copyfile", "tempfile.mkstemp",
    "tempfile.mkdtemp", "os.chmod", "os.utime",
})


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def dirs_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())


class Payload:
    """Unpickling this runs code: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def payload_bytes(marker: Path, kind: str) -> bytes:
    if kind == "pickle":
        return pickle.dumps(Payload(marker))
    holder = marker.parent / "payload.pt"
    torch.save({"state": Payload(marker)}, holder)
    return holder.read_bytes()


# --------------------------------------------------------------------------
# damage: each function damages a fresh checkpoint at ``ckpt`` one way at a
# time, yielding a description and what is allowed (True: loading the
# untouched state is fine; False: the load must be refused)
# --------------------------------------------------------------------------


def each_file(change: Callable[[Path, Path], None], may_load: bool = True):
    def damage(ckpt: Path, outside: Path, count: int) -> tuple[str, bool]:
        file = files_under(ckpt)[count]
        change(file, outside)
        return f"{file.relative_to(ckpt)}", may_load
    damage.per = "file"
    return damage


def each_dir(change: Callable[[Path, Path], None], may_load: bool = True, root: bool = True):
    """``root``: the checkpoint directory itself too (the caller's path; a
    symlink there is the caller's choice, not the checkpoint's)."""
    def damage(ckpt: Path, outside: Path, count: int) -> tuple[str, bool]:
        folder = ([ckpt] * root + dirs_under(ckpt))[count]
        change(folder, outside)
        return f"{folder.relative_to(ckpt)}/", may_load
    damage.per = "dir" if root else "subdir"
    return damage


def flip(position: Callable[[int], int]):
    def change(file: Path, outside: Path) -> None:
        raw = bytearray(file.read_bytes())
        if raw:
            raw[position(len(raw))] ^= 0x5A
        file.write_bytes(bytes(raw))
    return change


def truncate(keep: Callable[[int], int]):
    def change(file: Path, outside: Path) -> None:
        raw = file.read_bytes()
        file.write_bytes(raw[: keep(len(raw))])
    return change


def to_symlink_outside(item: Path, outside: Path) -> None:
    copy = outside / f"copy-{item.name}-{len(list(outside.iterdir()))}"
    if item.is_dir():
        shutil.copytree(item, copy, symlinks=True)
        shutil.rmtree(item)
    else:
        shutil.copyfile(item, copy)
        item.unlink()
    item.symlink_to(copy, target_is_directory=copy.is_dir())


def replace_by(kind: str):
    def change(file: Path, outside: Path) -> None:
        file.write_bytes(payload_bytes(outside / "PWNED", kind))
    return change


def add_payloads(folder: Path, outside: Path) -> None:
    blob = payload_bytes(outside / "PWNED", "pickle")
    for name in ("prefetch.pkl", "state.pkl", "metadata.pkl", "transform.t", "buffer.pt", "data.pt"):
        if not (folder / name).exists():
            (folder / name).write_bytes(blob)


FAULTS = {
    "file_deleted": each_file(lambda f, o: f.unlink()),
    "file_emptied": each_file(truncate(lambda n: 0)),
    "file_truncated_to_half": each_file(truncate(lambda n: n // 2)),
    "file_missing_last_byte": each_file(truncate(lambda n: max(n - 1, 0))),
    "byte_flipped_at_start": each_file(flip(lambda n: 0)),
    "byte_flipped_in_middle": each_file(flip(lambda n: n // 2)),
    "byte_flipped_at_end": each_file(flip(lambda n: n - 1)),
    "extra_file_in_directory": each_dir(lambda d, o: (d / "unexpected.bin").write_bytes(b"\x00junk" * 9)),
    "file_replaced_by_pickle_payload": each_file(replace_by("pickle")),
    "file_replaced_by_torch_save_payload": each_file(replace_by("torch")),
    "pickle_payloads_added_under_common_names": each_dir(add_payloads),
    "file_replaced_by_symlink_outside": each_file(to_symlink_outside, may_load=False),
    "directory_replaced_by_symlink_outside": each_dir(to_symlink_outside, may_load=False, root=False),
}


# --------------------------------------------------------------------------
# contradictions: the state of an rbcheck checkpoint edited and re-sealed
# --------------------------------------------------------------------------


def reseal(ckpt: Path, edit: Callable[[dict, dict], None]) -> bool:
    """Edit the state of the rbcheck checkpoint at ``ckpt`` in place and seal it
    again: ``edit(state, tensors)`` changes the JSON state (``{"tensor": name}``
    in each tensor's place) and the ``{name: tensor}`` of its tensor file; the
    tensor file is rewritten, its digest and ``meta.json``'s checksum
    recomputed. False (nothing changed) when ``ckpt`` is not in rbcheck's
    format (another library's checkpoint: no state to edit)."""
    import json

    from safetensors.torch import load as load_tensors
    from safetensors.torch import save as dump_tensors

    from rbcheck.reference import checkpoint_format as fmt

    pointer = ckpt / "CURRENT"
    if not pointer.is_file():
        return False
    live = ckpt / pointer.read_text().strip()
    try:
        meta = json.loads((live / fmt.META).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("format") != fmt.FORMAT:
        return False
    tensors = dict(load_tensors((live / fmt.TENSORS).read_bytes()))
    edit(meta["state"], tensors)
    blob = dump_tensors(tensors)
    (live / fmt.TENSORS).write_bytes(blob)
    (live / fmt.META).write_bytes(fmt.encode_meta(meta["state"], fmt.digest(blob)))
    return True


@dataclass(frozen=True)
class Contradiction:
    """An edit of a checkpoint's state that no buffer could have saved. ``field``:
    what the refusal must name; ``needs``: the capability of the spec it applies
    to ("prioritized": it edits the sum tree or the max priority, or only a
    prioritized buffer's leaves show it), or "" (any)."""

    edit: Callable[[dict, dict], None]
    field: str
    needs: str = ""


def _leaves(state: dict, tensors: dict) -> torch.Tensor:
    return tensors[state["sampler"]["sum_tree"]["leaves"]["tensor"]]


def _set(*where: str, value):
    def edit(state: dict, tensors: dict) -> None:
        part = state
        for key in where[:-1]:
            part = part[key]
        part[where[-1]] = value
    return edit


def _leaf_of_a_slot_never_written(state: dict, tensors: dict) -> None:
    leaves = _leaves(state, tensors)
    leaves[-1] = leaves.max()  # the source holds fewer rows than its capacity


#: The source buffer (``checkpoint_state.source``) holds 6 rows of 8, with
#: stored priorities 5.0 and 0.5 at slots 1 and 4 (max priority 5.0).
CONTRADICTIONS = {
    # issue 39: a full or partly full buffer said to hold 3 rows: leaves 3.. are non-zero
    "write_count_below_the_rows_with_priorities": Contradiction(
        _set("writer", "write_count", value=3), "write_count", "prioritized"),
    "priority_in_a_slot_never_written": Contradiction(_leaf_of_a_slot_never_written, "leaves", "prioritized"),
    "max_priority_below_a_stored_priority": Contradiction(
        _set("sampler", "max_priority", value=1.0), "max_priority", "prioritized"),
    "max_priority_below_its_start": Contradiction(
        _set("sampler", "max_priority", value=0.25), "max_priority", "prioritized"),
    "inner_nodes_beside_the_leaves": Contradiction(
        _set("sampler", "sum_tree", "nodes", value=[0.0] * 16), "nodes", "prioritized"),
    "cursor_beside_the_write_count": Contradiction(_set("writer", "cursor", value=2), "cursor"),
    "generations_beside_the_write_count": Contradiction(
        _set("writer", "generation", value=[7, 6, 5, 4, 3, 2, 1, 0]), "generation"),
    "unknown_key_in_the_state": Contradiction(_set("notes", value="resume here"), "notes"),
    "unknown_key_in_the_storage": Contradiction(_set("storage", "size", value=3), "size"),
    "unknown_key_in_the_sampler": Contradiction(_set("sampler", "temperature", value=0.5), "temperature"),
}


def count_items(ckpt: Path, per: str) -> int:
    return {"file": len(files_under(ckpt)), "dir": 1 + len(dirs_under(ckpt)), "subdir": len(dirs_under(ckpt))}[per]


def outside_state(outside: Path) -> dict:
    return {p.name: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()}


# --------------------------------------------------------------------------
# interrupted saves
# --------------------------------------------------------------------------

_HOOK = {"armed": False, "count": 0, "at": 0, "action": None}


def _audit(event: str, args) -> None:
    if _HOOK["armed"] and event in FS_EVENTS:
        _HOOK["count"] += 1
        if _HOOK["count"] == _HOOK["at"]:
            _HOOK["armed"] = False
            _HOOK["action"]()


def interrupted_save(buf, path: Path, at: int, kill: bool) -> str:
    """Save ``buf`` to ``path`` in a forked child that is SIGKILLed (or whose
    operation raises OSError) at its ``at``-th filesystem operation.
    Returns "completed", "interrupted", "hung" or "failed before any
    injected fault" (the save raised on its own in the child).

    Once CUDA is initialised in this process a forked child cannot use it
    (CUDA does not survive fork), so the save runs here instead
    (:func:`interrupted_save_here`), with the same outcomes but "hung"."""
    if torch.cuda.is_initialized():
        return interrupted_save_here(buf, path, at, kill)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            def act():
                _HOOK["fired"] = True
                if kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(28, f"injected failure at filesystem operation {at}")
            _HOOK.update(armed=False, count=0, at=at, action=act, fired=False)
            sys.addaudithook(_audit)
            _HOOK["armed"] = True
            buf.save(path)
            code = 0 if _HOOK["count"] < at else 3
        except BaseException:  # noqa: BLE001 - the injected failure or its consequence
            code = 3 if _HOOK.get("fired") else 4  # 4: the save failed on its own
        os._exit(code)
    deadline = time.monotonic() + 20  # a child that hangs (a lock held at fork) is killed
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.001)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 4):
        return {0: "completed", 4: "failed before any injected fault"}[os.WEXITSTATUS(status)]
    return "interrupted"


class _Killed(BaseException):
    """Stops a save run in this process at the injected kill."""


_INSTALLED: list[bool] = []


def interrupted_save_here(buf, path: Path, at: int, kill: bool) -> str:
    """:func:`interrupted_save` without a fork. ``kill``: at the ``at``-th
    filesystem operation the folder that holds ``path`` is copied as it is
    on disk at that moment (what a SIGKILL leaves: data still in the save's
    own buffers is not there), the save is stopped, and once it has
    returned the folder is put back exactly as copied, undoing whatever the
    save's error handling did after the kill. Otherwise the operation raises
    OSError and the save's own handling of it is what stays.

    It rewrites the whole of ``path.parent``: call it only on a path in a
    scratch folder of its own (the properties use pytest's ``tmp_path``).
    Unlike the forked save, the buffer keeps whatever the interrupted save
    did to it, and a save that hangs is not stopped."""
    folder = path.parent
    snapshot = Path(tempfile.mkdtemp(prefix="rbcheck-kill-"))

    def act():
        _HOOK["fired"] = True
        if kill:
            shutil.copytree(folder, snapshot / "folder", symlinks=True)
            raise _Killed()
        raise OSError(28, f"injected failure at filesystem operation {at}")

    if not _INSTALLED:  # an audit hook cannot be removed: install one, arm it per save
        sys.addaudithook(_audit)
        _INSTALLED.append(True)
    _HOOK.update(armed=False, count=0, at=at, action=act, fired=False)
    try:
        _HOOK["armed"] = True
        try:
            buf.save(path)
            outcome = "completed" if _HOOK["count"] < at else "interrupted"
        except BaseException:  # noqa: BLE001 - the injected fault, its consequence, or the save's own error
            if not _HOOK["fired"]:
                return "failed before any injected fault"
            outcome = "interrupted"
        finally:
            _HOOK["armed"] = False
        if kill and _HOOK["fired"]:
            for entry in list(folder.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            for entry in (snapshot / "folder").iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, folder / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, folder / entry.name, follow_symlinks=False)
        return outcome
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
