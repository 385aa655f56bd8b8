"""TorchRL's C++ extension, rebuilt here when the shipped one does not load.

    python tools/torchrl_build.py [--cache DIR] [--source-version 0.14.1]

TorchRL's ``PrioritizedSampler`` needs its compiled extension
``torchrl._torchrl`` (the segment trees). A wheel's binary is built against
one torch; against another it fails to load (an undefined symbol), and every
prioritized property would be "unavailable". The torchrl 0.14.1 wheel ships
the extension's C++ sources (``torchrl/csrc/``), which build against the
installed torch with ``torch.utils.cpp_extension`` (``CppExtension``,
``-O3``, no ``-std`` flag: the torch headers pick their own standard, C++20
for torch 2.13). Older wheels (0.6.0 .. 0.9.2) ship no sources; their Python
code uses the same classes (``SumSegmentTreeFp32`` ...), so they get the
extension built from 0.14.1's sources, fetched with ``pip download --no-deps``.

What this module does, in the current environment:

1. probe: import ``torchrl._torchrl`` and build a ``SumSegmentTreeFp32`` in a
   subprocess. If that works, nothing is done.
2. sources: the installed torchrl's own ``csrc/``, else the ``csrc/`` of the
   torchrl ``--source-version`` wheel (downloaded once into the cache).
3. build, cached in ``DIR/<key>/`` where the key hashes the sources, the torch
   version, the Python extension suffix and the flags, so several
   environments with the same torch (the history sessions) build once.
4. install: the shipped binary is kept beside as ``<name>.shipped`` and the
   built one takes its place; ``torchrl/_rbcheck_extension.json`` records what
   was done (read by the TorchRL adapter, which puts one line in the report),
   and the probe runs again.

If the build fails, the shipped binary stays, the marker holds the
compiler's error, and TorchRL's prioritized sampler stays "unavailable" with
that error. The exit status is 0 either way (a third party that cannot run
here is reported, not fatal); ``--strict`` makes a failure exit 1.

A repository tool (not in the wheel); the marker's name and reader live in
the TorchRL adapter (``rbcheck.harness.adapters.torchrl``), which reads it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rbcheck.harness.adapters.torchrl import MARKER, read_marker, sha256_of

#: The release whose wheel carries the sources used for releases without them.
SOURCE_VERSION = "0.14.1"
#: Sources compiled (the CUDA ones need nvcc and are left out).
SOURCES = ("pybind.cpp", "utils.cpp")
CFLAGS = ("-O3",)
EXTENSION = "_torchrl"
BUILD_SCRIPT = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="rbcheck_torchrl_extension",
    ext_modules=[CppExtension({name!r}, {sources!r}, include_dirs=[{include!r}],
                              extra_compile_args={cflags!r})],
    cmdclass={{"build_ext": BuildExtension}},
)
"""
PROBE = (
    "import torchrl._torchrl as ext; t = ext.SumSegmentTreeFp32(4); t[0] = 1.0; "
    "assert abs(t.query(0, 4) - 1.0) < 1e-6, t.query(0, 4)"
)


