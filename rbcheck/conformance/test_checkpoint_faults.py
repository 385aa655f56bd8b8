"""Checkpoints survive crashes and hostile files (exact).

Each fault of the catalogue is one test id. A checkpoint is written by the
implementation itself (any format), then damaged in a way that does not
depend on the format -- files deleted, emptied, truncated, a byte flipped,
files added, files replaced by a pickle that would run code or by a symlink
leaving the checkpoint -- or loaded into a buffer it does not fit, or its
save is interrupted at the k-th filesystem operation (an ``OSError``, or a
``SIGKILL`` of a forked writer) for every k.

A load *survives* a fault when

* no code from the checkpoint ran and nothing outside it changed, and
* either it raised and the target buffer is exactly as before (length,
  cursor, write count, contents, stored priorities, max priority, and for a
  seedable adapter the generator and the write generations, seen in the
  next sample, compared with a twin that never saw the load), or it
  returned and the buffer is exactly the saved one (the damage did not
  matter, e.g. an extra file nobody reads). A symlink leaving the checkpoint
  must be refused: following it lets a checkpoint read any file.

An interrupted save survives when the directory still loads, exactly, as
either the previous checkpoint or the new one.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.oracle import reads_back
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("save_load")

#: Audit events that change (or open) files: the "filesystem operations" of a save.
FS_EVENTS = frozenset({
    "open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.link",
    "os.symlink", "shutil.rmtree", "shutil.move", "shutil.copyfile", "tempfile.mkstemp",
    "tempfile.mkdtemp", "os.chmod", "os.utime",
})
MAX_OPS = 150  # a save with more operations is only tried at its first MAX_OPS


def rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"obs": torch.stack([x.float(), x.float() / 3], 1), "action": x,
                       "episode": x // 3}, batch_size=[n])


def spec_for(impl) -> BufferSpec:
    sampler = "prioritized" if impl.has("prioritized") else "random"
    return BufferSpec(capacity=8, sampler=sampler, alpha=0.7, beta=0.5, eps=1e-3, seed=11)


def source(impl, spec: BufferSpec, extra: int = 0):
    """The buffer whose checkpoint is damaged (``extra`` rows more: state B)."""
    buf = impl.make(spec)
    buf.extend(rows(6))
    if spec.sampler == "prioritized":
        buf.update_priority(torch.tensor([1, 4]), impl.conventions.priorities([5.0, 0.5]))
    buf.sample(3)
    if extra:
        buf.extend(rows(extra, 50))
    return buf


def target(impl, spec: BufferSpec):
    """A buffer holding other rows, loaded into."""
    buf = impl.make(spec.but(seed=spec.seed + 1))
    buf.extend(rows(3, 100))
    return buf


#: Draws of the snapshot's sample: at capacity 8, every held slot is drawn
#: (and its write generation seen) but with a negligible probability.
DRAWS = 64


def snapshot(buf, spec: BufferSpec, impl) -> dict:
    """What a refused load must leave and a load must restore: length,
    cursor, write count, contents, stored priorities and max priority (with
    ``priority_readback``), and for a seedable adapter the generator and the
    write generations, seen in one sample of ``DRAWS`` taken LAST (its
    indices, weights and ``info["generation"]``). The sample moves the
    generator: compare snapshots of buffers at the same point of their lives
    (:func:`untouched` builds the one that never saw the load)."""
    state = {"len": len(buf), "cursor": buf.cursor, "write_count": buf.write_count}
    if len(buf):
        for key, value in buf.contents().items(include_nested=True, leaves_only=True):
            state[f"contents[{key!r}]"] = value
    if reads_back(spec, impl):  # capability "priority_readback"
        state["stored_priority"] = buf.stored_priority(torch.arange(spec.capacity))
        state["max_priority"] = buf.max_priority
    if len(buf) and impl.conventions.seedable:
        try:
            _, info = buf.sample(DRAWS)
        except Exception as err:  # noqa: BLE001 - compared like any other observable
            state[f"sample({DRAWS})"] = f"<raised {type(err).__name__}>"
        else:  # ".index" sorts first: a moved generator is named as such
            state[f"sample({DRAWS}).index"] = info["index"]
            for key, value in info.items():
                if isinstance(value, torch.Tensor) and key != "index":
                    state[f"sample({DRAWS}).info[{key!r}]"] = value
    return state


def untouched(build: Callable, spec: BufferSpec, impl) -> dict:
    """The snapshot of a buffer ``build()`` makes, never loaded into or
    saved from. Two are built: when they differ (a seedable adapter whose
    draws do not follow the seed), that fails here, as such, instead of
    being blamed on a load."""
    first, second = snapshot(build(), spec, impl), snapshot(build(), spec, impl)
    diff = difference(second, first)
    if diff:
        fail("two untouched buffers of one spec and seed: the second one's", diff,
             "the first one's (conventions.seedable=True: the draws follow the seed)")
    return first


def difference(got: dict, want: dict) -> str | None:
    """The first observable that differs (bit for bit, types included), or None."""
    for key in sorted(set(got) | set(want)):
        if key not in got or key not in want:
            return f"{key} present in only one of them"
        a, b = got[key], want[key]
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
                return f"{key}={a}, expected {b}"
            if not torch.equal(a.cpu().reshape(-1).view(torch.uint8) if a.numel() else a.cpu(),
                               b.cpu().reshape(-1).view(torch.uint8) if b.numel() else b.cpu()):
                return f"{key}{first_difference(a, b)}"
        elif type(a) is not type(b) or a != b:
            return f"{key}={a!r}, expected {b!r}"
    return None


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """``"=<a>, expected <b>"`` for short tensors of one shape and dtype, else
    the first entry that differs bit for bit and how many do."""
    if a.numel() <= 8:
        return f"={a}, expected {b}"
    flat_a, flat_b = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
    differ = (flat_a.view(torch.uint8).reshape(flat_a.numel(), -1)
              != flat_b.view(torch.uint8).reshape(flat_b.numel(), -1)).any(dim=1)
    i = int(torch.nonzero(differ)[0])
    return (f"[{i}]={flat_a[i].item()!r}, expected {flat_b[i].item()!r} "
            f"({int(differ.sum())} of {differ.numel()} entries differ)")


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def dirs_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())


class Payload:
    """Unpickling this runs code: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def payload_bytes(marker: Path, kind: str) -> bytes:
    if kind == "pickle":
        return pickle.dumps(Payload(marker))
    holder = marker.parent / "payload.pt"
    torch.save({"state": Payload(marker)}, holder)
    return holder.read_bytes()


