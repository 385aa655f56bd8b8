"""bench/peers.py at tiny sizes with a stub peer (a NumPy buffer): the run checks and
times every operation, the checks fail on a wrong answer (one broken stub per
check), and the committed table is the render of the committed report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench import peers as P
from rbcheck.harness.failure import PropertyFailure
from rbcheck.harness.raw_calls import RawCalls
from rbcheck.harness.raw_checks import raw_priority
from rbcheck.harness.records import peer_builtins

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"capacity": 256, "widths": [3], "batch": 16, "reps": 3, "budget_s": 0.0, "runs": 1,
         "extend_sizes": (1, 8, 32)}


class Stub(RawCalls):
    """A correct prioritized NumPy buffer (a raw face, harness/raw_calls.py); subclasses break one
    thing each."""

    def __init__(self, spec):
        super().__init__(spec)
        self.buffer = {"cursor": 0, "capacity": spec.capacity, "rng": np.random.default_rng(0)}

    def fill(self, rows, priority):
        n = len(rows["obs"])
        self.buffer.update({k: rows[k].copy() for k in ("obs", "action", "reward")})
        self.buffer["p"] = P.transformed(raw_priority(np.arange(n)) if priority is None else priority)

    def prepare(self, rows, priority):
        return rows, raw_priority(rows["obs"][:, 0].astype(np.int64)) if priority is None else priority

    def add(self, prepared):
        rows, priority = prepared
        buf = self.buffer
        slots = (buf["cursor"] + np.arange(len(priority))) % buf["capacity"]
        for key in ("obs", "action", "reward"):
            buf[key][slots] = rows[key]
        buf["p"][slots] = P.transformed(priority)
        buf["cursor"] = int(slots[-1] + 1) % buf["capacity"]

    def sample(self, batch):
        buf = self.buffer
        p = buf["p"]
        index = buf["rng"].choice(len(p), batch, p=p / p.sum())
        weight = (p[index] / p.min()) ** -P.BETA
        return {"obs": buf["obs"][index], "action": buf["action"][index], "reward": buf["reward"][index],
                "index": index, "weight": weight}

    def update_priorities(self, index, priority):
        self.buffer["p"][index] = P.transformed(priority)

    def priority_at(self, slots):
        return self.buffer["p"][slots]

    def rows_at(self, slots):
        return {k: self.buffer[k][slots] for k in ("obs", "action", "reward")}

    def save(self, path):
        path.mkdir(parents=True, exist_ok=True)
        np.savez(path / "b.npz", **{k: self.buffer[k] for k in ("obs", "action", "reward", "p")})

    def loader(self, path):
        target = self._loaded(dict(self.buffer))

        def load():
            with np.load(path / "b.npz") as f:
                target.buffer.update({k: f[k].copy() for k in f.files})
            return target

        return load


def peer(raw=Stub, name="stub"):
    return P.Peer(name, raw, "0")


class WrongExtend(Stub):
    def add(self, prepared):
        super().add(prepared)
        self.buffer["obs"][(self.buffer["cursor"] - 1) % self.buffer["capacity"], 1] += 1  # the last row changed


class WrongRows(Stub):
    def sample(self, batch):
        out = super().sample(batch)
        out["reward"] = out["reward"] + 1
        return out


class WrongIndex(Stub):
    def sample(self, batch):
        out = super().sample(batch)
        out["index"] = (out["index"] + 1) % self.buffer["capacity"]
        return out


class WrongWeights(Stub):
    def sample(self, batch):
        out = super().sample(batch)
        out["weight"] = out["weight"] / out["weight"].max()  # normalised by the batch, declared by min
        return out


class StaleUpdate(Stub):
    def update_priorities(self, index, priority):
        self.buffer["p"][index[1:]] = P.transformed(priority[1:])  # the first slot keeps its old priority


class NoReadback(StaleUpdate):
    """Without a read-back the update is checked through a large sample's weights."""

    def update_priorities(self, index, priority):
        self.buffer["p"][index] = P.transformed(priority * 1.5)

    def priority_at(self, slots):
        return None


class NoRowRead(Stub):
    """Without a read of its rows the contents are checked through samples (rlox)."""

    def rows_at(self, slots):
        return None


class NoRowReadWrongExtend(NoRowRead, WrongExtend):
    pass


