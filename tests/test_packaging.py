"""The installed package, from a wheel built from a clean copy of this checkout.

* It is one namespace, ``rbcheck``, and carries every file its code reads at
  run time: each file of reference/, variants/ and harness/ under
  ``rbcheck/`` (the native tree's C source, the known-failure lists), the
  conformance suite, and no other top-level package. Without the data files
  an installed rbcheck silently falls back to the slow tree path and reports
  no known failures.
* What a user does (the issue's "done when"), in a fresh venv in an empty
  directory: ``pip install`` the wheel (torch pinned by the constraints
  file), ``rbcheck validate example`` and ``rbcheck validate mymod:adapter``
  with a module of that directory; every first-party built-in
  (``reference``, ``device``, ``triton``, ``example``) on the properties
  that import each of their components (:data:`SMOKE`); a throwaway project that calls
  ``rbcheck.check_buffer`` and ``rbcheck.parametrize_with_checks`` from its
  own tests. One venv serves every check (module fixtures); marked ``wheel``
  (``-m "not wheel"`` leaves it out; CI's tests session runs it once).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from tests.harness.test_cli import MYMOD, UNIFORM

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.wheel
#: Repository folders and where the wheel puts them (pyproject.toml's package-dir).
PACKAGES = {"reference": "rbcheck/reference", "variants": "rbcheck/variants",
            "harness": "rbcheck/harness", "rbcheck": "rbcheck"}


def package_files() -> set[str]:
    """Every file of the mapped folders, as its path inside the wheel."""
    found = set()
    for folder, target in PACKAGES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix != ".pyc" and "__pycache__" not in path.parts:
                found.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


def clean_copy(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked but not ignored) without
    build leftovers: an old egg-info would list data files a fresh build lacks."""
    listing = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"not a git checkout: {listing.stderr.strip()}")
    for name in filter(None, listing.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = clean_copy(tmp / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = (tmp / "dist").glob("rbcheck-*.whl")
    return built


#: What the wheel must not ship (issue 18): the mutants (the repository's
#: tests/mutants) and the repository tools (tools/: TorchRL's extension
#: build, the TorchRL release history, the speed check), under any name.
NOT_SHIPPED = ("mutants", "torchrl_build", "torchrl_history", "speed_check")


def repository_only(names) -> list[str]:
    """The names among ``names`` (paths in the wheel) that are repository-only."""
    return sorted(n for n in names
                  if n.split("/", 1)[0] in ("tests", "tools")
                  or any(part.startswith(NOT_SHIPPED) for part in n.split("/")))


def test_mapped_folders_hold_no_mutants_nor_tools():
    """Fast (no build): every file the packages map into the wheel is one
    users call; the mutants and the tools live outside them."""
    shipped = repository_only(package_files())
    assert not shipped, f"repository-only files in the installed package={shipped}, but should be none"
    assert (ROOT / "tools" / "torchrl_build.py").exists() and (ROOT / "tests" / "mutants" / "registry.py").exists()


def test_wheel_holds_every_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = package_files()
    assert {"rbcheck/variants/native/tree.c", "rbcheck/harness/known_failures/torchrl.txt",
            "rbcheck/conformance/test_priority_transform.py"} <= wanted
    missing = sorted(wanted - names)
    assert not missing, f"files missing from the wheel={missing}, but should be none (package-data)"
    tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"rbcheck"}, f"top-level names in the wheel={sorted(tops)}, but should be ['rbcheck']"
    shipped = repository_only(names)
    assert not shipped, f"repository-only files in the wheel={shipped}, but should be none (mutants, tools)"


# ----------------------------------------------------------- installed wheel

# the user's module (MYMOD) is the one the CLI tests use: a sampler that never
# draws the last slot

#: A throwaway project's own tests of its buffer (rbcheck's plugin not turned on).
USER_TESTS = f'''
import sys

import pytest
import rbcheck
from mymod import adapter
from rbcheck.harness.examples.list_buffer import adapter as good_adapter

UNIFORM = {UNIFORM!r}


def test_plugin_stayed_off():
    assert "rbcheck.harness.pytest_plugin" not in sys.modules


def test_check_buffer_reports_the_failure():
    with pytest.raises(rbcheck.ConformanceError, match="chi-square"):
        rbcheck.check_buffer(adapter(), only=[UNIFORM])
    expected = [rbcheck.ExpectedFailure(f"{{UNIFORM}}[{{case}}]", "chi-square", "skips the last slot")
                for case in ("7-5", "10-23", "33-33")]  # capacity 1 has no last slot to skip
    rbcheck.check_buffer(adapter(), expected, only=[UNIFORM], strict=True)


@rbcheck.parametrize_with_checks(good_adapter)
def test_rbcheck(check):
    if check.property_id.startswith(("test_sampling_distributions::test_uniform", "test_sampling_distributions::test_prio")):
        check()
    else:
        pytest.skip("this throwaway project runs two properties")
'''


def run(command, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """``(bin dir, empty work dir, env)``: a fresh venv with the wheel installed
    (and its ``triton`` extra)."""
    tmp = tmp_path_factory.mktemp("installed")
    venv.create(tmp / "venv", with_pip=True)
    bin_dir = tmp / "venv" / ("Scripts" if os.name == "nt" else "bin")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RBCHECK_IMPL", "RBCHECK_PROFILE", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    # with the triton extra, as a user of the triton built-in installs it
    proc = run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile", "-c", str(ROOT / ".ci" / "constraints.txt"),
                f"rbcheck[triton] @ {wheel.as_uri()}"], cwd=tmp, env=env)
    if proc.returncode != 0 and ("No matching distribution" in proc.stderr or "connection" in proc.stderr.lower()):
        pytest.skip(f"cannot install the wheel's dependencies here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp / "work"
    work.mkdir()
    return bin_dir, work, env


def test_installed_site_packages_hold_only_rbcheck(installed):
    bin_dir, work, env = installed
    proc = run([str(bin_dir / "python"), "-c", "import rbcheck, sys; print(sys.modules['rbcheck'].__file__)"],
               cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    site = Path(proc.stdout.strip()).parents[1]
    assert (site / "rbcheck" / "conformance").is_dir()
    taken = [name for name in ("harness", "reference", "variants") if (site / name).exists()]
    assert taken == [], f"top-level packages in site-packages={taken}, but should be none besides rbcheck"


def test_rbcheck_validate_a_builtin_and_a_users_module(installed):
    bin_dir, work, env = installed
    proc = run([str(bin_dir / "rbcheck"), "validate", "example", "--out", "example-report"], cwd=work, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((work / "example-report" / "conformance.json").read_text())
    ring = [row["cells"]["example"]["outcome"] for row in report["rows"]
            if row["id"].startswith("test_ring_eviction.py::test_ring_eviction_matches_reference_and_closed_form")]
    assert ring and set(ring) == {"pass"}, ring
    assert "no problems in example" in proc.stdout
    assert f"[rbcheck] example {UNIFORM}: " in proc.stderr  # progress, one line per property

    (work / "mymod.py").write_text(textwrap.dedent(MYMOD))
    proc = run([str(bin_dir / "rbcheck"), "validate", "mymod:adapter", "--only", UNIFORM, "--out", "report"],
               cwd=work, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "slot frequencies: chi-square p-value" in proc.stdout, proc.stdout  # the failures come first
    assert "FAIL (AssertionError: slot frequencies" in proc.stderr, proc.stderr  # the verdict's problems
    assert (work / "report" / "conformance.md").is_file() and (work / "report" / "conformance.json").is_file()


#: One property per component the first-party built-ins import, so that an
#: import that works only in the clone (``import variants``: issue 17) fails
#: here: the storage and the uniform sampler, the prioritized sampler with its
#: trees (torch, native C or Triton), the slice sampler, the checkpoint module
#: (save and load of every sampler's state) and the pinning module.
SMOKE = (
    "test_sampling_distributions::test_uniform_sampling_matches_closed_form",
    "test_sampling_distributions::test_prioritized_sampling_matches_closed_form",
    "test_sampling_distributions::test_slice_sampling_matches_closed_form",
    "test_checkpoint_roundtrip::test_save_load_round_trips_exactly",
    "test_pin_memory::test_pin_memory_without_accelerator_is_a_clear_error",
)
FIRST_PARTY = ("reference", "device", "triton", "example")


def test_every_first_party_builtin_validates_from_the_wheel(installed):
    """``rbcheck validate reference device triton example`` from the installed
    wheel in an empty directory: exit 0, and in every column the
    :data:`SMOKE` properties ran and passed (``example`` skips what it does
    not declare, with the reason). The full suite takes ~6 min for the
    reference alone; these five properties exercise every module the
    built-ins import (an import error fails each of them) in well under a
    minute per implementation, which keeps CI's tests session short."""
    bin_dir, work, env = installed
    only = [arg for prop in SMOKE for arg in ("--only", prop)]
    proc = run([str(bin_dir / "rbcheck"), "validate", *FIRST_PARTY, *only, "--out", "first-party"],
               cwd=work, env=env, timeout=900)
    shown = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, shown
    report = json.loads((work / "first-party" / "conformance.json").read_text())
    ran = {row["property"] for row in report["rows"]}
    assert ran == set(SMOKE), f"properties in the report={sorted(ran)}, but should be {sorted(SMOKE)}"
    for name in FIRST_PARTY:
        impl = report["implementations"][name]
        assert impl["status"] == "ran", f"{name}: status={impl['status']!r} ({impl['why']}), but should be 'ran'"
        cells = {row["id"]: row["cells"][name] for row in report["rows"]}
        allowed = {"pass", "skip"} if name == "example" else {"pass"}
        wrong = {id_: cell["text"] for id_, cell in cells.items() if cell["outcome"] not in allowed}
        assert not wrong, f"{name}: cells={wrong}, but should be {sorted(allowed)}\n{shown}"
        skipped = [cell["message"] for cell in cells.values() if cell["outcome"] == "skip"]
        assert all(m.startswith("not declared") for m in skipped), (name, skipped)
        assert any(cell["outcome"] == "pass" for cell in cells.values()), f"{name}: nothing passed"


def test_a_throwaway_project_uses_check_buffer_and_parametrize_with_checks(installed):
    bin_dir, work, env = installed
    project = work.parent / "project"
    (project / "tests").mkdir(parents=True)
    (project / "mymod.py").write_text(textwrap.dedent(MYMOD))
    (project / "tests" / "test_buffer.py").write_text(textwrap.dedent(USER_TESTS))
    proc = run([str(bin_dir / "python"), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"],
               cwd=project, env={**env, "PYTHONPATH": str(project)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # the uniform property passed, the prioritized one is skipped with the reason
    assert "not declared: prioritized" in proc.stdout, proc.stdout
    assert "3 passed" in proc.stdout, proc.stdout
    header = [line for line in proc.stdout.splitlines() if line.startswith("rbcheck")]
    assert header == [], header
