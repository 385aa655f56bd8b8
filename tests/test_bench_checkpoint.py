"""bench/checkpoint_speed.py: the committed table is the render of the committed JSON, and a
small run checks the streamed files against the reference's before it times anything."""

from __future__ import annotations

import json
from pathlib import Path

from bench import checkpoint_speed as C

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_table_is_the_render_of_the_committed_report():
    report = json.loads((ROOT / C.DATA).read_text())
    committed = (ROOT / C.DOC).read_text()
    assert committed == C.render(report), "run `python -m bench.checkpoint_speed --render` and commit the result"


def test_a_small_run_times_every_cell_and_renders(tmp_path):
    report = C.measure(capacity=64, width=3, reps=1, runs=2, peers=False)
    assert set(report["medians_s"]) >= {C.SAVE, C.LOAD, C.WRITE, C.READ, C.READ_HUGE, "reference save"}
    assert all(len(ms) == 2 for ms in report["medians_s"].values())
    assert set(report["ratios"]) == set(report["goal_met"]) == {
        f"{C.SAVE} / {C.WRITE}", f"{C.LOAD} / {C.READ}", f"{C.LOAD} / {C.READ_HUGE}"}
    table = C.render(report)
    assert "| rbcheck save |" in table and f"| {C.LOAD} / {C.READ} |" in table


def test_the_run_refuses_files_that_are_not_the_references(monkeypatch, tmp_path):
    from rbcheck.reference import checkpoint as ref

    real = ref.save_checkpoint

    def other(buf, path):  # a "reference" that writes something else: the check must notice
        real(buf, path)
        live = ref.live_dir(path) / "meta.json"
        live.write_bytes(live.read_bytes() + b" ")

    monkeypatch.setattr(ref, "save_checkpoint", other)
    try:
        C.measure(capacity=64, width=3, reps=1, runs=1, peers=False)
    except AssertionError as error:
        assert "differ from the reference's" in str(error)
    else:
        raise AssertionError("the run timed files it had not checked")
