"""Who owns the memory: the buffer owns its storage and leaves the caller's
tensors alone (the catalogue of invariants: memory ownership).

* after ``extend`` / ``add`` / ``update_priority`` return, an in-place edit
  of the caller's tensors (the rows, the index, the priorities) never
  changes what the buffer holds or returns later;
* no call changes its arguments: the rows keep their keys and values, the
  index and the priorities their values;
* a returned sample, its info tensors and ``contents()`` share no memory
  with the storage, nor with each other across calls: editing one in place
  (a user normalising a batch, an in-place transform) changes nothing the
  buffer holds, and a later call does not rewrite an earlier result.

Every check is exact: the values read back are compared bit for bit with a
snapshot (a deep copy) taken before the edit. An adapter that must repack
the caller's rows before its library sees them (stable-baselines3 takes one
flat array) checks at the library's boundary instead: ``library_aliasing()``
on the buffer lists what it handed over or got back that shares memory with
the library's storage, and any entry fails. Where a leaf cannot be edited
in place (a tensor whose elements share one memory location, such as an
``expand``), that leaf is left alone: no edit can reach the storage through
it. Capacities that are not powers of two are drawn, and batches of one row
(a one-row sample is a contiguous run: a slice view of the storage would
serve it).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDictBase

from rbcheck.harness.assertions import (
    Trace,
    assert_close,
    assert_td_equal,
    assert_tensor_equal,
    fail,
    priority_tolerance,
)
from rbcheck.harness.oracle import PriorityOracle
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.stateful import declared_samplers
from rbcheck.harness.strategies import Field, Layout, layouts

#: A layout with every dtype family an edit must reach (float, int, bool, uint8, nested).
LAYOUT = Layout((Field(("obs",), (2,), "float32"), Field(("next", "done"), (), "bool"),
                 Field(("reward",), (), "float64"), Field(("action",), (3,), "uint8")))


def scramble(value) -> None:
    """Edit ``value`` (a tensor or every leaf of a TensorDict) in place, so
    that every element changes; leaves that cannot be written in place are
    left alone (nothing can reach the storage through them)."""
    if isinstance(value, TensorDictBase):
        for leaf in value.values(include_nested=True, leaves_only=True):
            scramble(leaf)
        return
    if not isinstance(value, torch.Tensor) or value.numel() == 0:
        return
    try:
        with torch.no_grad():
            if value.dtype is torch.bool:
                value.logical_not_()
            elif value.is_floating_point():
                value.neg_().sub_(1000.0)
            else:
                value.add_(101)
    except RuntimeError:  # overlapping memory (an expand), an inference tensor: not writable
        return


def snapshot(value):
    """A deep copy (its own memory) of a tensor or TensorDict."""
    return value.clone() if isinstance(value, (torch.Tensor, TensorDictBase)) else value


@st.composite
def ownership_setups(draw, impl):
    sampler = draw(st.sampled_from(declared_samplers(impl)), label="sampler")
    capacity = draw(st.sampled_from([1, 3, 5, 6, 7, 8, 12, 13]), label="capacity")
    spec = BufferSpec(capacity=capacity, sampler=sampler, alpha=0.7, beta=0.6, eps=1e-3,
                      seed=draw(st.integers(0, 2**16), label="seed"))
    sizes = st.one_of(st.just(capacity), st.integers(1, capacity + 2))  # a batch that fills the ring, often
    writes = draw(st.lists(st.one_of(st.just(("add",)), st.tuples(st.just("extend"), sizes)),
                           min_size=1, max_size=5), label="writes")
    layout = draw(st.one_of(st.just(LAYOUT), layouts(max_fields=3)), label="layout")
    return spec.but(layout=layout.spec_layout()), layout, writes


def _skip_undeclared(impl, spec: BufferSpec) -> None:
    conv = impl.conventions
    for name in ("alpha", "beta", "eps"):
        rng = conv.param_range(name)
        if not rng.contains(getattr(spec, name)):
            pytest.skip(f"convention: param_ranges.{name}={rng.describe()} excludes {name}={getattr(spec, name)!r}")


def _start(impl, data) -> tuple[Run, list]:
    """The drawn setup of every ownership property: a Run over the drawn
    spec and layout (skipped where a declared range excludes the spec), and
    the writes to make."""
    spec, layout, writes = data.draw(ownership_setups(impl), label="setup")
    _skip_undeclared(impl, spec)
    return Run(impl, spec, layout), writes


class Run:
    """One buffer, its trace and (prioritized) its oracle; every write and
    update goes through here so the trace replays it."""

    def __init__(self, impl, spec: BufferSpec, layout: Layout):
        self.impl, self.spec, self.layout = impl, spec, layout
        self.trace = Trace(impl, spec)
        self.trace.need("from rbcheck.conformance.test_ownership import scramble")
        self.trace.let("layout", layout)
        self.buf = self.trace.wrap(impl.make(spec))
        self.oracle = PriorityOracle(spec, impl.conventions) if spec.sampler == "prioritized" else None
        self.written = 0

    def batch(self, kind: tuple):
        n = 1 if kind[0] == "add" else kind[1]
        if kind[0] == "add":
            return self.layout.row(self.written), f"layout.row({self.written})", n
        return self.layout.batch(self.written, n), f"layout.batch({self.written}, {n})", n

    def write(self, kind: tuple, data, expr: str, n: int):
        self.trace.op(f"data = {expr}")
        self.trace.name(data, "data")
        out = self.buf.add(data) if kind[0] == "add" else self.buf.extend(data)
        self.check_boundary(f"{kind[0]}")
        if self.oracle is not None:
            self.oracle.write(n)
        self.written += n
        return out

    def sample(self, k: int, bind: str = "rows, info"):
        self.trace.bind(bind)
        out = self.buf.sample(k)
        self.check_boundary("sample")
        return out

    def check_boundary(self, call: str) -> None:
        """An adapter that cannot hand the caller's tensors to its library as
        they are (it packs them first) checks ownership where it calls the
        library: ``buf.library_aliasing()`` lists what it handed or got back
        that shares memory with the library's storage."""
        hook = getattr(self.buf.inner, "library_aliasing", None)
        found = hook() if callable(hook) else []
        if found:
            fail(f"memory shared with the library's storage at {call}", found, "none", self.trace)

    def check_sample(self, rows, info, k: int, when: str) -> None:
        """The sample's slots are held, its rows are the stored rows, its
        weights (prioritized) the closed form over what the buffer was given."""
        trace, n = self.trace, len(self.buf)
        index = info.get("index") if isinstance(info, dict) else None
        if not isinstance(index, torch.Tensor) or tuple(index.shape) != (k,):
            fail(f"info['index'] {when}", f"<{type(index).__name__}>", f"torch.int64[{k}]", trace)
        idx = index.detach().cpu().to(torch.int64)
        if bool(((idx < 0) | (idx >= n)).any()):
            fail(f"info['index'] {when}", idx, f"held slots in [0, {n})", trace)
        assert_td_equal(f"sample rows {when}", rows, self.buf.contents()[idx], trace, check_device=False)
        if self.oracle is None or not bool((self.oracle.leaves() > 0).any()):
            return
        weight = info.get("weight")
        if not isinstance(weight, torch.Tensor):
            fail(f"sorted(info) {when}", sorted(info), "a dict with 'weight'", trace)
        tol = self.oracle.weight_tolerance(idx, weight.dtype)
        assert_close(f"info['weight'] {when}", weight.detach().cpu(), self.oracle.weights(idx), trace, tol=tol)

    def check_priorities(self, when: str) -> None:
        """What the buffer holds for the priorities: read back where it can,
        else through a sample's weights (beta = 0.6 carries their ratios)."""
        if self.oracle is None:
            return
        conv, trace = self.impl.conventions, self.trace
        if self.impl.has("priority_readback"):
            n = len(self.buf)
            trace.bind()
            got = torch.as_tensor(self.buf.stored_priority(torch.arange(n))).detach().cpu().to(torch.float64)
            assert_close(f"stored_priority(all slots) {when}", got, self.oracle.leaves(), trace,
                         tol=priority_tolerance(conv.priority_dtype, self.spec.alpha))
        if bool((self.oracle.leaves() > 0).any()):
            k = 2 * self.spec.capacity
            rows, info = self.sample(k)
            self.check_sample(rows, info, k, when)


