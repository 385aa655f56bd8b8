"""Differential (exact): a checkpoint written by the reference loads into each
variant, and the variant's checkpoint back into the reference, bit for bit:
the variants reuse the reference's format. Damaged checkpoints are refused by
the variants as by the reference, with their state unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.protocol import BufferSpec
from rbcheck.reference import CheckpointError

from ..unit.test_buffer import same
from ..variants.common import VARIANTS, cpu, rows, specs

SPECS = specs(7)


def adapter(name: str):
    impl = load_adapter(name)
    if not impl.has("save_load"):
        pytest.skip(f"{name}: save_load unavailable: {impl.unavailable.get('save_load', 'not declared')}")
    return impl


def filled(impl, spec: BufferSpec):
    buf = impl.make(spec)
    buf.extend(rows(9))
    if spec.sampler == "prioritized":
        buf.update_priority(torch.tensor([0, 3]), torch.tensor([3.0, 0.0]))
    buf.sample(4)
    return buf


@pytest.mark.parametrize("sampler", sorted(SPECS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_checkpoint_round_trips_through_a_variant(variant, sampler, tmp_path):
    """exact: reference -> variant -> reference gives the reference's state
    bit for bit, and the next samples agree."""
    spec = SPECS[sampler]
    ref, var = load_adapter("reference"), adapter(variant)
    original = filled(ref, spec)
    original.save(tmp_path / "ref")
    middle = var.make(spec.but(seed=99))
    middle.extend(rows(2, 50))
    middle.load(tmp_path / "ref")
    assert same(cpu(middle.buffer.state_dict()), original.buffer.state_dict())
    middle.save(tmp_path / "var")
    back = ref.make(spec.but(seed=98))
    back.load(tmp_path / "var")
    assert same(back.buffer.state_dict(), original.buffer.state_dict())
    for buf in (middle, back):
        (r1, i1), (r2, i2) = buf.sample(4), _copy(ref, spec, original).sample(4)
        assert (r1.cpu() == r2).all() and same(cpu(dict(i1)), dict(i2))


def _copy(ref, spec, buf):
    twin = ref.make(spec.but(seed=97))
    twin.buffer.load_state_dict(buf.buffer.state_dict())
    return twin.buffer


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_refuses_a_damaged_reference_checkpoint(variant, tmp_path):
    """exact: a checkpoint with a changed value (checksum not updated) or of
    another capacity is refused and the variant's state is unchanged."""
    spec = SPECS["prioritized"]
    filled(load_adapter("reference"), spec).save(tmp_path / "ckpt")
    var = adapter(variant)
    buf = var.make(spec.but(seed=99))
    buf.extend(rows(2, 50))
    before = cpu(buf.buffer.state_dict())
    live = tmp_path / "ckpt" / (tmp_path / "ckpt" / "CURRENT").read_text().strip()
    meta = json.loads((live / "meta.json").read_text())
    meta["state"]["sampler"]["max_priority"] = 1e9
    (live / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="checksum"):
        buf.load(tmp_path / "ckpt")
    assert same(cpu(buf.buffer.state_dict()), before)
    other = var.make(spec.but(capacity=9))
    filled(load_adapter("reference"), spec).save(tmp_path / "ok")
    before = cpu(other.buffer.state_dict())
    with pytest.raises(CheckpointError, match="capacity"):
        other.load(tmp_path / "ok")
    assert same(cpu(other.buffer.state_dict()), before)
