"""The records (harness/records.py) are the one place a built-in's facts live:
the noxfile's lists, the README's list of names and ``rbcheck list`` are
derived from them, so a record added there shows up in each, and no library
name is written into the noxfile."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rbcheck import cli
from rbcheck.harness import records
from rbcheck.harness.adapters import builtin_table, is_first_party
from rbcheck.harness.records import BenchPeer, Record

ROOT = Path(__file__).resolve().parents[1]
NOXFILE = ROOT / "noxfile.py"

FAKES = (
    Record("fake-lib", "fakepkg.buffers:fake_adapter", False, "a fake library's buffer", groups=("fakegroup",),
           libraries=("FakeLib",), peers=(BenchPeer("fake-peer", part="fakegroup", options=("--capacity", "8")),)),
    Record("fake-alone", "fakepkg.alone:adapter", False, "a fake library that installs alone",
           groups=("fakeenvgroup",), env="fakeenv", libraries=("FakeAlone",)),
    Record("fake-variant", "rbcheck.harness.adapters.variants:fake", True, "a fake variant", variant=True),
)


@pytest.fixture
def fake_records(monkeypatch):
    for record in FAKES:
        monkeypatch.setitem(records.RECORDS, record.name, record)
    return FAKES


class FakeSession:
    """What a nox session's function asks of nox: its installs and commands, recorded."""

    def __init__(self, name: str, posargs=()):
        self.name, self.posargs, self.env, self.calls, self.bin = name, list(posargs), {}, [], "bin"
        self.virtualenv = types.SimpleNamespace(location="venv")

    def install(self, *args, **kwargs):
        self.calls.append(("install", args))

    def run(self, *args, **kwargs):
        self.calls.append(("run", args))
        return "0" * 40

    def skip(self, message):
        raise AssertionError(f"skipped: {message}")

    def error(self, message):
        raise AssertionError(f"failed: {message}")

    def log(self, message):
        pass


