"""The variants' own load and save paths (exact), not only through the code
they share with the reference.

The reference buffer validates a checkpoint by loading it into SHALLOW copies
of its storage, writer and sampler, and only then copies the staged parts
into the live ones (``reference/buffer.py``). That is only safe when every
component's ``load_state_dict`` *rebinds* its attributes and never writes into
memory it already holds: a component that copies the checkpoint into its
existing tensors writes into the live buffer's memory through the shallow
copy, before the load is known to fit. ``DeviceStorage`` once did exactly that
(a reload copied into its interleaved rows), so a load refused late -- the
sampler differs -- left the checkpoint's rows in a live buffer.

Checked here for every variant component and both variant buffers:

* ``state_dict`` -> ``load_state_dict`` into a fresh component round-trips;
* loading another state into a shallow copy leaves the original's state and
  every read (rows, leaves, generations) unchanged, bit for bit;
* a refused load (an invalid state) leaves the component unchanged;
* the issue's repro: a prioritized checkpoint refused by a random-sampler
  buffer leaves the buffer's rows as they were, and the rows before the load
  differ from the checkpoint's in every slot (so an overwrite would show).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.protocol import BufferSpec
from rbcheck.reference import CheckpointError
from rbcheck.variants import (
    DeviceStorage,
    DeviceWriter,
    PrioritizedSampler,
    RandomSampler,
    SliceSampler,
    triton_tree,
)

from ..unit.test_buffer import same
from .common import cpu, rows

BACKENDS = ["torch"] + ([] if triton_tree.UNAVAILABLE else ["triton"])


# --------------------------------------------------------------------------
# each component: filled twice (state A in the live one, state B elsewhere)
# and the reads that must not change
# --------------------------------------------------------------------------


def storage_pair(capacity=6):
    a, b = DeviceStorage(capacity, "cpu"), DeviceStorage(capacity, "cpu")
    a.write(0, rows(capacity))
    b.write(0, rows(capacity, 100))
    return a, b, lambda s: s.get(torch.arange(len(s))).clone()


def writer_pair(capacity=6):
    a, b = DeviceWriter(capacity), DeviceWriter(capacity)
    a.next_indices(4)
    b.next_indices(9)
    return a, b, lambda w: (w.cursor, w.write_count, w.generation.clone(),
                            w.generation_at(torch.arange(capacity)))


def sampler_pair(backend, capacity=6):
    a = PrioritizedSampler(capacity, 0.6, 0.4, 1e-3, backend=backend)
    b = PrioritizedSampler(capacity, 0.7, 0.5, 1e-2, backend=backend)
    a.on_write(torch.arange(capacity), torch.arange(1.0, capacity + 1.0))
    b.on_write(torch.arange(capacity), torch.full((capacity,), 9.0))
    b.update_priority(torch.tensor([2]), torch.tensor([50.0]))
    return a, b, lambda s: (s.sum_tree.nodes.clone(), s.min_tree.nodes.clone(), s.max_priority,
                            s.alpha, s.beta, s.eps, s.indices_from_uniforms(torch.linspace(0, 0.99, 7)))


def slice_pair(capacity=6):
    a, b = SliceSampler(slice_len=2), SliceSampler(slice_len=3, strict_length=False)
    return a, b, lambda s: (s.num_slices, s.slice_len, s.strict_length, s.episode_key)


def random_pair(capacity=6):
    a, b = RandomSampler(), RandomSampler()
    return a, b, lambda s: s.state_dict()


PAIRS = {
    "DeviceStorage": storage_pair,
    "DeviceWriter": writer_pair,
    **{f"PrioritizedSampler[{backend}]": (lambda backend=backend: sampler_pair(backend))
       for backend in BACKENDS},
    "SliceSampler": slice_pair,
    "RandomSampler": random_pair,
}


def load(component, state: dict, source) -> None:
    """``component.load_state_dict(state)``; a storage is also given its size (the
    buffer passes min(write count, capacity)), here the size of ``source``."""
    if isinstance(component, DeviceStorage):
        component.load_state_dict(state, len(source))
    else:
        component.load_state_dict(state)


def reads_equal(x, y) -> bool:
    if isinstance(x, tuple):
        return len(x) == len(y) and all(reads_equal(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, TensorDict):
        return same(x.to_dict(), y.to_dict())
    return same(x, y)


@pytest.mark.parametrize("component", sorted(PAIRS))
def test_component_state_round_trips_on_its_own(component):
    """exact: the component's state_dict loaded into a fresh one of the same
    kind gives the same state_dict and the same reads."""
    live, other, reads = PAIRS[component]()
    fresh = copy.deepcopy(other)
    load(fresh, live.state_dict(), live)
    assert same(cpu(fresh.state_dict()), cpu(live.state_dict()))
    assert reads_equal(reads(fresh), reads(live))


@pytest.mark.parametrize("component", sorted(PAIRS))
def test_load_into_a_shallow_copy_never_changes_the_original(component):
    """exact: ``copy.copy(c).load_state_dict(other_state)`` (how the buffer
    stages a load before it knows the checkpoint fits) leaves ``c``'s
    state_dict and reads bit for bit as they were."""
    live, other, reads = PAIRS[component]()
    before_state, before_reads = cpu(live.state_dict()), reads(live)
    staged = copy.copy(live)
    load(staged, other.state_dict(), other)
    assert same(cpu(staged.state_dict()), cpu(other.state_dict())), "the staged copy did not load"
    assert same(cpu(live.state_dict()), before_state), f"{component}: state_dict changed through a shallow copy"
    assert reads_equal(reads(live), before_reads), f"{component}: reads changed through a shallow copy"


def _invalid(component: str, state: dict) -> dict:
    """A state the component must refuse (ValueError), per kind."""
    state = dict(state)
    if component == "DeviceStorage":
        state["columns"] = [c[:, None] if i == 0 else c for i, c in enumerate(state["columns"])]
    elif component == "DeviceWriter":
        state["write_count"] = -1
    elif component.startswith("PrioritizedSampler"):
        state["max_priority"] = -1.0
    elif component == "SliceSampler":
        state["slice_len"] = -3
    else:
        state["type"] = "NotASampler"
    return state


@pytest.mark.parametrize("component", sorted(PAIRS))
def test_refused_component_load_changes_nothing(component):
    """exact: an invalid state is refused with ValueError (or KeyError for a
    missing key) and the component keeps its state and reads."""
    live, other, reads = PAIRS[component]()
    before_state, before_reads = cpu(live.state_dict()), reads(live)
    bad = _invalid(component, other.state_dict())
    if same(cpu(bad), cpu(other.state_dict())):
        pytest.skip(f"{component}: no invalid state to try")
    with pytest.raises((ValueError, KeyError)):
        load(live, bad, other)
    assert same(cpu(live.state_dict()), before_state)
    assert reads_equal(reads(live), before_reads)


# --------------------------------------------------------------------------
# the whole variant buffer: the repro, and a late refusal of every kind
# --------------------------------------------------------------------------

VARIANTS = ["device", "triton"]


def variant(name):
    impl = load_adapter(name)
    if not impl.has("save_load"):
        pytest.skip(f"{name}: save_load unavailable: {impl.unavailable.get('save_load', 'not declared')}")
    return impl


@pytest.mark.parametrize("name", VARIANTS)
def test_refused_load_keeps_live_rows(name, tmp_path):
    """exact (the issue's repro): save a prioritized buffer holding x = 0..5,
    load it into a random-sampler buffer holding x = [100, 101]: the load is
    refused (the sampler differs) and contents() still shows [100, 101]."""
    impl = variant(name)
    spec = BufferSpec(capacity=8, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=11)
    source = impl.make(spec)
    source.extend(rows(6))
    source.save(tmp_path / "ckpt")
    target = impl.make(spec.but(sampler="random", seed=12))
    target.extend(rows(2, 100))
    before = target.contents()
    assert not bool((before["action"] == source.contents()["action"][:2]).any()), "test data overlap"
    with pytest.raises(CheckpointError, match="sampler"):
        target.load(tmp_path / "ckpt")
    after = target.contents()
    assert after["action"].tolist() == [100, 101], f"contents after a refused load={after['action'].tolist()}"
    assert same(after.to_dict(), before.to_dict())


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("late", ["sampler", "writer", "generator"])
def test_load_refused_after_the_storage_was_staged_changes_nothing(name, late, tmp_path):
    """exact: a state whose storage part is valid but whose writer, sampler or
    generator part is not (the last two refused after the storage was staged)
    leaves the buffer's whole state as it was, live rows included."""
    impl = variant(name)
    spec = BufferSpec(capacity=8, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=11)
    source = impl.make(spec)
    source.extend(rows(6))
    state = source.buffer.state_dict()
    if late == "sampler":
        state["sampler"] = {**state["sampler"], "alpha": -1.0}
    elif late == "writer":
        state["writer"] = {**state["writer"], "write_count": -1}
    else:
        state["generator"] = torch.zeros(3, dtype=torch.uint8)
    target = impl.make(spec.but(seed=12))
    target.extend(rows(3, 100))
    before = cpu(target.buffer.state_dict())
    with pytest.raises(ValueError):
        target.buffer.load_state_dict(state)
    assert same(cpu(target.buffer.state_dict()), before)
    assert target.contents()["action"].tolist() == [100, 101, 102]


@pytest.mark.parametrize("name", VARIANTS)
def test_reload_after_a_refused_load_and_keep_writing(name, tmp_path):
    """exact: after a refused load, a valid load of the same layout and further
    writes and samples behave as on the reference (the reused rows are the
    live buffer's own, written only after the load was accepted)."""
    impl, ref = variant(name), load_adapter("reference")
    spec = BufferSpec(capacity=8, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=11)
    good = ref.make(spec)
    good.extend(rows(6))
    good.save(tmp_path / "good")
    bad = ref.make(spec.but(sampler="random"))
    bad.extend(rows(5, 50))
    bad.save(tmp_path / "bad")
    bufs = [impl.make(spec.but(seed=3)), ref.make(spec.but(seed=3))]
    for buf in bufs:
        buf.extend(rows(4, 200))
        with pytest.raises(CheckpointError):
            buf.load(tmp_path / "bad")
        buf.load(tmp_path / "good")
        buf.extend(rows(3, 300))
    got, want = bufs
    assert same(cpu(got.buffer.state_dict()), want.buffer.state_dict())
    (r1, i1), (r2, i2) = got.sample(5), want.sample(5)
    assert same(r1.cpu().to_dict(), r2.to_dict()) and same(cpu(dict(i1)), dict(i2))
