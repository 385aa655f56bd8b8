"""``sample``'s fast path (rbcheck.variants.sample_fast) against the reference, bit for bit.

Each program of extends, priority updates and samples runs on three buffers:
the reference, the variant with the fast path and the variant without it.
Every sample's rows, index, weights and generations (keys, dtypes, bits) and
the generator's state after it are the reference's. A call the fast path does
not take raises the reference's error without drawing. The fast path is
checked to be the one taken, and the comparison to be able to fail.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck import reference, variants
from rbcheck.variants import native, sample_fast
from rbcheck.variants.native import torch_pow
from tests.variants.common import use_library
from tests.variants.test_differential import assert_state_equal

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load: "
                                "the fast path needs it")


def batch(n: int, start: int, nested: bool, priority=None) -> TensorDict:
    """obs float32[3] (its first field the row number), action int64, episode int64 (four
    rows each), a reward (nested or not)."""
    x = torch.arange(start, start + n)
    td = TensorDict({"obs": torch.stack([x.float(), x / 3, -x.float()], 1), "action": x % 5,
                     "episode": x // 4}, batch_size=[n])
    td.set(("next", "reward") if nested else "reward", x.double() / 7)
    if priority is not None:
        td.set("priority", torch.as_tensor(priority, dtype=torch.float32))
    return td


def three(capacity: int, sampler: str, alpha=0.6, beta=0.4, eps=1e-8, seed=3):
    """(reference, variant with the fast path, variant without it), built alike."""
    def make(mod):
        if sampler == "prioritized":
            return mod.PrioritizedSampler(capacity, alpha, beta, eps)
        return mod.RandomSampler()
    ref = reference.ReplayBuffer(capacity, sampler=make(reference), generator=seed)
    fast, slow = (variants.ReplayBuffer(capacity, sampler=make(variants), generator=seed, device="cpu")
                  for _ in range(2))
    return ref, fast, slow


@contextlib.contextmanager
def full_path(monkeypatch):
    """Within the block the buffer's sample takes its full path."""
    with monkeypatch.context() as m:
        m.setattr(sample_fast, "ENABLED", False)
        yield


def assert_same_sample(got, want, where: str) -> None:
    (rows, info), (want_rows, want_info) = got, want
    assert list(info) == list(want_info), f"{where}: info keys={list(info)}, but should be {list(want_info)}"
    assert_state_equal(dict(info), dict(want_info), f"{where}.info")
    assert_state_equal(rows.to_dict(), want_rows.to_dict(), f"{where}.rows")
    assert rows.batch_size == want_rows.batch_size


def sample_all(bufs, n: int, monkeypatch, where: str) -> None:
    """Sample ``n`` from (reference, fast, slow): the same results and generator states."""
    ref, fast, slow = bufs
    want = ref.sample(n)
    assert_same_sample(fast.sample(n), want, f"{where} fast")
    with full_path(monkeypatch):
        assert_same_sample(slow.sample(n), want, f"{where} full")
    for var in (fast, slow):
        assert torch.equal(var.generator.get_state(), ref.generator.get_state()), where


programs = st.lists(st.one_of(
    st.tuples(st.just("extend"), st.integers(1, 9), st.lists(st.sampled_from([0.0, 1e-300, 0.5, 3.25, 1e6])
                                                             | st.floats(0, 50), min_size=9, max_size=9)),
    st.tuples(st.just("update"), st.integers(1, 9), st.lists(st.floats(0, 50), min_size=9, max_size=9)),
    st.tuples(st.just("sample"), st.integers(1, 40), st.just([])),
), min_size=1, max_size=12)


@settings(deadline=None)
@given(capacity=st.integers(1, 20), program=programs, sampler=st.sampled_from(["prioritized", "uniform"]),
       nested=st.booleans(), alpha=st.sampled_from([0.0, 0.6, 1.0]), beta=st.sampled_from([0.0, 0.4, 1.0]),
       eps=st.sampled_from([0.0, 1e-8]), seed=st.integers(0, 2**16))