def load_noxfile(tmp_path: Path, monkeypatch):
    """noxfile.py as nox loads it (its records by file path), with a stand-in for nox (not
    installed here) and, beside a copy of it, a harness/records.py that is this process's
    records module (the monkeypatched RECORDS)."""
    import tomllib

    nox = types.ModuleType("nox")
    nox.session = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    nox.parametrize = lambda *a, **k: (lambda f: f)
    nox.options = types.SimpleNamespace()
    nox.Session = object
    nox.project = types.SimpleNamespace(load_toml=lambda path: tomllib.loads((ROOT / path).read_text()),
                                        dependency_groups=lambda pyproject, group: [f"<{group}>"])
    monkeypatch.setitem(sys.modules, "nox", nox)
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "records.py").write_text(
        "from rbcheck.harness.records import *  # noqa: F403\nfrom rbcheck.harness.records import __all__  # noqa: F401\n")
    (tmp_path / "noxfile.py").write_text(NOXFILE.read_text())
    spec = importlib.util.spec_from_file_location("noxfile_under_test", tmp_path / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_new_record_is_in_the_noxfiles_lists_the_readme_and_rbcheck_list(fake_records, tmp_path, monkeypatch,
                                                                           capsys):
    noxfile = load_noxfile(tmp_path, monkeypatch)
    assert "fake-variant" in noxfile.VARIANTS, noxfile.VARIANTS
    assert "fakegroup" in noxfile.THIRD_PARTY_GROUPS and "fakeenvgroup" not in noxfile.THIRD_PARTY_GROUPS
    assert "fakegroup" in noxfile.VALIDATE_ENVS["main"][0], noxfile.VALIDATE_ENVS
    assert noxfile.VALIDATE_ENVS["fakeenv"] == (("test", "fakeenvgroup"), ("fake-alone",)), noxfile.VALIDATE_ENVS

    bench = FakeSession("bench")
    monkeypatch.chdir(tmp_path)
    noxfile.bench(bench)
    installed = [arg for kind, args in bench.calls if kind == "install" for arg in args]
    assert "<fakegroup>" in installed, installed
    runs = [args for kind, args in bench.calls if kind == "run" and args[:3] == ("python", "-m", "bench.peers")]
    assert ("python", "-m", "bench.peers", "--runs", "3", "--peers", "fake-peer", "--capacity", "8",
            "--out", "reports/peers.fakegroup.json") in runs, runs
    thirdparty = FakeSession("thirdparty")
    noxfile.thirdparty(thirdparty)
    assert "<fakegroup>" in thirdparty.calls[0][1], thirdparty.calls[0]

    block = records.readme_block()
    assert "FakeLib `fake-lib`" in block and "FakeAlone `fake-alone`" in block, block
    assert "`fake-variant`" in block.split(";")[0], block  # rbcheck's own

    assert cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "fake-lib" in listed and "fakepkg.buffers:fake_adapter" in listed, listed
    assert builtin_table()["fake-alone"] == "fakepkg.alone:adapter"
    assert is_first_party("fake-variant") and not is_first_party("fake-lib")


def test_the_readme_lists_the_builtins_the_records_generate():
    """README.md's list of built-in names is the records' (rewrite it with
    ``python -m tools.records --write``)."""
    text = (ROOT / "README.md").read_text()
    assert records.readme_with_block(text) == text, (
        "README.md's list of built-in names differs from the records': run python -m tools.records --write")


def test_the_readme_tool_checks_and_writes(tmp_path):
    from tools import records as tool

    readme = tmp_path / "README.md"
    readme.write_text(f"intro:\n{records.README_BEGIN}\n`stale` {records.README_END}\nOptions: the rest\n")
    assert tool.main(["--check", "--readme", str(readme)]) == 1
    assert tool.main(["--write", "--readme", str(readme)]) == 0
    assert tool.main(["--check", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert f"\n{records.readme_block()} {records.README_END}\nOptions: the rest\n" in text, text
    assert "`stale`" not in text


def test_no_library_name_is_written_into_the_noxfile():
    """Every built-in name, dependency group of a record and peer the noxfile
    uses comes from the records: none is a string of its code (docstrings aside)."""
    names = {r.name for r in records.RECORDS.values()} | set(records.peer_names())
    names |= {g for r in records.RECORDS.values() for g in r.groups}
    names |= {r.env for r in records.RECORDS.values()} - {records.MAIN}
    tree = ast.parse(NOXFILE.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = sorted({node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                    and isinstance(node.value, str) and id(node) not in docstrings
                    and any(part in names for part in node.value.replace(",", " ").split())})
    assert not found, f"library names written into noxfile.py={found}, but should come from harness/records.py"


def test_every_records_groups_are_declared_and_each_builtin_is_validated_once():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"])
    unknown = {r.name: g for r in records.RECORDS.values() for g in r.groups if g not in declared}
    assert not unknown, f"record groups not in pyproject.toml's [dependency-groups]={unknown}"
    envs = records.validate_envs()
    listed = [name for _, names in envs.values() for name in names]
    assert len(listed) == len(set(listed)) and set(listed) <= set(records.RECORDS), listed
    assert all(set(groups) <= declared for groups, _ in envs.values()), envs
    for r in records.RECORDS.values():
        assert r.path.count(":") == 1 and r.about and "\n" not in r.about, r
        assert r.first_party or r.libraries, f"{r.name}: a third party's record names the libraries it drives"
        assert not r.variant or r.first_party, f"{r.name}: a variant is rbcheck's own"
        if r.path.startswith("rbcheck.harness."):
            module = r.path.split(":")[0].removeprefix("rbcheck.harness.").replace(".", "/")
            assert (ROOT / "harness" / f"{module}.py").is_file(), f"{r.name}: {r.path} has no module file"


def test_the_records_import_nothing_but_the_standard_library():
    """noxfile.py loads harness/records.py by its path in nox's own environment."""
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('r', {str(ROOT / 'harness' / 'records.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "assert m.variants() and m.validate_envs()['main']\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('rbcheck', 'torch', 'numpy', 'nox'))\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
