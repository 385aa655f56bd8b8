"""``ReplayBuffer.add``: one row per call, as an agent writes each step, without a TensorDict.

Contract
--------
``buffer.add(obs=..., action=..., ...)`` (or ``buffer.add({"obs": ..., ...})``) writes ONE row
and returns its slot (an int). Each value is that row of one column: a ``torch.Tensor``,
a NumPy array or scalar, or anything ``torch.as_tensor`` takes, of the column's row shape
(no batch dimension) and dtype; a mapping is a nested key. It is, by definition,
``int(buffer.extend(TensorDict({key: torch.as_tensor(value)[None]}, batch_size=[1]))[0])``:
the same checks, errors and state, bit for bit (tests/variants/test_add_fast_path.py).
Every refusal raises before anything changes. A value ``torch.as_tensor`` cannot read
raises ``ValueError`` naming its key.

How (``try_add``): the layout is checked once, when the storage's columns are bound
(``extend_fast._Plan``: the first write allocates them through the full path; a plan is
rebuilt when the columns are replaced), and on every call re-checked cheaply: the keys
given are exactly the storage's (top level), each torch value's dtype, shape, device and
contiguity (attribute reads), the rows' memory, the writer's generation column, the trees
and max priority, ``alpha`` and ``eps`` still the bound ones at the same addresses
(as ``extend_fast``). Then ONE native call (``calls().add``, calls.c): it checks each
NumPy value through the buffer protocol (format, item size, shape, C-contiguous; any
doubt and nothing is written), then runs ``rb_extend`` (uniform) or ``rb_extend_whole``
(the priority's checks, ``+ eps``, torch's pow bit for bit, the trees, the max priority,
the row, the generation). Anything else (a value of another type or layout, nested keys,
the first write, a refused priority, the ctypes calls with a NumPy value, the pow outside
C) goes to ``extend`` with a one-row TensorDict: the reference's errors.

Cost: O(row bytes + log capacity); no allocation on the fast path (the slot is an int,
the native call's slot output a scratch int64 kept per storage).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDict

from rbcheck.variants import native
from rbcheck.variants.device_storage import DeviceStorage, DeviceWriter
from rbcheck.variants.extend_fast import _Plan, extend_lock
from rbcheck.variants.native import extend_args as A
from rbcheck.variants.native import torch_pow
from rbcheck.variants.prioritized import PrioritizedSampler
from rbcheck.variants.random_sampler import RandomSampler

#: Set to False to turn the fast path off (the tests compare both paths).
ENABLED = True
_DIMS, _SPEC = 8, 11  # calls.c's RB_ADD_DIMS, RB_ADD_SPEC


class _AddSpec:
    """Per plan: the columns' specs for calls.c's ``add`` (one int64 block), a scratch slot."""

    __slots__ = ("plan", "block", "address", "slot", "keys")

    def __init__(self, plan: _Plan):
        self.plan = plan
        self.keys = frozenset(name for name, _, _ in plan.specs)
        rows = []
        for _, dtype, shape in plan.specs:
            row = [0] * _SPEC
            fmt = _format(dtype)
            if fmt is not None and len(shape) <= _DIMS:
                row[0:3] = ord(fmt), torch.empty((), dtype=dtype).element_size(), len(shape)
                row[3:3 + len(shape)] = list(shape)
            rows.append(row)
        self.block = torch.tensor(rows or [[0] * _SPEC], dtype=torch.int64)
        self.address = self.block.data_ptr()
        self.slot = torch.empty(1, dtype=torch.int64)

    def __reduce__(self):
        return _none, ()


def _none() -> None:
    return None


def _format(dtype: torch.dtype) -> str | None:
    """The buffer-protocol format character NumPy gives this dtype, or None (no NumPy twin)."""
    try:
        probe = torch.empty((), dtype=dtype).numpy()
    except (TypeError, RuntimeError):
        return None
    fmt = memoryview(np.ascontiguousarray(probe)).format
    return fmt if len(fmt) == 1 else None


def one_row(columns: Mapping, prefix: str = "") -> dict:
    """``{key: torch.as_tensor(value)[None]}`` (nested mappings: nested dicts); a value
    ``torch.as_tensor`` cannot read raises ``ValueError`` naming its key."""
    out = {}
    for key, value in columns.items():
        if isinstance(value, Mapping):
            out[key] = one_row(value, f"{prefix}{key}.")
            continue
        try:
            out[key] = torch.as_tensor(value).unsqueeze(0)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{prefix}{key}={type(value).__name__}, but should be a tensor, array or number "
                             f"of the column's dtype and row shape ({error})") from None
    return out


def add(buffer, columns: Mapping) -> int:
    """``ReplayBuffer.add``'s work (see the module doc)."""
    with extend_lock(buffer.storage):
        slot = try_add(buffer, columns)
    if slot is not None:
        return slot
    return int(buffer.extend(TensorDict(one_row(columns), batch_size=[1]))[0])


