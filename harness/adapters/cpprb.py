"""cpprb's replay buffers (written against cpprb 11.0.0) as BufferUnderTest.

Two built-in names: ``cpprb`` (``cpprb.ReplayBuffer``, uniform) and
``cpprb-per`` (``cpprb.PrioritizedReplayBuffer``). Line numbers below are of
cpprb 11.0.0's sources: ``PyReplayBuffer.pyx`` (shipped compiled; the line
numbers are the ones the generated ``PyReplayBuffer.cpp`` of the sdist
quotes), ``ReplayBuffer.hh`` and ``SegmentTree.hh``.

Mapping (nothing emulated but the uniform draw, see ``sample``):

* buffer: ``ReplayBuffer(capacity, env_dict)`` /
  ``PrioritizedReplayBuffer(capacity, env_dict, alpha=spec.alpha,
  eps=spec.eps)`` (pyx:961, pyx:1577). ``env_dict`` has one entry per leaf
  of the rows, named ``"/".join(key)`` (``"next/obs"``), with the row shape
  (``1`` for a scalar leaf: cpprb's own default) and the NumPy dtype. cpprb
  allocates every field up front (``dict2buffer``, pyx:995), so the buffer
  is built in ``make(spec)`` from ``spec.layout``; without a layout it is
  built on the first write from that batch's leaves.
* ``extend(data)``: ``add(**{name: array})`` (pyx:1102) with every leaf of
  ``data`` (cpprb ignores names it does not know and raises on a missing
  one); it returns the first slot written, the others follow round the
  ring (``RingBufferIndex.fetch_add``, pyx:861). ``add(row)`` is an extend
  of one row. With ``spec.priority_key`` the column is also handed over as
  ``add(priorities=...)`` (pyx:1638) and stays a stored column.
* ``len``: ``get_stored_size()`` (pyx:1422); ``cursor``:
  ``get_next_index()`` (pyx:1442). cpprb keeps no count of rows written over
  its life: ``write_count`` is counted by the adapter (rows of each write
  cpprb accepted).
* ``contents()``: ``get_all_transitions()`` (pyx:1188), slot order.
* ``sample`` (uniform): cpprb's ``ReplayBuffer.sample`` returns rows but no
  indices. The adapter repeats its draw, ``np.random.randint(0,
  get_stored_size(), batch_size)`` (pyx:1392), on NumPy's global generator
  with this buffer's own state swapped in (:class:`GlobalNumpyStream`,
  seeded with ``spec.seed``: cpprb's uniform draw is seeded by seeding
  NumPy), and reads the rows with the private ``_encode_sample(idx)``
  (pyx:1329), as ``sample`` does. tests/thirdparty checks that the repeat
  equals cpprb's own ``sample`` under the same NumPy state.
* ``sample`` (prioritized): ``sample(batch_size, beta=spec.beta)``
  (pyx:1709): ``info["index"]`` is its ``"indexes"`` (uint64, as int64),
  ``info["weight"]`` its ``"weights"`` (float32).
* ``update_priority(index, priority)``: ``update_priorities(index,
  priority)`` (pyx:1749; ``CppPrioritizedSampler::update_priorities``,
  ReplayBuffer.hh:457). No write generation (``check_for_update`` drops
  updates of any slot written since the *last* sample, a different rule), so
  "stale_updates" is not declared. An index outside ``[0, capacity)`` is not
  handed over: cpprb converts it to ``size_t`` and writes outside its
  segment tree (``SegmentTree::set``, SegmentTree.hh:138, no bound check;
  index 10**6 kills the process), so the adapter fails the test with that
  reason instead of corrupting the test process (docs/findings.md).
* read-back: the priorities live in a C++ ``CppPrioritizedSampler`` the
  Python class does not expose (a ``cdef`` pointer, pyx:1580), and ``get_max_priority``
  (pyx:1804) alone is not a read-back of the slots: "priority_readback" is
  not declared; priorities are checked through sampling frequencies and
  weights.
* no ``save``/``load``: ``save_transitions`` / ``load_transitions``
  (pyx:1209, pyx:1297) export the rows in slot order and *add* them to a
  buffer (no priorities, no ring position, NumPy pickle inside the npz); it
  is a transition export, not a checkpoint, so "save_load" is not declared.

Conventions of ``cpprb-per`` (``Conventions.notes`` cites each):

* priorities and trees are float32 (``CppPrioritizedSampler<float>``,
  pyx:1580);
* eps is added on every path, ``(p + eps) ** alpha`` (ReplayBuffer.hh:358,
  :439, :447, :465): the spec's rule;
* a new row gets ``(max_priority + eps) ** alpha`` with the raw max over the
  buffer's life, 1.0 at first (ReplayBuffer.hh:375, :443): the spec's rule;
* weights are normalised by the smallest probability over the stored slots
  (``set_weights``, ReplayBuffer.hh:333): the spec's rule;
* sampling is stratified: draw k of a batch of B falls in the k-th of B
  equal segments of the total mass (``sample_proportional``,
  ReplayBuffer.hh:314);
* not seedable: the generator is ``std::mt19937`` seeded from
  ``std::random_device`` (ReplayBuffer.hh:382), with no way to set it.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.numpy_rows import (
    GlobalNumpyStream,
    OwnRandomness,
    RowLayout,
    check_batch_size,
    layout_from_rows,
    layout_from_spec,
    leaves,
    row_count,
    rows_from_arrays,
    to_numpy,
)
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "cpprb 11.0.0"
UNIFORM_CAPABILITIES = frozenset({"random", "bad_input"})
PER_CAPABILITIES = frozenset({"prioritized", "priority_key", "bad_input"})

PER_CONVENTIONS = Conventions(
    priority_dtype=torch.float32,
    sampling="stratified",
    seedable=False,
    notes={
        "priority_dtype": f"CppPrioritizedSampler<float> ({SRC} PyReplayBuffer.pyx:1580)",
        "sampling": "draw k from the k-th of B equal segments of the total mass "
        f"(sample_proportional, {SRC} ReplayBuffer.hh:314-331)",
        "seedable": f"std::mt19937 seeded from std::random_device, no seed argument ({SRC} ReplayBuffer.hh:382)",
    },
)


def _name(key: tuple[str, ...], sep: str = "/") -> str:
    return sep.join(key)


def _env_dict(layout: RowLayout, sep: str = "/") -> dict[str, dict[str, Any]]:
    return {
        _name(key, sep): {"shape": shape or 1, "dtype": torch.empty((), dtype=dtype).numpy().dtype}
        for key, shape, dtype in layout
    }


class CpprbBuffer(OwnRandomness):
    """A :class:`BufferUnderTest` over a cpprb ``ReplayBuffer`` or ``PrioritizedReplayBuffer``."""

    LIBRARY = "cpprb"
    SEP = "/"  # a leaf's cpprb name: its key joined by this (cpprb-mmap: '.', a file name's part)

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        self.prioritized = spec.sampler == "prioritized"
        self.rb: Any = None
        self.layout: RowLayout | None = None
        self.written = 0
        self.stream = GlobalNumpyStream(spec.seed)
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._build(layout)
        else:
            # cpprb checks (or not) its arguments at construction: build a buffer
            # of a probe field now, so a bad capacity / alpha / eps surfaces in
            # make() as it would for a user; the first write rebuilds it
            self.rb = self._construct({"_probe": {"shape": 1}})

    def __repr__(self) -> str:
        return f"CpprbBuffer({type(self.rb).__name__}, {self.spec})"

    def _construct(self, env_dict: dict[str, dict[str, Any]]) -> Any:
        cpprb = importlib.import_module("cpprb")
        if self.prioritized:
            return cpprb.PrioritizedReplayBuffer(
                self.spec.capacity, env_dict, alpha=self.spec.alpha, eps=self.spec.eps
            )
        return cpprb.ReplayBuffer(self.spec.capacity, env_dict)

    def _build(self, layout: RowLayout) -> None:
        self.layout = layout
        self.rb = self._construct(_env_dict(layout, self.SEP))

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.layout is None:  # no spec.layout: allocate from the first batch
            self._build(layout_from_rows(data) if isinstance(data, TensorDictBase) else
                        tuple(sorted((k, v.shape[1:], torch.as_tensor(v).dtype) for k, v in leaves(data).items())))
        kwargs = {_name(k, self.SEP): v for k, v in leaves(data).items()}
        n = row_count(data)
        if self.prioritized and self.spec.priority_key is not None:
            kwargs["priorities"] = kwargs.get(self.spec.priority_key)
        first = self.rb.add(**kwargs)
        self.written += n
        return (int(first) + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # reading
    def __len__(self) -> int:
        return 0 if self.rb is None else int(self.rb.get_stored_size())

    def _rows(self, arrays: dict[str, np.ndarray], n: int):
        if self.layout is None:  # nothing written yet
            return TensorDict({}, batch_size=[n])
        by_key = {key: arrays[_name(key, self.SEP)] for key, _, _ in self.layout}
        return rows_from_arrays(self.layout, by_key, n)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        if self.prioritized:
            out = self.rb.sample(batch_size, beta=self.spec.beta)
            index = torch.as_tensor(out["indexes"].astype(np.int64))
            info = {"index": index, "weight": torch.as_tensor(out["weights"])}
        else:
            with self.stream.active():  # PyReplayBuffer.pyx:1392, repeated
                idx = np.random.randint(0, self.rb.get_stored_size(), batch_size)
            out = self.rb._encode_sample(idx)  # PyReplayBuffer.pyx:1329
            index = torch.as_tensor(np.asarray(idx, dtype=np.int64))
            info = {"index": index}
        return self._rows(out, len(index)), info

    def contents(self) -> TensorDictBase:
        n = len(self)
        return self._rows(self.rb.get_all_transitions(), n)

    @property
    def cursor(self) -> int:
        return 0 if self.rb is None else int(self.rb.get_next_index())

    @property
    def write_count(self) -> int:
        return self.written

    # priorities
    def update_priority(self, index, priority, generation=None) -> None:
        if not self.prioritized:  # cpprb's uniform ReplayBuffer has no update_priorities
            self.rb.update_priorities(index, priority)
            return
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but cpprb's update_priorities(indexes, priorities) "
                "takes no write generation (capability 'stale_updates' is not declared)"
            )
        idx = to_numpy(torch.as_tensor(index))
        if idx.dtype.kind in "iu" and idx.size and (idx.min() < 0 or idx.max() >= self.spec.capacity):
            import pytest  # a FAIL with the reason, not an exception the property would count as a refusal

            pytest.fail(
                f"update_priority(index={idx.tolist()}): {SRC} would accept it, but should "
                f"refuse an index outside [0, capacity={self.spec.capacity}); not handed over, because "
                f"cpprb casts it to size_t and writes outside its segment tree (SegmentTree.hh:138, no "
                f"bound check; index 10**6 kills the process) -- docs/findings.md",
                pytrace=False,
            )
        pri = to_numpy(torch.as_tensor(priority))
        self.rb.update_priorities(idx, pri)

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError(
            "cpprb keeps priorities in a C++ sampler the Python class does not expose "
            "(capability 'priority_readback' is not declared)"
        )

    @property
    def max_priority(self) -> float:
        raise NotImplementedError(
            "cpprb's get_max_priority() is readable but its slots are not "
            "(capability 'priority_readback' is not declared)"
        )



def _version() -> str:
    try:
        cpprb = importlib.import_module("cpprb")
    except ImportError as err:
        raise ImportError(
            f"cpprb is not installed ({type(err).__name__}: {err}), but should be: install the "
            f"'cpprb' dependency group"
        ) from err
    from importlib.metadata import version

    del cpprb
    return f"{version('cpprb')} (numpy {np.__version__})"


def _make(spec: BufferSpec) -> CpprbBuffer:
    if spec.sampler not in ("random", "prioritized"):
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized' (cpprb)")
    return CpprbBuffer(spec)


def cpprb_adapter() -> Adapter:
    """cpprb's uniform ``ReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="cpprb", version=_version(), make=_make, capabilities=UNIFORM_CAPABILITIES,
                   raw=RawFace("rbcheck.harness.adapters.cpprb_raw:CpprbRaw"))


def cpprb_per_adapter() -> Adapter:
    """cpprb's ``PrioritizedReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(
        raw=RawFace("rbcheck.harness.adapters.cpprb_raw:CpprbRaw"),
        name="cpprb-per",
        version=_version(),
        make=_make,
        capabilities=PER_CAPABILITIES,
        conventions=PER_CONVENTIONS,
    )


__all__ = ["CpprbBuffer", "PER_CONVENTIONS", "cpprb_adapter", "cpprb_per_adapter"]
