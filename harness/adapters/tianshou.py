"""tianshou's replay buffers (written against tianshou 2.0.1) as BufferUnderTest.

Two built-in names: ``tianshou`` (``tianshou.data.ReplayBuffer``, uniform)
and ``tianshou-per`` (``tianshou.data.PrioritizedReplayBuffer``). Files
below are under ``tianshou/data/``: ``buffer/buffer_base.py``,
``buffer/prio.py``, ``utils/segtree.py``, ``utils/converter.py``.

Mapping (read from tianshou's source, nothing emulated):

* buffer: ``ReplayBuffer(capacity, random_seed=spec.seed)``
  (buffer_base.py:71; the seed feeds its ``np.random.RandomState``, :98) /
  ``PrioritizedReplayBuffer(capacity, alpha=spec.alpha, beta=spec.beta,
  random_seed=spec.seed)`` (prio.py:25, ``weight_norm=True``, its default).
  tianshou takes no eps (see conventions). It allocates its arrays on the
  first ``add`` from that transition (``create_value``, buffer_base.py:497):
  ``spec.layout`` is not needed.
* a row: tianshou stores transitions with the keys ``obs, act, rew,
  terminated, truncated`` (required, buffer_base.py:62). The row's leaves go
  in ``obs`` as a nested ``Batch`` of NumPy arrays (any keys, shapes and
  dtypes: tianshou keeps them); ``act=0, rew=0.0, terminated=False,
  truncated=False`` fill the other required keys and are not part of the row.
* ``extend(data)``: one ``add(Batch(obs=row, ...))`` per row
  (buffer_base.py:420; ``add`` writes one transition and returns its slot
  first); ``add(row)`` is one ``add``.
* ``len``: ``len(buf)`` (``_size``, buffer_base.py:235); ``cursor``:
  ``_insertion_idx`` (buffer_base.py:380, private: no public cursor).
  tianshou keeps no count of rows written over its life: ``write_count`` is
  counted by the adapter and saved inside tianshou's file (see ``save``).
* ``contents()``: ``get(arange(len), "obs")`` (buffer_base.py:557), slot order.
* ``sample(batch_size)``: ``sample(batch_size)`` (buffer_base.py:547)
  returns ``(batch, indices)``: the rows are ``batch.obs``, ``info["index"]``
  the indices; for the prioritized buffer ``info["weight"]`` is
  ``batch.weight`` (prio.py:106). Uniform draws come from the buffer's own
  seeded ``_random_state.choice`` (buffer_base.py:517); the prioritized draw
  is ``np.random.rand(batch_size) * weight.reduce()`` then
  ``get_prefix_sum_idx`` (prio.py:65-66), from NumPy's *global* generator,
  not the buffer's seeded one (docs/findings.md).
* ``update_priority(index, priority)``: ``update_weight(index, priority)``
  (prio.py:81). No write generation: "stale_updates" is not declared.
* read-back: ``stored_priority`` reads the sum tree's leaves,
  ``buf.weight[index]`` (segtree.py:31, float64); ``max_priority`` is
  ``_max_prio`` (prio.py:39, :89): the largest ``|p| + eps`` seen, 1.0 at
  first.
* ``save(path)``: ``save_hdf5(path / "buffer.hdf5")`` (buffer_base.py:252),
  which writes the buffer's whole ``__dict__`` (converter.py:93); the
  adapter's write count rides in it as the attribute
  ``rbcheck_write_count`` (so the checkpoint is tianshou's one file);
  ``load(path)``: ``load_hdf5`` (buffer_base.py:258, a classmethod that
  builds a new buffer, which replaces this one's).

Conventions of ``tianshou-per`` (``Conventions.notes`` cites each):

* eps: no argument; ``finfo(float32).eps`` is added on ``update_weight``
  only (prio.py:42, :87), and a new row gets ``_max_prio ** alpha``
  (prio.py:47) where ``_max_prio`` already includes it;
* priority dtype: the eps is float32's, and priorities handed over as
  float32 are transformed in float32 (NumPy keeps the array's dtype,
  prio.py:87-88) before the float64 tree stores them (segtree.py:25);
* weights are divided by the batch's largest weight (``weight_norm=True``,
  prio.py:106);
* ``alpha > 0`` is asserted (prio.py:36), so alpha = 0 is outside its range.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rbcheck.harness.adapters.numpy_rows import (
    RowLayout,
    check_batch_size,
    layout_from_rows,
    leaves,
    rows_from_arrays,
    to_numpy,
)
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions, ParamRange

SRC = "tianshou 2.0.1"
UNIFORM_CAPABILITIES = frozenset({"random", "save_load", "bad_input"})
PER_CAPABILITIES = frozenset({"prioritized", "priority_readback", "save_load", "bad_input"})

PER_CONVENTIONS = Conventions(
    priority_dtype=torch.float32,
    eps_rule="finfo_on_update",
    weight_normaliser="batch_max",
    param_ranges={"alpha": ParamRange(0.0, math.inf, low_closed=False)},
    notes={
        "eps_rule": f"no eps argument; np.finfo(np.float32).eps added in update_weight ({SRC} buffer/prio.py:42, :87)",
        "priority_dtype": f"eps is float32's; float32 priorities are transformed in float32 ({SRC} buffer/prio.py:87-88), "
        "then held in a float64 tree (utils/segtree.py:25)",
        "weight_normaliser": f"weight_norm=True (default): weight / weight.max() over the batch ({SRC} buffer/prio.py:106)",
        "param_ranges": f"assert alpha > 0.0 ({SRC} buffer/prio.py:36)",
    },
)


def _row_batch(row: dict[tuple[str, ...], np.ndarray]) -> Any:
    """One transition: the row in ``obs`` and placeholders for the other required keys."""
    from tianshou.data import Batch

    obs: dict[str, Any] = {}
    for key, value in row.items():
        node = obs
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return Batch(obs=obs, act=np.zeros((), np.int64), rew=0.0, terminated=False, truncated=False)


def _arrays(batch: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], np.ndarray]:
    """The leaves of a (nested) tianshou Batch, by tuple key."""
    from tianshou.data import Batch

    out = {}
    for key in batch.get_keys():
        value = batch[key]
        if isinstance(value, Batch):
            out.update(_arrays(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = np.asarray(value)
    return out


class TianshouBuffer:
    """A :class:`BufferUnderTest` over a tianshou ``ReplayBuffer`` or ``PrioritizedReplayBuffer``."""

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        self.prioritized = spec.sampler == "prioritized"
        data = importlib.import_module("tianshou.data")
        if self.prioritized:
            self.rb = data.PrioritizedReplayBuffer(
                spec.capacity, alpha=spec.alpha, beta=spec.beta, random_seed=spec.seed
            )
        else:
            self.rb = data.ReplayBuffer(spec.capacity, random_seed=spec.seed)
        self.layout: RowLayout | None = None
        self.written = 0

    def __repr__(self) -> str:
        return f"TianshouBuffer({type(self.rb).__name__}, {self.spec})"

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        n = data.batch_size[0] if data.batch_dims else 1
        slots = []
        for i in range(n):
            slots.append(self.add(data[i]))
        return torch.tensor(slots, dtype=torch.int64)

    def add(self, row: TensorDictBase) -> int:
        arrays = leaves(row)
        ptr, *_ = self.rb.add(_row_batch(arrays))
        self.written += 1
        if self.layout is None:
            self.layout = layout_from_rows(row, batched=False)
        return int(np.asarray(ptr).reshape(-1)[0])

    # reading
    def __len__(self) -> int:
        return len(self.rb)

    def _rows(self, obs: Any, n: int):
        arrays = _arrays(obs)
        layout = self.layout or tuple(
            sorted((k, tuple(np.asarray(v).shape[1:]), torch.as_tensor(v).dtype) for k, v in arrays.items())
        )
        return rows_from_arrays(layout, arrays, n)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        batch, indices = self.rb.sample(batch_size)
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        info = {"index": index}
        if self.prioritized:
            info["weight"] = torch.as_tensor(np.asarray(batch.weight))
        return self._rows(batch.obs, len(index)), info

    def contents(self) -> TensorDictBase:
        n = len(self.rb)
        return self._rows(self.rb.get(np.arange(n), "obs"), n)

    @property
    def cursor(self) -> int:
        return int(self.rb._insertion_idx)

    @property
    def write_count(self) -> int:
        return self.written

    # priorities
    def update_priority(self, index, priority, generation=None) -> None:
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but tianshou's update_weight(index, new_weight) takes no "
                "write generation (capability 'stale_updates' is not declared)"
            )
        # a uniform ReplayBuffer has no update_weight: AttributeError, tianshou's own refusal
        update = self.rb.update_weight
        update(to_numpy(torch.as_tensor(index)), to_numpy(torch.as_tensor(priority)))

    def stored_priority(self, index) -> torch.Tensor:
        idx = torch.as_tensor(index, dtype=torch.int64).cpu().numpy()
        return torch.as_tensor(np.asarray(self.rb.weight[idx], dtype=np.float64))

    @property
    def max_priority(self) -> float:
        return float(self.rb._max_prio)

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("tianshou draws its own uniforms (capability 'shared_rng' is not declared)")

    # checkpoints
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.rb.rbcheck_write_count = self.written  # rides in the __dict__ save_hdf5 stores
        self.rb.save_hdf5(str(path / "buffer.hdf5"))

    def load(self, path: Path) -> None:
        rb = type(self.rb).load_hdf5(str(Path(path) / "buffer.hdf5"))
        self.rb, self.written = rb, int(getattr(rb, "rbcheck_write_count", len(rb)))
        self.layout = None  # taken from the loaded rows


def _version() -> str:
    try:
        importlib.import_module("tianshou.data")
    except ImportError as err:
        raise ImportError(
            f"tianshou is not installed ({type(err).__name__}: {err}), but should be: install the "
            f"'tianshou' dependency group"
        ) from err
    from importlib.metadata import version

    return f"{version('tianshou')} (numpy {np.__version__})"


def _make(spec: BufferSpec) -> TianshouBuffer:
    if spec.sampler not in ("random", "prioritized"):
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized' (tianshou)")
    return TianshouBuffer(spec)


def tianshou_adapter() -> Adapter:
    """tianshou's uniform ``ReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="tianshou", version=_version(), make=_make, capabilities=UNIFORM_CAPABILITIES,
                   raw=RawFace("rbcheck.harness.adapters.tianshou_raw:TianshouRaw"))


def tianshou_per_adapter() -> Adapter:
    """tianshou's ``PrioritizedReplayBuffer`` (``weight_norm=True``, its default)."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(
        raw=RawFace("rbcheck.harness.adapters.tianshou_raw:TianshouRaw"),
        name="tianshou-per",
        version=_version(),
        make=_make,
        capabilities=PER_CAPABILITIES,
        conventions=PER_CONVENTIONS,
    )


__all__ = ["PER_CONVENTIONS", "TianshouBuffer", "tianshou_adapter", "tianshou_per_adapter"]
