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
import time
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
    failed = target.with_name(target.name + ".failed")
    tools = _fingerprint(cc, extra)
    try:
        seen, reason = failed.read_text(errors="replace").split("\n", 1)
        fresh = time.time() - failed.stat().st_mtime < REMEMBER_S
    except (OSError, ValueError):
        pass
    else:
        if seen == tools and fresh:
            raise RuntimeError(f"{reason} (remembered: {failed} records this build's failure with this "
                               "compiler, for a day; delete it to try again)")
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
            reason = f"{' '.join(cc)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            if _diagnosed(done.returncode, done.stderr):
                _remember(failed, f"{tools}\n{reason}")
            raise RuntimeError(reason)
        os.replace(tmp, target)  # atomic: concurrent builders agree on the result
        try:
            failed.unlink(missing_ok=True)  # the failure it recorded is over
        except OSError:
            pass  # another user's record in a shared cache: the build stands all the same
    except (OSError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"{' '.join(cc)} could not run: {err}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


#: How long a recorded failure holds (seconds): past it the build is tried again, whatever
#: the fingerprint says (it cannot see every file a compiler reads).
REMEMBER_S = 24 * 3600


def _diagnosed(code: int, stderr: str) -> bool:
    """Whether a failed build is worth remembering: the compiler exited with an error it
    diagnosed ("error" in its messages), not a signal, a kill (the OOM killer's "Killed" as
    the driver reports it) or a compiler that did not start: those may pass."""
    text = stderr.lower()
    return code > 0 and "error" in text and "killed" not in text and "signal" not in text


def _fingerprint(cc: list[str], extra: tuple) -> str:
    """What a remembered failure holds for: every word of the compiler command that names a
    program (a launcher such as ccache and the compiler behind it), the headers' folders
    (``-I``, and the system's ``/usr/include``) as they are now (path, size, change time),
    and the variables that steer a compiler's search. A failure the build key alone keyed
    would outlive a repaired compiler at the same path, or headers installed later."""
    programs = [shutil.which(word) for word in cc]
    paths = [os.path.realpath(p) for p in programs if p] + \
        [extra[i + 1] for i, word in enumerate(extra[:-1]) if word == "-I"] + ["/usr/include"]
    parts = [f"{name}={os.environ.get(name, '')}" for name in ("PATH", "CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH")]
    for path in paths:
        try:
            st = os.stat(path)
            parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
        except OSError:
            parts.append(f"{path}:missing")
    return " ".join(parts)


def _remember(failed: Path, text: str) -> None:
    """Record a failed build (atomically; not recording it only costs a rebuild)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(suffix=".failed", dir=failed.parent)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, failed)
    except OSError:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