def test_samples_are_the_references_bit_for_bit(capacity, program, sampler, nested, alpha, beta, eps, seed):
    """exact: after any program of extends and updates, each sample of the fast path and of
    the full path is the reference's (rows, info, generator state); a refused sample
    raises the reference's error without drawing, on both paths."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_program(three(capacity, sampler, alpha, beta, eps, seed), program, sampler, nested, monkeypatch)


def run_program(bufs, program, sampler: str, nested: bool, monkeypatch) -> None:
    start = 0
    for step, (op, n, values) in enumerate(program):
        where = f"step {step} ({op} {n})"
        if op == "extend":
            data = batch(n, start, nested, values[:n] if sampler == "prioritized" else None)
            start += n
            for buf in bufs:
                buf.extend(data.clone())
        elif op == "update" and sampler == "prioritized" and len(bufs[0]):
            index = torch.arange(n) % len(bufs[0])
            for buf in bufs:
                buf.update_priority(index, torch.tensor(values[:n], dtype=torch.float64))
        elif op == "sample":
            try:
                want = bufs[0].sample(n)
            except ValueError as err:  # empty, or a total priority of 0: the same error, no draw
                for buf, path in ((bufs[1], contextlib.nullcontext()), (bufs[2], full_path(monkeypatch))):
                    with path, pytest.raises(ValueError) as raised:
                        buf.sample(n)
                    assert str(raised.value) == str(err), where
                    assert torch.equal(buf.generator.get_state(), bufs[0].generator.get_state()), where
                continue
            assert_same_sample(bufs[1].sample(n), want, f"{where} fast")
            with full_path(monkeypatch):
                assert_same_sample(bufs[2].sample(n), want, f"{where} full")


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_the_fast_path_is_taken(sampler, monkeypatch):
    """With the samplers' own ``sample`` made to fail, the buffer still samples (the fast
    path ran); with the fast path off the failure shows (the patch bites)."""
    ref, fast, slow = three(64, sampler)
    for buf in (ref, fast, slow):
        buf.extend(batch(50, 0, False, torch.rand(50, generator=torch.Generator().manual_seed(1))))
    want = ref.sample(16)

    def broken(*args, **kwargs):
        raise AssertionError("the sampler's own sample ran")
    monkeypatch.setattr(type(fast.sampler), "sample", broken)
    assert_same_sample(fast.sample(16), want, "fast")
    with full_path(monkeypatch), pytest.raises(AssertionError, match="own sample ran"):
        slow.sample(16)


def test_a_large_batch_split_over_threads_is_the_references(monkeypatch):
    """``THREADED`` draws and more: the descent may split over torch's threads; the same bits."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    bufs = three(1 << 12, "prioritized")
    data = batch(1 << 12, 0, False, torch.rand(1 << 12, generator=torch.Generator().manual_seed(2)))
    for buf in bufs:
        buf.extend(data.clone())
    sample_all(bufs, sample_fast.THREADED + 5, monkeypatch, "threaded")


class _RowsSpy:
    """The native library, recording each ``rb_sample_rows`` call's ``do_pow`` and, as a
    mutant, raising the weights' bases to an exponent 1% off."""

    def __init__(self, lib, off: bool = False):
        self._lib, self.off, self.pows = lib, off, []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rb_sample_rows(self, address):
        args = native.SampleArgs.from_address(address)
        self.pows.append(bool(args.do_pow))
        if self.off and args.do_pow:
            args.exponent *= 1.01
        return self._lib.rb_sample_rows(address)