class LossyLoad(Stub):
    def loader(self, path):
        load = super().loader(path)

        def lossy():
            target = load()
            target.buffer["action"] = target.buffer["action"].copy()
            target.buffer["action"][-1] = 0.5
            return target

        return lossy


def test_smoke_run_checks_and_times_every_operation():
    lines = []
    report = P.run([peer()], log=lines.append, **SMALL)
    ops = P.ops_for(SMALL["extend_sizes"])
    got = {(r["op"], r["peer"]) for r in report["ratios"]}
    assert got == {(op, "stub") for op in ops}
    assert all(r["ratio_median"] > 0 and r["ratio_min"] > 0 and r["n"] >= P.MIN_REPS for r in report["ratios"])
    assert report["checks_passed"] > 10 and any("checks passed" in line for line in lines)
    text = P.render(json.loads(json.dumps(report)))
    assert "| `extend` 32 rows |" in text and "| stub |" in text and "rbcheck is faster" in text
    cpu = report["machine"]["model"]
    assert "torch's CPU capability " in cpu and f"{cpu}, {os.cpu_count()} cores" in text, \
        "the table says which processor the numbers are from"


def _timed_calls(monkeypatch) -> list:
    """The ``(op, peer)`` of every call ``time_width`` makes, in order (warm-up included)."""
    calls, real = [], P.Bench._call

    def spied(self, peer, op):
        fn = real(self, peer, op)
        return lambda: (calls.append((op, peer.name)), fn())
    monkeypatch.setattr(P.Bench, "_call", spied)
    return calls


def test_checkpoints_are_timed_in_a_rotation_of_their_own(monkeypatch):
    """Each run times every in-memory cell, then every save/load cell: a checkpoint's
    file, page-cache and allocator work is never timed into the next in-memory call."""
    calls = _timed_calls(monkeypatch)
    report = P.run([peer()], log=lambda line: None, **{**SMALL, "runs": 2})
    kinds = [op in P.CHECKPOINT_OPS for op, _ in calls]
    back = sum(1 for a, b in zip(kinds[:-1], kinds[1:], strict=True) if a and not b)  # a checkpoint, then in-memory
    assert kinds[-1] and back == 2, kinds  # warm-up, run 1, run 2: each in-memory cells, then checkpoints
    reps, counts = SMALL["reps"], {key: calls.count(key) for key in set(calls)}
    assert counts[("extend_1", "stub")] == 1 + 2 * (1 + reps)  # warm-up, then per run an untimed pass
    assert counts[("save", "stub")] == 1 + 2 * reps
    assert {(r["op"], r["run"]) for r in report["ratios"]} >= {("save", 1), ("load", 1), ("extend_1", 1)}
    assert "`save` and `load` in a rotation of their own" in P.render(json.loads(json.dumps(report)))


def test_every_run_times_the_control_beside_the_in_memory_cells(monkeypatch, tmp_path):
    """The control (no library's code) is timed in each run's in-memory rotation, never among
    the checkpoints, gets no ratio, and its medians per run are rendered, a part's too."""
    calls, real = _timed_calls(monkeypatch), P.control_cell

    def spied(*args):
        fn = real(*args)
        return lambda: (calls.append((P.CONTROL, P.CONTROL)), fn())

    monkeypatch.setattr(P, "control_cell", spied)
    report = P.run([peer()], log=lambda line: None, **{**SMALL, "runs": 2})
    reps = SMALL["reps"]
    assert calls.count((P.CONTROL, P.CONTROL)) == 1 + 2 * (1 + reps)  # warm-up; per run an untimed pass
    checkpoint = [op in P.CHECKPOINT_OPS for op, _ in calls] + [False]
    assert not any(checkpoint[i - 1] and checkpoint[i + 1]  # never inside a checkpoint rotation
                   for i, (op, _) in enumerate(calls) if op == P.CONTROL and i), calls
    assert [(c["run"], c["width"], c["n"]) for c in report["controls"]] == [(0, 3, reps), (1, 3, reps)]
    assert not any(r["peer"] == P.CONTROL for r in report["ratios"])
    text = P.render(json.loads(json.dumps(report)))
    medians = ", ".join(f"{c['median_s'] * 1e6:.0f}" for c in report["controls"])
    assert "## How fast the machine was in each run" in text and f"| the table's run | 3 | {medians} |" in text
    (tmp_path / "peers.json").write_text(json.dumps(report))
    (tmp_path / "peers.other.json").write_text(json.dumps(P.run([peer(name="other")], log=lambda line: None, **SMALL)))
    assert "| other | 3 |" in P.render(P.load_report(tmp_path / "peers.json"))


