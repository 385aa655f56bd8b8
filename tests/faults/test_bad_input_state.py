"""Bad input leaves the WHOLE state unchanged in our implementations (exact).

The conformance catalogue (``rbcheck/conformance/test_bad_input.py``) checks
what any implementation exposes. Here the reference and the variants are
held to more: after each refused call the full ``state_dict()`` -- storage,
cursor, write count, per-slot write generations, both trees, max priority,
sampler parameters and the generator state -- is bit-identical, and the
error is a ``ValueError`` / ``TypeError`` / ``IndexError`` reading
``<arg>...=<got>, but should be <allowed>``.
"""

from __future__ import annotations

import re

import pytest

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.bad_input import CATALOGUE, ZERO_CASES, fill

from ..unit.test_buffer import same
from .test_variant_checkpoints import cpu

IMPLS = ["reference", "device", "triton"]


@pytest.fixture(scope="module", params=IMPLS)
def own(request):
    return load_adapter(request.param)


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.id for c in CATALOGUE])
def test_refused_call_changes_nothing_at_all(own, case):
    """exact: message names the argument; state_dict() bit-identical."""
    missing = [cap for cap in (*case.needs, case.spec.sampler) if not own.has(cap)]
    if missing:
        pytest.skip(f"{own.name}: {missing[0]} not declared or unavailable")
    if case.id in ZERO_CASES and not own.conventions.positive_priorities:
        pytest.skip("spec: a priority of 0 is allowed (bad input only under positive_priorities)")
    buf = own.make(case.spec)
    if not case.empty:
        fill(buf, case.spec, own.conventions)
    if case.setup is not None:
        case.setup(buf, own.conventions)
    before = cpu(buf.buffer.state_dict())
    with pytest.raises((ValueError, TypeError, IndexError)) as info:
        case.call(buf, own.conventions)
    assert re.search(re.escape(case.arg) + r"[^=]{0,40}=.*, but should be ", str(info.value), re.S), \
        f"message {str(info.value)!r} does not name {case.arg!r} as '<arg>=<got>, but should be <allowed>'"
    assert same(cpu(buf.buffer.state_dict()), before), f"{case.id}: state changed by a refused call"


def test_priority_key_none_ignores_a_priority_column(own):
    """exact: with ``priority_key=None`` a "priority" column is plain data:
    new rows get the max priority (the variants once raised a TypeError)."""
    import torch
    from tensordict import TensorDict

    from rbcheck.harness.protocol import BufferSpec

    buf = own.make(BufferSpec(capacity=4, sampler="prioritized", alpha=1.0, eps=0.0))
    buf.buffer.priority_key = None
    buf.extend(TensorDict({"x": torch.arange(2), "priority": torch.tensor([5.0, 6.0])}, [2]))
    assert buf.max_priority == 1.0
    assert buf.stored_priority(torch.arange(2)).tolist() == [1.0, 1.0]


def test_a_generator_state_of_another_device_kind_is_refused_by_name(own):
    """exact: a state whose generator is another kind's (a CUDA generator's 16 bytes
    in a CPU buffer's state) is refused naming the generator; nothing changes."""
    import torch

    from rbcheck.harness.protocol import BufferSpec

    buf = own.make(BufferSpec(capacity=8))
    fill(buf, BufferSpec(capacity=8), own.conventions)
    before = cpu(buf.buffer.state_dict())
    state = buf.buffer.state_dict()
    state["generator"] = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"generator state=16 bytes .*, but should be the state of a cpu"):
        buf.buffer.load_state_dict(state)
    assert same(cpu(buf.buffer.state_dict()), before)