@pytest.mark.conventions("priority_dtype", "eps_rule", "weight_normaliser")
@given(data=st.data())
def test_buffer_keeps_no_reference_to_the_callers_tensors(impl, data):
    """exact (rows, stored priorities read back) and tolerance tied to the
    declared dtype (weights): after each extend / add returns, the caller
    edits its rows in place (every leaf, every element); contents() is still
    the snapshot taken before the edit, and a later sample returns the
    stored rows. Prioritized: after update_priority(index, priority) returns,
    the caller reuses index and priority in place (the index rolled by one,
    the priorities times 1000 plus 7: still valid arguments); the stored
    priorities (read back, or through the weights of a sample) are still
    those it was given."""
    run, writes = _start(impl, data)
    trace = run.trace
    for kind in writes:
        batch, expr, n = run.batch(kind)
        run.write(kind, batch, expr, n)
        held = snapshot(run.buf.contents())
        trace.op("scramble(data)  # the caller edits its rows in place")
        scramble(batch)
        assert_td_equal(f"contents() after the caller edited the rows it gave to {kind[0]}",
                        run.buf.contents(), held, trace)
    k = min(3, len(run.buf))
    rows, info = run.sample(k)
    run.check_sample(rows, info, k, "after the caller edited its rows")
    if run.oracle is None:
        return
    conv = impl.conventions
    n = len(run.buf)
    raw = [float(1 + (3 * i) % 7) for i in range(n)]
    index, pri = torch.arange(n), conv.priorities(raw)
    trace.op(f"index, priority = torch.arange({n}), torch.tensor({raw}, dtype={pri.dtype})")
    trace.name(index, "index"), trace.name(pri, "priority")
    run.buf.update_priority(index, pri)
    run.oracle.update(torch.arange(n), raw)
    trace.op("index.copy_(index.roll(1)); priority.mul_(1000).add_(7)  # the caller reuses them in place")
    index.copy_(index.roll(1))
    pri.mul_(1000).add_(7)
    run.check_priorities("after the caller edited the index and priorities it gave to update_priority")


