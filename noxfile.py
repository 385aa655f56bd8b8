"""Sessions for rbcheck. Every session builds its own virtualenv and installs
what it needs; torch is pinned through .ci/constraints.txt so no install ever
pulls an accelerator build on the development machines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nox


def _load_records():
    """harness/records.py, loaded by its path: nox's own environment may not have rbcheck
    installed, and the records import nothing but the standard library."""
    path = Path(__file__).resolve().parent / "harness" / "records.py"
    spec = importlib.util.spec_from_file_location("_rbcheck_records", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: One record per built-in (harness/records.py): every library-specific list below derives from them.
RECORDS = _load_records()

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
CONSTRAINTS = ("-c", ".ci/constraints.txt")
#: Built-in adapters of variants/ whose conformance runs in the tests session.
VARIANTS = RECORDS.variants()
#: Test files that mostly wait on subprocesses (rbcheck validate, a wheel built
#: and installed in a venv, pytest runs of a user's project): the tests session
#: runs them in a second lane beside the main run, so both cores stay busy.
SUBPROCESS_LANE = (
    "tests/harness/test_cli.py",
    "tests/test_packaging.py",
    "tests/harness/test_api.py",
    "tests/harness/test_optin.py",
    "tests/harness/test_parallel_validate.py",
    "tests/harness/test_readme_example.py",
    "tests/harness/test_no_false_pass.py",
    "tests/harness/test_report_browser.py",
)
#: Dependency groups of the third-party buffers validate reports on (the groups of the records
#: of validate's main environment, in their order); never needed by the tests session.
THIRD_PARTY_GROUPS = RECORDS.third_party_groups()
#: TorchRL releases measured by `nox -s history` (each in its own prefix).
TORCHRL_HISTORY = ("0.6.0", "0.8.1", "0.9.2", "0.14.1")
#: Where TorchRL's C++ extension builds are cached (keyed by sources + torch),
#: shared by every session that installs TorchRL.
TORCHRL_BUILD_CACHE = ".nox/_torchrl_extension"


def install(session: nox.Session, *groups: str) -> None:
    """Install the project (editable) plus the named dependency groups."""
    requirements = []
    for group in groups:
        requirements += nox.project.dependency_groups(PYPROJECT, group)
    session.install(*CONSTRAINTS, "-e", ".", *requirements)


def env_default(session: nox.Session, name: str, value: str) -> str:
    """``name`` for the session's commands: the caller's own (their shell's
    environment; ``session.env`` holds only what the session set, and it
    wins over the caller's), else ``value``."""
    import os

    session.env[name] = session.env.get(name) or os.environ.get(name) or value
    return session.env[name]


def build_extensions(session: nox.Session, groups) -> None:
    """The build scripts of the records whose groups ``groups`` installed (TorchRL's: rebuild its
    C++ extension where the shipped one does not load against this torch; cached; a failure is
    reported, TorchRL's prioritized sampler then shows as unavailable with the compiler's error)."""
    for script in RECORDS.builds(groups):
        session.run("python", script, "--cache", TORCHRL_BUILD_CACHE)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of reference/, the conformance suite on the reference and
    every variant, the meta tests (mutants must be caught), the docs, and
    the benchmarks in smoke mode."""
    install(session, "test", "bench")
    env_default(session, "RBCHECK_PROFILE", "ci")
    if session.posargs:  # a targeted run: just what was asked for
        session.run("pytest", *session.posargs)
        return
    # Two lanes run beside the main run, so that both cores stay busy (the
    # main run is mostly single-threaded): the conformance suite on every
    # variant (each its own --impl run, one after the other; the triton
    # variant's kernels run in Triton's interpreter here and take minutes),
    # and the tests that mostly wait on subprocesses (SUBPROCESS_LANE). The
    # main run: the micro-benchmarks in smoke mode (each once, checked, no
    # timing), then everything else with the reference as --impl (the asv
    # benchmarks' smoke run is tests/test_asv_smoke.py). The lanes' output is
    # printed at the end.
    variants = Beside(session, [("pytest", "rbcheck/conformance", "--impl", variant, "-q", "-p", "no:cacheprovider")
                                for variant in VARIANTS])
    waiting = Beside(session, [("pytest", *SUBPROCESS_LANE, "-q", "-p", "no:cacheprovider", "--durations=15")])
    try:
        session.run("pytest", "bench/micro", "--benchmark-disable", "-q", "-p", "no:cacheprovider")
        session.run("pytest", "--durations=40",  # the slowest tests, to keep CI within its budget
                    *(f"--ignore={path}" for path in SUBPROCESS_LANE))
    finally:
        failed = [lane.finish(fail=False) for lane in (variants, waiting)]
        if any(failed):
            session.error(f"failed beside the main run: {[cmd for lane in failed for cmd in lane]}")


class Beside:
    """Commands run one after the other in a background thread of a session,
    with the session's environment and virtualenv; :meth:`finish` waits,
    prints each command's output and fails the session if one failed."""

    def __init__(self, session: nox.Session, commands):
        import os
        import subprocess
        import threading

        env = {k: v for k, v in {**os.environ, **session.env}.items() if v is not None}  # None: unset
        env["PATH"] = os.pathsep.join([session.bin, env.get("PATH", "")])
        self.session, self.commands, self.results = session, list(commands), []

        def run_all():
            for cmd in self.commands:
                try:
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                except Exception as err:  # noqa: BLE001 - not started: a failure, never a silent pass
                    proc = subprocess.CompletedProcess(cmd, 127, "", f"{err}\n")
                self.results.append((cmd, proc))

        self.thread = threading.Thread(target=run_all, daemon=True)
        self.thread.start()

    def finish(self, fail: bool = True) -> list[str]:
        """Wait, print each command's output; the commands that failed (or
        never ran), and with ``fail`` the session fails on any."""
        self.thread.join()
        failed = []
        for cmd, proc in self.results:
            self.session.log(f"(run beside) {' '.join(cmd)}: exit status {proc.returncode}")
            print(proc.stdout[-20000:] + proc.stderr[-5000:])
            if proc.returncode:
                failed.append(" ".join(cmd))
        failed += [" ".join(cmd) + " (never ran)" for cmd in self.commands[len(self.results):]]
        if failed and fail:
            self.session.error(f"failed: {failed}")
        return failed


@nox.session
def lint(session: nox.Session) -> None:
    install(session, "lint")
    session.run("ruff", "check", ".")


#: The environments `nox -s validate` builds, for libraries that do not
#: install together (a record's env: d3rlpy 2.8.1 pins gymnasium==1.0.0, which
#: ray[rllib] 2.60.0 does not accept): name -> (dependency groups, the built-in
#: names it validates). "main" is the validate session's own environment and
#: validates every built-in that no other environment lists.
VALIDATE_ENVS = RECORDS.validate_envs()
#: Where each environment writes its implementations' results (one folder per
#: environment), merged into reports/conformance.{md,json} by the validate session.
VALIDATE_PARTS = "reports/parts"


def validate_in(session: nox.Session, env: str) -> bool:
    """`rbcheck validate` on the built-ins of environment ``env`` (or those of
    the session's NAME arguments that belong to it; arguments starting with
    "-" go to every run), implementations in parallel worker processes
    (RBCHECK_JOBS, default one per core), each result written to
    VALIDATE_PARTS/env. Its own verdict does not stop the session: the merge
    gives the verdict of every environment at once. False (nothing installed
    or run) when none of the NAME arguments belongs to ``env``."""
    import shutil
    from pathlib import Path

    groups, names = VALIDATE_ENVS[env]
    parts = Path(VALIDATE_PARTS) / env
    shutil.rmtree(parts, ignore_errors=True)  # a stale part must never stand in for this run
    others = [n for e, (_, listed) in VALIDATE_ENVS.items() if e != env for n in listed]
    options = [a for a in session.posargs if a.startswith("-")]
    asked = [a for a in session.posargs if not a.startswith("-")]
    if asked:
        selection = [n for n in asked if (n in names if names else n not in others)]
        if not selection:
            return False
    else:
        selection = list(names) or ["--all", *(f"--exclude={n}" for n in others)]
    install(session, *groups)
    build_extensions(session, groups)
    env_default(session, "RBCHECK_PROFILE", "ci")
    session.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    session.run("rbcheck", "validate", *selection, *options, "--jobs", env_default(session, "RBCHECK_JOBS", "auto"),
                "--parts", str(parts), "--third-party-informational", "--must-load", success_codes=[0, 1, 2])
    return True


@nox.session
@nox.parametrize("env", [env for env in VALIDATE_ENVS if env != "main"])
def validate_env(session: nox.Session, env: str) -> None:
    """One of validate's other environments (VALIDATE_ENVS): its built-ins'
    results in reports/parts/<env>; `nox -s validate` runs it first."""
    if not validate_in(session, env):
        session.skip(f"none of {session.posargs} is validated in the {env!r} environment")


@nox.session(requires=[f"validate_env(env='{env}')" for env in VALIDATE_ENVS if env != "main"])
def validate(session: nox.Session) -> None:
    """The conformance report: `rbcheck validate` on every built-in
    implementation (TorchRL included; `nox -s validate -- NAME ...` for some),
    each environment of VALIDATE_ENVS in turn (the others first, then this
    one), implementations in parallel within each; the parts merged into
    reports/conformance.md, .json and .html, and the compliance page
    reports/compliance.md and .html (library x invariant). Fails only when the reference, a variant
    or the example fails, or when a column did not run or its adapter did
    not load (every library is installed here): third parties are reported."""
    if not validate_in(session, "main"):
        install(session, "test")  # for the merge
    asked = [a for a in session.posargs if not a.startswith("-")]
    session.run("rbcheck", "report", "--merge", VALIDATE_PARTS, *(f"--impl={n}" for n in asked),
                "--third-party-informational", "--must-load", "--out", "reports")


#: Wall-clock bound of each command of the Ray sessions (seconds); a run past it is killed.
RAY_TIMEOUT_S = "900"


@nox.session
def ray(session: nox.Session) -> None:
    """TorchRL's Ray-served buffer (--impl torchrl-ray) against a local Ray on
    this machine (loopback only, this machine's cores, no dashboard): the
    concurrency properties and the adapter's tests (tests/ray), then the Ray
    benchmark in smoke mode. Each command is bounded (RAY_TIMEOUT_S) and shuts
    Ray down when it ends. CI (.ci/run) runs it beside `nox -s tests`."""
    groups = RECORDS.session_groups(session.name)  # the records naming this session: TorchRL's Ray-served buffer
    install(session, "test", *groups)
    build_extensions(session, groups)  # the served buffer's prioritized sampler needs TorchRL's extension
    env_default(session, "RBCHECK_PROFILE", "ci")
    session.env["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine
    session.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's single-machine mode: loopback only
    bounded = ("timeout", "-k", "30", RAY_TIMEOUT_S)
    session.run(*bounded, "python", "-m", "pytest", "rbcheck/conformance/test_concurrency.py", "tests/ray",
                *(arg for name in RECORDS.session_builtins(session.name) for arg in ("--impl", name)), "-q", "-p", "no:cacheprovider", "-rs", "--durations=15", *session.posargs,
                external=True)
    session.run(*bounded, "python", "-m", "bench.ray_bench", "--smoke", "--out",
                "reports/ray_bench_smoke", external=True)


@nox.session
def ray_bench(session: nox.Session) -> None:
    """Extend and sample through Ray against in-process with 1, 2 and 4 writer
    processes, and the priority-update round trip, as ratios: reports/ray_bench.{md,json}
    (`nox -s ray_bench -- --address auto` on a running Ray cluster)."""
    install(session, "test", *RECORDS.session_groups(session.name))
    session.env["RAY_USAGE_STATS_ENABLED"] = "0"
    session.run("python", "-m", "bench.ray_bench", *session.posargs)


@nox.session
@nox.parametrize("env", [env for env in VALIDATE_ENVS if env != "main"])
def thirdparty_env(session: nox.Session, env: str) -> None:
    """The executed repros of a library with a validate environment of its
    own (VALIDATE_ENVS), tests/thirdparty/test_<env>_*.py, in that
    environment; `nox -s thirdparty` runs it first."""
    import glob

    groups, _ = VALIDATE_ENVS[env]
    install(session, *groups)
    env_default(session, "RBCHECK_PROFILE", "ci")
    # test_registered_repros.py: every repro of docs/bugs.toml in these files was collected
    session.run("pytest", *sorted(glob.glob(f"tests/thirdparty/test_{env}_*.py")),
                "tests/thirdparty/test_registered_repros.py", "-q", "-p", "no:cacheprovider", "-rxs", *session.posargs)


@nox.session(requires=[f"thirdparty_env(env='{env}')" for env in VALIDATE_ENVS if env != "main"])
def thirdparty(session: nox.Session) -> None:
    """The executed repros of docs/findings.md (tests/thirdparty) with cpprb,
    and every other library of validate's main environment, installed
    (THIRD_PARTY_GROUPS; those of a library with an environment of its own ran
    first, in it: thirdparty_env); the tests session skips them (the libraries
    are not installed there)."""
    install(session, "test", *THIRD_PARTY_GROUPS)
    build_extensions(session, THIRD_PARTY_GROUPS)  # test_torchrl_bugs.py runs TorchRL's PrioritizedSampler
    env_default(session, "RBCHECK_PROFILE", "ci")
    session.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # RLlib's repros: nothing leaves the machine
    session.run("pytest", "tests/thirdparty", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def history(session: nox.Session) -> None:
    """TorchRL's releases (TORCHRL_HISTORY) through the conformance suite:
    each release in its own prefix (pip --target, no deps) over this
    session's torch and tensordict, its C++ extension rebuilt where needed
    (built once, cached); writes reports/torchrl_history.md and .json."""
    install(session, "test", *RECORDS.session_groups(session.name))  # torchrl 0.14.1: every release's dependencies
    env_default(session, "RBCHECK_PROFILE", "ci")
    session.run("python", "-m", "tools.torchrl_history", "--cache", TORCHRL_BUILD_CACHE,
                "--prefixes", f"{session.virtualenv.location}/torchrl", *TORCHRL_HISTORY,
                *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """pytest-benchmark micro-benchmarks of every implementation side by side
    (default grid; `nox -s bench -- --bench-grid full` for every size): JSON in
    reports/bench.json, ratio tables in reports/bench_ratios.{txt,md}, the
    throughput plot in reports/bench_throughput.png; then rbcheck's `device`
    variant side by side with every peer of the records (bench/peers.py; each
    answer checked first, three runs) into reports/peers.json, a peer with a
    part of its own alone into reports/peers.PART.json, the parts of save/load
    (--costs) and what the checks cost (--checks), all rendered to
    docs/results/peers.md. Quote ratios, not times."""
    install(session, "test", "bench", *THIRD_PARTY_GROUPS)
    build_extensions(session, THIRD_PARTY_GROUPS)
    # one intra-op thread: stable numbers on shared machines (docs/benchmarks.md)
    env_default(session, "RBCHECK_BENCH_THREADS", "1")
    session.run(
        "pytest", "bench/micro", "-q", "-p", "no:cacheprovider",
        "--benchmark-json=reports/bench.json", "--benchmark-min-rounds=5",
        "--benchmark-max-time=0.5", "--benchmark-columns=min,median,iqr,rounds",
        *session.posargs,
    )
    session.run("python", "-m", "bench.ratios", "reports/bench.json", "-o", "reports/bench_ratios.txt")
    session.run("python", "-m", "bench.ratios", "reports/bench.json", "--format", "markdown",
                "-o", "reports/bench_ratios.md", silent=True)
    session.run("python", "-m", "bench.plot", "reports/bench.json", "-o", "reports/bench_throughput.png")
    # the peers' runs (harness/records.py): the main run, then each part alone (bench.peers merges
    # reports/peers.PART.json into the table), rbcheck timed in the same process; they install
    # together here, and each can run in an environment of its own. A part's options are its
    # records' (RLlib stores one Python object per row: 2^18 rows, as filling 2^20 takes over ten
    # minutes per buffer here).
    for part, peers, options in RECORDS.peer_runs():
        if part is not None:  # a part's library (JAX's, Ray's) set up as the parts need (idempotent)
            env_default(session, "JAX_PLATFORMS", "cpu")
            session.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        out = "reports/peers.json" if part is None else f"reports/peers.{part}.json"
        session.run("python", "-m", "bench.peers", "--runs", "3", "--peers", ",".join(peers), *options,
                    "--out", out)
    session.run("python", "-m", "bench.peers", "--costs", "--out", "reports/peers.json")
    session.run("python", "-m", "bench.peers", "--checks", "--out", "reports/peers.json")
    session.run("python", "-m", "bench.peers", "--render", "reports/peers.json", "-o", "docs/results/peers.md")


@nox.session
def asv(session: nox.Session) -> None:
    """Record HEAD's asv results on this machine (quick mode, in this session's
    environment: no per-commit environments are built) and publish the HTML
    to .asv/html. Machine name: env RBCHECK_ASV_MACHINE (default rbcheck-dev)."""
    import os

    groups = RECORDS.session_groups(session.name)
    install(session, "test", "bench", *groups)
    build_extensions(session, groups)
    machine = os.environ.get("RBCHECK_ASV_MACHINE", "rbcheck-dev")
    commit = session.run("git", "rev-parse", "HEAD", silent=True, external=True).strip()
    session.run("asv", "machine", "--machine", machine, "--yes")
    # With a custom name, asv 0.6 stores only the name; record os/arch/cpu/ram too.
    session.run("python", "-c", "import sys; from asv.machine import Machine, MachineCollection; "
                "d = Machine.get_defaults(); d['machine'] = sys.argv[1]; MachineCollection.save(sys.argv[1], d)",
                machine)
    session.run("asv", "run", "--python=same", "--quick", "--show-stderr", "--machine", machine,
                "--set-commit-hash", commit, *session.posargs)
    session.run("asv", "publish")
