"""The bad-input catalogue of ``rbcheck/conformance/test_bad_input.py``:
each :class:`Case` is a named invalid call on a buffer in a known state
(filled by :func:`fill`), each :class:`SpecCase` a bad buffer description.
The property, its state comparison and its message rule are in the
conformance file; the cases live here so that other tests (and a repro
snippet) can build the same states.

Every priority a case hands over is in the dtype the adapter declares
(``conventions.priority_dtype``, :func:`declared`), so a bad value is refused
for its value, never for a dtype the buffer does not take.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import BufferSpec

__all__ = [
    "CAPACITY", "WRITTEN", "rows", "named_rows", "declared", "with_priority", "PRIORITIZED", "UNIFORM", "SLICES",
    "KEYED", "OVERFLOW", "HUGE", "fill", "meta", "Case", "update", "P", "CATALOGUE", "SpecCase",
    "SPEC_CATALOGUE", "ZERO_CASES",
]

CAPACITY = 8
WRITTEN = 5  # slots 5, 6, 7 are never written


def rows(n: int, start: int = 0, *, episode_len: int = 2) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.stack([x.float(), -x.float(), x.float() / 2], dim=1),
            "action": x,
            "episode": x // episode_len,
            "next": {"obs": x.float() + 1},
        },
        batch_size=[n],
    )


def named_rows(trace, n: int, start: int = 0) -> TensorDict:
    """:func:`rows`, named ``rows(n, start)`` in ``trace``'s snippet (if any)."""
    data = rows(n, start)
    if trace is not None:
        trace.need("from rbcheck.harness.bad_input import rows")
        trace.name(data, f"rows({n})" if start == 0 else f"rows({n}, {start})")
    return data


def declared(priority, conv) -> torch.Tensor:
    """``priority`` (numbers) in the dtype the adapter under test declares
    (``conv``: its conventions, ``priority_dtype``): a bad value must be
    refused for its value, not for a dtype the buffer does not take."""
    return conv.priorities(priority)


def with_priority(n: int, priority: list[float], conv) -> TensorDict:
    data = rows(n)
    data.set("priority", declared(priority, conv))
    return data


PRIORITIZED = BufferSpec(capacity=CAPACITY, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=3)
UNIFORM = BufferSpec(capacity=CAPACITY, sampler="random", seed=3)
SLICES = BufferSpec(capacity=CAPACITY, sampler="slice", num_slices=2, seed=3)
KEYED = PRIORITIZED.but(priority_key="priority")
#: alpha = 2: the transform (1e200 + eps) ** 2 of a finite priority overflows float64
OVERFLOW = PRIORITIZED.but(alpha=2.0)
HUGE = 1e200


def fill(buf, spec: BufferSpec, conv, trace=None) -> None:
    """``WRITTEN`` rows (and two priorities, prioritized); ``trace``: a repro
    trace whose snippet writes the rows as ``rows(WRITTEN)``."""
    if spec.priority_key:
        buf.extend(with_priority(WRITTEN, [0.5, 1.0, 2.0, 0.0 if conv.admits(0.0) else 0.125, 3.0], conv))
    else:
        buf.extend(named_rows(trace, WRITTEN))
    if spec.sampler == "prioritized":  # in the declared dtype, as every priority the suite hands over
        buf.update_priority(torch.tensor([0, 2]), conv.priorities([4.0, 0.25]))