def _args_unchanged(what: str, got, before, trace: Trace) -> None:
    if isinstance(before, TensorDictBase):
        assert_td_equal(what, got, before, trace)
    else:
        assert_tensor_equal(what, got, before, trace)


@given(data=st.data())
def test_calls_leave_their_arguments_unchanged(impl, data):
    """exact: extend(data), add(row), update_priority(index, priority) and
    stored_priority(index) leave their arguments as they were: the same keys
    (no bookkeeping column written into the caller's rows), the same values,
    dtypes and shapes, bit for bit."""
    run, writes = _start(impl, data)
    trace = run.trace
    for kind in writes:
        batch, expr, n = run.batch(kind)
        before = snapshot(batch)
        run.write(kind, batch, expr, n)
        _args_unchanged(f"the rows given to {kind[0]} (the caller's, after the call)", batch, before, trace)
    if run.oracle is None:
        return
    conv = impl.conventions
    n = len(run.buf)
    order = data.draw(st.permutations(list(range(n))), label="update order")
    raw = [float(1 + (5 * i) % 9) / 4 for i in range(n)]
    index, pri = torch.tensor(order, dtype=torch.int64), conv.priorities(raw)
    index_before, pri_before = index.clone(), pri.clone()
    trace.op(f"index, priority = torch.tensor({order}), torch.tensor({raw}, dtype={pri.dtype})")
    trace.name(index, "index"), trace.name(pri, "priority")
    run.buf.update_priority(index, pri)
    run.oracle.update(index_before, raw)
    _args_unchanged("the index given to update_priority (after the call)", index, index_before, trace)
    _args_unchanged("the priorities given to update_priority (after the call)", pri, pri_before, trace)
    if impl.has("priority_readback"):
        trace.bind()
        run.buf.stored_priority(index)
        _args_unchanged("the index given to stored_priority (after the call)", index, index_before, trace)


@pytest.mark.conventions("priority_dtype", "eps_rule", "weight_normaliser")
@given(data=st.data())
def test_returned_samples_and_contents_share_no_memory_with_the_storage(impl, data):
    """exact: a sample (rows and info tensors) and contents() are the
    caller's to keep: a later sample does not rewrite an earlier one, and
    editing them in place (every leaf) changes neither contents() nor what a
    later sample returns (rows, and for a prioritized buffer weights that
    still follow the closed form, tolerance tied to the declared dtype).
    Batches of one row are drawn: a contiguous run a slice view could serve."""
    run, writes = _start(impl, data)
    spec, trace = run.spec, run.trace
    for kind in writes:
        batch, expr, n = run.batch(kind)
        run.write(kind, batch, expr, n)
    held = snapshot(run.buf.contents())
    for rnd in range(data.draw(st.integers(1, 3), label="rounds")):
        k1 = data.draw(st.sampled_from([1, 2, spec.capacity]), label=f"batch {rnd}")
        rows, info = run.sample(k1)
        first, first_info = snapshot(rows), {k: snapshot(v) for k, v in info.items()}
        k2 = data.draw(st.sampled_from([1, 3]), label=f"second batch {rnd}")
        rows2, info2 = run.sample(k2, "rows2, info2")
        assert_td_equal("the first sample's rows after a second sample", rows, first, trace)
        for key, value in first_info.items():
            if isinstance(value, torch.Tensor):
                _args_unchanged(f"the first sample's info[{key!r}] after a second sample", info[key], value, trace)
        trace.op("for value in (rows, rows2, *info.values(), *info2.values()): scramble(value)"
                 "  # the caller edits the samples in place")
        for value in (rows, rows2, *info.values(), *info2.values()):
            scramble(value)
        assert_td_equal("contents() after the caller edited a sample in place", run.buf.contents(), held, trace)
        trace.bind("c")
        c = run.buf.contents()
        trace.op("scramble(c)  # the caller edits contents() in place")
        scramble(c)
        assert_td_equal("contents() after the caller edited an earlier contents() in place",
                        run.buf.contents(), held, trace)
    k = min(4, 2 * len(run.buf))
    rows, info = run.sample(k)
    run.check_sample(rows, info, k, "after the caller edited earlier samples in place")
    run.check_priorities("after the caller edited earlier samples in place")
