"""In-place edits (``buf.set(index, rows)``, TorchRL's ``rb[idx] = rows``)
change the rows at those slots and nothing else (exact).

An edit is not a write: the length, the cursor, the write count, each slot's
write generation and each slot's priority stay as they were, and every row
not edited is unchanged. An index at or past the held length is refused with
an error, and nothing changes.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.disk_checks import bookkeeping
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import layouts, priority_vectors

pytestmark = pytest.mark.requires("edit")


def observed(buf, spec: BufferSpec, impl) -> dict:
    """What an edit must leave: bookkeeping, and priorities held (with read-back)."""
    out = {"(len, cursor, write_count)": bookkeeping(buf)}
    if spec.sampler == "prioritized" and impl.has("priority_readback") and len(buf):
        out["stored_priority(held slots)"] = buf.stored_priority(torch.arange(len(buf))).cpu()
        out["max_priority"] = buf.max_priority
    return out


def check_observed(got: dict, want: dict, trace, when: str) -> None:
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert_tensor_equal(f"{key} {when}", got[key], value, trace, check_device=False)
        else:
            assert_same(f"{key} {when}", got[key], value, trace)


@given(data=st.data())
def test_an_edit_changes_the_edited_rows_and_nothing_else(impl, data):
    """exact: across drawn writes (the ring wraps), priority updates and
    edits of drawn slots (repeats: the last row wins), each edit leaves len,
    cursor, write count and the held priorities (with "priority_readback") as
    they were; the contents are the previous ones with the edited slots
    replaced; a sample's ``info["generation"]`` (when given) is each slot's
    last write, never the edit."""
    samplers = [s for s in ("random", "prioritized") if impl.has(s)]
    if not samplers:
        pytest.skip("not declared: random or prioritized")
    sampler = data.draw(st.sampled_from(samplers), label="sampler")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    layout = data.draw(layouts(max_fields=2), label="layout")
    spec = BufferSpec(capacity=capacity, sampler=sampler, seed=4, layout=layout.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = trace.wrap(impl.make(spec))
    written, edited = 0, 0
    last_write = {}  # slot -> the id (write number) last written there
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        n = data.draw(st.integers(1, 2 * capacity), label="rows")
        buf.extend(layout.batch(written, n))
        last_write.update({(written + j) % capacity: written + j for j in range(n)})
        written += n
        if sampler == "prioritized" and data.draw(st.booleans(), label="update priorities"):
            k = min(len(buf), 3)
            prio = data.draw(priority_vectors(k, conventions=impl.conventions), label="priorities")
            buf.update_priority(torch.arange(k), impl.conventions.priorities(prio))
        index = data.draw(st.lists(st.integers(0, len(buf) - 1), min_size=1, max_size=4), label="edited slots")
        before, contents = observed(buf, spec, impl), buf.contents()
        rows = layout.batch(10**6 + edited, len(index))
        try:
            buf.set(torch.tensor(index), rows)
        except Exception as err:  # noqa: BLE001 - a valid edit must be taken
            fail("buf.set(index, rows)", f"<raised {type(err).__name__}: {err}>", "the edit made", trace)
        edited += len(index)
        check_observed(observed(buf, spec, impl), before, trace, "after the edit")
        want = contents.clone()
        for j, slot in enumerate(index):  # the last row for a slot wins
            want[slot] = rows[j]
        assert_td_equal("buf.contents() after the edit", buf.contents(), want, trace, check_device=False)
        _, info = buf.sample(6)
        if "generation" in info:
            slots = info["index"].cpu().tolist()
            assert_tensor_equal("info['generation'] after an edit (each slot's last write)",
                                info["generation"].cpu().long(), torch.tensor([last_write[s] for s in slots]), trace)


@given(data=st.data())
def test_an_edit_past_the_held_length_is_refused_and_nothing_changes(impl, data):
    """exact: an edit naming a slot at or past len(buf) (an empty buffer
    included) raises, and len, cursor, write count and contents stay as they
    were."""
    if not impl.has("random"):
        pytest.skip("not declared: random")
    capacity = data.draw(st.integers(1, 6), label="capacity")
    layout = data.draw(layouts(max_fields=2), label="layout")
    held = data.draw(st.integers(0, capacity), label="rows held")
    spec = BufferSpec(capacity=capacity, seed=5, layout=layout.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = trace.wrap(impl.make(spec))
    if held:
        buf.extend(layout.batch(0, held))
    bad = data.draw(st.integers(held, capacity + 2), label="slot at or past len")
    index = data.draw(st.permutations([bad] + list(range(min(held, 2)))), label="edited slots")
    before = bookkeeping(buf)
    try:
        buf.set(torch.tensor(index), layout.batch(1000, len(index)))
    except Exception:  # noqa: BLE001 - any error is a refusal
        pass
    else:
        fail(f"buf.set({index}, ...) with len(buf)={held}", "<returned>", "an error (slot at or past len)", trace)
    assert_same("(len, cursor, write_count) after the refused edit", bookkeeping(buf), before, trace)
    if held:
        assert_td_equal("buf.contents() after the refused edit", buf.contents(), layout.batch(0, held), trace,
                        check_device=False)