def meta(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class Case:
    """One bad input: ``call(buf, conventions)`` on a buffer built from ``spec`` (filled
    unless ``empty``); ``arg`` is the argument the message must name."""

    id: str
    spec: BufferSpec
    arg: str
    call: Callable
    needs: tuple[str, ...] = ()
    empty: bool = False
    probe: int = 4  # batch size of the next-sample comparison
    setup: Callable | None = None  # run after filling, before the "before" snapshot


def update(index, priority, **kw):
    """``update_priority(index, priority)``; numbers in ``priority`` are handed
    over in the declared dtype (:func:`declared`), a tensor as it is."""
    def call(buf, conv):
        value = priority if isinstance(priority, torch.Tensor) else declared(priority, conv)
        return buf.update_priority(torch.as_tensor(index), value, **kw)
    return call


P = ("prioritized",)
CATALOGUE = [
    # --- priorities (Reverb: NaN, inf, negative refused; zero allowed) ------
    Case("priority_nan", PRIORITIZED, "priority", update([0, 1], [1.0, math.nan]), P),
    Case("priority_inf", PRIORITIZED, "priority", update([0, 1], [math.inf, 1.0]), P),
    Case("priority_minus_inf", PRIORITIZED, "priority", update([1], [-math.inf]), P),
    Case("priority_negative", PRIORITIZED, "priority", update([0, 1, 2], [1.0, -0.5, 2.0]), P),
    Case("priority_complex_dtype", PRIORITIZED, "priority", update([0], torch.tensor([1 + 1j])), P),
    Case("priority_longer_than_index", PRIORITIZED, "priority", update([0, 1], [1.0, 2.0, 3.0]), P),
    Case("priority_shorter_than_index", PRIORITIZED, "priority", update([0, 1, 2], [1.0, 2.0]), P),
    Case("priority_2d", PRIORITIZED, "priority", update([0, 1], [[1.0, 2.0], [3.0, 4.0]]), P),
    Case("priority_on_meta_device", PRIORITIZED, "priority",
         lambda buf, conv: buf.update_priority(torch.tensor([0, 1]), declared([0.0, 0.0], conv).to("meta")), P),
    Case("priority_key_nan_on_extend", KEYED, "priority",
         lambda buf, conv: buf.extend(with_priority(2, [1.0, math.nan], conv)), P + ("priority_key",)),
    Case("priority_key_negative_on_extend", KEYED, "priority",
         lambda buf, conv: buf.extend(with_priority(2, [-1.0, 1.0], conv)), P + ("priority_key",)),
    # --- a finite priority whose transform (p + eps) ** alpha overflows float64 -
    # (stored as inf, it would give NaN weights and a checkpoint no load takes)
    Case("priority_transform_overflows", OVERFLOW, "priority", update([0, 1], [1.0, HUGE]), P),
    Case("priority_transform_overflows_in_stale_entry", OVERFLOW, "priority",
         update([0, 1], [HUGE, 1.0], generation=torch.tensor([-5, -5])), P + ("stale_updates",)),
    Case("priority_key_transform_overflows_on_extend", OVERFLOW.but(priority_key="priority"), "priority",
         lambda buf, conv: buf.extend(with_priority(2, [1.0, HUGE], conv)), P + ("priority_key",)),
    Case("priority_key_transform_overflows_on_add", OVERFLOW.but(priority_key="priority"), "priority",
         lambda buf, conv: buf.add(with_priority(1, [HUGE], conv)[0]), P + ("priority_key",)),
    # --- indices -------------------------------------------------------------
    Case("index_at_capacity", PRIORITIZED, "index", update([0, CAPACITY], [1.0, 2.0]), P),
    Case("index_negative", PRIORITIZED, "index", update([-1], [2.0]), P),
    Case("index_never_written", PRIORITIZED, "index", update([1, WRITTEN + 1], [2.0, 2.0]), P),
    Case("index_float_dtype", PRIORITIZED, "index", update(torch.tensor([0.0, 1.0]), [2.0, 2.0]), P),
    Case("index_2d", PRIORITIZED, "index", update([[0, 1]], [[2.0, 2.0]]), P),
    Case("index_on_meta_device", PRIORITIZED, "index",
         lambda buf, conv: buf.update_priority(meta(2, torch.long), declared([1.0, 2.0], conv)), P),
    Case("generation_wrong_shape", PRIORITIZED, "generation",
         update([0, 1], [2.0, 2.0], generation=torch.tensor([0])), P + ("stale_updates",)),
    Case("generation_float_dtype", PRIORITIZED, "generation",
         update([0, 1], [2.0, 2.0], generation=torch.tensor([0.0, 1.0])), P + ("stale_updates",)),
    Case("update_priority_on_uniform_buffer", UNIFORM, "sampler", update([0], [2.0])),
    # --- batches that do not match the storage --------------------------------
    Case("extend_missing_key", UNIFORM, "data", lambda buf, conv: buf.extend(rows(2).exclude("action"))),
    Case("extend_extra_key", UNIFORM, "data", lambda buf, conv: buf.extend(rows(2).set("extra", torch.ones(2)))),
    Case("extend_nested_key_renamed", UNIFORM, "data",
         lambda buf, conv: buf.extend(rows(2).rename_key_(("next", "obs"), ("next", "state")))),
    Case("extend_wrong_dtype", UNIFORM, "data",
         lambda buf, conv: buf.extend(rows(2).set("action", torch.arange(2, dtype=torch.int32)))),
    Case("extend_wrong_row_shape", UNIFORM, "data",
         lambda buf, conv: buf.extend(rows(2).set("obs", torch.zeros(2, 4)))),
    Case("extend_2d_batch", UNIFORM, "data", lambda buf, conv: buf.extend(rows(6).reshape(2, 3))),
    Case("extend_on_meta_device", UNIFORM, "data", lambda buf, conv: buf.extend(rows(2).to("meta"))),
    Case("extend_plain_dict", UNIFORM, "data", lambda buf, conv: buf.extend({"obs": torch.zeros(2, 3)})),
    Case("add_with_batch_dim", UNIFORM, "row", lambda buf, conv: buf.add(rows(2))),
    Case("add_wrong_dtype", UNIFORM, "data",
         lambda buf, conv: buf.add(rows(1)[0].set("action", torch.tensor(1.5)))),
    # --- sampling -------------------------------------------------------------
    Case("sample_empty_buffer", UNIFORM, "len(buffer)", lambda buf, conv: buf.sample(2), empty=True),
    Case("sample_empty_prioritized_buffer", PRIORITIZED, "len(buffer)", lambda buf, conv: buf.sample(2), P,
         empty=True),
    Case("sample_batch_size_zero", UNIFORM, "batch_size", lambda buf, conv: buf.sample(0)),
    Case("sample_batch_size_negative", UNIFORM, "batch_size", lambda buf, conv: buf.sample(-3)),
    Case("sample_batch_size_float", UNIFORM, "batch_size", lambda buf, conv: buf.sample(2.5)),
    Case("sample_all_priorities_zero", PRIORITIZED.but(eps=0.0), "total priority", lambda buf, conv: buf.sample(2), P,
         setup=update(torch.arange(WRITTEN), [0.0] * WRITTEN)),
    Case("slice_batch_not_divisible", SLICES, "batch_size", lambda buf, conv: buf.sample(5), ("slice",)),
    Case("slice_longer_than_every_episode", SLICES.but(num_slices=None, slice_len=3), "slice_len",
         lambda buf, conv: buf.sample(3), ("slice",), probe=2),
    # --- a priority of 0 where the buffer declares positive_priorities ------
    Case("priority_zero", PRIORITIZED, "priority", update([0, 1, 2], [1.0, 0.0, 2.0]), P),
    Case("priority_key_zero_on_extend", KEYED, "priority",
         lambda buf, conv: buf.extend(with_priority(2, [1.0, 0.0], conv)), P + ("priority_key",)),
]
#: Cases that are bad input only under conventions.positive_priorities (the
#: spec allows a priority of 0: test_sampling_distributions checks such a
#: row is never drawn).
ZERO_CASES = ("priority_zero", "priority_key_zero_on_extend")

@dataclass(frozen=True)
class SpecCase:
    """A bad buffer description: ``make(spec)`` must raise (``deferred``: or
    the first ``sample()`` with the default batch size)."""

    id: str
    spec: BufferSpec
    arg: str
    needs: tuple[str, ...] = ()
    deferred: bool = False
    #: the bad value is one some buffers take per ``sample()`` call (the batch
    #: size, beta): a third party may refuse it at the first ``sample()``
    #: instead (ours must refuse it in ``make``)
    sample_arg: bool = False


SPEC_CATALOGUE = [
    SpecCase("capacity_zero", UNIFORM.but(capacity=0), "capacity"),
    SpecCase("capacity_negative", UNIFORM.but(capacity=-4), "capacity"),
    SpecCase("batch_size_zero", UNIFORM.but(batch_size=0), "batch_size", sample_arg=True),
    SpecCase("batch_size_negative", UNIFORM.but(batch_size=-2), "batch_size", sample_arg=True),
    SpecCase("alpha_negative", PRIORITIZED.but(alpha=-0.5), "alpha", P),
    SpecCase("alpha_nan", PRIORITIZED.but(alpha=math.nan), "alpha", P),
    SpecCase("alpha_inf", PRIORITIZED.but(alpha=math.inf), "alpha", P),
    SpecCase("beta_negative", PRIORITIZED.but(beta=-0.1), "beta", P, sample_arg=True),
    SpecCase("beta_nan", PRIORITIZED.but(beta=math.nan), "beta", P, sample_arg=True),
    SpecCase("eps_negative", PRIORITIZED.but(eps=-1e-3), "eps", P),
    SpecCase("eps_nan", PRIORITIZED.but(eps=math.nan), "eps", P),
    SpecCase("num_slices_zero", SLICES.but(num_slices=0), "num_slices", ("slice",)),
    SpecCase("num_slices_negative", SLICES.but(num_slices=-2), "num_slices", ("slice",)),
    SpecCase("slice_len_zero", SLICES.but(num_slices=None, slice_len=0), "slice_len", ("slice",)),
    SpecCase("slice_len_negative", SLICES.but(num_slices=None, slice_len=-3), "slice_len", ("slice",)),
    SpecCase("batch_size_not_divisible_by_num_slices", SLICES.but(batch_size=5), "batch_size",
             ("slice",), deferred=True),
    SpecCase("batch_size_not_divisible_by_slice_len", SLICES.but(num_slices=None, slice_len=2, batch_size=5),
             "batch_size", ("slice",), deferred=True),
]
