"""Consuming sampling (sampler "consuming", reference/consuming_sampler.py):
a row leaves after ``max_sample_count`` draws, writes reuse the consumed
slots first, and the counts survive a save and load.

The declared rules: a batch holds ``min(batch, unconsumed)`` distinct
unconsumed held slots (a sample with none left raises); a write puts its
rows first in the consumed slots, in ascending slot order, then at the
ring's cursor (round robin, overwriting the oldest ring slot once full); a
written row starts at 0 draws.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_same, assert_td_equal, assert_tensor_equal, fail
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout

pytestmark = pytest.mark.requires("consuming")
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))


class Model:
    """The draws left to each held slot and the ring's cursor (module doc)."""

    def __init__(self, capacity: int, limit: int):
        self.capacity, self.limit = capacity, limit
        self.count: list[int] = []  # draws of each held slot's row
        self.ring = 0  # rows the ring placed

    def consumed(self) -> list[int]:
        return [s for s, c in enumerate(self.count) if c >= self.limit]

    def unconsumed(self) -> set[int]:
        return {s for s, c in enumerate(self.count) if c < self.limit}

    def place(self, n: int) -> list[int]:
        """The slots of the next ``n`` rows, in write order."""
        free = self.consumed()[:n]
        ring = [(self.ring + j) % self.capacity for j in range(n - len(free))]
        self.ring += len(ring)
        return free + ring

    def written(self, slots: list[int]) -> None:
        for s in slots:
            while len(self.count) <= s:
                self.count.append(0)
            self.count[s] = 0


def consuming_spec(data, **fixed) -> BufferSpec:
    capacity = fixed.get("capacity") or data.draw(st.integers(1, 2048), label="capacity")
    limit = data.draw(st.integers(1, 4), label="max_sample_count")
    return BufferSpec(capacity=capacity, sampler="consuming", max_sample_count=limit,
                      seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT.spec_layout())


def run_program(impl, data, check_writes: bool) -> None:
    """Drawn writes and samples on a consuming buffer, checked against the
    model: the draws always, the slots of each write when ``check_writes``
    (else the model follows the slots the buffer reports)."""
    spec = consuming_spec(data)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    model, written = Model(spec.capacity, spec.max_sample_count), 0
    for step in range(data.draw(st.integers(1, 14), label="steps")):
        if written == 0 or data.draw(st.booleans(), label=f"write at step {step}"):
            n = data.draw(st.integers(1, spec.capacity + 2), label=f"rows written at step {step}")
            got = torch.as_tensor(buf.extend(layout.batch(written, n))).cpu()
            want = model.place(n)
            if check_writes:
                assert_tensor_equal(f"slots of {n} rows written at step {step} (consumed slots "
                                    f"{model.consumed()[:8]}..., then the ring)", got, torch.tensor(want), trace)
                ids = buf.contents()["id"].cpu()
                last = {s: written + j for j, s in enumerate(want)}  # the last row written to a slot wins
                slots = sorted(last)
                assert_tensor_equal(f"contents()['id'] of the slots written at step {step}", ids[slots],
                                    torch.tensor([last[s] for s in slots]), trace)
            model.written(want if check_writes else got.tolist())
            written += n
            continue
        batch = data.draw(st.integers(1, 3000), label=f"batch at step {step}")
        live = model.unconsumed()
        try:
            rows, info = buf.sample(batch)
        except Exception as err:  # noqa: BLE001 - allowed only when every row is consumed
            if live:
                fail(f"buf.sample({batch}) at step {step}", f"<raised {type(err).__name__}: {err}>",
                     f"a batch of {min(batch, len(live))} of the {len(live)} unconsumed rows", trace)
            continue
        index = torch.as_tensor(info["index"]).cpu()
        when = f"at step {step} ({len(live)} unconsumed of {len(model.count)} held, max_sample_count={model.limit})"
        if not live:
            fail(f"buf.sample({batch}) {when}", f"<a batch of slots {index[:8].tolist()}>",
                 "an error (every held row was drawn max_sample_count times)", trace)
        spent = sorted(set(index.tolist()) - live)
        if spent:
            fail(f"consumed or unheld slots drawn {when}", spent[:8], "none", trace,
                 f"their draws so far: {[model.count[s] if s < len(model.count) else None for s in spent[:8]]}")
        if len(set(index.tolist())) != len(index):
            fail(f"slots drawn twice in one batch {when}", index, "distinct slots", trace)
        assert_same(f"len(info['index']) {when}", len(index), min(batch, len(live)), trace)
        assert_td_equal(f"sample rows {when}", rows, buf.contents()[index], trace, check_device=False)
        for s in index.tolist():
            model.count[s] += 1


@given(data=st.data())
def test_a_row_is_drawn_at_most_max_sample_count_times(impl, data):
    """exact: over drawn interleavings of writes and samples (batches up to
    3000, capacities up to 2048, max_sample_count 1 to 4), a batch holds
    ``min(batch, unconsumed)`` distinct slots, each of a row drawn fewer than
    ``max_sample_count`` times before; a written row starts again at 0; a
    sample with every held row consumed raises."""
    run_program(impl, data, check_writes=False)


@given(data=st.data())
def test_writes_reuse_consumed_slots_first(impl, data):
    """exact: each write's slots are the consumed slots in ascending order,
    then the ring's next slots (round robin), and the rows land there (the
    last row written to a slot wins)."""
    run_program(impl, data, check_writes=True)


@pytest.mark.requires("save_load")
@pytest.mark.exact_replay
@given(data=st.data())
def test_consumption_survives_save_and_load(impl, data):
    """exact (seedable): after a load of a checkpoint taken when some rows
    were consumed (into the same buffer, and into a fresh one built with
    another seed), the next samples and the slots of the next write are the
    ones the buffer gave after the save: the counts and the consumed slots
    are in the checkpoint."""
    spec = consuming_spec(data, capacity=data.draw(st.integers(2, 64), label="capacity"))
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, spec.capacity))
    batch = data.draw(st.integers(1, spec.capacity), label="batch size")
    for _ in range(data.draw(st.integers(1, 4), label="samples before the save")):
        try:
            buf.sample(batch)
        except Exception:  # noqa: BLE001 - every row consumed: the test is about what follows
            break

    def carry_on(target) -> list:
        out = []
        for k in range(3):
            try:
                out.append(("sample", target.sample(batch)[1]["index"].cpu()))
            except Exception as err:  # noqa: BLE001 - the same refusal expected after the load
                out.append(("sample", f"<raised {type(err).__name__}>"))
            out.append(("write", torch.as_tensor(target.extend(layout.batch(1000 + k, 2))).cpu()))
        return out

    with tempfile.TemporaryDirectory() as tmp:
        tmp = trace.directory(Path(tmp))
        buf.save(tmp)
        want = carry_on(buf)
        fresh = trace.make(spec.but(seed=spec.seed + 1), "fresh")
        for name, target in (("buf", buf), ("a fresh buffer", fresh)):
            target.load(tmp)
            for k, ((kind, got), (_, expected)) in enumerate(zip(carry_on(target), want, strict=True)):
                what = f"{kind} {k // 2} after loading into {name}"
                if isinstance(expected, str) or isinstance(got, str):
                    assert_same(what, str(got) if isinstance(got, str) else "<a batch>",
                                str(expected) if isinstance(expected, str) else "<a batch>", trace)
                else:
                    assert_tensor_equal(f"info['index'] of {what}" if kind == "sample" else f"slots of {what}",
                                        got, expected, trace)
