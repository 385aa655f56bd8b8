"""Meta tests: the conformance suite must catch every deliberately broken
adapter declared in tests/mutants/ (all but the concurrency ones, which
test_concurrent_mutants_caught.py runs), in the property aimed at its bug.

Each mutant runs the targeted conformance tests in a warm pytest worker
(tests/meta/warm.py; ``--impl tests.mutants.<module>:<factory>``, ci profile,
``--rbcheck-results``);
the run must fail, and one of the targeted properties must be among the
failures with a self-explaining message (``... but should be ...``). The
reference must pass the same tests (the control), so a catch is never an
artefact of a broken test. The table of which test caught which mutant is
printed at the end of the run.

These tests check the suite itself, not an implementation: they run once,
with the reference as ``--impl``, and are skipped for other ``--impl`` values.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.meta.warm import WarmPool, pool_env
from tests.mutants.registry import Mutant, of_kind

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "rbcheck" / "conformance"
#: Bound of one conformance subprocess (seconds); generous, since a slow or shared
#: machine runs them at a fraction of a core while failures are being shrunk.
TIMEOUT_S = 600
#: Conformance runs at once (warm workers): one per core, at most 4.
WORKERS = max(1, min(4, os.cpu_count() or 1))
#: Repro snippets printed by the caught mutants, run together at the end
#: (test_repro_snippets_run) in one fresh interpreter.
SNIPPETS: list[str] = []
CAUGHT: list[tuple[str, str, str, str]] = []  # (mutant, bug class, caught by, message)
#: Every mutant declared in tests/mutants but the concurrency ones and the
#: cheap ones run in process (tests/meta/test_in_process_mutants.py).
MUTANTS = [m for m in of_kind("plain", "historic", "convention") if not m.in_process]
#: The subprocesses import the mutants from the repository (``tests`` is not
#: installed): its root goes on their PYTHONPATH.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))


def impl_of(mutant: Mutant) -> str:
    """The adapter string of a mutant (``--impl``)."""
    return mutant.impl


def control_of(mutant: Mutant) -> str:
    """The adapter string of a mutant's control, or "reference"."""
    return mutant.control


@pytest.fixture(autouse=True)
def _only_with_the_reference(impl):
    if impl.name != "reference":
        pytest.skip(
            f"meta tests check the suite itself; run them with --impl reference (not {impl.name!r})"
        )


@pytest.fixture(scope="module", autouse=True)
def _print_table(request):
    yield
    if not CAUGHT:
        return
    lines = ["", "mutant -> caught by (conformance property)"]
    for name, bug, test, message in CAUGHT:
        lines.append(f"  {name:<36} {test}")
        lines.append(f"  {'':<36} ({bug}) {message[:160]}")
    text = "\n".join(lines)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(text)
    else:  # pragma: no cover
        print(text)


#: Runs every repro snippet of a results file in a fresh interpreter, each in
#: its own namespace, from an empty directory: a snippet must not fail on a
#: missing name or import (the buffer's own error is what it reproduces).
SNIPPET_RUNNER = r"""
import json, sys
bad = []
for i, text in enumerate(json.load(open(sys.argv[1]))):
    try:
        exec(compile(text, f"<repro {i}>", "exec"), {"__name__": "__repro__"})
    except (NameError, SyntaxError, ImportError) as err:
        bad.append(f"{type(err).__name__}: {err}\n{text}")
    except BaseException:  # noqa: BLE001 - the buffer's error: the failure reproduced
        pass
print(json.dumps(bad))
"""


def repros(results: Path) -> list[str]:
    """Every distinct repro snippet printed by a failure of the run."""
    out: list[str] = []
    for record in json.loads(results.read_text())["tests"]:
        for snippet in record.get("repros", []):
            if snippet not in out:
                out.append(snippet)
    return out


