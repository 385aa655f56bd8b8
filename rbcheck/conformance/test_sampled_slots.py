"""What a prioritized sample returns: live slots, and weights that belong
to them (the catalogue of invariants: live slots, weights, repeated slots).

* every sampled slot is a live slot and the weight returned belongs to it:
  at every fill level, right after the ring became exactly full, after many
  priority updates over a wide range, over large batches and (shared
  randomness) at the extreme uniforms; info tensors on the buffer's device;
* an update with a repeated slot follows one rule (the last entry wins):
  the sampling frequencies follow it (distributional), not only the leaves.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_chi_square,
    assert_close,
    assert_td_equal,
    fail,
    weight_tolerance,
)
from rbcheck.harness.oracle import start_prioritized
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout, scale_limit, training_batch_sizes

#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
#: uniforms at the ends of [0, 1): where a float32 prefix search runs past the filled part
EXTREME_UNIFORMS = [0.0, 2.0**-53, 0.5, 1 - 2.0**-24, 1 - 2.0**-30, 1 - 2.0**-53]
#: priorities over twelve orders of magnitude (float32 sums lose the small ones)
WIDE = [0.0, 1e-6, 1e-3, 0.5, 1.0, 3.0, 1e3, 1e6]


def _sample(buf, k: int, trace: Trace, when: str):
    try:
        return buf.sample(k)
    except Exception as err:  # noqa: BLE001 - a raising sample is the failure reported
        fail(f"buf.sample({k}) {when}", f"<raised {type(err).__name__}: {err}>",
             "a batch of live slots", trace)


def _check_batch(buf, rows, info, k: int, oracle, trace: Trace, when: str, impl) -> None:
    index = info.get("index")
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or tuple(index.shape) != (k,):
        got = f"<{getattr(index, 'dtype', type(index).__name__)}{list(getattr(index, 'shape', []))}>"
        fail(f"info['index'] {when}", got, f"torch.int64[{k}]", trace)
    n = len(buf)
    idx = index.cpu()
    bad = (idx < 0) | (idx >= n)
    if bool(bad.any()):
        fail(f"info['index'] {when}", idx[bad][:8], f"live slots in [0, len(buf)={n})", trace)
    assert_td_equal(f"sample rows {when}", rows, buf.contents()[idx], trace, check_device=False)
    if oracle is None:
        return
    weight = info.get("weight")
    if not isinstance(weight, torch.Tensor):
        fail(f"sorted(info) {when}", sorted(info), "a dict with 'weight'", trace)
    if weight.device != index.device:
        fail(f"info['weight'].device {when}", str(weight.device), f"{index.device} (info['index']'s)", trace)
    conv = impl.conventions
    tol = weight_tolerance(conv.priority_dtype, n, weight.dtype)
    assert_close(f"info['weight'] of the returned slots {when}", weight, oracle.weights(idx), trace, tol=tol)


@st.composite
def live_setups(draw):
    capacity = draw(st.integers(2, 16), label="capacity")
    chunk = draw(st.integers(1, capacity), label="rows per extend")
    alpha = draw(st.sampled_from([0.6, 1.0]), label="alpha")
    return capacity, chunk, alpha, draw(st.integers(0, 2**16), label="seed")


@pytest.mark.requires("prioritized")
@given(setup=live_setups(), data=st.data())
def test_sampled_slots_are_live_and_weights_belong_to_them(impl, setup, data):
    """exact (slots, rows) and tolerance tied to the declared dtype (weights):
    from one row to exactly full (cursor back at 0) to wrapped, after rounds
    of updates with priorities from 0 to 1e6, every sampled slot is in
    [0, len), its row is the stored row, its weight equals the closed form for
    THAT slot (over the declared normaliser; on the index's device), in
    batches of 1 to 4096 draws (a training loop's 32..256 among them; an
    adapter's cost hint ``sample_batch`` may bound them) and in a batch of
    2**16 draws; with shared randomness the extreme uniforms
    (0, 1 - 2**-53, ...) map to live slots too."""
    capacity, chunk, alpha, seed = setup
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=alpha, beta=0.6, eps=1e-6,
                      seed=seed, layout=LAYOUT.spec_layout())
    conv = impl.conventions
    hint = scale_limit(impl, "sample_batch")  # an adapter's cost hint bounds the drawn batches
    batch = training_batch_sizes(hint[0] if hint else 4096)
    trace, buf, oracle, layout = start_prioritized(impl, spec, LAYOUT, record=True)
    written = 0
    for stage in range(data.draw(st.integers(2, 4), label="stages")):
        n = min(chunk, 2 * capacity - written) if written < 2 * capacity else chunk
        buf.extend(layout.batch(written, n))
        oracle.write(n)
        written += n
        when = f"after {written} rows (capacity {capacity})"
        for _ in range(data.draw(st.integers(0, 3), label=f"update rounds {stage}")):
            if not bool((oracle.leaves() > 0).any()):
                break
            k = data.draw(batch, label="batch size")
            rows, info = _sample(buf, k, trace, when)
            _check_batch(buf, rows, info, k, oracle, trace, when, impl)
            wide = [w for w in WIDE if conv.admits(w)]  # no 0 for a buffer that refuses it
            raw = data.draw(st.lists(st.sampled_from(wide), min_size=8, max_size=8), label="priorities")
            raw = (raw * -(-k // 8))[:k]  # a batch of k: the 8 drawn, repeated along it
            index = info["index"].cpu()
            buf.update_priority(index, conv.priorities(raw))
            oracle.update(index, raw)
        if not bool((oracle.leaves() > 0).any()):
            continue
        k = data.draw(batch, label="batch size")
        rows, info = _sample(buf, k, trace, when)
        _check_batch(buf, rows, info, k, oracle, trace, when, impl)
        if impl.has("shared_rng"):
            u = torch.tensor(EXTREME_UNIFORMS, dtype=torch.float64)
            got = torch.as_tensor(buf.indices_from_uniforms(u)).cpu()
            bad = (got < 0) | (got >= len(buf))
            if bool(bad.any()):
                fail(f"indices_from_uniforms(extreme uniforms) {when}", got,
                     f"live slots in [0, len(buf)={len(buf)})", trace,
                     f"uniforms {[x for x, b in zip(EXTREME_UNIFORMS, bad.tolist(), strict=True) if b]}")
    if bool((oracle.leaves() > 0).any()):
        big = 1 << 16
        rows, info = _sample(buf, big, trace, "in a large batch")
        _check_batch(buf, rows, info, big, oracle, trace, "in a large batch", impl)


@pytest.mark.requires("prioritized")
@pytest.mark.parametrize("case", range(3))
def test_update_with_repeated_slots_samples_by_the_last_entry(impl, case):
    """distributional (chi-square, false-alarm rate 1e-4): after
    update_priority with a slot repeated (the last entry wins, the rule of
    the spec), slots are drawn with probability (p_last + eps)^alpha / sum:
    the tree's inner sums must follow the leaves, not the sum of every entry."""
    capacity = 6
    spec = BufferSpec(capacity=capacity, sampler="prioritized", alpha=1.0, beta=0.4, eps=1e-3,
                      seed=31 + case, layout=LAYOUT.spec_layout())
    conv = impl.conventions
    trace, buf, oracle, _ = start_prioritized(impl, spec, LAYOUT, fill=capacity, record=True)
    updates = [
        ([0, 0, 1, 2, 0], [50.0, 40.0, 1.0, 2.0, 0.5]),
        ([3, 3, 3, 4, 5], [0.1, 20.0, 8.0, 1.0, 1.0]),
        ([5, 1, 5, 1, 2, 2], [30.0, 30.0, 1.0, 2.0, 9.0, 0.25]),
    ][case]
    index, raw = updates
    buf.update_priority(torch.tensor(index), conv.priorities(raw))
    oracle.update(torch.tensor(index), raw)
    counts = torch.zeros(capacity, dtype=torch.float64)
    for _ in range(4):
        _, info = buf.sample(5000)
        idx = info["index"].cpu()
        bad = (idx < 0) | (idx >= capacity)
        if bool(bad.any()):
            fail("info['index']", idx[bad][:8], f"live slots in [0, {capacity})", trace)
        counts += torch.bincount(idx, minlength=capacity).to(torch.float64)
    probs = oracle.draw_probabilities(1)[0]
    assert_chi_square("slot frequencies after an update with repeated slots", counts, probs, trace,
                      false_alarm=FALSE_ALARM)
