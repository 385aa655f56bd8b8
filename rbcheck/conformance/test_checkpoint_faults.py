"""Checkpoints survive crashes and hostile files (exact).

Each fault of the catalogue (``rbcheck.harness.checkpoint_damage``) is one
test id. A checkpoint is written by the implementation itself (any format),
then damaged in a way that does not depend on the format -- files deleted, emptied, truncated, a byte flipped,
files added, files replaced by a pickle that would run code or by a symlink
leaving the checkpoint -- or loaded into a buffer it does not fit, or its
save is interrupted at the k-th filesystem operation (an ``OSError``, or a
``SIGKILL`` of a forked writer) for every k.

A *contradiction* (``CONTRADICTIONS``) is an rbcheck checkpoint whose state
was edited into one no buffer could have saved -- fewer rows held than the
sum tree has priorities for, a max priority below a stored one, an unknown
key (a cursor, generations or inner tree nodes beside what they derive from)
-- then re-sealed (checksum and digest recomputed, as anyone can), so that
only the state's meaning can refuse it. It must be refused with an error
naming the field, the buffer as before. Another library's checkpoint format
has no such edits here: the property is skipped for it, saying so.

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
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.checkpoint_damage import (
    CONTRADICTIONS,
    FAULTS,
    count_items,
    interrupted_save,
    outside_state,
    reseal,
)
from rbcheck.harness.checkpoint_state import (
    difference,
    rows,
    snapshot,
    source,
    spec_for,
    target,
    untouched,
)

pytestmark = pytest.mark.requires("save_load")

MAX_OPS = 150  # a save with more operations is only tried at its first MAX_OPS


def load_problem(impl, spec, ckpt: Path, outside: Path, saved: dict, may_load: bool, what: str,
                 refuse_because: str = "read through a symlink leaving the checkpoint",
                 names: str | None = None, trace: Trace | None = None) -> str | None:
    """What went wrong loading the damaged ``ckpt`` into another buffer, or None.
    ``may_load=False``: a load that returns is wrong (``refuse_because`` says
    why); ``names``: what a refusal's message must name (with "but should");
    ``trace``: records the buffer loaded into, as ``target``."""
    buf = target(impl, spec, trace)
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
        if names is not None and (names not in str(error) or "but should" not in str(error)):
            return (f"load({what}) raised {type(error).__name__}: {str(error)[:160]!r}, but should "
                    f"name {names!r} and what it should be ('... but should ...')")
        return None
    if not may_load:
        return f"load({what}) {refuse_because}, but should refuse it"
    diff = difference(after, saved)
    if diff:
        return f"load({what}) returned with {diff}, but should load the saved state or raise"
    return None


def fail_with(problems: list[str], trace: Trace, expected: str = "refused or loaded exactly") -> None:
    if problems:
        problems.sort(key=lambda p: "RAN CODE" not in p)  # code execution first
        fail(f"{len(problems)} damaged checkpoint(s)", problems[0], expected, trace,
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
    trace = Trace(impl, spec)
    trace.directory(tmp_path)
    trace.need("from rbcheck.harness.checkpoint_damage import FAULTS")
    buf = source(impl, spec, trace=trace)
    saved = untouched(lambda: source(impl, spec), spec, impl)
    buf.save(tmp_path / "probe")
    problems = []
    for count in range(count_items(tmp_path / "probe", damage.per)):
        ckpt, outside = tmp_path / f"ckpt{count}", tmp_path / f"outside{count}"
        outside.mkdir()
        trace.op(f"({trace.render(outside)}).mkdir()")
        buf.save(ckpt)
        what, may_load = damage(ckpt, outside, count)
        trace.op(f"FAULTS[{fault!r}]({trace.render(ckpt)}, {trace.render(outside)}, {count})  # {what}")
        problem = load_problem(impl, spec, ckpt, outside, saved, may_load, f"{fault}: {what}", trace=trace)
        if problem:
            problems.append(problem)
    fail_with(problems, trace)


@pytest.mark.parametrize("contradiction", sorted(CONTRADICTIONS))
def test_resealed_contradiction_is_refused_and_nothing_changes(impl, contradiction, tmp_path):
    """exact: a checkpoint whose state contradicts itself (fewer rows held than
    the sum tree has priorities for, a priority in a slot never written, a max
    priority below a stored one or below its start, an unknown key: a cursor,
    generations or inner tree nodes beside what they derive from), re-sealed
    so that its checksums hold, is refused with an error naming the field;
    the buffer is as before."""
    spec, case = spec_for(impl), CONTRADICTIONS[contradiction]
    if case.needs and spec.sampler != case.needs:
        pytest.skip(f"not declared: {case.needs} (the contradiction is in its state)")
    trace = Trace(impl, spec)
    trace.directory(tmp_path)
    ckpt = trace.let("path", tmp_path / "ckpt", "tmp / 'ckpt'")
    outside = tmp_path / "outside"
    outside.mkdir()
    source(impl, spec, trace=trace).save(ckpt)
    if not reseal(ckpt, case.edit):
        pytest.skip("unavailable: the checkpoint is not in rbcheck's format (no state to edit and re-seal)")
    trace.need("from rbcheck.harness.checkpoint_damage import CONTRADICTIONS, reseal")
    trace.op(f"reseal(path, CONTRADICTIONS[{contradiction!r}].edit)  # edited, checksums recomputed")
    problem = load_problem(impl, spec, ckpt, outside, {}, False, f"{contradiction}, re-sealed",
                           refuse_because="loaded a state that contradicts itself", names=case.field, trace=trace)
    fail_with([problem] if problem else [], trace, "refused with an error naming the field")


def test_missing_or_empty_directory_is_refused(impl, tmp_path):
    """exact: loading from a path that does not exist, or an empty directory,
    raises and leaves the buffer unchanged."""
    spec = spec_for(impl)
    trace = Trace(impl, spec)
    trace.directory(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "outside").mkdir()
    trace.op("(tmp / 'empty').mkdir()")
    problems = [load_problem(impl, spec, path, tmp_path / "outside", {}, False, path.name, trace=trace)
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


def differs_in_every_slot(live, saved, what: str, trace: Trace) -> None:
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
            fail(f"{what}: slots of {key!r} equal to the checkpoint's", torch.nonzero(same).flatten().tolist(),
                 "none (harness bug: the test data could hide a load that overwrote live rows)", trace)


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
    other, data = MISFITS[misfit](impl, spec)
    trace = Trace(impl, other)
    trace.directory(tmp_path)
    n = data.batch_size[0]
    if misfit == "field_layout_differs":
        trace.need("from tensordict import TensorDict")
        trace.let("data", data, f"TensorDict({{'obs': torch.full(({n}, 5), -1.0, dtype=torch.float64)}}, "
                  f"batch_size=[{n}])")
    else:
        trace.need("from rbcheck.harness.checkpoint_state import rows")
        trace.name(data, f"rows({n}, 100)")

    def build():
        made = impl.make(other)
        made.extend(data)
        return made

    buf = trace.wrap(impl.make(other))  # the snippet's buf: made first there, so made first here
    saved = source(impl, spec, trace=trace, var="saved")
    saved.save(tmp_path / "ckpt")
    trace.note(f"buf: {misfit}")
    buf.extend(data)
    before = untouched(build, other, impl)
    differs_in_every_slot(buf.contents(), saved.contents(), f"the {misfit} buffer", trace)
    try:
        buf.load(tmp_path / "ckpt")
    except Exception as err:  # noqa: BLE001
        diff = difference(snapshot(buf, other, impl), before)
        if diff:
            fail(f"after a refused load ({misfit})", diff, "the state before", trace, f"{type(err).__name__}: {err}")
        return
    fail(f"load ({misfit})", "<returned normally>", "an error: the checkpoint does not fit", trace)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("how", ["killed", "failing"])
def test_interrupted_save_leaves_a_loadable_checkpoint(impl, how, tmp_path):
    """exact: a save of state B over a checkpoint of state A, SIGKILLed (or
    failing with OSError) at its k-th filesystem operation, for every k,
    leaves a directory that loads exactly as A or as B."""
    spec = spec_for(impl)
    trace = Trace(impl, spec)
    trace.directory(tmp_path)
    trace.need("from rbcheck.harness.checkpoint_damage import interrupted_save")
    buf_a, buf_b = source(impl, spec, trace=trace), source(impl, spec, extra=3, trace=trace, var="buf_b")
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
        outcome = interrupted_save(buf_b.inner, path, at, kill=how == "killed")  # its save is not recorded
        outcomes.append(outcome)
        trace.op(f"interrupted_save(buf_b, {trace.render(path)}, {at}, kill={how == 'killed'})  # {outcome}")
        if outcome.startswith("failed"):
            fail(f"save in a forked child, {how} at operation {at}", outcome,
                 "a save that runs until the injected fault", trace)
        loaded = target(impl, spec, trace)
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
