"""The hot native calls: ``calls.c``'s extension module, and ``native.CtypesCalls`` where
Python's headers are missing. Both make the same calls with the same results (here: a
program of extends, samples and updates on three buffers, the reference's state and
samples bit for bit after every step), the module is the one the fast paths take, and
a library built without the headers (or with ``RBCHECK_NATIVE_CALLS=0``) still works.
"""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

from rbcheck.variants import native
from rbcheck.variants.native import extend_args, torch_pow
from tests.variants.test_extend_fast_path import assert_same, flat_rows, three
from tests.variants.test_sample_fast_path import assert_same_sample

pytestmark = pytest.mark.skipif(native.lib() is None, reason="rbcheck.variants.native does not load")


def test_the_module_makes_the_calls_where_pythons_headers_are():
    calls = native.calls()
    if native.calls_reason() == "RBCHECK_NATIVE_CALLS=0":
        assert isinstance(calls, native.CtypesCalls)
    elif native.python_include() is None:
        assert isinstance(calls, native.CtypesCalls)
        assert "Python.h" in native.calls_reason()
    else:
        assert native.calls_reason() is None, native.calls_reason()
        assert isinstance(calls, types.ModuleType) and calls.abi_version == native.ABI_VERSION


class _Counting:
    """A stand-in for the calls, counting each by name, then making it."""

    def __init__(self, calls):
        self._calls, self.seen = calls, []

    def __getattr__(self, name):
        real = getattr(self._calls, name)
        return lambda *args: (self.seen.append(name), real(*args))[1]


def test_the_fast_paths_make_their_calls_through_native_calls(monkeypatch):
    """The calls are live: an extend, a sample and an update of a prioritized buffer go
    through ``native.calls()`` (whichever it is), and their results are the reference's."""
    spy = _Counting(native.calls())
    monkeypatch.setitem(native._state, "calls", spy)
    ref, fast, _ = three(64, "prioritized")
    for buf in (ref, fast):
        buf.extend(flat_rows(5, 0, [1.0, 2.0, 0.5, 3.0, 4.0]))  # allocates: the full path
        buf.extend(flat_rows(3, 5, [1.0, 2.0, 0.5]))
    # one call with the transform in C, else prepare, torch's pow, extend (a CPU without a known vector pow)
    assert spy.seen == (["extend"] if fast.storage._extend_plan.c_pow else ["extend", "extend"])
    spy.seen.clear()
    assert_same_sample(fast.sample(6), ref.sample(6), "sample")
    assert spy.seen == ["sample", "sample"]
    spy.seen.clear()
    for buf in (ref, fast):
        buf.update_priority(torch.tensor([1, 6]), torch.tensor([0.25, 7.0]))
    # one call with the transform in C, else prepare, torch's pow, finish (then the trees, through ctypes)
    assert spy.seen == (["update_whole"] if torch_pow.in_c(2, fast.sampler.alpha) else
                        ["prepare_update", "finish_update"])
    assert_same(ref, fast)


def _program(ref, fast, other, monkeypatch, calls_of_other):
    """Extends (1 to 3000 rows: the GIL kept and released), samples and updates, the same on
    the three; after each step the state and the sample are the reference's."""
    gen = torch.Generator().manual_seed(5)
    start = 0
    for n in (1, 7, 300, 2999, 1, 1500):
        data = flat_rows(n, start, torch.rand(n, generator=gen) * 4)
        start += n
        want = ref.extend(data.clone())
        assert torch.equal(fast.extend(data.clone()), want)
        with monkeypatch.context() as m:
            m.setitem(native._state, "calls", calls_of_other)
            assert torch.equal(other.extend(data.clone()), want)
        assert_same(ref, fast, other)
        for k in (3, 1200):
            expected = ref.sample(k)
            assert_same_sample(fast.sample(k), expected, f"sample {k}")
            with monkeypatch.context() as m:
                m.setitem(native._state, "calls", calls_of_other)
                assert_same_sample(other.sample(k), expected, f"sample {k} (other calls)")
        if ref.sampler.__class__.__name__ == "PrioritizedSampler":
            index = torch.randint(0, len(ref), (1100,), generator=gen)
            value = torch.rand(1100, generator=gen, dtype=torch.float64) * 3
            for buf in (ref, fast):
                buf.update_priority(index, value)
            with monkeypatch.context() as m:
                m.setitem(native._state, "calls", calls_of_other)
                other.update_priority(index, value)
            assert_same(ref, fast, other)


@pytest.mark.parametrize("sampler", ["random", "prioritized"])
def test_the_module_and_ctypes_give_the_references_state(sampler, monkeypatch):
    ref, fast, other = three(4096, sampler)
    _program(ref, fast, other, monkeypatch, native.CtypesCalls(native.lib()))


class _OffByOneFirst(native.CtypesCalls):
    """Mutant: an extend that writes its rows one slot further on."""

    def extend(self, block, mode, first, *rest):
        return super().extend(block, mode, (first + 1) % ctypes.c_int64.from_address(block + 16).value, *rest)


def test_the_comparison_catches_calls_that_write_elsewhere(monkeypatch):
    ref, fast, other = three(4096, "random")
    with pytest.raises(AssertionError):
        _program(ref, fast, other, monkeypatch, _OffByOneFirst(native.lib()))