def default_cache() -> Path:
    env = os.environ.get("RBCHECK_TORCHRL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rbcheck" / "torchrl-ext"


def strip_paths(text: str) -> str:
    """Drop directories from file paths in an error text (keep the file name)."""
    return re.sub(r"(?<![\w:/.])(?:/[^/\s:]+)+/([^/\s:]+)", r"\1", text)


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    line = strip_paths((errors or lines or ["(no output)"])[-1])
    return line if len(line) <= 300 else line[:297] + "..."


def probe(python: str = sys.executable) -> str | None:
    """Why ``torchrl._torchrl`` does not load and run in ``python``, or None."""
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return _last_error_line(proc.stderr + proc.stdout)


def compiler_error(log: str) -> str:
    """The compiler's first error (with the line after it) from a build log."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if " error:" in line or line.startswith("error:") or "fatal error" in line:
            return strip_paths(" ".join(part.strip() for part in lines[i : i + 2]))[:600]
    return _last_error_line(log)


@dataclass(frozen=True)
class Plan:
    """What to do: ``keep`` (the extension loads), ``install`` (a cached build
    exists for this key), ``build`` (compile, then install) or ``give_up``."""

    action: str
    why: str


def plan(load_error: str | None, have_sources: bool, cached: bool) -> Plan:
    """The decision, separate from its effects (unit-tested without building)."""
    if load_error is None:
        return Plan("keep", "torchrl._torchrl loads")
    if cached:
        return Plan("install", f"the shipped extension does not load ({load_error}); a build for "
                    "this torch is cached")
    if not have_sources:
        return Plan("give_up", f"the shipped extension does not load ({load_error}) and no "
                    "sources were found to rebuild it")
    return Plan("build", f"the shipped extension does not load ({load_error})")


def build_key(csrc: Path, torch_version: str, ext_suffix: str) -> str:
    """Hash of everything the binary depends on: sources, torch, ABI, flags."""
    digest = hashlib.sha256()
    for path in sorted(csrc.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"torch={torch_version};suffix={ext_suffix};flags={CFLAGS};sources={SOURCES}".encode())
    return digest.hexdigest()[:16]


def torchrl_dir() -> Path:
    spec = importlib.util.find_spec("torchrl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchrl is not installed in this environment, but should be: "
                         "install the 'torchrl' dependency group")
    return Path(next(iter(spec.submodule_search_locations)))


def installed_version(package: Path) -> str:
    from importlib.metadata import version

    try:
        return version("torchrl")
    except Exception:
        return package.name


def fetch_sources(version: str, cache: Path) -> Path:
    """``csrc/`` of the torchrl ``version`` wheel (``pip download --no-deps``), cached."""
    target = cache / "sources" / version / "csrc"
    if (target / "pybind.cpp").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        f"torchrl=={version}", "-d", tmp], check=True)
        wheels = list(Path(tmp).glob("torchrl-*.whl"))
        if not wheels:
            raise FileNotFoundError(f"pip download torchrl=={version} gave no wheel")
        staging = target.parent / "csrc.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                if member.startswith("torchrl/csrc/") and not member.endswith("/"):
                    (staging / Path(member).name).write_bytes(wheel.read(member))
        if not (staging / "pybind.cpp").exists():
            raise FileNotFoundError(f"the torchrl=={version} wheel has no torchrl/csrc/pybind.cpp")
        staging.replace(target)
    return target


def find_sources(package: Path, cache: Path, source_version: str) -> tuple[Path, str]:
    """(csrc directory, where it came from)."""
    own = package / "csrc"
    if (own / "pybind.cpp").exists():
        return own, f"torchrl {installed_version(package)}'s own csrc"
    return fetch_sources(source_version, cache), f"torchrl {source_version}'s csrc"


def compile_extension(csrc: Path, out: Path) -> Path:
    """Build ``_torchrl`` from ``csrc`` into ``out``; return the binary.
    Raises RuntimeError with the compiler's error on failure."""
    work = out.parent / (out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sources = [str(csrc / name) for name in SOURCES]
    (work / "setup.py").write_text(BUILD_SCRIPT.format(
        name=EXTENSION, sources=sources, include=str(csrc), cflags=list(CFLAGS)))
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    proc = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(work / "lib"),
         "--build-temp", str(work / "tmp")],
        cwd=work, capture_output=True, text=True, env=env,
    )
    (work / "build.log").write_text(proc.stdout + proc.stderr)
    built = sorted((work / "lib").glob(f"{EXTENSION}*.so")) if proc.returncode == 0 else []
    if not built:
        raise RuntimeError(compiler_error(proc.stdout + proc.stderr))
    out.mkdir(parents=True, exist_ok=True)
    binary = out / built[0].name
    shutil.copy2(built[0], binary)
    shutil.rmtree(work, ignore_errors=True)
    return binary