@pytest.mark.parametrize("beta", [0.4, 0.7, 0.123])
def test_the_weights_pow_in_c_is_the_references(beta, monkeypatch):
    """Samples of up to thousands of draws raise their weights' bases to ``-beta`` in C (as
    torch's pow computes it, ``native.torch_pow``): the reference's weights bit for bit,
    the C pow taken; and a C pow with another exponent is caught by the comparison."""
    if not torch_pow.agrees(-beta):
        pytest.skip("torch's pow is not done in C here (capability "
                    f"{torch.backends.cpu.get_cpu_capability()}, or no native library)")
    bufs = three(1 << 12, "prioritized", beta=beta)
    data = batch(1 << 12, 0, False, torch.rand(1 << 12, generator=torch.Generator().manual_seed(3)) * 7)
    for buf in bufs:
        buf.extend(data.clone())
    spy = _RowsSpy(native.lib())
    use_library(monkeypatch, spy)
    for n in (4099, 9, 1):
        sample_all(bufs, n, monkeypatch, f"{n} draws")
    assert spy.pows and all(spy.pows)
    use_library(monkeypatch, _RowsSpy(spy._lib, off=True))
    with pytest.raises(AssertionError, match="weight"):
        sample_all(bufs, 4099, monkeypatch, "mutant")


@pytest.mark.parametrize("batch_size", [0, -3, 2.0, True, "4", None])
@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_a_refused_batch_size_raises_the_references_error_without_drawing(sampler, batch_size):
    ref, fast, _ = three(8, sampler)
    for buf in (ref, fast):
        buf.extend(batch(5, 0, False, [1.0] * 5))
    with pytest.raises(ValueError) as want:
        ref.sample(batch_size)
    with pytest.raises(ValueError) as got:
        fast.sample(batch_size)
    assert str(got.value) == str(want.value)
    assert torch.equal(fast.generator.get_state(), ref.generator.get_state())


def test_an_empty_buffer_and_a_zero_total_raise_the_references_errors():
    for sampler, fill in (("uniform", False), ("prioritized", False), ("prioritized", True)):
        ref, fast, _ = three(8, sampler, eps=0.0)
        if fill:  # every priority 0 and eps 0: the total is 0
            for buf in (ref, fast):
                buf.extend(batch(3, 0, False, [0.0] * 3))
        assert sample_fast.try_sample(fast, 4) is None  # declined before any draw
        with pytest.raises(ValueError) as want:
            ref.sample(4)
        with pytest.raises(ValueError) as got:
            fast.sample(4)
        assert str(got.value) == str(want.value)
        assert torch.equal(fast.generator.get_state(), ref.generator.get_state())


def subnormal_batch() -> TensorDict:
    """Two rows, priorities 3.25 and 5e-324 (float64: the smallest subnormal)."""
    data = batch(2, 0, False)
    data.set("priority", torch.tensor([3.25, 5e-324], dtype=torch.float64))
    return data


@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_a_smallest_priority_that_underflows_is_refused_alike_before_the_draw(beta, monkeypatch):
    """A subnormal smallest priority next to a total of 3.25 (alpha 1, eps 0): ``P_min``
    underflows to 0 (or its power overflows), so the weights' divisor is not a finite float.
    The reference refuses by name before drawing; the fast and the full path alike."""
    bufs = three(2, "prioritized", alpha=1.0, beta=beta, eps=0.0)
    for buf in bufs:
        buf.extend(subnormal_batch())
    with pytest.raises(ValueError, match=r"\(len\(buffer\) \* min priority / total\) \*\* -beta=inf") as want:
        bufs[0].sample(4)
    assert sample_fast.try_sample(bufs[1], 4) is None
    for buf, path in ((bufs[1], contextlib.nullcontext()), (bufs[2], full_path(monkeypatch))):
        with path, pytest.raises(ValueError) as got:
            buf.sample(4)
        assert str(got.value) == str(want.value)
        assert torch.equal(buf.generator.get_state(), bufs[0].generator.get_state())
    assert torch.equal(bufs[0].generator.get_state(), torch.Generator().manual_seed(3).get_state())


