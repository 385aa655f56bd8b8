"""Compiling the native library: the compiler, the per-user build cache, one cached
build per source, compiler, flags and Python (``native.lib()`` loads it)."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("tree.c")
#: tree.c plus the hot calls as a CPython extension module (``calls()``), built where Python.h is.
CALLS = SOURCE.with_name("calls.c")
#: Every file of the build: tree.c includes pow.c, tree_update.c and sample.c (one translation unit).
SOURCES = (SOURCE, SOURCE.with_name("pow.c"), SOURCE.with_name("tree_update.c"), SOURCE.with_name("sample.c"))
#: -Werror=implicit-function-declaration: what GCC 14 and clang 16 do by default, on every compiler
FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-std=gnu99", "-pthread",
         "-Werror=implicit-function-declaration")
#: Libraries linked after the source (libm: ``pow``, see ``rb_extend_prepare``).
LIBS = ("-lm",)


def _compiler() -> list[str] | None:
    """The compiler command (``$CC`` may carry words, e.g. ``ccache gcc``), or None."""
    words = shlex.split(os.environ.get("CC", ""))
    if words:
        found = shutil.which(words[0])
        return [found, *words[1:]] if found else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def cache_dir() -> Path:
    root = os.environ.get("RBCHECK_NATIVE_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rbcheck"


def _compile(cc: list[str], main: Path, extra: tuple, suffix: str) -> Path:
    """The cached build of ``main`` (which includes the other sources), compiled if missing."""
    source = b"\0".join(path.read_bytes() for path in (main, *SOURCES))
    key = hashlib.sha256(b"\0".join([source, " ".join(cc).encode(), " ".join(FLAGS + extra + LIBS).encode(),
                                     sys.platform.encode(), platform.machine().encode(),
                                     sys.version.encode(), suffix.encode()])).hexdigest()[:20]
    folder = cache_dir()
    target = folder / f"rbcheck_tree_{key}{suffix}"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=suffix, dir=folder)
        os.close(fd)
    except OSError as err:
        raise RuntimeError(f"cannot write the build cache {folder}: {err}") from err
    try:
        done = subprocess.run([*cc, *FLAGS, *extra, "-o", tmp, str(main), *LIBS], capture_output=True,
                              text=True, errors="replace", timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cc)} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: concurrent builders agree on the result
    except (OSError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"{' '.join(cc)} could not run: {err}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