def run_snippets(snippets: list[str], workdir: Path) -> list[str]:
    """The snippets that fail on a name or an import, with the error."""
    if not snippets:
        return []
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "snippets.json"
    source.write_text(json.dumps(snippets))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RBCHECK_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = PYTHONPATH  # a snippet loads its mutant from the repository
    proc = subprocess.run([sys.executable, "-c", SNIPPET_RUNNER, str(source)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode:
        return [f"snippet runner exit status={proc.returncode}: {proc.stderr[-1000:]}"]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_conformance(impl: str, files, targets, results: Path, extra=()) -> subprocess.CompletedProcess:
    """The targeted conformance tests on ``impl``, in a warm pytest worker
    (tests/meta/warm.py: a fresh interpreter per run would spend most of the
    run starting up)."""
    args = [
        *[str(CONFORMANCE / f) for f in files],
        "--impl",
        impl,
        "--rbcheck-profile",
        "ci",
        "--rbcheck-results",
        str(results),
        "-p",
        "no:cacheprovider",
        "-q",
        "-W",
        "ignore::DeprecationWarning",
        "-k",
        " or ".join(targets),
        *extra,
    ]
    return shared_pool().run(args, timeout=TIMEOUT_S)


_POOL: list[WarmPool] = []
_POOL_LOCK = threading.Lock()


def shared_pool() -> WarmPool:
    """The warm workers of this session (one per core, at most 4), started
    on first use and closed at exit. Threads of ``ThreadPoolExecutor`` ask for it
    at once: without the lock, two could each start a pool, and the one not at
    ``_POOL[0]`` was never closed (CI's run ended with its workers still running
    and four pipes unclosed)."""
    with _POOL_LOCK:
        if not _POOL:
            pool = WarmPool(WORKERS, pool_env(PYTHONPATH), ROOT)
            _POOL.append(pool)
            atexit.register(pool.close)
        return _POOL[0]


def outcomes(results: Path) -> dict[str, tuple[str, str]]:
    """``{test function name: (outcome, message)}`` from a results file (the
    worst outcome over parametrized cases)."""
    data = json.loads(results.read_text())
    rank = {"fail": 3, "error": 3, "pass": 1}
    out: dict[str, tuple[str, str]] = {}
    for record in data["tests"]:
        name = record["property"].split("::")[-1]
        old = out.get(name)
        if old is None or rank.get(record["outcome"], 0) > rank.get(old[0], 0):
            out[name] = (record["outcome"], record["message"])
    return out


def assert_caught(mutant: Mutant, future: Future, results: Path):
    """Wait for the run of ``mutant``: pytest exited 1, a property it targets
    failed, and the failure explains itself. Returns ``(proc, tail, caught,
    message)``."""
    proc = future.result(timeout=2 * TIMEOUT_S)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 1, (
        f"pytest exit status={proc.returncode} on mutant {mutant.factory!r}, but should be 1 "
        f"(tests failed: the bug '{mutant.bug}' must be caught)\n{tail}"
    )
    seen = outcomes(results)
    caught = [t for t in mutant.targets if seen.get(t, ("", ""))[0] in ("fail", "error")]
    assert caught, (
        f"failed properties={sorted(t for t, (o, _) in seen.items() if o in ('fail', 'error'))}, "
        f"but should include one of {list(mutant.targets)} (bug: {mutant.bug})\n{tail}"
    )
    message = seen[caught[0]][1]
    if message.startswith("ExceptionGroup: Hypothesis found"):  # several distinct bugs: read the log
        explained = [ln.strip() for ln in proc.stdout.splitlines() if "but should be" in ln]
        message = explained[0] if explained else message
    assert "but should be" in message, (
        f"failure message={message!r}, but should explain itself ('<what>=<got>, but should be <expected>')"
    )
    CAUGHT.append((mutant.factory, mutant.bug, ", ".join(caught), message))
    print(f"{mutant.factory}: caught by {', '.join(caught)}: {message[:200]}")
    return proc, tail, caught, message


def assert_outcomes(who: str, future: Future, results: Path, targets, want: str = "pass",
                    excused=()) -> dict[str, tuple[str, str]]:
    """Wait for the run of ``who``: pytest exited 0 and every target but the
    ``excused`` ones ended ``want``. Returns the outcomes."""
    proc = future.result(timeout=2 * TIMEOUT_S)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"pytest exit status={proc.returncode} on {who}, but should be 0\n{tail}"
    seen = outcomes(results)
    for target in targets:
        outcome = seen.get(target, ("missing", ""))[0]
        if target not in excused:
            assert outcome == want, f"outcome of {target} on {who}={outcome!r}, but should be {want!r}"
    return seen


def _control_args(control: str = "reference") -> tuple[list[str], list[str]]:
    chosen = [m for m in MUTANTS if control_of(m) == control]
    files = sorted({f for m in chosen for f in m.files})
    targets = sorted({t for m in chosen for t in m.targets})
    return files, targets


#: Controls other than the reference: correct adapters that declare the
#: conventions their mutants declare (e.g. float32 trees), so a catch is the
#: mutant's bug and not the convention.
CONTROLS = sorted({control_of(m) for m in MUTANTS} - {"reference"})


@pytest.fixture(scope="module")
def runs(request):
    """Start the subprocess runs of every selected test at once (one worker
    per core) and hand out ``name -> (Future[CompletedProcess], results path)``."""
    selected = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "mutant" in callspec.params:
            selected.add(callspec.params["mutant"].factory)
        elif item.name == "test_reference_passes_every_targeted_property":
            selected.add("reference")
        elif callspec is not None and "control" in callspec.params:
            selected.add(f"control:{callspec.params['control']}")
    tmp = Path(tempfile.mkdtemp(prefix="rbcheck-meta-"))
    jobs: dict[str, tuple[Future, Path]] = {}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        files, targets = _control_args()
        path = tmp / "reference.json"
        if "reference" in selected:
            jobs["reference"] = (
                pool.submit(run_conformance, "reference", files, targets, path),
                path,
            )
        for control in CONTROLS:
            if f"control:{control}" not in selected:
                continue
            files, targets = _control_args(control)
            path = tmp / f"control-{control.replace(':', '-')}.json"
            future = pool.submit(run_conformance, control, files, targets, path)
            jobs[f"control:{control}"] = (future, path)
        for m in MUTANTS:
            if m.factory not in selected:
                continue
            path = tmp / f"{m.factory}.json"
            device = ("--rbcheck-device", "cuda") if m.needs_cuda and torch.cuda.is_available() else ()
            future = pool.submit(run_conformance, impl_of(m), m.files, m.targets, path, device)
            jobs[m.factory] = (future, path)
        yield jobs
        for future, _ in jobs.values():
            future.cancel()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.factory for m in MUTANTS])
