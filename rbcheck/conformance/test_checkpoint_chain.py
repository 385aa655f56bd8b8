"""Checkpoints in a chain: save -> load -> save (at a new path) -> load is
the identity, and carrying on after a load behaves like carrying on without
one (random, prioritized and slice buffers).
"""

from __future__ import annotations

import pytest
import torch

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import EpisodeLayout, Field, Layout, spec_layout

LAYOUT = Layout((Field(("obs",), (2,), "float32"),))


def _observe(buf, spec, k: int, seedable: bool):
    """What must agree between a buffer and its reloaded copy."""
    state = {"len": len(buf), "cursor": buf.cursor, "write_count": buf.write_count}
    if len(buf):
        state["contents"] = buf.contents()
    if seedable:
        rows, info = buf.sample(k)
        state["sample rows"] = rows
        state["sample index"] = info["index"]
    return state


def _assert_same_state(what, got, want, trace) -> None:
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert_tensor_equal(f"{what}: {key}", got[key].cpu(), want[key].cpu(), trace)
        elif hasattr(want[key], "batch_size"):
            assert_td_equal(f"{what}: {key}", got[key], want[key], trace, check_device=False)
        else:
            assert_same(f"{what}: {key}", got[key], want[key], trace)


def _checkpoint_call(call, what: str, expected: str, trace: Trace) -> None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - a save or load that raises is the failure
        fail(what, f"<raised {type(err).__name__}: {err}>", expected, trace)


@pytest.mark.requires("save_load")
@pytest.mark.parametrize("sampler", ["random", "prioritized", "slice"])
def test_save_load_chain_and_carrying_on_match_no_checkpoint(impl, sampler, tmp_path):
    """exact: a buffer saved at path A and then at a NEW path B loads back
    from both with the same state, and so does the loaded buffer saved again
    (B, then over A); writing and sampling on from the reloaded buffer gives what
    the never-saved twin gives (same contents, and with a seedable generator
    the same samples), slices included (episode bookkeeping after a load)."""
    if not impl.has(sampler):
        pytest.skip(f"not declared: {sampler}")
    episodes = EpisodeLayout((3, 5, 2, 6, 4, 4, 3))
    seedable = impl.conventions.seedable
    extra = {"slice_len": 2} if sampler == "slice" else {}
    spec = BufferSpec(capacity=12, sampler=sampler, seed=5, **extra, layout=spec_layout(episodes.batch()))
    trace = Trace(impl, spec)
    data = trace.source("episodes", episodes).batch()
    path = trace.directory(tmp_path, "path")
    buf, twin = trace.wrap(impl.make(spec)), trace.make(spec, "twin")
    for b in (twin, buf):
        b.extend(data[:9])
        b.extend(data[9:20])  # 20 rows into 12 slots: the ring has wrapped
    k = 4
    for step, (first, second) in enumerate([("A", "B"), ("B", "A")]):
        for name in (first, second):  # a second checkpoint from the same buffer, at a new path
            _checkpoint_call(lambda name=name, buf=buf: buf.save(path / name), f"buf.save(path / {name!r})",
                             "a checkpoint written", trace)
        loaded = []
        for name in (second, first):
            fresh = trace.make(spec.but(seed=spec.seed + 1 + step), f"loaded{step}_{name}")
            _checkpoint_call(lambda fresh=fresh, name=name: fresh.load(path / name),
                             f"buf.load(path / {name!r}) (the buffer saved at {first!r} then {second!r})",
                             "the state just saved there", trace)
            loaded.append(fresh)
        _assert_same_state(f"loaded from {second!r} vs from {first!r}", _observe(loaded[0], spec, k, False),
                           _observe(loaded[1], spec, k, False), trace)
        buf = loaded[0]
    trace.note("carry on; compare with a twin never saved")
    for b in (twin, buf):
        b.extend(data[20:])
    _assert_same_state("reloaded buffer vs never-saved twin", _observe(buf, spec, k, seedable),
                       _observe(twin, spec, k, seedable), trace)
