"""Re-sealed checkpoints whose state contradicts itself are refused (exact;
issue 39, item 6).

The checksum of ``meta.json`` and the digest of the tensor file are no trust
boundary: anyone can recompute them. A checkpoint of a full 8-slot
prioritized buffer whose ``write_count`` was set to 3 and re-sealed loaded
as a buffer of 3 rows whose every ``sample`` raised (the leaves of slots it
no longer held were non-zero), and the state before the load was gone.
Unknown keys in the state were ignored. Each load here, by the reference and
by the ``device`` and ``triton`` variants, must raise ``CheckpointError``
naming the field, with "but should", and leave the buffer exactly as before;
an untouched re-sealed checkpoint, and legitimate corner states (no rows; a
zero priority with ``eps=0``; a priority far above the start), still load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.checkpoint_damage import CONTRADICTIONS, reseal
from rbcheck.harness.protocol import BufferSpec
from rbcheck.reference import CheckpointError

from ..unit.test_buffer import same
from ..variants.common import cpu, rows

IMPLS = ("reference", "device", "triton")
SPEC = BufferSpec(capacity=8, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=3)


def adapter(name: str):
    impl = load_adapter(name)
    if not impl.has("save_load"):
        pytest.skip(f"{name}: save_load unavailable: {impl.unavailable.get('save_load', 'not declared')}")
    return impl


def target(impl, spec: BufferSpec = SPEC):
    """A buffer holding other rows (state that a load must not destroy)."""
    buf = impl.make(spec.but(seed=spec.seed + 1))
    buf.extend(rows(3, 100))
    return buf


def refused(impl, path: Path, field: str, spec: BufferSpec = SPEC) -> str:
    """Load ``path`` into a buffer holding other rows; it must be refused
    naming ``field``, the buffer's whole state (generator included) unchanged
    and still sampling. The error's message."""
    buf = target(impl, spec)
    before = cpu(buf.buffer.state_dict())
    with pytest.raises(CheckpointError) as caught:
        buf.load(path)
    message = str(caught.value)
    assert "but should" in message and field in message, f"unclear error: {message}"
    assert same(cpu(buf.buffer.state_dict()), before), f"a refused load changed the buffer ({message})"
    buf.sample(4)  # the state before is intact and usable
    return message


@pytest.mark.parametrize("name", IMPLS)
def test_full_buffer_said_to_hold_three_rows_is_refused(name, tmp_path):
    """The issue's case: a full 8-slot prioritized checkpoint, ``write_count``
    set to 3 and re-sealed, is refused, naming ``write_count``; the buffer
    loaded into keeps its rows and still samples."""
    impl = adapter(name)
    buf = impl.make(SPEC)
    buf.extend(rows(10))
    buf.update_priority(torch.tensor([1, 4]), torch.tensor([5.0, 0.5]))
    buf.save(tmp_path / "ckpt")
    assert reseal(tmp_path / "ckpt", lambda state, tensors: state["writer"].update(write_count=3))
    refused(impl, tmp_path / "ckpt", "write_count")


def source(impl, spec: BufferSpec = SPEC):
    """The buffer of the catalogue (``checkpoint_state.source``): 6 rows of 8,
    priorities 5.0 and 0.5 at slots 1 and 4."""
    buf = impl.make(spec)
    buf.extend(rows(6))
    if spec.sampler == "prioritized":
        buf.update_priority(torch.tensor([1, 4]), torch.tensor([5.0, 0.5]))
    return buf


@pytest.mark.parametrize("contradiction", sorted(CONTRADICTIONS))
@pytest.mark.parametrize("name", IMPLS)
def test_each_contradiction_is_refused_naming_its_field(name, contradiction, tmp_path):
    """Each contradiction of the catalogue (prioritized buffer) is refused,
    naming its field, and leaves the buffer as it was."""
    impl, case = adapter(name), CONTRADICTIONS[contradiction]
    source(impl).save(tmp_path / "ckpt")
    assert reseal(tmp_path / "ckpt", case.edit)
    refused(impl, tmp_path / "ckpt", case.field)


@pytest.mark.parametrize("contradiction", sorted(c for c in CONTRADICTIONS if not CONTRADICTIONS[c].needs))
def test_unknown_keys_are_refused_for_a_uniform_sampler(contradiction, tmp_path):
    """Unknown keys are refused whatever the sampler (the reference's uniform one)."""
    impl, spec = adapter("reference"), SPEC.but(sampler="random")
    source(impl, spec).save(tmp_path / "ckpt")
    assert reseal(tmp_path / "ckpt", CONTRADICTIONS[contradiction].edit)
    refused(impl, tmp_path / "ckpt", CONTRADICTIONS[contradiction].field, spec)


def corner_states():
    def empty(buf):
        pass

    def zero_priority(buf):
        buf.extend(rows(5))
        buf.update_priority(torch.tensor([0, 2]), torch.tensor([0.0, 3.0]))

    def huge_priority(buf):
        buf.extend(rows(11))
        buf.update_priority(torch.tensor([6]), torch.tensor([1e150], dtype=torch.float64))
        buf.extend(rows(2, 40))

    return {"no_rows": (empty, SPEC), "zero_priority_eps_0": (zero_priority, SPEC.but(eps=0.0)),
            "huge_priority_wrapped": (huge_priority, SPEC.but(alpha=2.0))}


@pytest.mark.parametrize("corner", sorted(corner_states()))
@pytest.mark.parametrize("name", IMPLS)
def test_consistent_states_still_load_exactly(name, corner, tmp_path):
    """Control: a re-sealed checkpoint left as it was, of a buffer with no
    rows, with a zero priority (``eps=0``) or with a priority whose transform
    is near float64's top, loads exactly (the checks refuse no legitimate state)."""
    impl = adapter(name)
    fill, spec = corner_states()[corner]
    buf = impl.make(spec)
    fill(buf)
    buf.save(tmp_path / "ckpt")
    assert reseal(tmp_path / "ckpt", lambda state, tensors: None)
    loaded = target(impl, spec)
    loaded.load(tmp_path / "ckpt")
    assert same(cpu(loaded.buffer.state_dict()), cpu(buf.buffer.state_dict()))


def test_a_leaf_a_few_ulp_above_the_max_priority_still_loads(tmp_path):
    """Control of the max-priority check's slack: the leaf of the row holding
    the max priority, a few ulp above its transform on this CPU (as float64
    ``pow`` on a GPU may give), loads exactly; one a part in a billion above
    is refused, naming ``max_priority``."""
    impl = adapter("reference")
    buf = source(impl)
    slot = int(torch.argmax(buf.buffer.sampler.sum_tree.leaf(torch.arange(8))))

    def nudge(by):
        def edit(state, tensors):
            leaves = tensors[state["sampler"]["sum_tree"]["leaves"]["tensor"]]
            leaves[slot] = by(leaves[slot])
        return edit

    up = torch.tensor(float("inf"), dtype=torch.float64)
    buf.save(tmp_path / "ulp")
    assert reseal(tmp_path / "ulp", nudge(lambda v: torch.nextafter(torch.nextafter(v, up), up)))
    loaded = target(impl)
    loaded.load(tmp_path / "ulp")
    assert loaded.buffer.sampler.sum_tree.leaf(torch.tensor([slot])) > buf.buffer.sampler.sum_tree.leaf(
        torch.tensor([slot]))
    buf.save(tmp_path / "far")
    assert reseal(tmp_path / "far", nudge(lambda v: v * (1 + 1e-9)))
    refused(impl, tmp_path / "far", "max_priority")