def test_a_call_with_the_wrong_arguments_raises_and_leaves_the_buffer_unchanged():
    ref, fast, _ = three(16, "random")
    for buf in (ref, fast):
        buf.extend(flat_rows(4, 0))
        buf.extend(flat_rows(2, 4))
    plan = fast.storage._extend_plan
    index = torch.empty(1, dtype=torch.int64)
    for calls in {type(native.calls()): native.calls(), native.CtypesCalls: native.CtypesCalls(native.lib())}.values():
        with pytest.raises(TypeError, match="sources=2, but should be the block's 3 columns"):
            calls.extend(plan.address, extend_args.EXTEND, 6, 1, 6, index.data_ptr(), 0, 0)
        with pytest.raises(TypeError):
            calls.extend(plan.address, "0", 6, 1, 6, index.data_ptr(), 0, 0, 0)
        for mode in (-1, 3):
            with pytest.raises(ValueError, match=f"mode={mode}, but should be 0, 1 or 2"):
                calls.extend(plan.address, mode, 6, 1, 6, index.data_ptr(), 0, 0, 0)
    assert_same(ref, fast)


def test_the_update_calls_refuse_wrong_arguments_alike():
    """``prepare_update``, ``finish_update`` and ``update_whole`` raise ``TypeError`` for a wrong count or
    kind of argument, through the module and through ctypes alike (ctypes's own
    ``ArgumentError`` is not a ``TypeError``), before any C runs."""
    for calls in {type(native.calls()): native.calls(), native.CtypesCalls: native.CtypesCalls(native.lib())}.values():
        for name, count in (("prepare_update", 9), ("finish_update", 7), ("update_whole", 14)):
            call = getattr(calls, name)
            with pytest.raises(TypeError):
                call(*[0] * (count - 1))
            with pytest.raises(TypeError):
                call("not an address", *[0] * (count - 1))
            with pytest.raises(OverflowError):
                call(1 << 64, *[0] * (count - 1))
        for step in ("x", None, 0.0):
            with pytest.raises(TypeError):
                calls.sample(0, step)


@pytest.mark.parametrize("case", ["index out of range", "NaN priority", "negative priority", "overflow"])
def test_update_whole_refuses_what_the_reference_refuses_and_changes_nothing(case, monkeypatch):
    """An update whose checks fail in the one C call (code 1: an index or a priority; code 2:
    a transform overflowed) changes nothing, and the full path raises the reference's error."""
    ref, fast, _ = three(64, "prioritized", alpha=1.3)
    if not torch_pow.in_c(2, 1.3):
        pytest.skip("the pow of alpha=1.3 is not done in C here: update_whole is not called")
    for buf in (ref, fast):  # full: the update goes straight to the sampler
        buf.extend(flat_rows(64, 0, [0.5 + i % 7 for i in range(64)]))
    index, priority, code = {
        "index out of range": ([1, 64], [1.0, 1.0], 1), "NaN priority": ([1, 2], [float("nan"), 1.0], 1),
        "negative priority": ([1, 2], [-1.0, 1.0], 1), "overflow": ([1, 2], [1e300, 1.0], 2)}[case]
    codes = []
    real = native._state["calls"].update_whole  # what every path's update calls (update_fast's too)
    monkeypatch.setattr(native._state["calls"], "update_whole", lambda *a: codes.append(real(*a)) or codes[-1])
    raised = []
    for buf in (ref, fast):
        with pytest.raises(ValueError) as err:
            buf.update_priority(torch.tensor(index), torch.tensor(priority, dtype=torch.float64))
        raised.append(str(err.value))
    assert codes == [code] and raised[0] == raised[1]
    assert_same(ref, fast)


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("native-cache")


REASONS = {"no headers": "Python's C headers (Python.h) are not installed",
           "switched off": "RBCHECK_NATIVE_CALLS=0",
           "a failed build": "calls.c not built or not loaded: "}


@pytest.mark.parametrize("why", list(REASONS))
def test_without_the_module_the_library_still_works(why, own_cache, monkeypatch, tmp_path):
    """No ``Python.h``, ``RBCHECK_NATIVE_CALLS=0``, or a calls.c that does not compile:
    the library is built from tree.c alone, the calls go through ctypes, the reason is
    reported, the results are the reference's."""
    monkeypatch.setenv("RBCHECK_NATIVE_CACHE", str(own_cache))
    if why == "no headers":
        monkeypatch.setattr(native, "python_include", lambda: None)
    elif why == "switched off":
        monkeypatch.setenv("RBCHECK_NATIVE_CALLS", "0")
    else:
        if native.python_include() is None:
            pytest.skip("Python's C headers are not installed here: calls.c is never compiled")
        broken = tmp_path / "calls.c"
        broken.write_text("#include <Python.h>\nthis is not C;\n")
        monkeypatch.setattr(native, "CALLS", broken)
    saved = dict(native._state)
    native.reset()
    try:
        assert native.lib() is not None, native.unavailable_reason()
        assert isinstance(native.calls(), native.CtypesCalls)
        assert native.calls_reason().startswith(REASONS[why]), native.calls_reason()
        assert [p.name for p in own_cache.iterdir() if p.name.endswith(".so")] \
            and not any(p.name.endswith(".so") and "cpython" in p.name for p in own_cache.iterdir())
        ref, fast, _ = three(64, "prioritized")
        for buf in (ref, fast):
            buf.extend(flat_rows(5, 0, [1.0, 2.0, 0.5, 3.0, 4.0]))
            buf.extend(flat_rows(3, 5, [1.0, 2.0, 0.5]))
            buf.update_priority(torch.tensor([1, 6]), torch.tensor([0.25, 7.0]))
        assert_same(ref, fast)
        assert_same_sample(fast.sample(6), ref.sample(6), "sample")
    finally:
        native._state.clear()
        native._state.update(saved)