def test_with_beta_0_the_same_priorities_sample_with_weights_1(monkeypatch):
    bufs = three(2, "prioritized", alpha=1.0, beta=0.0, eps=0.0)
    for buf in bufs:
        buf.extend(subnormal_batch())
    sample_all(bufs, 8, monkeypatch, "beta 0")
    assert torch.equal(bufs[1].sample(8)[1]["weight"], torch.ones(8))


def test_what_the_fast_path_does_not_cover_takes_the_full_path():
    """A transform, ``pin_memory`` (refused at construction without an accelerator, so
    set after), a sampler of another kind: declined, and the sample is still the
    reference's."""
    cases = []
    ref, var, _ = three(16, "uniform")
    ref.transform = var.transform = lambda td: td.apply(lambda x: x * 2)
    cases.append((ref, var))
    ref, var, _ = three(16, "uniform")
    ref.sampler, var.sampler = reference.SliceSampler(num_slices=2), variants.SliceSampler(num_slices=2)
    cases.append((ref, var))
    for ref, var in cases:
        for buf in (ref, var):
            buf.extend(batch(12, 0, False))
        assert sample_fast.try_sample(var, 4) is None
        assert_same_sample(var.sample(4), ref.sample(4), "declined")
    _, var, _ = three(16, "uniform")
    var.extend(batch(12, 0, False))
    var.pin_memory = True
    assert sample_fast.try_sample(var, 4) is None


def test_the_comparison_catches_a_fast_path_that_misreads_a_generation(monkeypatch):
    """A fast path whose generations are one write count off is caught by ``sample_all``."""
    bufs = three(8, "prioritized")
    for buf in bufs:
        buf.extend(batch(12, 0, False, [1.0] * 12))
    real = sample_fast.try_sample

    def off_by_one(buffer, batch_size):
        writer = buffer.writer
        writer.write_count += 1
        try:
            return real(buffer, batch_size)
        finally:
            writer.write_count -= 1
    monkeypatch.setattr(variants.buffer, "try_sample", off_by_one)
    with pytest.raises(AssertionError, match="generation"):
        sample_all(bufs, 16, monkeypatch, "mutant")


def test_samples_recycle_their_block_only_once_dropped():
    """One block per sample: reused once every tensor of the sample is gone, never while
    a view of any of them lives; a block in use makes the next sample take another."""
    _, var, _ = three(64, "prioritized")
    var.extend(batch(64, 0, False, [1.0] * 64))
    rows, info = var.sample(8)
    pointer = rows["obs"].data_ptr()
    view = info["weight"][2:]
    del rows, info
    again = var.sample(8)
    assert again[0]["obs"].data_ptr() != pointer  # the view keeps the first block
    del view, again
    got = {var.sample(8)[0]["obs"].data_ptr() for _ in range(3)}  # each dropped at once
    assert got == {pointer}  # the first free block in the pool's order: the first one
    held = [var.sample(8) for _ in range(sample_fast.PER_SIZE + 2)]  # more than the pool keeps
    pointers = {h[0]["obs"].data_ptr() for h in held}
    assert len(pointers) == len(held)  # no two live samples share memory
    del held
    first = var.sample(8)[0]["obs"].data_ptr()
    assert var.sample(8)[0]["obs"].data_ptr() == first  # each dropped at once: the same block again


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_concurrent_samples_never_share_a_block(sampler):
    """Two threads sampling one buffer: every sample's rows are the rows of its own
    index (obs[:, 0] is the row number), so no block served both at once."""
    _, var, _ = three(256, sampler)
    var.extend(batch(256, 0, False, torch.rand(256, generator=torch.Generator().manual_seed(4)) + 0.1))
    errors = []
    start = threading.Barrier(2)

    def work():
        start.wait()
        for _ in range(200):
            rows, info = var.sample(64)
            time.sleep(0)  # let the other thread sample while this one is held
            if not torch.equal(rows["obs"][:, 0], info["index"].float()):
                errors.append("a sample's rows are not its index's")
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
