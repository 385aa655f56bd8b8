"""What the properties of disk-backed storages (issue 41) need around a buffer:
the user's files and what became of them, the buffer's bookkeeping, and the
faults a disk can have (a read-only directory, a full disk) made on purpose.

* :func:`user_files` writes a user's files into a directory (also into the
  buffer's own scratch directory: a storage must never delete them);
  :func:`entries` snapshots every entry under a root (bytes of files, symlink
  targets, directories), so a property can say which of the user's entries a
  call touched, or what it wrote outside its directory (:func:`touched`).
* :func:`bookkeeping` is ``(len, cursor, write_count)``.
* :func:`permission_bits_stop_writes` probes whether a directory without the
  write bit stops this process (it does not for root or a process with
  CAP_DAC_OVERRIDE): the property is then skipped, saying so, never passed.
* :func:`file_size_limit` makes the disk "full" for this process: a soft
  ``RLIMIT_FSIZE`` (a file may not grow past ``nbytes``; an allocation or
  write past it fails with EFBIG, SIGXFSZ ignored meanwhile), put back after.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The user's files: relative path -> bytes (names a storage could take for its own).
USER_FILES = {"notes.txt": b"lr=3e-4\n", "rbcheck-memmap-notes.txt": b"the user's, not rbcheck's\n",
              "run/0.bin": bytes(range(64))}


def user_files(root: Path) -> None:
    """Write :data:`USER_FILES` under ``root`` (made if missing)."""
    for name, data in USER_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def entries(root: Path) -> dict[str, Any]:
    """Every entry under ``root``: relative path -> bytes (file), ``("link", target)``
    or ``"dir"``."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = path.read_bytes()
    return out


def touched(before: dict[str, Any], after: dict[str, Any], declared: str) -> list[str]:
    """What a buffer did to entries it should not have: each entry of ``before`` (the
    user's) removed or changed, and each entry added outside ``declared`` (the scratch
    directory, relative to the root)."""
    bad = [f"{k} ({'removed' if k not in after else 'changed'})" for k in before if after.get(k) != before[k]]
    return bad + [f"{k} (added)" for k in after
                  if k not in before and k != declared and not k.startswith(declared + "/")]


def bookkeeping(buf: Any) -> tuple[int, int, int]:
    return len(buf), int(buf.cursor), int(buf.write_count)


def permission_bits_stop_writes(directory: Path) -> str | None:
    """None when a directory without the write bit refuses a new file here; else the
    reason it does not (root, CAP_DAC_OVERRIDE, a file system without permissions)."""
    probe = directory / "rbcheck-permission-probe"
    probe.mkdir()
    try:
        probe.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            (probe / "x").write_bytes(b"x")
        except PermissionError:
            return None
        who = "root (euid 0)" if hasattr(os, "geteuid") and os.geteuid() == 0 else "this process"
        return (f"running as {who}: a directory without the write bit still takes new files here, so "
                f"a read-only directory cannot be made (not checked, not passed)")
    finally:
        probe.chmod(stat.S_IRWXU)
        for path in probe.iterdir():
            path.unlink()
        probe.rmdir()


@contextlib.contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """No file of this process may grow past ``nbytes`` inside the block (see module doc)."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def disk_full_reason() -> str | None:
    """None when :func:`file_size_limit` can run here; else why not."""
    try:
        import resource
        import signal
    except ImportError as error:
        return f"no resource or signal module here ({error}): a full disk cannot be simulated"
    if not hasattr(signal, "SIGXFSZ") or not hasattr(resource, "RLIMIT_FSIZE"):
        return "no RLIMIT_FSIZE / SIGXFSZ on this platform: a full disk cannot be simulated"
    return None
