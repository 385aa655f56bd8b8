"""The warm pytest workers (tests/meta/warm.py) report a run that crashed, hung
or lost its worker as a failure (an exit status < 0), never as a pass, and
keep serving runs afterwards; output a run leaves behind (a thread printing
after the run ended) does not reach the channel the answers come back on."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.meta.warm import WarmPool, pool_env

ROOT = Path(__file__).resolve().parents[2]

TESTS = {
    "test_passes.py": "def test_passes():\n    assert True\n",
    "test_fails.py": "def test_fails():\n    assert False\n",
    "test_crashes.py": "import os\n\ndef test_crashes():\n    os._exit(0)\n",
    "test_hangs.py": "import time\n\ndef test_hangs():\n    time.sleep(120)\n",
    "test_prints_later.py": textwrap.dedent("""\
        import os, stat, threading, time

        def later():  # once fd 1 is a pipe again (the run's log is off it), or after 5 s
            deadline = time.monotonic() + 5
            while not stat.S_ISFIFO(os.fstat(1).st_mode) and time.monotonic() < deadline:
                time.sleep(0.001)
            os.write(1, b"output after the run ended\\n")

        def test_prints_later():
            threading.Thread(target=later, daemon=True).start()
        """),
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    where = tmp_path_factory.mktemp("warm")
    for name, text in TESTS.items():
        (where / name).write_text(text)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    warm = WarmPool(1, pool_env(pythonpath), where)
    yield warm, where
    warm.close()


def run(pool, name: str, timeout: float = 120):
    warm, where = pool
    return warm.run([str(where / name), "-q", "-p", "no:cacheprovider", "-p", "no:rbcheck"], timeout=timeout)


def test_a_pass_and_a_failure_keep_their_exit_status(pool):
    assert run(pool, "test_passes.py").returncode == 0
    failed = run(pool, "test_fails.py")
    assert failed.returncode == 1, f"exit status={failed.returncode}, but should be 1\n{failed.stdout[-2000:]}"


def test_output_after_a_run_does_not_reach_the_answers(pool):
    first = run(pool, "test_prints_later.py")
    second = run(pool, "test_passes.py")
    assert (first.returncode, second.returncode) == (0, 0), (
        f"exit statuses={(first.returncode, second.returncode)}, but should be (0, 0)\n"
        f"{first.stderr}{first.stdout[-1500:]}{second.stderr}")


def test_a_crash_is_a_failure_and_the_pool_serves_on(pool):
    crashed = run(pool, "test_crashes.py")  # the worker exits 0 in the middle of the run
    assert crashed.returncode < 0, f"exit status={crashed.returncode}, but should be < 0 (the worker died)"
    assert run(pool, "test_passes.py").returncode == 0


def test_a_worker_lost_between_runs_is_a_failure_and_the_pool_serves_on(pool):
    warm, _ = pool
    for worker in warm.all:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()
    lost = run(pool, "test_passes.py")
    assert lost.returncode < 0, f"exit status={lost.returncode}, but should be < 0 (the worker was gone)"
    assert run(pool, "test_passes.py").returncode == 0


@pytest.mark.skipif(sys.platform == "win32", reason="the workers are killed by signal")
def test_a_run_past_its_timeout_is_a_failure_and_the_pool_serves_on(pool):
    hung = run(pool, "test_hangs.py", timeout=3)
    assert hung.returncode < 0, f"exit status={hung.returncode}, but should be < 0 (the run timed out)"
    assert "exceeded" in hung.stderr
    assert run(pool, "test_passes.py").returncode == 0


def test_the_shared_pool_is_made_once_when_threads_ask_at_once(monkeypatch):
    """The mutants' runs ask for the shared pool from several threads at once: one pool
    is made and closed at exit (two made at once left one never closed, its workers
    still running when CI's run ended)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tests.meta import test_mutants_caught as mutants

    made, closes = [], []

    class Pool:
        def __init__(self, *args):
            made.append(self)
            time.sleep(0.05)  # the window in which another thread would see no pool yet

        def close(self):
            pass

    monkeypatch.setattr(mutants, "WarmPool", Pool)
    monkeypatch.setattr(mutants, "_POOL", [])
    monkeypatch.setattr(mutants.atexit, "register", closes.append)
    start = threading.Barrier(4)

    def ask(_):
        start.wait()  # all four at once
        return mutants.shared_pool()

    with ThreadPoolExecutor(4) as threads:
        got = list(threads.map(ask, range(4)))
    assert len(made) == 1, f"{len(made)} pools made"
    assert all(pool is made[0] for pool in got)
    assert closes == [made[0].close]
