"""Sampling without replacement (sampler "without_replacement",
reference/without_replacement_sampler.py): epochs, ``drop_last``,
``shuffle``, the declared rule for writes during an epoch, and an epoch that
survives a save and load.

The declared rule: an epoch is a permutation of the slots held when it
starts (``0 .. n0-1``); batches are consecutive pieces of it; a slot the ring
overwrote during the epoch is still drawn once (its current row), slots
first written during it wait for the next epoch. ``drop_last=True``: a tail
shorter than the batch is never returned (the next sample starts a new
epoch); ``False``: it is returned short. ``shuffle=False``: slot order.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_chi_square,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.sampler_laws import sampler_rule
from rbcheck.harness.strategies import Field, Layout

pytestmark = pytest.mark.requires("without_replacement")
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4


def drawn_index(buf, batch: int, trace: Trace, when: str):
    """``(rows, int64 CPU index)`` of ``buf.sample(batch)``, the index checked to be
    distinct held slots; a raise is the failure."""
    try:
        rows, info = buf.sample(batch)
    except Exception as err:  # noqa: BLE001 - a raising sample is the failure reported
        fail(f"buf.sample({batch}) {when}", f"<raised {type(err).__name__}: {err}>", "a batch", trace)
    index = info.get("index")
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.dim() != 1:
        fail(f"info['index'] {when}", f"<{getattr(index, 'dtype', type(index).__name__)}>", "a 1-D int64 tensor", trace)
    index = index.cpu()
    dead = (index < 0) | (index >= len(buf))
    if bool(dead.any()):
        fail(f"info['index'] {when}", index[dead][:8], f"held slots in [0, len(buf)={len(buf)})", trace)
    if len(set(index.tolist())) != len(index):
        repeated = sorted({i for i in index.tolist() if index.tolist().count(i) > 1})[:8]
        fail(f"slots drawn twice in one batch {when}", repeated, "none (without replacement)", trace)
    return rows, index


@st.composite
def epoch_setups(draw):
    capacity = draw(st.integers(1, 4096), label="capacity")
    batch = draw(st.integers(1, 3000), label="batch size")
    return capacity, batch, draw(st.booleans(), label="drop_last"), draw(st.booleans(), label="shuffle")


@pytest.mark.conventions("sampler_rules")
@given(setup=epoch_setups(), data=st.data())
def test_an_epoch_draws_every_held_slot_exactly_once(impl, setup, data):
    """exact: over drawn interleavings of writes (the ring wrapping and
    overwriting mid-epoch) and samples, every batch holds distinct slots of
    the epoch in progress not drawn before in it, of the declared size
    (``batch``, or what is left; a short tail dropped with ``drop_last``); an
    epoch draws each slot held at its start exactly once (all but the
    ``n0 % batch`` tail with ``drop_last``), in slot order without
    ``shuffle``; slots written after it started are not in it; every row
    returned is the slot's current row. ``drop_last`` with fewer held rows
    than a batch raises."""
    capacity, batch, drop_last, shuffle = setup
    spec = BufferSpec(capacity=capacity, sampler="without_replacement", drop_last=drop_last, shuffle=shuffle,
                      seed=data.draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT.spec_layout(),
                      batch_size=batch)  # the one size sampled (TorchRL's drop_last needs it built in)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    written, n0, order = 0, 0, []  # rows written; the epoch's size and its slots in the order drawn
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        if written == 0 or data.draw(st.booleans(), label=f"write at step {step}"):
            n = data.draw(st.integers(1, 2 * capacity + 1), label=f"rows written at step {step}")
            buf.extend(layout.batch(written, n))
            grew = min(written + n, capacity) != min(written, capacity)
            written += n
            if grew and sampler_rule(impl.conventions, "epoch_on_growth") == "restart":
                n0, order = 0, []  # declared: the next sample begins a new epoch
            continue
        held, left = min(written, capacity), n0 - len(order)
        if left == 0 or (drop_last and left < batch):  # the next sample starts an epoch
            if drop_last and batch > held:
                try:
                    buf.sample(batch)
                except Exception:  # noqa: BLE001 - the refusal asked for
                    continue
                fail(f"buf.sample({batch}) with drop_last and len(buf)={held}", "<a batch>",
                     "an error (no full batch in an epoch)", trace)
            n0, order, left = held, [], held
        when = f"at step {step} (draw {len(order)} of an epoch of {n0} slots, batch {batch})"
        rows, index = drawn_index(buf, batch, trace, when)
        if len(index) != min(batch, left):
            fail(f"len(info['index']) {when}", len(index), min(batch, left), trace,
                 f"{left} slots of the epoch left, drop_last={drop_last}")
        again = sorted(set(index.tolist()) & set(order))
        if again:
            fail(f"slots drawn a second time in one epoch {when}", again[:8], "none", trace)
        late = index[index >= n0]
        if late.numel():
            fail(f"slots written after the epoch started, drawn in it {when}", late[:8],
                 f"none (the epoch holds slots 0 .. {n0 - 1})", trace)
        if not shuffle:
            want = torch.arange(len(order), len(order) + len(index))
            assert_tensor_equal(f"info['index'] without shuffle {when}", index, want, trace)
        assert_td_equal(f"sample rows {when}", rows, buf.contents()[index], trace, check_device=False)
        order += index.tolist()
        if len(order) == n0 or (drop_last and n0 - len(order) < batch):
            want = n0 - n0 % batch if drop_last else n0
            if len(order) != want:  # unreachable given the checks above; kept as the statement
                fail(f"slots drawn in an epoch of {n0}", len(order), want, trace)


@pytest.mark.conventions("sampler_rules")
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("capacity,batch,rewrite", [(6, 3, False), (7, 3, False), (100, 7, False),
                                                    (5, 2, True), (7, 3, True), (64, 10, True)])
def test_an_epoch_draws_each_slot_once_fixed_cases(impl, capacity, batch, rewrite, shuffle):
    """exact, fixed cases (a full ring, ``drop_last=False``, drawn to the
    epoch's end): the epoch's batches hold each held slot exactly once, each
    of the batch size but the last (what is left); with ``rewrite``, the
    ring is written over whole after the first batch (slots already drawn
    rewritten mid-epoch, the ring not growing): each slot is still drawn
    once in the epoch, a rewritten one already drawn not again."""
    spec = BufferSpec(capacity=capacity, sampler="without_replacement", drop_last=False, shuffle=shuffle,
                      seed=capacity * 10 + batch, layout=LAYOUT.spec_layout(), batch_size=batch)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, capacity))
    seen: list[int] = []
    rewritten = ", the ring rewritten after its first batch" if rewrite else ""
    while len(seen) < capacity:
        when = f"(draw {len(seen)} of an epoch of {capacity} slots{rewritten})"
        _, index = drawn_index(buf, batch, trace, when)
        if len(index) != min(batch, capacity - len(seen)):
            fail(f"len(info['index']) {when}", len(index), min(batch, capacity - len(seen)), trace,
                 f"{capacity - len(seen)} slots of the epoch left, drop_last=False")
        again = sorted(set(index.tolist()) & set(seen))
        if again:
            fail(f"slots drawn a second time in one epoch {when}", again[:8], "none", trace)
        seen += index.tolist()
        if rewrite and len(seen) == len(index):
            trace.note("the ring is written over whole mid-epoch: slots already drawn are rewritten")
            buf.extend(layout.batch(capacity, capacity))


@pytest.mark.conventions("sampler_rules")
@pytest.mark.parametrize("capacity,batch", [(10, 3), (7, 2), (64, 48), (4097, 1000)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_an_epochs_tail_follows_drop_last(impl, capacity, batch, drop_last):
    """exact, fixed cases (an epoch whose size is not a multiple of the
    batch, drawn to its end): with ``drop_last`` the ``n0 % batch`` tail is
    never returned and the sample after the last full batch starts a new
    epoch (every slot again); without it the last batch is the tail, short."""
    spec = BufferSpec(capacity=capacity, sampler="without_replacement", drop_last=drop_last, shuffle=True,
                      seed=capacity + batch, layout=LAYOUT.spec_layout(), batch_size=batch)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, capacity))
    full, tail = divmod(capacity, batch)
    seen: list[int] = []
    for k in range(full):
        _, index = drawn_index(buf, batch, trace, f"(batch {k} of an epoch of {capacity} slots)")
        seen += index.tolist()
    if len(set(seen)) != len(seen):
        fail(f"slots drawn twice in the epoch's {full} full batches", len(seen) - len(set(seen)), 0, trace)
    _, index = drawn_index(buf, batch, trace, f"(after the epoch's {full} full batches)")
    if drop_last:
        if len(index) != batch:
            fail("len(info['index']) after the last full batch, drop_last=True", len(index), batch, trace,
                 f"the {tail} slots left are a short tail: dropped, a new epoch begins")
        if set(index.tolist()) <= set(range(capacity)) - set(seen) and tail < batch:
            fail("the batch after the last full one, drop_last=True", sorted(index.tolist())[:8],
                 "a batch of a new epoch (the tail is dropped)", trace)
    else:
        if len(index) != tail:
            fail("len(info['index']) of the epoch's last batch, drop_last=False", len(index), tail, trace)
        if set(index.tolist()) & set(seen):
            fail("the tail of the epoch, drop_last=False", sorted(set(index.tolist()) & set(seen))[:8],
                 "only slots not drawn yet in the epoch", trace)


@pytest.mark.requires("save_load")
@pytest.mark.exact_replay
@given(data=st.data())
def test_a_saved_epoch_resumes_after_load(impl, data):
    """exact (seedable): a checkpoint taken mid-epoch holds the epoch: after
    a load (into the same buffer, and into a fresh one built with another
    seed) the next batches are the ones the buffer gave after the save, to
    the end of the epoch and into the next."""
    capacity = data.draw(st.integers(2, 300), label="capacity")
    rows = data.draw(st.integers(1, 2 * capacity), label="rows written")
    held = min(rows, capacity)
    batch = data.draw(st.integers(1, held), label="batch size")
    spec = BufferSpec(capacity=capacity, sampler="without_replacement", drop_last=data.draw(st.booleans(), label="drop_last"),
                      shuffle=data.draw(st.booleans(), label="shuffle"), seed=data.draw(st.integers(0, 99), label="seed"),
                      layout=LAYOUT.spec_layout())
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, rows))
    per_epoch = held // batch if spec.drop_last else -(-held // batch)
    before = data.draw(st.integers(0, per_epoch), label="batches before the save")
    for _ in range(before):
        drawn_index(buf, batch, trace, "before the save")
    after = per_epoch - before + 1  # to the end of the epoch, and one more
    with tempfile.TemporaryDirectory() as tmp:
        tmp = trace.directory(Path(tmp))
        buf.save(tmp)
        want = [drawn_index(buf, batch, trace, "after the save")[1] for _ in range(after)]
        fresh = trace.make(spec.but(seed=spec.seed + 1), "fresh")
        for name, target in (("buf", buf), ("a fresh buffer", fresh)):
            target.load(tmp)
            for k in range(after):
                got = drawn_index(target, batch, trace, f"{name} after the load")[1]
                assert_tensor_equal(f"info['index'] of batch {k} after loading into {name} ({before} batches "
                                    "of the epoch drawn before the save)", got, want[k], trace)


CASES = [(6, 6), (5, 2), (7, 3)]  # (held slots, batch): whole epochs, and epochs split over batches


def test_shuffled_epochs_are_uniform_permutations(impl):
    """distributional (chi-square, false-alarm rate 1e-4 per case): with
    ``shuffle`` each epoch is a uniformly random order of the held slots:
    over 2000 epochs, the slot at each position of the epoch (batches put end
    to end) is uniform over the held slots; every epoch is checked exactly to
    be a permutation first."""
    for held, batch in CASES:
        spec = BufferSpec(capacity=held, sampler="without_replacement", shuffle=True, seed=held * 100 + batch,
                          layout=LAYOUT.spec_layout())
        trace = Trace(impl, spec)
        layout = trace.source("layout", LAYOUT)
        buf = trace.wrap(impl.make(spec))
        buf.extend(layout.batch(0, held))
        table = torch.zeros(held, held, dtype=torch.float64)
        for _ in range(2000):
            epoch = torch.cat([buf.sample(batch)[1]["index"].cpu() for _ in range(-(-held // batch))])
            if sorted(epoch.tolist()) != list(range(held)):
                fail(f"an epoch's slots (batches of {batch})", epoch, f"a permutation of 0 .. {held - 1}", trace)
            table[torch.arange(held), epoch] += 1
        assert_chi_square(f"slot at each position of a shuffled epoch of {held} (batches of {batch})",
                          table.flatten(), torch.full((held * held,), 1.0 / (held * held)), trace,
                          false_alarm=FALSE_ALARM)
