"""Warm pytest workers for the meta tests.

A conformance run of one mutant used to be a fresh ``python -m pytest``: about
8 s of interpreter, torch and plugin start-up for a run that often takes one
second. A :class:`WarmPool` keeps a few worker interpreters that have imported
pytest, torch and rbcheck once, and runs each request as ``pytest.main(args)``
inside one of them, with its output in its own log file. A request gets back a
:class:`subprocess.CompletedProcess`, as the cold runs did, so the callers'
assertions are unchanged.

What a warm run shares with the runs before it in the same worker: the
imported modules (each property receives its implementation through the
``impl`` fixture, never a module global, so nothing of a mutant stays behind)
and Hypothesis' shrink limit, which the worker puts back after each run. A
worker that crashes, overruns its timeout, is gone before a request or
answers something else is killed and replaced; the request reports it (exit
status < 0) instead of hanging the pool. Between runs the worker's fd 1 is
``/dev/null``: output a run leaves behind (a thread still printing) never
reaches the channel the answers come back on. tests/meta/test_warm.py
checks each of these.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The worker: imports what every run needs once, then serves one request
#: (a JSON line ``{"args", "cwd", "log"}``) at a time on stdin, and answers
#: ``{"rc": exit status}`` on its own copy of the original stdout.
WORKER = r"""
import json, os, sys, traceback
answer = os.fdopen(os.dup(1), "w", buffering=1)
null = os.open(os.devnull, os.O_WRONLY)  # fd 1 between runs: what a run leaves behind never reaches answer
os.dup2(null, 1)
os.close(null)
import pytest, torch  # noqa: F401 - the start-up every run would pay
import hypothesis.internal.conjecture.engine as engine
import rbcheck.harness.adapters  # noqa: F401
shrink = getattr(engine, "MAX_SHRINKING_SECONDS", None)
for line in sys.stdin:
    req = json.loads(line)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log, 1); os.dup2(log, 2)
    try:
        os.chdir(req["cwd"])
        rc = int(pytest.main(req["args"]))
    except BaseException:  # noqa: BLE001 - reported as the run's own failure
        traceback.print_exc()
        rc = 99
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
        if shrink is not None:
            engine.MAX_SHRINKING_SECONDS = shrink
    answer.write(json.dumps({"rc": rc}) + "\n")
"""


class _Worker:
    def __init__(self, env: dict[str, str], cwd: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def run(self, args: list[str], cwd: Path, log: Path, timeout: float) -> int:
        """The run's exit status; raises TimeoutError or RuntimeError (the
        worker died) after which this worker is not used again."""
        try:
            self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "log": str(log)}) + "\n")
            self.proc.stdin.flush()
        except OSError as err:  # the worker died between runs (a broken pipe)
            raise RuntimeError(f"warm pytest worker gone before the run (exit status {self.proc.poll()}): "
                               f"{err}") from err
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            self.close()
            raise TimeoutError(f"warm pytest run exceeded {timeout} s: {args}")
        if not box or not box[0]:
            code = self.proc.wait()
            raise RuntimeError(f"warm pytest worker died with exit status {code}")
        try:
            return int(json.loads(box[0])["rc"])
        except (ValueError, KeyError, TypeError) as err:
            raise RuntimeError(f"warm pytest worker answered {box[0]!r}, but should be {{'rc': exit status}}") from err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        """Its ends of the pipes (else each is left for the collector, with a ResourceWarning,
        or a BrokenPipeError where a dead worker's input was still buffered)."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WarmPool:
    """``size`` warm workers; :meth:`run` is safe to call from ``size``
    threads at once (each takes a free worker)."""

    def __init__(self, size: int, env: dict[str, str], cwd: Path):
        self.env, self.cwd = env, cwd
        self.free: queue.Queue[_Worker] = queue.Queue()
        self.all: list[_Worker] = []
        self.lock = threading.Lock()
        self.logs = Path(tempfile.mkdtemp(prefix="warm-pytest-logs-"))
        self.count = 0
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        worker = _Worker(self.env, self.cwd)
        with self.lock:
            self.all.append(worker)
        self.free.put(worker)

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """``pytest.main(args)`` in a warm worker, as a CompletedProcess
        whose stdout is the run's whole output."""
        with self.lock:
            self.count += 1
            log = self.logs / f"run-{self.count}.log"
        worker = self.free.get()
        try:
            rc = worker.run(args, self.cwd, log, timeout)
        except (TimeoutError, RuntimeError) as err:
            worker.close()
            self._spawn()
            out = log.read_text(errors="replace") if log.exists() else ""
            return subprocess.CompletedProcess(args, -9, out, f"{err}\n")
        self.free.put(worker)
        return subprocess.CompletedProcess(args, rc, log.read_text(errors="replace"), "")

    def close(self) -> None:
        for worker in self.all:
            if worker.proc.poll() is None:
                worker.close_pipes()  # the end of its input ends its loop
                try:
                    worker.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    worker.close()
            worker.close_pipes()
        shutil.rmtree(self.logs, ignore_errors=True)


def pool_env(pythonpath: str) -> dict[str, str]:
    """The workers' environment: the caller's, without a preselected
    implementation or profile, one thread per worker, the repository on the
    path (the mutants live in its ``tests`` package)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RBCHECK_IMPL", "RBCHECK_PROFILE")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = pythonpath
    return env
