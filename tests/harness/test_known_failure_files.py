"""The shipped known-failures files and the TorchRL adapter's choice of one,
without TorchRL installed: every file parses in the keyed-by-cause format,
none names a test of a seed invariant, and each release of the history gets
its own file when there is one."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rbcheck.harness.plugin.known_failures import parse_known_failures, seed_invariant_of

KNOWN = Path(__file__).resolve().parents[2] / "harness" / "known_failures"
FILES = sorted(KNOWN.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_shipped_known_failures_parse_and_hide_no_seed_bug(path):
    for entry in parse_known_failures(path):
        assert entry.pattern.pattern and entry.reason != "no reason given", entry
        nodeid = "rbcheck/conformance/" + entry.test_id
        assert seed_invariant_of(nodeid) is None, f"{path.name}:{entry.line} names a seed invariant"


def test_each_torchrl_release_gets_its_own_file_or_the_default():
    from rbcheck.harness.adapters.torchrl import known_failures_file

    for release in ("0.6.0", "0.8.1", "0.9.2", "0.14.1", "9.9.9"):
        own = KNOWN / f"torchrl-{release}.txt"
        assert known_failures_file(release) == (own if own.exists() else KNOWN / "torchrl.txt")


@pytest.mark.parametrize("names, expected", [
    (("BaseCollector", "DataCollectorBase"), "BaseCollector"),  # 0.14.1 has both names
    (("DataCollectorBase",), "DataCollectorBase"),  # 0.6.0 - 0.9.2
])
def test_collector_base_maps_each_release(monkeypatch, names, expected):
    from rbcheck.harness.adapters import torchrl as adapter

    fake = SimpleNamespace(**{name: type(name, (), {}) for name in names})
    monkeypatch.setitem(sys.modules, "torchrl.collectors", fake)
    monkeypatch.setattr(adapter.importlib, "import_module", lambda name: sys.modules[name])
    assert adapter.collector_base().__name__ == expected


def test_collector_base_missing_is_a_clear_error(monkeypatch):
    from rbcheck.harness.adapters import torchrl as adapter

    monkeypatch.setattr(adapter.importlib, "import_module", lambda name: SimpleNamespace())
    with pytest.raises(ImportError, match="neither BaseCollector nor DataCollectorBase"):
        adapter.collector_base()


def test_history_summary_folds_parametrizations_and_keeps_single_messages():
    from rbcheck.harness.report import ImplResult, build
    from tools.torchrl_history import summary

    def run(name, outcomes):
        return ImplResult(name=name, status="ran", tests=[
            {"nodeid": f"rbcheck/conformance/{nodeid}", "property": nodeid.split("[")[0], "outcome": o,
             "message": m} for nodeid, o, m in outcomes])

    table = build([
        run("torchrl 0.6.0", [("test_a.py::test_x[1]", "pass", ""), ("test_a.py::test_x[2]", "fail", "m"),
                              ("test_b.py::test_once", "fail", "AssertionError: stored=2.0, but should be 1.5")]),
        run("torchrl 0.14.1", [("test_a.py::test_x[1]", "pass", ""), ("test_a.py::test_x[2]", "pass", ""),
                               ("test_b.py::test_once", "pass", "")]),
    ])
    lines = summary(table).splitlines()
    assert lines[0] == "| property | torchrl 0.6.0 | torchrl 0.14.1 |"
    assert lines[2] == "| `test_a.py::test_x` | 1 pass, 1 FAIL | 2 pass |"
    assert lines[3] == "| `test_b.py::test_once` | FAIL: AssertionError: stored=2.0, but should be 1.5 | pass |"