class NoCheckpoint(Stub):
    unsupported = {"save": "no checkpoint", "load": "no checkpoint"}


def test_rbcheck_is_not_timed_on_operations_no_peer_is_timed_on(monkeypatch):
    """A part whose peers have no checkpoint (flashbax) times no rbcheck save/load: such a
    cell compares with nothing and would only disturb the others."""
    calls = _timed_calls(monkeypatch)
    report = P.run([peer(NoCheckpoint)], log=lambda line: None, **SMALL)
    assert calls and not any(op in P.CHECKPOINT_OPS for op, _ in calls)
    assert {b["op"] for b in report["baselines"]} == set(P.ops_for(SMALL["extend_sizes"])) - {"save", "load"}
    assert "| `save` | — |" in P.render(json.loads(json.dumps(report)))


class UniformOnly(Stub):
    samplers = ("random",)


def test_rbcheck_extends_only_into_the_kind_of_buffer_peers_extend_into(monkeypatch):
    """Peers that all extend into a uniform buffer (stable-baselines3, flashbax's flat one) are
    compared with rbcheck's uniform buffer: rbcheck's own prioritized extend, compared with
    nothing, is not timed, and every extend still has its ratio."""
    calls = _timed_calls(monkeypatch)
    report = P.run([peer(UniformOnly)], log=lambda line: None, **SMALL)
    assert not any(op.startswith("extend_") and name == "rbcheck" for op, name in calls)
    assert {r["op"] for r in report["ratios"]} >= {f"extend_{n}" for n in SMALL["extend_sizes"]}
    assert all(r["base_n"] >= P.MIN_REPS for r in report["ratios"])


@pytest.mark.parametrize("broken", [WrongExtend, WrongRows, WrongIndex, WrongWeights, StaleUpdate,
                                    NoReadback, LossyLoad, NoRowReadWrongExtend])
def test_a_wrong_answer_gets_no_number(broken):
    """Each check raises the harness's own failure (harness/raw_checks.py, harness/failure.py)."""
    with pytest.raises(PropertyFailure, match="but should be"):
        P.run([peer(broken)], log=lambda line: None, **{**SMALL, "reps": P.MIN_REPS})


def test_peers_that_cannot_run_are_listed_with_the_reason():
    missing = P.Peer.of_builtin("nothing", "rbcheck_no_such_module:factory")
    report = P.run([missing], log=lambda line: None, **SMALL)
    assert report["peers"]["nothing"]["skipped"].startswith("not installed")
    assert report["ratios"] == []
    assert "skipped: not installed" in P.render(report)


def test_extends_that_would_wrap_the_ring_are_refused():
    with pytest.raises(ValueError, match="but should be <= capacity"):
        P.run([peer()], log=lambda line: None, **{**SMALL, "extend_sizes": (200, 100)})


def test_the_committed_table_is_the_render_of_the_committed_report():
    report = P.load_report(ROOT / "reports" / "peers.json")  # with its parts, reports/peers.NAME.json
    committed = (ROOT / "docs" / "results" / "peers.md").read_text()
    assert committed == P.render(report), "run `python -m bench.peers --render` and commit the result"


def test_ops_re_measures_some_rows_and_keeps_the_others():
    report = P.run([peer()], log=lambda line: None, **SMALL)
    again = P.run([peer()], log=lambda line: None, **SMALL, only=["save", "load"])
    assert {r["op"] for r in again["ratios"]} == {"save", "load"}
    merged = P.merge(json.loads(json.dumps(report)), again, ["save", "load"])
    assert sorted((r["op"], r["run"]) for r in merged["ratios"]) == sorted((r["op"], r["run"]) for r in report["ratios"])
    assert [r for r in merged["ratios"] if r["op"] == "save"] == [r for r in again["ratios"] if r["op"] == "save"]
    assert "`save`, `load`: re-measured on" in P.render(merged)
    assert len(P.merge(merged, again, ["save", "load"])["remeasured"]) == 1  # the replaced record goes