def install(binary: Path, package: Path) -> list[str]:
    """Put ``binary`` in place of the shipped extension (kept as ``.shipped``)."""
    shipped = sorted(p for p in package.glob(f"{EXTENSION}*.so"))
    targets = shipped or [package / (EXTENSION + sysconfig.get_config_var("EXT_SUFFIX"))]
    for target in targets:
        backup = target.with_name(target.name + ".shipped")
        if target.exists() and not backup.exists():
            target.replace(backup)
        shutil.copy2(binary, target)
    return [t.name for t in targets]


def write_marker(package: Path, **fields: object) -> None:
    (package / MARKER).write_text(json.dumps(fields, indent=2) + "\n")


def ensure(cache: Path, source_version: str = SOURCE_VERSION) -> tuple[bool, str]:
    """Make ``torchrl._torchrl`` load in this environment if it can be done.
    Returns (loads, one line saying what happened)."""
    import torch

    cache = Path(cache).resolve()
    package = torchrl_dir()
    version = installed_version(package)
    load_error = probe()
    marker = read_marker(package)
    if load_error is None:
        if marker and marker.get("status") == "rebuilt":
            return True, marker["line"]
        (package / MARKER).unlink(missing_ok=True)  # a stale record of an earlier failure
        return True, f"torchrl {version}: the shipped extension loads against torch {torch.__version__}"
    try:
        csrc, origin = find_sources(package, cache, source_version)
    except Exception as err:  # no network, no such wheel: reported, not fatal
        csrc, origin = None, f"no sources ({type(err).__name__}: {err})"
    key = build_key(csrc, torch.__version__, sysconfig.get_config_var("EXT_SUFFIX")) if csrc else ""
    out = cache / key if key else cache
    cached = bool(key) and any(out.glob(f"{EXTENSION}*.so"))
    decision = plan(load_error, csrc is not None, cached)
    print(f"[torchrl_build] torchrl {version}, torch {torch.__version__}: {decision.action}: "
          f"{decision.why}", flush=True)
    if decision.action == "give_up":
        line = f"torchrl {version}: extension not rebuilt: {origin}"
        write_marker(package, status="build_failed", torch=torch.__version__, error=line, line=line)
        return False, line
    started = time.perf_counter()
    try:
        if decision.action == "build":
            print(f"[torchrl_build] compiling {origin} against torch {torch.__version__} "
                  f"(a few minutes) ...", flush=True)
            binary = compile_extension(csrc, out)
        else:
            binary = sorted(out.glob(f"{EXTENSION}*.so"))[0]
    except Exception as err:
        line = (f"torchrl {version}: rebuilding the extension from {origin} against torch "
                f"{torch.__version__} failed: {err}")
        write_marker(package, status="build_failed", torch=torch.__version__, error=str(err), line=line)
        return False, line
    seconds = time.perf_counter() - started
    replaced = install(binary, package)
    still = probe()
    if still is not None:
        line = (f"torchrl {version}: the extension rebuilt from {origin} against torch "
                f"{torch.__version__} does not load either: {still}")
        write_marker(package, status="build_failed", torch=torch.__version__, error=still, line=line)
        return False, line
    line = f"C++ extension rebuilt here from {origin} against torch {torch.__version__}"
    write_marker(package, status="rebuilt", torch=torch.__version__, source=origin, key=key,
                 replaced=replaced, sha256=sha256_of(binary), line=line,
                 seconds=round(seconds, 1) if decision.action == "build" else None)
    return True, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/torchrl_build.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=None,
                        help="build cache directory (env RBCHECK_TORCHRL_CACHE, default "
                             "~/.cache/rbcheck/torchrl-ext)")
    parser.add_argument("--source-version", default=SOURCE_VERSION,
                        help=f"torchrl release whose csrc/ is used when the installed one has none "
                             f"(default {SOURCE_VERSION})")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the extension does not load")
    args = parser.parse_args(argv)
    loads, line = ensure(args.cache or default_cache(), args.source_version)
    print(f"[torchrl_build] {line}", flush=True)
    return 0 if loads or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