# --------------------------------------------------------------------------
# damage: each function damages a fresh checkpoint at ``ckpt`` one way at a
# time, yielding a description and what is allowed (True: loading the
# untouched state is fine; False: the load must be refused)
# --------------------------------------------------------------------------


def each_file(change: Callable[[Path, Path], None], may_load: bool = True):
    def damage(ckpt: Path, outside: Path, count: int) -> tuple[str, bool]:
        file = files_under(ckpt)[count]
        change(file, outside)
        return f"{file.relative_to(ckpt)}", may_load
    damage.per = "file"
    return damage


def each_dir(change: Callable[[Path, Path], None], may_load: bool = True, root: bool = True):
    """``root``: the checkpoint directory itself too (the caller's path; a
    symlink there is the caller's choice, not the checkpoint's)."""
    def damage(ckpt: Path, outside: Path, count: int) -> tuple[str, bool]:
        folder = ([ckpt] * root + dirs_under(ckpt))[count]
        change(folder, outside)
        return f"{folder.relative_to(ckpt)}/", may_load
    damage.per = "dir" if root else "subdir"
    return damage


def flip(position: Callable[[int], int]):
    def change(file: Path, outside: Path) -> None:
        raw = bytearray(file.read_bytes())
        if raw:
            raw[position(len(raw))] ^= 0x5A
        file.write_bytes(bytes(raw))
    return change


def truncate(keep: Callable[[int], int]):
    def change(file: Path, outside: Path) -> None:
        raw = file.read_bytes()
        file.write_bytes(raw[: keep(len(raw))])
    return change


def to_symlink_outside(item: Path, outside: Path) -> None:
    copy = outside / f"copy-{item.name}-{len(list(outside.iterdir()))}"
    if item.is_dir():
        shutil.copytree(item, copy, symlinks=True)
        shutil.rmtree(item)
    else:
        shutil.copyfile(item, copy)
        item.unlink()
    item.symlink_to(copy, target_is_directory=copy.is_dir())


def replace_by(kind: str):
    def change(file: Path, outside: Path) -> None:
        file.write_bytes(payload_bytes(outside / "PWNED", kind))
    return change