def test_a_re_measured_op_that_now_runs_drops_its_old_skip_reason():
    """A peer skipped on an operation (say TorchRL's prioritized sampler
    before its extension was rebuilt) and re-timed on it with --ops: the
    table must not keep saying it was skipped, and other ops' reasons stay."""
    report = P.run([peer()], log=lambda line: None, **SMALL)
    report["peers"]["stub"]["ops_skipped"] = {"update_priority": "no tree", "save": "no checkpoint"}
    again = P.run([peer()], log=lambda line: None, **SMALL, only=["update_priority"])
    merged = P.merge(json.loads(json.dumps(report)), again, ["update_priority"])
    assert merged["peers"]["stub"]["ops_skipped"] == {"save": "no checkpoint"}


def test_checkpoint_costs_time_every_part_and_render():
    costs = P.checkpoint_costs(4096, 8, reps=1, log=lambda line: None)
    assert {"save", "load", "hash sha256", "write + fsync", "load by the reference's path (before)"} <= set(costs["parts"])
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in costs["parts"].values())
    report = P.run([peer()], log=lambda line: None, **SMALL)
    report["checkpoint_costs"], report["checkpoint_costs_load_average"] = [costs], 1.0
    assert "| hash sha256 |" in P.render(report)


def test_parts_from_other_environments_are_merged_into_the_table(tmp_path):
    main = P.run([peer(), P.Peer.of_builtin("other", "rbcheck_no_such_module:factory")], log=lambda line: None,
                 **SMALL)
    part = P.run([peer(name="other")], log=lambda line: None, **SMALL)
    (tmp_path / "peers.json").write_text(json.dumps(main))
    (tmp_path / "peers.other.json").write_text(json.dumps(part))
    merged = P.load_report(tmp_path / "peers.json")
    assert merged["peers"]["other"]["skipped"] is None and merged["peers"]["stub"]["skipped"] is None
    assert {r["peer"] for r in merged["ratios"]} == {"stub", "other"}
    text = P.render(merged)
    assert "| operation | stub | other |" in text and "other: timed in an environment of its own" in text
    assert f"at commit {part['commit']} ({part['machine']['model']}): capacity" in text
    assert P.render(P.load_report(tmp_path / "peers.json", parts=[])) == P.render(main)
    P.main(["--render", str(tmp_path / "peers.json"), "-o", str(tmp_path / "peers.md")])
    assert (tmp_path / "peers.md").read_text() == text


@pytest.mark.parametrize("name", list(peer_builtins()))
def test_every_peer_passes_every_check_at_a_small_size(name):
    """Each peer of the records (its adapter's raw face; skipped where its library is not installed,
    as in the tests environment) answers every check and gets a number for each operation it has."""
    one = P.Peer.of_builtin(name, peer_builtins()[name])
    if one.unavailable():
        pytest.skip(one.unavailable())
    report = P.run([one], log=lambda line: None, **SMALL)
    status = report["peers"][name]
    assert status["skipped"] is None, status
    timed = {r["op"] for r in report["ratios"]}
    assert timed == set(P.ops_for(SMALL["extend_sizes"])) - set(status["ops_skipped"])
    assert report["checks_passed"] > 10


def _check_costs(**kw):
    from bench import check_costs

    return check_costs.measure(256, 3, 16, 6, 1, log=lambda line: None, uniform_peer=peer(),
                               prioritized_peer=peer(), **kw)


def test_check_costs_time_each_way_and_render():
    """bench/check_costs.py: every cell timed in every run, the states checked equal, the section
    rendered (the peers here: the NumPy stub)."""
    from bench import check_costs

    part = _check_costs()
    ops = {"extend 1 row, uniform", "extend 1 row, prioritized", "update_priority 16"}
    want = {f"{op}|{way}" for op in ops for way in ("stub", "shipped", "dropped")} \
        | {f"{op}|at hand" for op in ops if op.startswith("extend")}
    assert set(part["runs"][0]) == want and all(t > 0 for t in part["runs"][0].values())
    text = "\n".join(check_costs.render({"date": "d", "commit": "c", "load_average": [1, 1], "widths": [part]}))
    assert "| 3 | update_priority 16 | stub |" in text and "| 3 | extend 1 row, uniform | stub |" in text


def test_check_costs_refuse_repetitions_the_ways_cannot_share():
    from bench import check_costs

    with pytest.raises(ValueError, match="reps=4, but should be a positive multiple of 3"):
        check_costs.measure(256, 3, 16, 4, 1, uniform_peer=peer(), prioritized_peer=peer())
    with pytest.raises(SystemExit):
        P.main(["--checks", "--check-reps", "0"])


