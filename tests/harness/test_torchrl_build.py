"""The TorchRL extension builder's decisions and bookkeeping, without
compiling anything (a real build takes minutes; the nox sessions that use
TorchRL do it): a fake torchrl package in a temporary directory, the probe
and the compiler replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import torchrl_build as tb


@pytest.mark.parametrize(
    "load_error, have_sources, cached, action",
    [
        (None, False, False, "keep"),  # loads: never rebuilt
        (None, True, True, "keep"),
        ("ImportError: undefined symbol", True, True, "install"),  # a cached build is reused
        ("ImportError: undefined symbol", False, True, "install"),
        ("ImportError: undefined symbol", True, False, "build"),
        ("ImportError: undefined symbol", False, False, "give_up"),
    ],
)
def test_plan(load_error, have_sources, cached, action):
    decision = tb.plan(load_error, have_sources, cached)
    assert decision.action == action
    if load_error:
        assert load_error in decision.why


def _csrc(tmp_path: Path, body: str = "int x;") -> Path:
    csrc = tmp_path / "csrc"
    csrc.mkdir(parents=True, exist_ok=True)
    (csrc / "pybind.cpp").write_text(body)
    (csrc / "utils.cpp").write_text("int y;")
    (csrc / "segment_tree.h").write_text("#pragma once")
    return csrc


def test_build_key_changes_with_sources_torch_and_abi_only(tmp_path):
    csrc = _csrc(tmp_path)
    key = tb.build_key(csrc, "2.13.0", ".cpython-311-x86_64-linux-gnu.so")
    assert key == tb.build_key(csrc, "2.13.0", ".cpython-311-x86_64-linux-gnu.so")
    assert key != tb.build_key(csrc, "2.11.0", ".cpython-311-x86_64-linux-gnu.so")
    assert key != tb.build_key(csrc, "2.13.0", ".cpython-312-x86_64-linux-gnu.so")
    (csrc / "README").write_text("not a source")  # ignored
    assert key == tb.build_key(csrc, "2.13.0", ".cpython-311-x86_64-linux-gnu.so")
    (csrc / "segment_tree.h").write_text("#pragma once // changed")
    assert key != tb.build_key(csrc, "2.13.0", ".cpython-311-x86_64-linux-gnu.so")


def test_compiler_error_is_the_first_error_without_directories():
    log = "\n".join([
        "building '_torchrl' extension",
        "/root/x/site-packages/torchrl/csrc/pybind.cpp:12:3: error: 'foo' was not declared in this scope",
        "   12 |   foo();",
        "/root/x/site-packages/torchrl/csrc/utils.cpp:1:1: error: second",
    ])
    assert tb.compiler_error(log) == (
        "pybind.cpp:12:3: error: 'foo' was not declared in this scope 12 |   foo();"
    )


@pytest.fixture
def fake_torchrl(tmp_path, monkeypatch):
    """A torchrl package holding a shipped binary; sources of its own."""
    package = tmp_path / "site" / "torchrl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_torchrl.so").write_bytes(b"shipped")
    _csrc(package)
    monkeypatch.setattr(tb, "torchrl_dir", lambda: package)
    monkeypatch.setattr(tb, "installed_version", lambda p: "0.6.0")
    return package


def _scripted_probe(monkeypatch, answers):
    answers = list(answers)
    monkeypatch.setattr(tb, "probe", lambda python=None: answers.pop(0))
    return answers


def _fake_compile(calls):
    def compile_extension(csrc, out):
        calls.append(csrc)
        out.mkdir(parents=True, exist_ok=True)
        binary = out / "_torchrl.cpython-311-x86_64-linux-gnu.so"
        binary.write_bytes(b"built")
        return binary

    return compile_extension


def test_ensure_keeps_an_extension_that_loads(fake_torchrl, tmp_path, monkeypatch):
    _scripted_probe(monkeypatch, [None])
    monkeypatch.setattr(tb, "compile_extension", lambda *a: pytest.fail("must not build"))
    loads, line = tb.ensure(tmp_path / "cache")
    assert loads and "the shipped extension loads" in line
    assert (fake_torchrl / "_torchrl.so").read_bytes() == b"shipped"
    assert tb.read_marker(fake_torchrl) is None


def test_ensure_builds_installs_records_and_then_reuses(fake_torchrl, tmp_path, monkeypatch):
    import torch

    calls: list = []
    monkeypatch.setattr(tb, "compile_extension", _fake_compile(calls))
    _scripted_probe(monkeypatch, ["ImportError: undefined symbol: _ZN5torch", None])
    loads, line = tb.ensure(tmp_path / "cache")
    assert loads and len(calls) == 1 and calls[0] == fake_torchrl / "csrc"
    assert line == f"C++ extension rebuilt here from torchrl 0.6.0's own csrc against torch {torch.__version__}"
    assert (fake_torchrl / "_torchrl.so").read_bytes() == b"built"  # in place of the shipped one
    assert (fake_torchrl / "_torchrl.so.shipped").read_bytes() == b"shipped"
    marker = tb.read_marker(fake_torchrl)
    assert marker["status"] == "rebuilt" and marker["torch"] == torch.__version__

    # the same environment again: it loads, nothing is built, the record stands
    _scripted_probe(monkeypatch, [None])
    assert tb.ensure(tmp_path / "cache") == (True, line)

    # a second environment (same sources and torch): installed from the cache
    (fake_torchrl / "_torchrl.so").write_bytes(b"shipped")
    (fake_torchrl / "_torchrl.so.shipped").unlink()
    (fake_torchrl / tb.MARKER).unlink()
    _scripted_probe(monkeypatch, ["ImportError: undefined symbol", None])
    assert tb.ensure(tmp_path / "cache") == (True, line)
    assert len(calls) == 1  # built once
    assert (fake_torchrl / "_torchrl.so").read_bytes() == b"built"


def test_a_stale_record_is_ignored(fake_torchrl, tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "compile_extension", _fake_compile([]))
    _scripted_probe(monkeypatch, ["ImportError: x", None])
    tb.ensure(tmp_path / "cache")
    (fake_torchrl / "_torchrl.so").write_bytes(b"reinstalled by pip")
    assert tb.read_marker(fake_torchrl) is None


def test_a_failed_build_keeps_the_shipped_binary_and_records_the_compiler_error(
    fake_torchrl, tmp_path, monkeypatch
):
    import torch

    def broken(csrc, out):
        raise RuntimeError("pybind.cpp:3:10: fatal error: torch/extension.h: No such file or directory")

    monkeypatch.setattr(tb, "compile_extension", broken)
    _scripted_probe(monkeypatch, ["ImportError: undefined symbol"])
    loads, line = tb.ensure(tmp_path / "cache")
    assert not loads
    assert line == (f"torchrl 0.6.0: rebuilding the extension from torchrl 0.6.0's own csrc against torch "
                    f"{torch.__version__} failed: pybind.cpp:3:10: fatal error: torch/extension.h: "
                    f"No such file or directory")
    assert (fake_torchrl / "_torchrl.so").read_bytes() == b"shipped"
    assert json.loads((fake_torchrl / tb.MARKER).read_text())["status"] == "build_failed"
    assert tb.read_marker(fake_torchrl)["line"] == line
    # the command reports it and exits 0 (a third party that cannot run is
    # reported, not fatal), or 1 with --strict
    _scripted_probe(monkeypatch, ["ImportError: undefined symbol"])
    assert tb.main(["--cache", str(tmp_path / "cache")]) == 0
    _scripted_probe(monkeypatch, ["ImportError: undefined symbol"])
    assert tb.main(["--cache", str(tmp_path / "cache"), "--strict"]) == 1


def test_releases_without_sources_use_the_source_release(fake_torchrl, tmp_path, monkeypatch):
    import shutil

    shutil.rmtree(fake_torchrl / "csrc")
    fetched = _csrc(tmp_path / "fetched")
    asked = []
    monkeypatch.setattr(tb, "fetch_sources", lambda version, cache: asked.append(version) or fetched)
    calls: list = []
    monkeypatch.setattr(tb, "compile_extension", _fake_compile(calls))
    _scripted_probe(monkeypatch, ["ImportError: x", None])
    loads, line = tb.ensure(tmp_path / "cache", source_version="0.14.1")
    assert loads and asked == ["0.14.1"] and calls == [fetched]
    assert "from torchrl 0.14.1's csrc against torch" in line


def test_no_sources_at_all_is_reported_not_raised(fake_torchrl, tmp_path, monkeypatch):
    import shutil

    shutil.rmtree(fake_torchrl / "csrc")

    def offline(version, cache):
        raise OSError("no network")

    monkeypatch.setattr(tb, "fetch_sources", offline)
    _scripted_probe(monkeypatch, ["ImportError: x"])
    loads, line = tb.ensure(tmp_path / "cache")
    assert not loads and "no sources (OSError: no network)" in line