def test_mutant_is_caught(mutant: Mutant, runs):
    """The targeted conformance property fails on the mutant, with a message
    in the ``<what>=<got>, but should be <expected>`` form; every repro snippet
    its failures printed loads the adapter string the run was given (they
    run together in test_repro_snippets_run)."""
    if mutant.factory == "pin_memory_silently_ignored" and torch.cuda.is_available():
        pytest.skip(
            "pin_memory=True is valid with an accelerator: this bug class only exists without one"
        )
    if mutant.needs_cuda and not torch.cuda.is_available():
        pytest.skip(f"{mutant.reproduces}: visible only on a CUDA buffer (run with a GPU; "
                    "the runs use --rbcheck-device cuda there)")
    future, results = runs[mutant.factory]
    _, tail, _, _ = assert_caught(mutant, future, results)
    impl_arg = impl_of(mutant)
    snippets = repros(results)
    assert snippets, f"repro snippets of the failures={snippets}, but should be at least one\n{tail}"
    for snippet in snippets:
        assert f"load_adapter({impl_arg!r})" in snippet, (
            f"repro snippet={snippet!r}, but should load the adapter the run was given ({impl_arg!r})")
    SNIPPETS.extend(s for s in snippets if s not in SNIPPETS)


@pytest.mark.parametrize("control", CONTROLS)
def test_control_passes_the_targets_of_its_mutants(control: str, runs):
    """The control of the mutants that declare conventions (e.g. a correct
    float32-tree buffer declaring priority_dtype=float32) passes every
    property they are aimed at: the declared convention alone fails nothing,
    so each catch is the mutant's violation, which the convention did not hide."""
    _, targets = _control_args(control)
    assert_outcomes(f"the control {control!r}", *runs[f"control:{control}"], targets)


def test_reference_passes_every_targeted_property(runs):
    """The control: the reference passes every property the mutants are
    aimed at (so each catch above is the mutant's bug, not a broken test)."""
    _, targets = _control_args()
    excused = ("test_pin_memory_without_accelerator_is_a_clear_error",) if torch.cuda.is_available() else ()
    assert_outcomes("the reference", *runs["reference"], targets, excused=excused)


def test_repro_snippets_run(tmp_path):
    """Every repro snippet the caught mutants printed runs in one fresh
    interpreter, from an empty directory, without a missing name or import
    (the buffer's own error is what a snippet reproduces)."""
    if not SNIPPETS:
        pytest.skip("no subprocess mutant ran in this session (run the whole file)")
    broken = run_snippets(SNIPPETS, tmp_path / "snippets")
    assert not broken, f"repro snippets that do not run={broken}, but should be none"