def test_check_costs_refuse_a_way_that_leaves_another_state(monkeypatch):
    """A way of calling that writes a different row, or skips the trees, gets no number."""
    from bench import check_costs

    dropped = check_costs.extend_dropped

    def wrong_row(buf, data):
        call = dropped(buf, data)

        def wrong():
            index = call()
            buf.storage.data["obs"][index] += 1
            return index

        return wrong

    monkeypatch.setattr(check_costs, "extend_dropped", wrong_row)
    with pytest.raises(PropertyFailure, match="rows/obs=<differs"):
        _check_costs()
    monkeypatch.setattr(check_costs, "extend_dropped", dropped)
    monkeypatch.setattr(check_costs, "update_dropped", lambda buf, index, priority: lambda: None)
    with pytest.raises(PropertyFailure, match="update_priority, dropped: sum_tree=<differs"):
        _check_costs()


def test_the_ablation_switches_are_on_and_restored():
    """The product's switches that --checks turns off for one call (variants/extend_fast.py,
    variants/update_fast.py) are on, and on again after a measurement."""
    from rbcheck.variants import extend_fast, update_fast

    _check_costs()
    assert extend_fast.CHECKS is True and update_fast.CHECKS is True


def test_phases_records_every_cell_and_the_memory_watched(tmp_path):
    """bench/phases.py at a tiny size: one block, every cell timed, the huge pages of the
    watched memory read, and the summary computed from the file."""
    from bench import phases

    if not Path("/proc/self/smaps").exists():
        pytest.skip("bench/phases.py reads Linux's /proc")
    out = tmp_path / "phases.jsonl"
    assert phases.main(["--minutes", "0", "--capacity", "4096", "--width", "3", "--batch", "64",
                        "--reps", "2", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1
    assert {"rb_update", "rb_usample", "rb_psample", "gather_4k", "gather_2m", "compute"} <= set(lines[0]["median_us"])
    assert set(lines[0]["huge_kib"]) == {"rows", "tree", "plain", "huge"}
    assert "gather_4k: median" in "\n".join(phases.summary(lines * 20))
    with pytest.raises(ValueError, match="1 blocks, but the summary needs at least 20"):
        phases.summary(lines)
    with pytest.raises(SystemExit):
        phases.main(["--batch", "0"])


def test_the_peers_are_the_records_peers_in_their_order():
    """The peers benchmark's list of peers comes from the built-ins' records
    (harness/records.py), each the raw face of a built-in's adapter."""
    from rbcheck.harness.records import RECORDS, peer_names

    assert [p.name for p in P.all_peers()] == list(peer_names())
    assert set(peer_builtins()) == set(peer_names()) and set(peer_builtins().values()) <= set(RECORDS)
    assert peer_builtins()["rlox"] == "rlox" and peer_builtins()["flashbax"] == "flashbax-item"


#: Import names of the libraries the adapters drive (harness/records.py's libraries).
LIBRARIES = ("torchrl", "cpprb", "tianshou", "stable_baselines3", "gymnasium", "flashbax", "jax", "ray", "rlox",
             "skrl", "d3rlpy", "reverb")
#: bench modules that still drive a library themselves (none: every benchmark reaches the
#: libraries through the adapters' raw faces)
NOT_YET: set[str] = set()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports too)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            if node.module == "bench":
                out |= {f"bench.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            out.add(node.args[0].value)
    return out


def test_bench_imports_no_library_the_adapters_drive():
    """The benchmarks drive the libraries through the adapters' raw faces (harness/raw_calls.py):
    no module of bench/ imports one (but those listed in NOT_YET)."""
    for path in sorted((ROOT / "bench").glob("*.py")):
        if path.name in NOT_YET:
            continue
        found = sorted(m for m in _imports(path) if m.split(".")[0] in LIBRARIES)
        assert not found, f"{path.name} imports {found}, but should reach the libraries through the adapters"


def test_bench_modules_import_no_cycle():
    """No import cycle between bench modules (bench/peers.py and bench/check_costs.py share bench/faces.py)."""
    paths = {f"bench.{p.stem}": p for p in (ROOT / "bench").glob("*.py")}
    graph = {name: {m for m in _imports(path) if m in paths and m != name} for name, path in paths.items()}

    def reach(start, node, seen):
        for nxt in graph[node]:
            assert nxt != start, f"{start} imports itself through {sorted(seen | {node})}"
            if nxt not in seen:
                seen.add(nxt)
                reach(start, nxt, seen)

    for name in graph:
        reach(name, name, set())