def try_add(buffer, columns) -> int | None:
    """The row's slot, written as ``extend`` writes it, or None (nothing changed: the
    caller extends with a one-row TensorDict). The caller holds ``extend_lock``."""
    if not ENABLED or type(columns) is not dict:
        return None
    calls = native._state.get("calls") or native.calls()
    storage, writer, sampler = buffer.storage, buffer.writer, buffer.sampler
    if calls is None or type(storage) is not DeviceStorage or type(writer) is not DeviceWriter \
            or storage.data is None:
        return None
    prioritized = type(sampler) is PrioritizedSampler
    if not (prioritized or type(sampler) is RandomSampler):
        return None
    plan = storage.__dict__.get("_extend_plan")
    if plan is None or plan.cols is not storage._cols:  # columns replaced
        plan = storage._extend_plan = _Plan(storage)
    if plan.specs is None or len(columns) != len(plan.specs):
        return None
    spec = storage.__dict__.get("_add_spec")
    if spec is None or spec.plan is not plan:
        spec = storage._add_spec = _AddSpec(plan)
    native_add = getattr(calls, "add", None)
    sources = []
    for name, dtype, shape in plan.specs:
        value = columns.get(name)
        kind = type(value)
        if kind is torch.Tensor:
            if value.dtype is not dtype or value.shape != shape or not value.is_cpu or not value.is_contiguous():
                return None
            sources.append(value.data_ptr())
        elif (kind is np.ndarray or isinstance(value, np.generic)) and native_add is not None:
            sources.append(value)  # checked in C (buffer protocol)
        else:
            return None
    if plan.moved():  # the rows' memory moved in place: a new plan, then this row again
        storage._extend_plan = _Plan(storage)
        return try_add(buffer, columns)
    bound, block = plan.bound, plan.block
    generation = writer.generation
    if (generation is not bound.get("generation") or generation.data_ptr() != plan.at["generation"]) \
            and not plan.bind_generation(generation):
        return None
    count, first = writer.write_count, writer.cursor
    priority_col, mode = -1, A.EXTEND
    if prioritized:
        sum_tree, min_tree = sampler.sum_tree, sampler.min_tree
        if (sum_tree._nodes is not bound.get("sum") or min_tree._nodes is not bound.get("min")
                or sampler._max_priority is not bound.get("max") or sampler.eps != bound.get("eps")
                or sampler.alpha != bound.get("alpha")
                or (sum_tree._nodes.data_ptr(), min_tree._nodes.data_ptr(), sampler._max_priority.data_ptr())
                != plan.at["trees"]) and not plan.bind_sampler(sampler):
            return None
        if not plan.c_pow or torch_pow.GRAIN <= 1:
            return None  # the transform by torch's pow: extend's general path
        column = plan.priority_column(buffer.priority_key)
        if column is not None:
            priority_col = column[0]
            block[A.IS_FLOAT32] = column[1]
        elif buffer.priority_key is not None and buffer.priority_key in columns:
            return None
        else:
            block[A.PRIORITY] = 0  # none: the max priority, as on_write
        block[A.DO_POW], mode = 1, A.WHOLE
    elif "sum" in bound:  # trees bound before (another sampler): none now
        block[A.SUM] = 0
        del bound["sum"]
    if native_add is None:  # ctypes: torch values only (NumPy ones went back above)
        if priority_col >= 0:
            block[A.PRIORITY] = sources[priority_col]
        code = calls.extend(plan.address, mode, first, 1, count, spec.slot.data_ptr(), *sources)
    else:
        code = native_add(plan.address, spec.address, mode, first, count, spec.slot.data_ptr(), priority_col,
                          *sources)
    if code:
        return None  # -2: a NumPy value of another layout; else a refused priority: nothing changed
    if prioritized:
        sum_tree._stale = sum_tree._stale or sum_tree.has_shadow  # mark_stale(), inlined
        min_tree._stale = min_tree._stale or min_tree.has_shadow
    if storage.size < storage.capacity:
        storage.size = max(storage.size, first + 1)
    storage.version += 1
    writer.write_count = count + 1
    writer.cursor = (count + 1) % storage.capacity
    return first
