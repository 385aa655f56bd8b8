"""Run the conformance suite on one implementation in a pytest subprocess,
isolated from the caller's pytest configuration (its own ini file, rootdir
and conftest cut-off): what ``rbcheck validate`` and
``python -m rbcheck.harness.report`` run per implementation. The property
ids (``<file stem>::<function>``) are listed by :func:`properties`.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import rbcheck.conformance
from rbcheck.harness.outcomes import ImplResult
from rbcheck.harness.plugin.known_failures import suite_relative
from rbcheck.harness.plugin.results import running_path

__all__ = ["SUITE", "properties", "node_path", "isolation_args", "clean_env", "run_subprocess",
           "pytest_output"]

#: The conformance suite: a package inside the installed rbcheck.
SUITE = Path(rbcheck.conformance.__file__).resolve().parent
#: The ini file of a run: empty, so nothing of the caller's configuration applies.
_INI = "[pytest]\n"


def properties() -> list[str]:
    """Every property id of the suite, in file order (no import needed)."""
    ids = []
    for path in sorted(SUITE.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        ids += [f"{path.stem}::{node.name}" for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")]
    return ids


def node_path(property_id: str) -> str:
    """A property id as a pytest path into the installed suite; an id that
    names no property raises ``ValueError`` naming the allowed form."""
    known = properties()
    if property_id not in known:
        stem = property_id.split("::", 1)[0]
        close = [p for p in known if p.startswith(stem + "::")] or known[:3]
        raise ValueError(
            f"property={property_id!r}, but should be a property id <file>::<test> such as "
            f"{', '.join(repr(p) for p in close[:4])} (`rbcheck list` prints them all)"
        )
    stem, _, name = property_id.partition("::")
    return f"{SUITE / (stem + '.py')}::{name}"


def isolation_args(workdir: Path) -> list[str]:
    """pytest options that make a run independent of the caller's directory:
    an empty ini file of its own, the suite's parent as rootdir, no conftest
    from outside the suite, no cache, and rbcheck's plugin on."""
    ini = workdir / "pytest.ini"
    ini.write_text(_INI)
    return ["-c", str(ini), f"--rootdir={SUITE.parent}", f"--confcutdir={SUITE}",
            "-p", "no:cacheprovider", "-p", "rbcheck"]


#: Variables of the caller's shell that would choose what a run tests (the
#: plugin's settings, pytest's extra options and plugins): a run's settings
#: come from its arguments only, so none of them reaches a suite subprocess.
RUN_SETTINGS_ENV = ("RBCHECK_IMPL", "RBCHECK_PROFILE", "RBCHECK_DEVICE", "RBCHECK_SHRINK_SECONDS",
                    "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")


def clean_env(pythonpath: Iterable[str] = ()) -> dict[str, str]:
    """The environment for a suite subprocess: the caller's, without the
    variables of :data:`RUN_SETTINGS_ENV`, with ``pythonpath`` first on the
    path. The ``RBCHECK_*`` variables left (``RBCHECK_NATIVE``, say: how the
    variants run, not what is tested) are listed in the report's settings."""
    env = dict(os.environ)
    for name in RUN_SETTINGS_ENV:
        env.pop(name, None)
    parts = [*pythonpath, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_subprocess(name: str, *, profile: str, workdir: Path, only: Iterable[str] = (),
                   known_failures: Path | None = None, extra: Iterable[str] = (),
                   pythonpath: Iterable[str] = (), progress: bool = True, device: str = "cpu"):
    """Run the suite against ``name`` in a pytest subprocess; the
    :class:`rbcheck.harness.outcomes.ImplResult` of the run. Progress lines
    (``--rbcheck-progress``) go to this process's stderr as they come."""
    safe = "".join(c if c.isalnum() else "_" for c in name)
    results = workdir / f"results-{safe}.json"
    paths = [node_path(p) for p in only] or [str(SUITE)]
    command = [sys.executable, "-m", "pytest", *paths, "-q", *isolation_args(workdir),
               f"--impl={name}", f"--rbcheck-profile={profile}", f"--rbcheck-device={device}",
               f"--rbcheck-results={results}"]
    if known_failures is not None:
        command.append(f"--rbcheck-known-failures={known_failures}")
    if progress:
        command.append("--rbcheck-progress")
    command += list(extra)
    with tempfile.TemporaryFile("w+") as out:
        # a session of its own: rbcheck stops the run and whatever it started (stop_all)
        proc = subprocess.Popen(command, cwd=workdir, env=clean_env(pythonpath), stdout=out,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        with _LOCK:
            _LIVE[proc] = (name, results)
        errors = []
        try:
            for line in proc.stderr:
                if line.startswith("[rbcheck] "):
                    sys.stderr.write(line)
                    sys.stderr.flush()
                else:
                    errors.append(line)
            proc.wait()
        except BaseException:  # interrupted here (Ctrl-C, SIGTERM): the run must not outlive rbcheck
            _stop(proc, name, results)
            raise
        finally:
            with _LOCK:
                _LIVE.pop(proc, None)
            _kill_group(proc.pid)  # nothing the run started is left behind
        out.seek(0)
        output = out.read()
    kept = pytest_output("".join(errors), output)
    if not results.exists():
        tail = " ".join((output + "".join(errors)).strip().splitlines()[-3:])
        running = _running(results)
        where = (f" while running {suite_relative(running)}, before writing its results" if running
                 else " before running a test")
        return ImplResult(name=name, status="crashed", why=f"pytest exit {proc.returncode}{where}: {tail}",
                          exitstatus=proc.returncode, output=kept)
    payload = json.loads(results.read_text())
    if "load_error" in payload:  # the adapter did not load (written before pytest's usage error)
        return ImplResult(name=name, status="unavailable", why=payload["load_error"])
    result = ImplResult.from_results(name, payload)
    result.output = kept
    return result


#: The suite runs under way: process -> (implementation name, results file).
_LIVE: dict[subprocess.Popen, tuple[str, Path]] = {}
_LOCK = threading.Lock()
#: Implementations whose run :func:`stop_all` stopped, with the test each was running.
STOPPED: dict[str, str] = {}
#: Seconds a stopped run may take to end after its interrupt, before it is killed.
STOP_GRACE_S = 10.0


def _running(results: Path) -> str:
    path = running_path(results)
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, name: str, results: Path) -> None:
    """Interrupt a run (SIGINT to its session, as a terminal's Ctrl-C would),
    give it :data:`STOP_GRACE_S` to end, then kill it and all it started."""
    STOPPED[name] = _running(results)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc.pid)
    proc.wait()


def stop_all() -> dict[str, str]:
    """Stop every run under way (an interrupt of rbcheck itself); the
    implementations stopped, each with the test it was running."""
    with _LOCK:
        live = list(_LIVE.items())
    for proc, (name, results) in live:
        _stop(proc, name, results)
    return dict(STOPPED)


def pytest_output(stderr: str, stdout: str, lines: int = 40) -> str:
    """What pytest said, for a run that did not complete: all of its stderr
    (a usage error is there) and the last ``lines`` lines of its stdout."""
    tail = stdout.strip().splitlines()[-lines:]
    return "\n".join([*stderr.strip().splitlines(), *tail]).strip()
