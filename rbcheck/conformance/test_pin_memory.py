"""Seed invariant 3: with ``pin_memory=True`` the RETURNED sample is pinned,
after every transform (including one that builds a new TensorDict with
``device=None``) and including the info keys; without an accelerator,
``pin_memory=True`` is a clear error at construction, never a silent no-op.

On a CPU-only machine the pin step itself cannot run, so the property is
checked through the adapter's ``patch_pin_step`` hook: we record exactly what
the pin step is handed and check it is the final transformed sample plus the
complete info, and that nothing is changed after it. On CUDA the real
``is_pinned()`` of every returned tensor is checked.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.stateful import declared_samplers
from rbcheck.harness.strategies import layouts, specs

pytestmark = pytest.mark.requires("pin_memory")


class PinRecorder:
    """Stands in for the pin step: remembers what it was handed (a deep
    snapshot taken at call time) and hands the same objects back."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, sample, info):
        self.calls.append(
            {
                "sample": sample,
                "info": info,
                "sample_copy": sample.clone(),
                "info_keys": sorted(info),
                "info_copy": {
                    k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in info.items()
                },
            }
        )
        return sample, info


def _ptrs(td) -> dict:
    return {k: v.data_ptr() for k, v in td.items(include_nested=True, leaves_only=True)}


@pytest.mark.requires("transforms")
@given(data=st.data())
def test_pin_step_is_last_and_sees_transformed_sample_and_info(impl, data):
    """exact: with pin_memory=True, each sample() hands the pin step exactly
    once the FINAL transformed sample (== transform(stored rows at
    info['index']), also for transforms returning device=None) and the
    complete info (the same keys the caller gets: index, and weight /
    generation where the buffer returns them); what sample() returns is what
    the pin step returned: the same tensors (same storage), no key added or
    changed afterwards."""
    if impl.patch_pin_step is None:
        pytest.skip("adapter declares pin_memory but provides no patch_pin_step hook")
    spec = data.draw(specs(declared_samplers(impl), with_transform=True, conventions=impl.conventions), label="spec")
    spec = spec.but(pin_memory=True)
    layout = data.draw(layouts(max_fields=3), label="layout")
    n = data.draw(st.integers(1, spec.capacity), label="rows written")
    k = data.draw(st.integers(1, 6), label="batch size")
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    recorder = PinRecorder()
    with impl.patch_pin_step(recorder):
        trace.note("the property runs this with the pin step replaced by a recorder (impl.patch_pin_step)")
        buf = trace.wrap(impl.make(spec))
        buf.extend(layout.batch(0, n))
        for _ in range(2):
            recorder.calls.clear()
            rows, info = buf.sample(k)
            assert_same("pin step calls for one sample()", len(recorder.calls), 1, trace)
            call = recorder.calls[0]
            assert_same(
                "sorted(info) returned vs handed to the pin step",
                sorted(info),
                call["info_keys"],
                trace,
            )
            if "index" not in info:
                fail("sorted(info)", sorted(info), "a dict with 'index'", trace)
            if spec.sampler == "prioritized" and "weight" not in info:
                fail("sorted(info)", sorted(info), "a dict with 'index' and 'weight'", trace)
            stored = buf.contents()[info["index"].cpu()]
            expected = spec.transform(stored) if spec.transform is not None else stored
            assert_td_equal(
                "sample handed to the pin step",
                call["sample_copy"],
                expected,
                trace,
                check_device=False,
            )
            assert_td_equal("returned sample", rows, call["sample_copy"], trace, check_device=False)
            if _ptrs(rows) != _ptrs(call["sample"]):
                fail(
                    "returned sample tensors",
                    "<copies made after the pin step>",
                    "the tensors the pin step returned (pinning runs last)",
                    trace,
                )
            for key in sorted(info):
                got = info[key]
                if isinstance(got, torch.Tensor):
                    assert_tensor_equal(
                        f"returned info[{key!r}]", got, call["info_copy"][key], trace
                    )
                    if got.data_ptr() != call["info"][key].data_ptr():
                        fail(
                            f"returned info[{key!r}]",
                            "<a copy made after the pin step>",
                            "the tensor the pin step returned",
                            trace,
                        )


@pytest.mark.cuda
@pytest.mark.requires("pin_memory", "cuda")
@given(data=st.data())
def test_returned_sample_is_pinned_on_cuda(impl, data):
    """exact: on a machine with CUDA, every tensor of the returned sample
    (after any transform, device=None included) and of info is pinned."""
    if not torch.cuda.is_available():  # pragma: no cover - `requires("cuda")` skips first
        pytest.skip("unavailable: cuda: torch.cuda.is_available() is False")
    spec = data.draw(specs(declared_samplers(impl), with_transform=True, conventions=impl.conventions), label="spec").but(
        pin_memory=True
    )
    layout = data.draw(layouts(max_fields=3), label="layout")
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = trace.wrap(impl.make(spec))
    n = min(4, spec.capacity)
    buf.extend(layout.batch(0, n))
    rows, info = buf.sample(3)
    for key, value in rows.items(include_nested=True, leaves_only=True):
        if value.device.type == "cpu" and not value.is_pinned():
            fail(f"rows[{key!r}].is_pinned()", False, "True", trace)
    for key, value in info.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_pinned():
            fail(f"info[{key!r}].is_pinned()", False, "True", trace)


@given(spec=specs())
def test_pin_memory_without_accelerator_is_a_clear_error(impl, spec):
    """exact: on a machine without an accelerator, building a buffer with
    pin_memory=True raises at construction with a message naming pin_memory
    (never a silent no-op that returns unpinned samples)."""
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present: pin_memory=True is valid here")
    spec = spec.but(sampler="random", pin_memory=True)
    trace = Trace(impl, spec)
    try:
        impl.make(spec)
    except Exception as err:  # noqa: BLE001 - any exception type, but it must explain itself
        if "pin_memory" not in str(err):
            fail(
                "error message",
                f"<{type(err).__name__}: {err}>",
                "a message naming pin_memory",
                trace,
            )
        return
    fail(
        "make(pin_memory=True) without an accelerator",
        "<a buffer>",
        "a clear error at construction",
        trace,
    )