def add_payloads(folder: Path, outside: Path) -> None:
    blob = payload_bytes(outside / "PWNED", "pickle")
    for name in ("prefetch.pkl", "state.pkl", "metadata.pkl", "transform.t", "buffer.pt", "data.pt"):
        if not (folder / name).exists():
            (folder / name).write_bytes(blob)


FAULTS = {
    "file_deleted": each_file(lambda f, o: f.unlink()),
    "file_emptied": each_file(truncate(lambda n: 0)),
    "file_truncated_to_half": each_file(truncate(lambda n: n // 2)),
    "file_missing_last_byte": each_file(truncate(lambda n: max(n - 1, 0))),
    "byte_flipped_at_start": each_file(flip(lambda n: 0)),
    "byte_flipped_in_middle": each_file(flip(lambda n: n // 2)),
    "byte_flipped_at_end": each_file(flip(lambda n: n - 1)),
    "extra_file_in_directory": each_dir(lambda d, o: (d / "unexpected.bin").write_bytes(b"\x00junk" * 9)),
    "file_replaced_by_pickle_payload": each_file(replace_by("pickle")),
    "file_replaced_by_torch_save_payload": each_file(replace_by("torch")),
    "pickle_payloads_added_under_common_names": each_dir(add_payloads),
    "file_replaced_by_symlink_outside": each_file(to_symlink_outside, may_load=False),
    "directory_replaced_by_symlink_outside": each_dir(to_symlink_outside, may_load=False, root=False),
}


def count_items(ckpt: Path, per: str) -> int:
    return {"file": len(files_under(ckpt)), "dir": 1 + len(dirs_under(ckpt)), "subdir": len(dirs_under(ckpt))}[per]


def outside_state(outside: Path) -> dict:
    return {p.name: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()}


def load_problem(impl, spec, ckpt: Path, outside: Path, saved: dict, may_load: bool, what: str) -> str | None:
    """What went wrong loading the damaged ``ckpt`` into another buffer, or None."""
    buf = target(impl, spec)
    before = untouched(lambda: target(impl, spec), spec, impl)
    outside_before = outside_state(outside)
    error = None
    try:
        buf.load(ckpt)
    except Exception as err:  # noqa: BLE001 - any refusal counts
        error = err
    if (outside / "PWNED").exists():
        return f"load({what}) RAN CODE from the checkpoint (an unpickled payload), but should never unpickle"
    if outside_state(outside) != outside_before:
        return f"load({what}) changed files outside the checkpoint, but should touch nothing outside"
    after = snapshot(buf, spec, impl)
    if error is not None:
        diff = difference(after, before)
        if diff:
            return (f"load({what}) raised {type(error).__name__}: {str(error)[:120]!r} and left "
                    f"{diff}, but should leave the buffer as before")
        return None
    if not may_load:
        return f"load({what}) read through a symlink leaving the checkpoint, but should refuse it"
    diff = difference(after, saved)
    if diff:
        return f"load({what}) returned with {diff}, but should load the saved state or raise"
    return None


def fail_with(problems: list[str], trace: Trace) -> None:
    if problems:
        problems.sort(key=lambda p: "RAN CODE" not in p)  # code execution first
        fail(f"{len(problems)} damaged checkpoint(s)", problems[0], "refused or loaded exactly", trace,
             "\n  ".join(problems[1:6]))


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_checkpoint_is_refused_and_nothing_changes(impl, fault, tmp_path):
    """exact: a checkpoint with a file deleted, emptied, truncated, a byte
    flipped, an extra file, a pickle payload or a symlink leaving it loads
    either exactly as saved or not at all (buffer unchanged); no code runs."""
    spec = spec_for(impl)
    if "symlink" in fault and not hasattr(os, "symlink"):
        pytest.skip("no symlinks on this platform")
    damage = FAULTS[fault]
    trace = Trace(impl.name, spec)
    buf = source(impl, spec)
    saved = untouched(lambda: source(impl, spec), spec, impl)
    buf.save(tmp_path / "probe")
    problems = []
    for count in range(count_items(tmp_path / "probe", damage.per)):
        ckpt, outside = tmp_path / f"ckpt{count}", tmp_path / f"outside{count}"
        outside.mkdir()
        buf.save(ckpt)
        what, may_load = damage(ckpt, outside, count)
        trace.op(f"buf.load({str(ckpt)!r})  # {fault}: {what}")
        problem = load_problem(impl, spec, ckpt, outside, saved, may_load, f"{fault}: {what}")
        if problem:
            problems.append(problem)
    fail_with(problems, trace)


def test_missing_or_empty_directory_is_refused(impl, tmp_path):
    """exact: loading from a path that does not exist, or an empty directory,
    raises and leaves the buffer unchanged."""
    spec = spec_for(impl)
    trace = Trace(impl.name, spec)
    (tmp_path / "empty").mkdir()
    (tmp_path / "outside").mkdir()
    problems = [load_problem(impl, spec, path, tmp_path / "outside", {}, False, path.name)
                for path in (tmp_path / "missing", tmp_path / "empty")]
    fail_with([p for p in problems if p], trace)


# The misfit buffers hold rows 100, 101, ... (the checkpoint's are 0..5): a
# load that wrote the checkpoint's rows into live memory before refusing shows
# in every slot (rows that agreed on a slot would hide it;
# ``differs_in_every_slot``). They wrap their ring (capacity + 2 rows), so the
# write generations of slots 0 and 1 differ from the checkpoint's too.


def other_capacity(impl, spec):
    return spec.but(capacity=spec.capacity + 3), rows(spec.capacity + 5, 100)


def other_layout(impl, spec):
    n = spec.capacity + 2
    return spec, TensorDict({"obs": torch.full((n, 5), -1.0, dtype=torch.float64)}, batch_size=[n])


def other_sampler(impl, spec):
    if spec.sampler != "prioritized":
        pytest.skip("not declared: prioritized")
    return spec.but(sampler="random"), rows(spec.capacity + 2, 100)


def differs_in_every_slot(live, saved, what: str) -> None:
    """Guard of the test data (a harness bug otherwise): in every slot both
    hold, every field both have differs between ``live`` and ``saved``."""
    shared = set(live.keys(include_nested=True, leaves_only=True)) & set(
        saved.keys(include_nested=True, leaves_only=True))
    slots = min(live.batch_size[0], saved.batch_size[0])
    for key in sorted(shared, key=str):
        a, b = live.get(key)[:slots].cpu(), saved.get(key)[:slots].cpu()
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            continue
        same = (a == b).reshape(slots, -1).all(dim=1)
        if bool(same.any()):
            raise AssertionError(
                f"{what}: slots of {key!r} equal to the checkpoint's={torch.nonzero(same).flatten().tolist()}, "
                "but should be none (harness bug: the test data could hide a load that overwrote "
                "live rows)")


MISFITS = {"capacity_differs": other_capacity, "field_layout_differs": other_layout,
           "sampler_differs": other_sampler}


@pytest.mark.parametrize("misfit", sorted(MISFITS))
def test_checkpoint_that_does_not_fit_is_refused(impl, misfit, tmp_path):
    """exact: a checkpoint of another capacity, field layout or sampler is
    refused and the buffer is unchanged; the buffer's rows differ from the
    checkpoint's in every slot and every shared field, so a load that copied
    rows into live memory before refusing cannot go unseen, and so do the
    write generations of slots 0 and 1 (the ring has wrapped), and its
    generator's state (another seed): a load that took either before
    refusing shows in the next sample (seedable adapters)."""
    spec = spec_for(impl)
    trace = Trace(impl.name, spec)
    saved = source(impl, spec)
    saved.save(tmp_path / "ckpt")
    other, data = MISFITS[misfit](impl, spec)

    def build():
        made = impl.make(other)
        made.extend(data)
        return made

    buf = build()
    before = untouched(build, other, impl)
    differs_in_every_slot(buf.contents(), saved.contents(), f"the {misfit} buffer")
    trace.spec = other
    trace.need("from rbcheck.conformance.test_checkpoint_faults import rows")
    n = data.batch_size[0]
    trace.op(f"buf.extend({f'rows({n}, 100)' if misfit != 'field_layout_differs' else 'data'})  # {misfit}")
    trace.let("data", None, f"TensorDict({{'obs': torch.full(({n}, 5), -1.0, dtype=torch.float64)}}, batch_size=[{n}])")
    trace.need("from tensordict import TensorDict")
    trace.op(f"buf.load({str(tmp_path / 'ckpt')!r})  # written by a buffer of {spec!r}")
    try:
        buf.load(tmp_path / "ckpt")
    except Exception as err:  # noqa: BLE001
        diff = difference(snapshot(buf, other, impl), before)
        if diff:
            fail(f"after a refused load ({misfit})", diff, "the state before", trace, f"{type(err).__name__}: {err}")
        return
    fail(f"load ({misfit})", "<returned normally>", "an error: the checkpoint does not fit", trace)


# --------------------------------------------------------------------------
# interrupted saves
# --------------------------------------------------------------------------

_HOOK = {"armed": False, "count": 0, "at": 0, "action": None}


def _audit(event: str, args) -> None:
    if _HOOK["armed"] and event in FS_EVENTS:
        _HOOK["count"] += 1
        if _HOOK["count"] == _HOOK["at"]:
            _HOOK["armed"] = False
            _HOOK["action"]()


def interrupted_save(buf, path: Path, at: int, kill: bool) -> str:
    """Save ``buf`` to ``path`` in a forked child that is SIGKILLed (or whose
    operation raises OSError) at its ``at``-th filesystem operation.
    Returns "completed", "interrupted", "hung" or "failed before any
    injected fault" (the save raised on its own in the child)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            def act():
                _HOOK["fired"] = True
                if kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(28, f"injected failure at filesystem operation {at}")
            _HOOK.update(armed=False, count=0, at=at, action=act, fired=False)
            sys.addaudithook(_audit)
            _HOOK["armed"] = True
            buf.save(path)
            code = 0 if _HOOK["count"] < at else 3
        except BaseException:  # noqa: BLE001 - the injected failure or its consequence
            code = 3 if _HOOK.get("fired") else 4  # 4: the save failed on its own
        os._exit(code)
    deadline = time.monotonic() + 20  # a child that hangs (a lock held at fork) is killed
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.001)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 4):
        return {0: "completed", 4: "failed before any injected fault"}[os.WEXITSTATUS(status)]
    return "interrupted"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("how", ["killed", "failing"])
def test_interrupted_save_leaves_a_loadable_checkpoint(impl, how, tmp_path):
    """exact: a save of state B over a checkpoint of state A, SIGKILLed (or
    failing with OSError) at its k-th filesystem operation, for every k,
    leaves a directory that loads exactly as A or as B."""
    spec = spec_for(impl)
    trace = Trace(impl.name, spec)
    buf_a, buf_b = source(impl, spec), source(impl, spec, extra=3)
    state_a = untouched(lambda: source(impl, spec), spec, impl)
    state_b = untouched(lambda: source(impl, spec, extra=3), spec, impl)
    elsewhere = getattr(buf_b, "saves_in_another_process", None)
    if elsewhere:  # the fault would be injected where the save does not run
        pytest.skip(f"unavailable: the save runs in another process ({elsewhere}); "
                    "inject the fault there")
    outcomes = []
    for at in range(1, MAX_OPS + 1):
        path = tmp_path / f"k{at}"
        buf_a.save(path)
        outcome = interrupted_save(buf_b, path, at, kill=how == "killed")
        outcomes.append(outcome)
        trace.op(f"# buf_a.save(path); buf_b.save(path)  # {how} at filesystem operation {at}: {outcome}")
        if outcome.startswith("failed"):
            fail(f"save in a forked child, {how} at operation {at}", outcome,
                 "a save that runs until the injected fault", trace)
        trace.op(f"buf.load({str(path)!r})")
        loaded = target(impl, spec)
        try:
            loaded.load(path)
        except Exception as err:  # noqa: BLE001
            fail(f"load after a save {how} at operation {at}", f"<{type(err).__name__}: {err}>",
                 "the previous or the new checkpoint", trace)
        got = snapshot(loaded, spec, impl)
        if difference(got, state_a) and difference(got, state_b):
            fail(f"load after a save {how} at operation {at}", difference(got, state_a),
                 "exactly the previous (A) or the new (B) checkpoint", trace)
        if outcome == "completed":
            if difference(got, state_b):
                fail("load after a completed save", difference(got, state_b), "state B", trace)
            break
        shutil.rmtree(path, ignore_errors=True)
    assert "interrupted" in outcomes, f"no save was interrupted: {outcomes}"
    print(f"{how}: {len(outcomes)} filesystem operations tried: {outcomes.count('interrupted')} interrupted")
