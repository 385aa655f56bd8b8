"""Offline-to-online mixing (``spec.mixing = (offline_size, fraction)``,
reference/mixing.py): a fixed offline dataset (``reference.mixing.
offline_rows``, negative ids) beside an online ring written by ``extend``.

The declared rules: each batch draws its rows from the two sources in the
declared proportion (``Conventions.hindsight["mix_count"]``,
harness/her_laws.py: each draw offline with probability ``fraction``, or
exactly ``round(fraction * B)`` offline rows), every row from the offline
dataset only while the ring is empty; an offline row is the dataset's row,
intact, however many online rows were written, and every one of them is
still drawn (uniformly); an online row is one of the last ``capacity``
written.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, assert_binomial, assert_chi_square, assert_same, assert_td_equal, fail
from rbcheck.harness.her_laws import exact_count, hindsight
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout
from rbcheck.reference.mixing import offline_rows

pytestmark = [pytest.mark.requires("mixing"), pytest.mark.conventions("hindsight")]
#: probability that one distributional check fails on a correct implementation
FALSE_ALARM = 1e-4
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)


def mixing_setup(data, written_low: int = 0):
    size = data.draw(st.integers(1, 48), label="offline rows")
    capacity = data.draw(st.integers(1, 48), label="online capacity")
    spec = BufferSpec(capacity=capacity, seed=data.draw(st.integers(0, 2**16), label="seed"),
                      layout=LAYOUT.spec_layout(),
                      mixing=(size, data.draw(st.sampled_from(FRACTIONS), label="offline fraction")))
    written = data.draw(st.integers(written_low, 4 * capacity + 8), label="online rows written")
    return spec, written


def sample_checked(buf, spec: BufferSpec, written: int, batches, impl, trace: Trace) -> tuple[int, int, torch.Tensor]:
    """Sample each size of ``batches``; check every row; return (offline, total, offline id counts)."""
    size, fraction = spec.mixing
    offline, first_online = offline_rows(size), max(0, written - spec.capacity)
    rule = hindsight(impl.conventions, "mix_count")
    from_offline, total, counts = 0, 0, torch.zeros(size, dtype=torch.float64)
    for k, b in enumerate(batches):
        rows, _ = buf.sample(b)
        what = f"batch {k} of {b} ({written} online rows written, capacity {spec.capacity})"
        ids = rows["id"].cpu().reshape(-1).long()
        assert_same(f"rows of {what}", len(ids), b, trace)
        off = ids < 0
        bad = ids[(off & (ids < -size)) | (~off & ((ids < first_online) | (ids >= written)))]
        if len(bad):
            fail(f"row ids of {what}", bad[:8].tolist(), f"offline ids in [-{size}, -1] or held online ids in "
                 f"[{first_online}, {written})", trace)
        if off.any():
            assert_td_equal(f"offline rows of {what}", rows[off].cpu().select("id", "obs"),
                            offline[-1 - ids[off]], trace, check_device=False)
        if (~off).any():
            assert_td_equal(f"online rows of {what}", rows[~off].cpu().select("id", "obs"),
                            LAYOUT.batch(0, written)[ids[~off]], trace, check_device=False)
        want = b if written == 0 else exact_count(rule, fraction, b)
        if want is not None:
            assert_same(f"offline rows of {what} (mix_count={rule!r})", int(off.sum()), want, trace)
        from_offline, total = from_offline + int(off.sum()), total + b
        counts += torch.bincount(-1 - ids[off], minlength=size).double()
    return from_offline, total, counts


@given(data=st.data())
def test_batches_mix_the_sources_in_the_declared_proportion(impl, data):
    """distributional (binomial, false-alarm rate 1e-4) or exact: with the
    online ring empty, partly filled or wrapped, 2000 rows in batches of
    1..8 or 32..256: every row is an intact offline row or a held online
    row, and the offline share is Binomial(2000, fraction) under
    ``mix_count="per_draw"`` (the spec), exactly ``round(fraction * B)`` of
    each batch under ``"round"``; every row offline while the ring is empty."""
    spec, written = mixing_setup(data)
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    if written:
        buf.extend(layout.batch(0, written))
    from rbcheck.harness.scale import batch_schedule

    small = data.draw(st.booleans(), label="batches of 1..8 (else 32..256)")
    batches = batch_schedule(1000, 1, 8) if small else batch_schedule(2000, 32, 256)
    from_offline, total, _ = sample_checked(buf, spec, written, batches, impl, trace)
    if written and hindsight(impl.conventions, "mix_count") == "per_draw":
        assert_binomial(f"offline rows of {total} sampled (fraction {spec.mixing[1]})", from_offline, total,
                        spec.mixing[1], trace, false_alarm=FALSE_ALARM)


@given(data=st.data())
def test_offline_data_is_never_overwritten(impl, data):
    """distributional (chi-square, false-alarm rate 1e-4) and exact: after
    online writes that wrap the ring several times, written one row at a time
    or in blocks, every offline row is still drawn, uniformly over the
    dataset, and intact (``len`` counts both sources)."""
    spec, written = mixing_setup(data, written_low=1)
    written += 2 * spec.capacity + spec.mixing[0]
    trace = Trace(impl, spec)
    layout = trace.source("layout", LAYOUT)
    buf = trace.wrap(impl.make(spec))
    block = data.draw(st.integers(1, 16), label="rows per extend")
    for s in range(0, written, block):
        buf.extend(layout.batch(s, min(block, written - s)))
    size = spec.mixing[0]
    assert_same("len(buf) (offline rows + held online rows)", len(buf), size + spec.capacity, trace)
    from rbcheck.harness.scale import batch_schedule

    total = max(2000, int(40 * size / spec.mixing[1]))
    _, _, counts = sample_checked(buf, spec, written, batch_schedule(total, 32, 256), impl, trace)
    if size > 1:
        assert_chi_square(f"draws of each offline row after {written} online writes", counts,
                          torch.full((size,), 1.0 / size), trace, false_alarm=FALSE_ALARM)
    elif counts.sum() == 0:
        fail(f"draws of the one offline row after {written} online writes", 0, "at least one", trace)
