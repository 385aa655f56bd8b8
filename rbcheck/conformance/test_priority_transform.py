"""Seed invariant 2: a raw priority is transformed to ``(p + eps) ** alpha``
exactly once per add / extend / update, whatever path wrote it: the writer's
default (the max raw priority seen), a priority key carried in the data, or
``update_priority``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_close, assert_same
from rbcheck.harness.stateful import PRIORITY_RTOL
from rbcheck.harness.strategies import alphas, epsilons, layouts, priorities

pytestmark = pytest.mark.requires("prioritized", "priority_readback")


def once(raw, eps: float, alpha: float) -> torch.Tensor:
    """The closed form, float64: ``(p + eps) ** alpha``."""
    return (torch.as_tensor(raw, dtype=torch.float64) + eps) ** alpha


@st.composite
def prioritized_setup(draw, priority_key: bool = False):
    from rbcheck.harness.protocol import BufferSpec

    capacity = draw(st.integers(2, 12), label="capacity")
    spec = BufferSpec(
        capacity=capacity,
        sampler="prioritized",
        alpha=draw(alphas(), label="alpha"),
        beta=0.5,
        eps=draw(epsilons(), label="eps"),
        priority_key="priority" if priority_key else None,
        seed=draw(st.integers(0, 2**16), label="seed"),
    )
    return spec, draw(layouts(max_fields=2), label="layout")


def _stored(buf, slots) -> torch.Tensor:
    return buf.stored_priority(torch.as_tensor(slots, dtype=torch.int64))


@given(setup=prioritized_setup(), data=st.data())
def test_writer_default_priority_is_transformed_once(impl, setup, data):
    """exact (float64 pow, up to last-ulp rounding): rows written by extend
    or add without a priority store ``(max_raw + eps) ** alpha`` where max_raw
    is the largest raw priority seen so far (1.0 initially), and max_priority
    equals max_raw exactly."""
    spec, layout = setup
    trace = Trace(impl, spec)
    trace.let("layout", layout)
    buf = impl.make(spec)
    max_raw, next_id = 1.0, 0
    for step in range(data.draw(st.integers(1, 4), label="rounds")):
        n = data.draw(st.integers(1, spec.capacity), label=f"extend size {step}")
        trace.op(f"buf.extend(layout.batch({next_id}, {n}))")
        slots = buf.extend(layout.batch(next_id, n)).cpu()
        next_id += n
        assert_close(
            "stored_priority(extended slots)",
            _stored(buf, slots),
            once([max_raw] * n, spec.eps, spec.alpha),
            trace,
            rtol=PRIORITY_RTOL,
        )
        trace.op(f"buf.add(layout.row({next_id}))")
        slot = buf.add(layout.row(next_id))
        next_id += 1
        assert_close(
            "stored_priority(added slot)",
            _stored(buf, [slot]),
            once([max_raw], spec.eps, spec.alpha),
            trace,
            rtol=PRIORITY_RTOL,
        )
        assert_same("max_priority", float(buf.max_priority), max_raw, trace)
        raw = data.draw(priorities(), label=f"raise max priority {step}")
        trace.op(
            f"buf.update_priority(torch.tensor([{slot}]), torch.tensor([{raw!r}], dtype=torch.float64))"
        )
        buf.update_priority(torch.tensor([slot]), torch.tensor([raw], dtype=torch.float64))
        max_raw = max(max_raw, raw)


@given(setup=prioritized_setup(), data=st.data())
def test_updated_priority_is_transformed_once(impl, setup, data):
    """exact (float64 pow, up to last-ulp rounding): after
    ``update_priority(index, p)`` (repeated slots: the last value wins) each
    slot stores ``(p + eps) ** alpha``; updating a slot again replaces its
    value (never compounds); other slots are untouched; max_priority is the
    max raw priority seen."""
    spec, layout = setup
    trace = Trace(impl, spec)
    trace.let("layout", layout)
    buf = impl.make(spec)
    trace.op(f"buf.extend(layout.batch(0, {spec.capacity}))")
    buf.extend(layout.batch(0, spec.capacity))
    expected = once([1.0] * spec.capacity, spec.eps, spec.alpha)
    max_raw = 1.0
    for step in range(data.draw(st.integers(1, 3), label="updates")):
        index = data.draw(
            st.lists(st.integers(0, spec.capacity - 1), min_size=1, max_size=6),
            label=f"slots {step}",
        )
        raw = data.draw(
            st.lists(priorities(), min_size=len(index), max_size=len(index)),
            label=f"raw priorities {step}",
        )
        trace.op(
            f"buf.update_priority(torch.tensor({index}), torch.tensor({raw}, dtype=torch.float64))"
        )
        buf.update_priority(torch.tensor(index), torch.tensor(raw, dtype=torch.float64))
        for i, p in zip(index, raw, strict=False):  # in order: the last write wins
            expected[i] = once([p], spec.eps, spec.alpha)[0]
        max_raw = max([max_raw, *raw])
        assert_close(
            "stored_priority(all slots)",
            _stored(buf, range(spec.capacity)),
            expected,
            trace,
            rtol=PRIORITY_RTOL,
        )
        assert_same("max_priority", float(buf.max_priority), max_raw, trace)


@pytest.mark.requires("priority_key")
@given(setup=prioritized_setup(priority_key=True), data=st.data())
def test_priority_key_in_data_is_transformed_once(impl, setup, data):
    """exact (float64 pow, up to last-ulp rounding): rows written by extend or
    add carrying their raw priority under ``spec.priority_key`` store
    ``(p + eps) ** alpha``, and max_priority becomes max(1.0, every p)."""
    spec, layout = setup
    trace = Trace(impl, spec)
    trace.let("layout", layout)
    buf = impl.make(spec)
    max_raw, next_id = 1.0, 0
    for step in range(data.draw(st.integers(1, 3), label="rounds")):
        n = data.draw(st.integers(1, spec.capacity), label=f"extend size {step}")
        raw = data.draw(
            st.lists(priorities(), min_size=n, max_size=n), label=f"raw priorities {step}"
        )
        pri = torch.tensor(raw, dtype=torch.float64)
        trace.op(
            f"buf.extend(layout.batch({next_id}, {n}, priority=torch.tensor({raw}, dtype=torch.float64)))"
        )
        slots = buf.extend(layout.batch(next_id, n, priority=pri)).cpu()
        next_id += n
        max_raw = max([max_raw, *raw])
        assert_close(
            "stored_priority(extended slots)",
            _stored(buf, slots),
            once(raw, spec.eps, spec.alpha),
            trace,
            rtol=PRIORITY_RTOL,
        )
        p = data.draw(priorities(), label=f"added row priority {step}")
        trace.op(
            f"buf.add(layout.row({next_id}, priority=torch.tensor({p!r}, dtype=torch.float64)))"
        )
        slot = buf.add(layout.row(next_id, priority=torch.tensor(p, dtype=torch.float64)))
        next_id += 1
        max_raw = max(max_raw, p)
        assert_close(
            "stored_priority(added slot)",
            _stored(buf, [slot]),
            once([p], spec.eps, spec.alpha),
            trace,
            rtol=PRIORITY_RTOL,
        )
        assert_same("max_priority", float(buf.max_priority), max_raw, trace)
