"""The tests session (what CI runs) covers every built-in variant: a variant
added to harness/adapters without a conformance run in CI fails here."""

import ast
from pathlib import Path

from rbcheck.harness.adapters import builtin_names
from rbcheck.harness.report import is_third_party

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"


def test_tests_session_runs_the_conformance_suite_on_every_variant(tmp_path, monkeypatch):
    from tests.test_records import load_noxfile

    listed = set(load_noxfile(tmp_path, monkeypatch).VARIANTS)
    variants = {name for name in builtin_names()
                if name not in ("reference", "example") and not is_third_party(name)}
    assert listed == variants, f"noxfile VARIANTS={sorted(listed or [])}, but should be {sorted(variants)}"


def test_the_subprocess_lane_names_test_files_that_exist():
    """The tests session runs SUBPROCESS_LANE beside the main run and leaves
    those files out of the main run: each must be a test file here."""
    tree = ast.parse(NOXFILE.read_text())
    lane = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "SUBPROCESS_LANE" for t in node.targets))
    root = NOXFILE.parent
    missing = [path for path in lane if not (root / path).is_file() or not Path(path).name.startswith("test_")]
    assert lane and not missing, f"SUBPROCESS_LANE entries={missing}, but should be test files of this repository"


def test_the_callers_environment_wins_over_the_sessions_defaults(monkeypatch):
    """`RBCHECK_JOBS=1 nox -s validate` (or RBCHECK_PROFILE=thorough) must reach
    the commands: nox's session.env holds only what the session set and wins
    over the caller's environment, so defaults go through env_default."""
    import types

    tree = ast.parse(NOXFILE.read_text())
    (fn,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "env_default"]
    namespace = {"nox": types.SimpleNamespace(Session=object)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(NOXFILE), "exec"), namespace)
    session = types.SimpleNamespace(env={})
    monkeypatch.setenv("RBCHECK_JOBS", "1")
    assert namespace["env_default"](session, "RBCHECK_JOBS", "auto") == "1" == session.env["RBCHECK_JOBS"]
    monkeypatch.delenv("RBCHECK_PROFILE", raising=False)
    assert namespace["env_default"](session, "RBCHECK_PROFILE", "ci") == "ci"
    source = NOXFILE.read_text()
    for name in ("RBCHECK_PROFILE", "RBCHECK_JOBS", "RBCHECK_BENCH_THREADS", "JAX_PLATFORMS"):
        assert f'session.env.setdefault("{name}"' not in source, f"{name}: set with env_default, not setdefault"
