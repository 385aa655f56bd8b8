"""Served tables (issue 42, Reverb's model): which item a sample draws, which
item a full table drops, and ``max_times_sampled``, checked exactly.

The declared rules (reference/selectors.py, reference/served_table.py): a
sample of ``batch`` is ``batch`` draws one after the other; "fifo" draws the
oldest held item, "lifo" the newest, "min_heap"/"max_heap" the lowest/highest
priority with ties to the least recently inserted; an insert into a table
holding ``capacity`` items drops the remover's pick after holding the new
one (it may be the new one); an item leaves after its ``max_times_sampled``-th
draw. Items are told apart by their ``id`` key.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, assert_same, fail
from rbcheck.harness.protocol import BufferSpec

ORDERED = ("fifo", "lifo", "min_heap", "max_heap")
PRIORITIES = (1.0, 2.0, 3.0)  # few values: ties are common
LAYOUT = {"id": ((), torch.int64), "priority": ((), torch.float64)}


def rows(start: int, priorities: list[float]) -> TensorDict:
    n = len(priorities)
    return TensorDict({"id": torch.arange(start, start + n, dtype=torch.int64),
                       "priority": torch.tensor(priorities, dtype=torch.float64)}, batch_size=[n])


class Model:
    """The held items of a served table: id -> [priority, insert number, draws]."""

    def __init__(self, spec: BufferSpec):
        self.spec, self.items = spec, {}

    def pick(self, kind: str) -> int:
        items = self.items.items()
        if kind == "fifo":
            return min(items, key=lambda kv: kv[1][1])[0]
        if kind == "lifo":
            return max(items, key=lambda kv: kv[1][1])[0]
        sign = 1 if kind == "min_heap" else -1
        return min(items, key=lambda kv: (sign * kv[1][0], kv[1][1]))[0]

    def insert(self, row_id: int, priority: float) -> None:
        self.items[row_id] = [priority, row_id, 0]
        if len(self.items) > self.spec.capacity:
            del self.items[self.pick(self.spec.remover)]

    def drawn(self, row_id: int) -> None:
        self.items[row_id][2] += 1
        if self.items[row_id][2] == self.spec.max_times_sampled:
            del self.items[row_id]

    def draws_left(self) -> int:
        k = self.spec.max_times_sampled
        return sum(k - c for _, _, c in self.items.values()) if k else 10**9


def run_program(impl, data, spec: BufferSpec) -> None:
    """Drawn inserts and samples on ``impl``'s table, each draw checked against the model."""
    trace = Trace(impl, spec)
    buf, model, written = trace.wrap(impl.make(spec)), Model(spec), 0
    for step in range(data.draw(st.integers(1, 16), label="steps")):
        when = f"at step {step} (sampler={spec.sampler!r}, remover={spec.remover!r}, " \
               f"max_times_sampled={spec.max_times_sampled}, held ids {sorted(model.items)})"
        if not model.items or data.draw(st.booleans(), label=f"insert at step {step}"):
            pri = data.draw(st.lists(st.sampled_from(PRIORITIES), min_size=1, max_size=3),
                            label=f"priorities inserted at step {step}")
            buf.extend(rows(written, pri))
            for j, p in enumerate(pri):
                model.insert(written + j, p)
            written += len(pri)
        else:
            batch = min(data.draw(st.integers(1, 3), label=f"batch at step {step}"), model.draws_left())
            got = torch.as_tensor(buf.sample(batch)[0]["id"]).reshape(-1).tolist()
            assert_same(f"number of items drawn by sample({batch}) {when}", len(got), batch, trace)
            for k, row_id in enumerate(got):
                if spec.sampler in ORDERED:
                    assert_same(f"id of draw {k} of sample({batch}) {when}", row_id, model.pick(spec.sampler), trace)
                elif row_id not in model.items:
                    fail(f"id of draw {k} of sample({batch}) {when}", row_id, f"one of {sorted(model.items)}", trace)
                model.drawn(row_id)
        assert_same(f"len(buf) after step {step} (held ids should be {sorted(model.items)})", len(buf),
                    len(model.items), trace)


@pytest.mark.requires("selector")
@given(data=st.data())
def test_selectors_draw_in_declared_order(impl, data):
    """exact: over drawn inserts (priorities among 1, 2, 3, so ties are
    common) and samples of 1 to 3 draws on tables of 1 to 6 items, each draw
    is the sampler's pick (fifo, lifo, min_heap, max_heap; ties to the least
    recently inserted) and each overflow drops the remover's pick."""
    spec = BufferSpec(capacity=data.draw(st.integers(1, 6), label="capacity"),
                      sampler=data.draw(st.sampled_from(ORDERED), label="sampler"),
                      remover=data.draw(st.sampled_from(ORDERED), label="remover"),
                      priority_key="priority", seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT)
    run_program(impl, data, spec)


@pytest.mark.requires("max_times_sampled")
@given(data=st.data())
def test_an_item_leaves_after_max_times_sampled_draws(impl, data):
    """exact: with ``max_times_sampled=k`` (1 to 4) an item is drawn at most
    k times and leaves the table on its k-th draw (the length says so after
    every call); with an ordered sampler (capability "selector") each draw is
    also the declared pick, so the item drawn k times in a row then goes."""
    samplers = ["random"] + (list(ORDERED) if impl.has("selector") else [])
    spec = BufferSpec(capacity=data.draw(st.integers(1, 6), label="capacity"),
                      sampler=data.draw(st.sampled_from(samplers), label="sampler"),
                      max_times_sampled=data.draw(st.integers(1, 4), label="max_times_sampled"),
                      priority_key="priority", seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT)
    run_program(impl, data, spec)
