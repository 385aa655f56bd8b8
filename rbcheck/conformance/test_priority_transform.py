"""Seed invariant 2: a raw priority is transformed to ``(p + eps) ** alpha``
exactly once per add / extend / update, whatever path wrote it: the writer's
default (the new-row priority), a priority key carried in the data, or
``update_priority``.

The expected values come from the independent oracle
(:class:`rbcheck.harness.oracle.PriorityOracle`), computed in float64 from the
priorities as the buffer received them (in its declared
``conventions.priority_dtype``), under its declared eps rule and new-row
rule. alpha and eps are drawn over the adapter's whole declared range (eps = 0
included where allowed); priorities are raised, lowered and evicted in any
order.

How the stored value is observed:

* with ``"priority_readback"``: ``stored_priority`` of every held slot, to the
  declared dtype's own error (``priority_tolerance``: rtol = 8 * eps(float64)
  = 1.8e-15 for float64 trees, 8 * eps(float32) = 9.5e-07 for float32 trees,
  times alpha when alpha > 1), and ``max_priority``;
* without it: a sample of 4 x len(buf) draws, whose slots must all be held and
  of positive expected priority, and whose weights must equal the oracle's
  (``weight_tolerance``); beta is then drawn from the declared range at 0.5 or
  more, so the weights carry the ratios of the stored values (beta = 0 would
  make every weight 1). A double transform changes those ratios from
  ``(a/b) ** alpha`` to about ``(a/b) ** (alpha**2)``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_close,
    fail,
    priority_tolerance,
)
from rbcheck.harness.oracle import PriorityOracle, start_prioritized
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout, param_values, priorities

pytestmark = [
    pytest.mark.requires("prioritized"),
    pytest.mark.conventions("priority_dtype", "eps_rule", "new_priority", "param_ranges",
                            "weight_normaliser"),
]

LAYOUT = Layout((Field(("obs",), (2,), "float32"),))


@st.composite
def prioritized_setup(draw, conventions, readback: bool, priority_key: bool = False):
    capacity = draw(st.integers(2, 12), label="capacity")
    beta_floor = None if readback else min(0.5, conventions.param_range("beta").high)
    layout = LAYOUT  # the rows' schema plays no part here: fixed, so failures shrink fast
    spec = BufferSpec(
        capacity=capacity,
        sampler="prioritized",
        alpha=draw(param_values("alpha", conventions), label="alpha"),
        beta=draw(param_values("beta", conventions, at_least=beta_floor), label="beta"),
        eps=draw(param_values("eps", conventions), label="eps"),
        priority_key="priority" if priority_key else None,
        seed=draw(st.integers(0, 2**16), label="seed"),
        layout=layout.spec_layout(
            **({"priority": ((), conventions.priority_dtype)} if priority_key else {})
        ),
    )
    return spec, layout


def check_priorities(impl, buf, oracle: PriorityOracle, trace: Trace, when: str) -> None:
    """The buffer holds what the oracle says (read back, or observed through a sample)."""
    spec = oracle.spec
    if impl.has("priority_readback"):
        tol = priority_tolerance(oracle.dtype, spec.alpha)
        got = buf.stored_priority(torch.arange(oracle.size))
        assert_close(f"stored_priority(all held slots) {when}", got, oracle.leaves(), trace, tol=tol)
        want_max = oracle.max_priority()
        if want_max is not None:
            mp = buf.max_priority
            if type(mp) is not float:
                fail("type(buf.max_priority)", type(mp).__name__, "float", trace)
            assert_close(f"max_priority {when}", torch.tensor([mp]), torch.tensor([want_max]), trace, tol=tol)
        return
    leaves = oracle.leaves()
    if not bool((leaves > 0).any()):
        return  # eps = 0 and every priority 0: nothing can be drawn (test_bad_input checks the refusal)
    k = 4 * oracle.size
    trace.note(f"observe {when}")
    _, info = buf.sample(k)
    index = torch.as_tensor(info["index"]).cpu()
    live = (index >= 0) & (index < oracle.size)
    if not bool(live.all()):
        fail(f"info['index'] {when}", index, f"held slots in [0, {oracle.size})", trace)
    if bool((leaves[index] <= 0).any()):
        fail(f"expected priority of the sampled slots {when}", leaves[index], "> 0 (0 is never drawn)", trace)
    weight = torch.as_tensor(info["weight"])
    tol = oracle.weight_tolerance(index, weight.dtype)
    assert_close(f"info['weight'] {when}", weight, oracle.weights(index), trace, tol=tol)


def _setup_strategy(impl, **kw):
    return prioritized_setup(impl.conventions, impl.has("priority_readback"), **kw)


@given(data=st.data())
def test_writer_default_priority_is_transformed_once(impl, data):
    """tolerance tied to the declared dtype (see module doc): rows written by
    extend or add without a priority store ``(q + eps) ** alpha`` where q is
    the new-row priority (the largest raw priority seen so far, 1.0 at
    first, under the spec's "max_seen"); max_priority equals that raw max.
    Checked after every write; updates in between raise and lower it."""
    spec, layout = data.draw(_setup_strategy(impl), label="setup")
    conv = impl.conventions
    trace, buf, oracle, layout = start_prioritized(impl, spec, layout, record=True)
    next_id = 0
    for step in range(data.draw(st.integers(1, 4), label="rounds")):
        n = data.draw(st.integers(1, spec.capacity), label=f"extend size {step}")
        buf.extend(layout.batch(next_id, n))
        oracle.write(n)
        next_id += n
        check_priorities(impl, buf, oracle, trace, f"after extend {step}")
        slot = buf.add(layout.row(next_id))
        oracle.write(1)
        next_id += 1
        check_priorities(impl, buf, oracle, trace, f"after add {step}")
        raw = data.draw(priorities(conventions=conv), label=f"raise or lower slot {slot} {step}")
        buf.update_priority(torch.tensor([slot]), conv.priorities([raw]))
        oracle.update([slot], [raw])


@st.composite
def _steps(draw, capacity: int, conventions=None):
    """Updates (slots in any order, repeats allowed, raw priorities raised or
    lowered) interleaved with writes that evict."""
    out = []
    for step in range(draw(st.integers(1, 5), label="steps")):
        kind = draw(st.sampled_from(["update", "update", "extend", "add"]), label=f"step {step}")
        if kind == "update":
            index = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=6),
                         label=f"slots {step}")
            raw = draw(st.lists(priorities(conventions=conventions), min_size=len(index), max_size=len(index)),
                       label=f"raw priorities {step}")
            out.append(("update", index, raw))
        elif kind == "extend":
            out.append(("extend", draw(st.integers(1, capacity), label=f"extend size {step}")))
        else:
            out.append(("add",))
    return out


@given(data=st.data())
def test_updated_priority_is_transformed_once(impl, data):
    """tolerance tied to the declared dtype (see module doc): after
    ``update_priority(index, p)`` (repeated slots: the last value wins) each
    slot stores ``(p + eps) ** alpha``; updating a slot again replaces its
    value (never compounds); other slots are untouched; rows written later
    evict old priorities and get the new-row priority; max_priority is the
    max raw priority seen."""
    spec, layout = data.draw(_setup_strategy(impl), label="setup")
    conv = impl.conventions
    trace, buf, oracle, layout = start_prioritized(impl, spec, layout, fill=spec.capacity, record=True)
    next_id = spec.capacity
    for step, op in enumerate(data.draw(_steps(spec.capacity, conv), label="operations")):
        if op[0] == "update":
            _, index, raw = op
            buf.update_priority(torch.tensor(index), conv.priorities(raw))
            oracle.update(index, raw)
        elif op[0] == "extend":
            buf.extend(layout.batch(next_id, op[1]))
            oracle.write(op[1])
            next_id += op[1]
        else:
            buf.add(layout.row(next_id))
            oracle.write(1)
            next_id += 1
        check_priorities(impl, buf, oracle, trace, f"after step {step} ({op[0]})")


@pytest.mark.requires("priority_key")
@given(data=st.data())
def test_priority_key_in_data_is_transformed_once(impl, data):
    """tolerance tied to the declared dtype (see module doc): rows written by
    extend or add carrying their raw priority under ``spec.priority_key`` (in
    the declared dtype) store ``(p + eps) ** alpha``, and max_priority
    becomes max(1.0, every p)."""
    spec, layout = data.draw(_setup_strategy(impl, priority_key=True), label="setup")
    conv = impl.conventions
    trace, buf, oracle, layout = start_prioritized(impl, spec, layout, record=True)
    next_id = 0
    for step in range(data.draw(st.integers(1, 3), label="rounds")):
        n = data.draw(st.integers(1, spec.capacity), label=f"extend size {step}")
        raw = data.draw(st.lists(priorities(conventions=conv), min_size=n, max_size=n),
                        label=f"raw priorities {step}")
        buf.extend(layout.batch(next_id, n, priority=conv.priorities(raw)))
        oracle.write(n, raw)
        next_id += n
        check_priorities(impl, buf, oracle, trace, f"after extend {step}")
        p = data.draw(priorities(conventions=conv), label=f"added row priority {step}")
        buf.add(layout.row(next_id, priority=conv.priorities([p])[0]))
        oracle.write(1, [p])
        next_id += 1
        check_priorities(impl, buf, oracle, trace, f"after add {step}")
