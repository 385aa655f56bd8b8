"""Checkpoints against the disk: rbcheck's ``save``/``load`` beside a plain write and read of
the same bytes, in one process.

``python -m bench.checkpoint_speed [--out docs/results/data/checkpoint_speed.json] [--render]``
builds a full uniform buffer of the ``device`` variant (CPU; ``--capacity`` rows, 2^20, of
obs float32[``--width``], action float32[2], reward float32), saves it once and checks the
streamed files are the reference's, byte for byte, and that a load gives the state back bit
for bit. Then it times, interleaved (each repetition calls every cell once, in a shuffled
order), the medians of ``--reps`` calls per cell in each of ``--runs`` runs:

* ``rbcheck save`` / ``rbcheck load``: ``ReplayBuffer.dumps`` / ``loads`` (every guarantee:
  digest checked before anything changes, damaged files refused, the state's meaning
  checked, fsync, the atomic commit, the previous checkpoint removed);
* ``plain write + fsync``: the checkpoint's bytes (tensor file and ``meta.json``), held in
  memory, written with one ``write`` into one file opened ``"wb"`` (truncating the previous
  run's) and fsynced: what the disk costs;
* ``plain read (new memory)``: that file read with ``readinto`` into a new ``torch.empty``
  tensor, and ``plain read (new huge-page memory)`` into new memory asking for transparent
  huge pages (``native.empty_huge``, which a load's rows use): what reading costs;
* ``reference save`` / ``reference load``: ``reference.checkpoint.save_checkpoint`` /
  ``load_checkpoint`` (safetensors' bytes, one more copy each way) on the same buffer;
* ``xxh3_128 of the bytes`` / ``sha256 of the bytes``: the digest alone (before: sha256);
* ``rbcheck read, into new interleaved rows`` / ``into new plain columns``:
  ``checkpoint_stream.read`` alone, with and without the storage's row layout (what moving
  the columns into interleaved rows costs); ``rbcheck commit protocol alone (empty files)``:
  the save protocol around two empty files (what the atomic commit and its fsyncs cost
  whatever the size).

With ``--peers`` (where they import: the validate environment), TorchRL's ``dumps``/``loads``
(``TensorDictReplayBuffer`` over a ``LazyTensorStorage``), tianshou's ``save_hdf5``/
``load_hdf5`` and stable-baselines3's ``save_to_pkl``/``load_from_pkl`` (what its
``save_replay_buffer`` does) of the same rows join the rotation, each driven through its
adapter's raw face (``save``/``loader``, harness/adapters/<lib>_raw.py), each with what
it guarantees (``GUARANTEES``; each round trip checked before timing). Reads come from the page cache, as a load right after a save
does. ``--render`` writes ``docs/results/checkpoint.md`` from the JSON.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench import interleaved
from bench.faces import Peer, spec_for

DATA = Path("docs/results/data/checkpoint_speed.json")
DOC = Path("docs/results/checkpoint.md")
GOAL = 1.2
SAVE, LOAD = "rbcheck save", "rbcheck load"
PROTOCOL = "rbcheck commit protocol alone (empty files)"
WRITE, READ, READ_HUGE = "plain write + fsync", "plain read (new memory)", "plain read (new huge-page memory)"
RBCHECK = ("digest (XXH3-128) of both files checked before anything changes; damaged, hostile or "
           "contradictory files refused, the buffer unchanged; fsync of files and directories; atomic "
           "commit (rename of CURRENT); no pickle")
GUARANTEES = {
    "torchrl": "`ReplayBuffer.dumps`: memory-mapped TensorDict files and JSON written in place "
               "(replay_buffers/checkpointers.py); no checksum, no fsync, not atomic; no pickle",
    "tianshou": "`save_hdf5`: `h5py.File(path, \"w\")` truncates and rewrites in place "
                "(data/buffer/buffer_base.py:252-256); no checksum, no fsync, not atomic",
    "sb3": "`save_to_pkl`: `pickle.dump` of the whole buffer into the file in place "
           "(common/save_util.py:339-354); no checksum, no fsync, not atomic; `load_from_pkl` unpickles",
}


def _version(dist: str) -> str:
    return interleaved.version(dist, "not installed")


def _files(path: Path) -> dict:
    from rbcheck.reference.checkpoint import live_dir

    return {f.name: f.read_bytes() for f in sorted(live_dir(path).iterdir())}


def make_rows(capacity: int, width: int) -> dict:
    """The rows every buffer holds: ``{"obs", "action", "reward"}`` float32 NumPy arrays."""
    rng = np.random.default_rng(0)
    return {"obs": rng.standard_normal((capacity, width), dtype=np.float32),
            "action": rng.standard_normal((capacity, 2), dtype=np.float32),
            "reward": rng.standard_normal(capacity, dtype=np.float32)}


def rbcheck_buffer(capacity: int, rows: dict | None = None, chunk: int = 1 << 16):
    from tensordict import TensorDict

    from rbcheck import variants

    buf = variants.ReplayBuffer(capacity, generator=0, device="cpu")
    for start in range(0, capacity, chunk) if rows is not None else ():
        part = {k: torch.from_numpy(v[start:start + chunk]) for k, v in rows.items()}
        buf.extend(TensorDict(part, batch_size=[len(part["reward"])]))
    return buf


def peer_cells(capacity: int, rows: dict, tmp: Path) -> tuple[dict, dict]:
    """``({"<lib> save"/"<lib> load": call}, {lib: version or why not})`` for TorchRL,
    tianshou and stable-baselines3 where they import, each through its adapter's raw face
    (``save`` and ``loader``, harness/adapters/<lib>_raw.py; uniform buffers filled with
    ``rows``); each round trip checked first."""
    out, versions = {}, {}
    spec = spec_for(capacity, rows["obs"].shape[1], False)
    slots = np.arange(capacity)
    for lib, dist in (("torchrl", "torchrl"), ("tianshou", "tianshou"), ("sb3", "stable-baselines3")):
        peer = Peer.of_builtin(lib, lib)
        if peer.raw is None:
            versions[lib] = peer.why if peer.why.startswith("not ") else f"not timed ({peer.why})"
            continue
        face = peer.raw(spec)
        face.fill(rows, None)
        where = tmp / lib
        face.save(where)
        load = face.loader(where)
        if not np.array_equal(np.asarray(load().rows_at(slots)["obs"]), rows["obs"]):
            raise AssertionError(f"{lib}'s load did not give the saved rows back")
        versions[lib], out[f"{lib} save"], out[f"{lib} load"] = _version(dist), functools.partial(face.save, where), load
    return out, versions


def cells(capacity: int, width: int, tmp: Path, peers: bool) -> tuple[dict, dict, int]:
    """``({name: call}, {library: version}, bytes)``; checks the files and the round trip first."""
    import xxhash

    from rbcheck.reference import checkpoint as ref
    from rbcheck.variants import checkpoint_stream, native

    rows = make_rows(capacity, width)
    buf, target = rbcheck_buffer(capacity, rows), rbcheck_buffer(capacity)
    buf.dumps(tmp / "rbcheck")
    ref.save_checkpoint(buf, tmp / "reference")
    files = _files(tmp / "rbcheck")
    if files != _files(tmp / "reference"):
        raise AssertionError("the streamed files differ from the reference's")
    target.loads(tmp / "rbcheck")
    for a, b in zip(target.state_dict()["storage"]["columns"], buf.state_dict()["storage"]["columns"], strict=True):
        if not torch.equal(a, b):
            raise AssertionError("a load did not give the saved rows back")
    blob = b"".join(files.values())
    plain = tmp / "plain"

    def write():
        with open(plain, "wb", buffering=0) as out:
            out.write(blob)
            os.fsync(out.fileno())

    def read(alloc):
        size = os.path.getsize(plain)
        out = alloc((size,), torch.uint8)
        with open(plain, "rb", buffering=0) as handle:
            view, got = memoryview(out.numpy()), 0
            while got < size:
                got += handle.readinto(view[got:]) or size
        return out

    write()
    out = {SAVE: lambda: buf.dumps(tmp / "rbcheck"), LOAD: lambda: target.loads(tmp / "rbcheck"),
           WRITE: write, READ: lambda: read(lambda shape, dtype: torch.empty(shape, dtype=dtype)),
           READ_HUGE: lambda: read(native.empty_huge),
           "rbcheck read, into new interleaved rows": lambda: checkpoint_stream.read(tmp / "rbcheck", capacity),
           "rbcheck read, into new plain columns": lambda: checkpoint_stream.read(tmp / "rbcheck"),
           PROTOCOL: lambda: ref.commit_checkpoint(tmp / "protocol", lambda new: (
               ref._write(new / ref.TENSORS, b""), ref._write(new / ref.META, b""))),
           "reference save": lambda: ref.save_checkpoint(buf, tmp / "reference"),
           "reference load": lambda: ref.load_checkpoint(target, tmp / "reference"),
           "xxh3_128 of the bytes": lambda: xxhash.xxh3_128(blob).hexdigest(),
           "sha256 of the bytes": lambda: hashlib.sha256(blob).hexdigest()}
    versions = {"rbcheck": _version("rbcheck"), "torch": torch.__version__, "xxhash": _version("xxhash")}
    if peers:
        more, peer_versions = peer_cells(capacity, rows, tmp)
        out.update(more)
        versions.update(peer_versions)
    return out, versions, len(blob)


def _bytes_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def measure(capacity: int, width: int, reps: int, runs: int, peers: bool) -> dict:
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="rbcheck-checkpoint-speed-"))
    try:
        calls, versions, nbytes = cells(capacity, width, tmp, peers)
        sizes = {name.split()[0]: _bytes_on_disk(tmp / name.split()[0]) for name in calls
                 if name.endswith(" save") and (tmp / name.split()[0]).exists()}
        medians, load = interleaved.medians(calls, reps, runs, pass_rep=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = {f"{a} / {b}": [x / y for x, y in zip(medians[a], medians[b], strict=True)]
              for a, b in ((SAVE, WRITE), (LOAD, READ), (LOAD, READ_HUGE))}
    return {"what": "medians of interleaved calls (seconds); ratios per run: save / plain write + fsync and "
                    f"load / plain read into new memory (the goals, <= {GOAL}), load / plain read into new "
                    "huge-page memory (a stricter floor)",
            "date": interleaved.today(),
            "machine": interleaved.machine(load, python=platform.python_version()),
            "sizes": {"capacity": capacity, "width": width, "reps": reps, "runs": runs, "checkpoint_bytes": nbytes,
                      "row": f"obs f32[{width}], action f32[2], reward f32"},
            "versions": versions, "bytes_on_disk": sizes, "medians_s": medians, "ratios": ratios,
            "goal_met": {op: all(r <= GOAL for r in rs) for op, rs in ratios.items()},
            "goals": [f"{SAVE} / {WRITE}", f"{LOAD} / {READ}"]}


def render(report: dict) -> str:
    s, m = report["sizes"], report["machine"]
    lines = ["# Checkpoints against the disk: rbcheck's `save` and `load` side by side", "",
             f"Generated by `python -m bench.checkpoint_speed --render` from `docs/results/data/"
             f"checkpoint_speed.json` (measured {report['date']}; {m['cores']} cores, load average "
             f"{m['load_average'][0]} to {m['load_average'][1]}, torch {m['torch']}, one thread). A full "
             f"uniform buffer of the `device` variant on the CPU: {s['capacity']} rows of {s['row']}, a "
             f"checkpoint of {s['checkpoint_bytes']} bytes; {s['runs']} runs of {s['reps']} interleaved "
             "repetitions (each calls every cell once, shuffled), the median per run. Reads come from the "
             "page cache. The plain cells do the least any checkpoint must: the same bytes written with "
             "one `write` and fsynced, read with `readinto` into new memory.", "",
             "| ratio | per run | at most 1.2x in every run |", "|---|---|---|"]
    for op, ratios in report["ratios"].items():
        goal = "(the goal) " if op in report["goals"] else "(a stricter floor) "
        lines.append(f"| {op} | {', '.join(f'{r:.2f}x' for r in ratios)} | {goal}"
                     f"{'yes' if report['goal_met'][op] else 'no'} |")
    lines += ["", "| cell | version | bytes on disk | medians (ms), per run | guarantees |", "|---|---|---|---|---|"]
    versions, sizes = report["versions"], report["bytes_on_disk"]
    for name, ms in report["medians_s"].items():
        lib = name.split()[0]
        version = {"plain": "", "reference": versions["rbcheck"], "sha256": f"Python {m.get('python', '')}",
                   "xxh3_128": f"xxhash {versions.get('xxhash', '?')}"}.get(lib, versions.get(lib, ""))
        guarantee = RBCHECK if lib == "rbcheck" else GUARANTEES.get(lib, "")
        if name.startswith("rbcheck read"):
            guarantee = "`checkpoint_stream.read` alone: the files' checks (digest, format), not the meaning or fit"
        if name == PROTOCOL:
            guarantee = ("what the atomic commit costs whatever the size: a new sub-directory, two files "
                         "fsynced, the directory fsynced, the pointer written, fsynced and renamed, the "
                         "parent fsynced, the previous checkpoint removed")
        if lib == "reference":
            guarantee = "the same files and checks as rbcheck's (the spec's path: safetensors bytes, one more copy)"
        size = sizes.get(lib, "")
        lines.append(f"| {name} | {version} | {size} | {', '.join(f'{x * 1e3:.1f}' for x in ms)} | {guarantee} |")
    lines += interleaved.not_timed(versions)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = interleaved.parser(__doc__.splitlines()[0], DATA, DOC, reps=7)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--peers", action="store_true", help="also time TorchRL, tianshou and stable-baselines3")
    args = parser.parse_args(argv)
    return interleaved.write_report(
        args, lambda: measure(args.capacity, args.width, args.reps, args.runs, args.peers), render)


if __name__ == "__main__":
    sys.exit(main())
