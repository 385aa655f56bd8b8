"""Records which tests of tests/thirdparty this pytest session collected, for
test_registered_repros.py: every repro of docs/bugs.toml must be among them
wherever its module was collected (its library installed)."""

from __future__ import annotations

from pathlib import Path

#: node ids collected in this session (parametrized ones without their [case])
COLLECTED: set[str] = set()
#: tests/thirdparty files this session collected tests from
COLLECTED_FILES: set[str] = set()

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        path = Path(str(item.path)).resolve()
        try:
            rel = path.relative_to(ROOT).as_posix()
        except ValueError:
            continue
        if rel.startswith("tests/thirdparty/"):
            COLLECTED_FILES.add(rel)
            COLLECTED.add(f"{rel}::{item.originalname if hasattr(item, 'originalname') else item.name}")
