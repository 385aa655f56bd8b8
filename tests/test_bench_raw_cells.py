"""The library cells of bench/add_speed.py and bench/checkpoint_speed.py go through the adapters'
raw faces (harness/adapters/<lib>_raw.py): the per-row writes (``prepare_row``/``add_row``) store
the row given, and every library that imports gets its cells (skipped where none does, as in the
tests environment)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import add_speed as A
from bench import checkpoint_speed as C
from bench.faces import Peer, spec_for


@pytest.mark.parametrize("name", ["sb3", "rlox"])
def test_a_per_row_write_stores_that_row(name):
    peer = Peer.of_builtin(name, name)
    if peer.unavailable():
        pytest.skip(peer.unavailable())
    face = peer.raw(spec_for(16, A.WIDTH, False))
    row = A.rows(1, seed=3)[0]
    face.add_row(face.prepare_row(row))
    got = face.rows_at(np.array([0])) or face.sample(1)
    for key in ("obs", "action"):
        assert np.array_equal(np.asarray(got[key]).reshape(-1), row[key]), f"{name}'s {key}={got[key]}"
    assert float(np.asarray(got["reward"]).reshape(-1)[0]) == float(row["reward"])


def test_add_speed_times_each_library_that_imports():
    calls, versions = A.cells(64, A.rows(8))
    for peer, cell in (("sb3", "sb3 add"), ("rlox", "rlox push")):
        assert (cell in calls) == (not versions[peer].startswith("not ")), versions[peer]
    for fn in calls.values():
        fn(0)


def test_checkpoint_peers_round_trip_where_they_import(tmp_path):
    cells, versions = C.peer_cells(32, C.make_rows(32, 3), tmp_path)
    if not cells:
        pytest.skip(f"no checkpoint peer imports here: {versions}")
    for lib, version in versions.items():
        assert ({f"{lib} save", f"{lib} load"} <= set(cells)) == (not version.startswith("not ")), version
    for fn in cells.values():
        fn()
