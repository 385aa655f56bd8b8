"""The installed package is one namespace, ``rbcheck``, and carries every
file its code reads at run time: a wheel built from this checkout holds each
file of reference/, variants/ and harness/ under ``rbcheck/`` (the native
tree's C source, the known-failure lists), the conformance suite, and no
other top-level package. Without the data files an installed rbcheck silently
falls back to the slow tree path and reports no known failures."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def test_wheel_holds_every_data_file(tmp_path):
    source = clean_copy(tmp_path / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("rbcheck-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = package_files()
    assert {"rbcheck/variants/native/tree.c", "rbcheck/harness/known_failures/torchrl.txt",
            "rbcheck/conformance/test_priority_transform.py"} <= wanted
    missing = sorted(wanted - names)
    assert not missing, f"files missing from the wheel={missing}, but should be none (package-data)"
    tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"rbcheck"}, f"top-level names in the wheel={sorted(tops)}, but should be ['rbcheck']"
