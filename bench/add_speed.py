"""One row per call, side by side: rbcheck's ``add`` against the per-step calls of the field.

``python -m bench.add_speed [--out docs/results/data/add_speed.json] [--render]`` times, in one
process and one thread, interleaved (each repetition calls every cell once, in a shuffled
order), the medians of ``--reps`` calls per cell in each of ``--runs`` runs:

* ``rbcheck add (numpy)`` / ``rbcheck add (torch)``: ``ReplayBuffer.add(**row)`` of the
  ``device`` variant (CPU, uniform) with the row's columns as NumPy arrays / torch tensors;
* ``rbcheck extend (one-row TensorDict)``: the same row as ``extend`` took it before ``add``:
  a TensorDict built from the tensors each call, then ``extend``;
* ``floor: tensor[slot] = row``: one torch copy per column into preallocated columns and
  the slot counter, no check at all: what any per-step write costs in torch;
* ``sb3 add`` (stable-baselines3's ``ReplayBuffer.add``) and ``rlox push`` (rlox's
  ``ReplayBuffer.push(obs, action, reward, terminated, truncated, next_obs=...)``) when they
  import (their versions recorded; "not installed" otherwise), each the per-row write of its
  adapter's raw face (``prepare_row``/``add_row``, harness/adapters/sb3_raw.py, rlox_raw.py):
  no library is imported here.

Every buffer: capacity ``--capacity`` (2^20), rows obs float32[8], next_obs float32[8],
action float32[2], reward float32, done float32 (stable-baselines3's row). Before timing,
rbcheck's ``add`` is checked to leave the state ``extend`` leaves (``tests/variants/
test_add_fast_path.py`` is the full comparison). The JSON holds each cell's medians per run
and each peer's ratio to ``rbcheck add (numpy)`` (> 1: rbcheck is faster); ``--render``
writes the table (docs/results/add.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from bench import interleaved
from bench.faces import Peer, spec_for

DATA = Path("docs/results/data/add_speed.json")
DOC = Path("docs/results/add.md")
WIDTH, ACTION = 8, 2
BASE = "rbcheck add (numpy)"


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"obs": rng.standard_normal(WIDTH, dtype=np.float32),
             "next_obs": rng.standard_normal(WIDTH, dtype=np.float32),
             "action": rng.standard_normal(ACTION, dtype=np.float32),
             "reward": np.float32(rng.standard_normal()), "done": np.float32(i % 97 == 0)} for i in range(n)]


def cells(capacity: int, data: list[dict]) -> tuple[dict, dict]:
    """``({name: call(i)}, {peer: version})``; each call writes row ``i % len(data)``."""
    from tensordict import TensorDict

    from rbcheck import variants

    out, versions = {}, {"rbcheck": _version("rbcheck")}
    n = len(data)
    tensors = [{k: torch.from_numpy(np.asarray(v)) for k, v in row.items()} for row in data]

    def buffer():
        buf = variants.ReplayBuffer(capacity, device="cpu", generator=0)
        buf.extend(TensorDict({k: v[None] for k, v in tensors[0].items()}, batch_size=[1]))  # allocates
        return buf

    a, b, c = buffer(), buffer(), buffer()
    out[BASE] = lambda i: a.add(**data[i % n])
    out["rbcheck add (torch)"] = lambda i: b.add(**tensors[i % n])
    out["rbcheck extend (one-row TensorDict)"] = lambda i: c.extend(
        TensorDict({k: v[None] for k, v in tensors[i % n].items()}, batch_size=[1]))
    floor = {k: torch.zeros((capacity, *v.shape), dtype=v.dtype) for k, v in tensors[0].items()}
    slot = [0]

    def copy(i):
        row = tensors[i % n]
        s = slot[0]
        for k, column in floor.items():
            column[s] = row[k]
        slot[0] = (s + 1) % capacity
        return s

    out["floor: tensor[slot] = row"] = copy
    spec = spec_for(capacity, WIDTH, False)
    for peer, dist, cell in (("sb3", "stable-baselines3", "sb3 add"), ("rlox", "rlox", "rlox push")):
        face = Peer.of_builtin(peer, peer)
        if face.raw is None:
            versions[peer] = face.why if face.why.startswith("not ") else f"not usable ({face.why})"
            continue
        try:
            buf = face.raw(spec)
            prepared = [buf.prepare_row(r) for r in data]
        except (ImportError, AttributeError, TypeError) as error:
            versions[peer] = f"not usable ({type(error).__name__}: {error})"
            continue
        out[cell] = lambda i, buf=buf, prepared=prepared: buf.add_row(prepared[i % n])
        versions[peer] = _version(dist)
    return out, versions


def _version(dist: str) -> str:
    return interleaved.version(dist, "unknown")


def check_add_is_extend(capacity: int, data: list[dict]) -> None:
    """``add`` of each row leaves the state ``extend`` of it leaves (raises otherwise)."""
    from tensordict import TensorDict

    from rbcheck import variants
    from rbcheck.variants import add_fast

    a, b = (variants.ReplayBuffer(capacity, device="cpu", generator=0) for _ in range(2))
    for row in data[:64]:
        a.add(**row)
        b.extend(TensorDict(add_fast.one_row(row), batch_size=[1]))
    for x, y in zip(a.state_dict()["storage"]["columns"], b.state_dict()["storage"]["columns"], strict=True):
        if not torch.equal(x, y):
            raise AssertionError("add's rows differ from extend's")
    if (a.write_count, a.cursor) != (b.write_count, b.cursor):
        raise AssertionError("add's counters differ from extend's")


def measure(capacity: int, reps: int, runs: int) -> dict:
    torch.set_num_threads(1)
    data = rows(256)
    check_add_is_extend(min(capacity, 1 << 10), data)
    calls, versions = cells(capacity, data)
    for fn in calls.values():  # warm up
        for i in range(64):
            fn(i)
    medians, load = interleaved.medians(calls, reps, runs, pass_rep=True)
    return {"what": "one row per call, medians of interleaved calls (seconds); ratio = cell / rbcheck add (numpy)",
            "date": interleaved.today(), "machine": interleaved.machine(load),
            "sizes": {"capacity": capacity, "reps": reps, "runs": runs,
                      "row": "obs f32[8], next_obs f32[8], action f32[2], reward f32, done f32"},
            "versions": versions, "medians_s": medians,
            "ratios": {name: [m / b for m, b in zip(ms, medians[BASE], strict=True)]
                       for name, ms in medians.items() if name != BASE}}


def render(report: dict) -> str:
    s = report["sizes"]
    lines = ["# One row per call: rbcheck's `add` side by side", "",
             f"Generated by `python -m bench.add_speed --render` from `docs/results/data/add_speed.json` "
             f"(measured {report['date']}; {report['machine']['cores']} cores, load average "
             f"{report['machine']['load_average'][0]} to {report['machine']['load_average'][1]}, torch "
             f"{report['machine']['torch']}, one thread). Capacity {s['capacity']}, rows {s['row']}; "
             f"{s['runs']} runs of {s['reps']} interleaved repetitions (each calls every cell once, shuffled). "
             "Ratio: the cell's median over rbcheck `add` (NumPy columns)'s in the same run (> 1: "
             "rbcheck's `add` is faster).", "",
             "| call | version | medians (us), per run | ratio to rbcheck `add` |", "|---|---|---|---|"]
    versions = report["versions"]
    for name, ms in report["medians_s"].items():
        peer = name.split()[0] if not name.startswith("floor") else None
        version = versions.get(peer, "") if peer else "torch " + report["machine"]["torch"]
        ratio = "1 (the base)" if name == BASE else ", ".join(f"{r:.2f}x" for r in report["ratios"][name])
        lines.append(f"| {name} | {version} | {', '.join(f'{m * 1e6:.1f}' for m in ms)} | {ratio} |")
    lines += interleaved.not_timed(versions)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = interleaved.parser(__doc__.splitlines()[0], DATA, DOC, reps=3000).parse_args(argv)
    return interleaved.write_report(args, lambda: measure(args.capacity, args.reps, args.runs), render)


if __name__ == "__main__":
    sys.exit(main())
