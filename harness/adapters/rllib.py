"""RLlib's old-stack replay buffers (written against ray[rllib] 2.60.0) as BufferUnderTest.

Two built-in names: ``rllib`` (``ray.rllib.utils.replay_buffers.ReplayBuffer``,
uniform) and ``rllib-per`` (``PrioritizedReplayBuffer``, its sum and min
trees the pure-Python ``SumSegmentTree`` / ``MinSegmentTree`` over a list of
floats). Line numbers below are of ray 2.60.0's ``rllib/utils/replay_buffers/
replay_buffer.py`` (``rb.py``), ``prioritized_replay_buffer.py`` (``prb.py``),
``multi_agent_prioritized_replay_buffer.py`` (``maprb.py``) and
``rllib/execution/segment_tree.py`` (``st.py``).

Mapping (nothing of the buffer emulated; the adapter converts rows at the
boundary and observes the library's own indices):

* buffer: ``ReplayBuffer(capacity, storage_unit="timesteps")`` (rb.py:122)
  / ``PrioritizedReplayBuffer(capacity, storage_unit="timesteps",
  alpha=spec.alpha)`` (prb.py:28). ``storage_unit="timesteps"`` (the
  default) makes each row one storage item (``batch.timeslices(1)``,
  rb.py:209-212), so ``capacity`` counts rows as the spec's does. RLlib
  takes no eps and no beta at construction: ``spec.beta`` goes to every
  ``sample(num_items, beta)`` (prb.py:96), ``spec.eps`` nowhere
  (convention ``eps_rule="none"``).
* rows: a ``SampleBatch`` (a dict of NumPy arrays ``[n, *row_shape]``) with
  one column per leaf of the TensorDict, named ``"/".join(key)``
  (``"next/obs"``); sampled and stored rows come back through the same
  names with the dtypes RLlib keeps (NumPy's, unchanged).
* ``extend(data)``: ``add(SampleBatch)`` (rb.py:193), which writes the
  timeslices one by one through ``_add_single_batch`` (rb.py:245; prb.py:64
  sets the new row's priority). The slots returned are the library's own:
  the adapter records ``_next_idx`` as each ``_add_single_batch`` starts.
  ``add(row)`` is an extend of one row. With ``spec.priority_key`` each row
  is added alone with ``add(row, weight=p)`` (prb.py:75-81), as RLlib's
  ``MultiAgentPrioritizedReplayBuffer`` does with the mean of each
  timeslice's ``"weights"`` (maprb.py:171, :205-224); the column stays stored.
* ``len``: ``len(buffer)`` (rb.py:189, items stored); ``cursor``:
  ``get_state()["_next_idx"]`` (rb.py:345); ``write_count``:
  ``stats()["added_count"]`` (rb.py:332, timesteps added over its life).
* ``contents()``: ``concat_samples(get_state()["_storage"])``, slot order
  (rb.py:345; the storage is a list indexed by slot, rb.py:259-266).
* ``sample``: ``sample(batch_size)`` (rb.py:282) /
  ``sample(batch_size, beta=spec.beta)`` (prb.py:96). ``info["index"]`` is
  the prioritized buffer's ``"batch_indexes"`` column (prb.py:160); the
  uniform buffer returns no indices, so the adapter records the ``idxes``
  its ``sample`` hands to ``_encode_sample`` (rb.py:315-316, :362).
  ``info["weight"]`` is the ``"weights"`` column (float64, prb.py:159).
* randomness: both draw from Python's global ``random`` module
  (``random.randint``, rb.py:315; ``random.random``, prb.py:89) and take no
  seed; a user seeds them with ``random.seed``. Each buffer keeps its own
  state of that generator, seeded with ``spec.seed``, swapped in for the
  length of each library call (:class:`GlobalRandomStream`), so buffers in
  one process do not share a stream.
* ``update_priority(index, priority)``: ``update_priorities(idxes,
  priorities)`` (prb.py:165) with NumPy arrays (it asserts a list or an
  ndarray, prb.py:177). No write generation: "stale_updates" is not
  declared (an update for a slot rewritten since it was sampled lands on
  the new row: ray-project/ray #6534, docs/findings.md).
* read-back (``priority_readback``): ``stored_priority(i)`` is leaf ``i`` of
  ``get_state()["sum_segment_tree"]`` (prb.py:222; the leaves are the
  second half of the list, st.py:18-29), ``max_priority`` is
  ``get_state()["max_priority"]`` (prb.py:224).
* ``indices_from_uniforms(u)`` (``shared_rng``): the library's own
  ``_sample_proportional(len(u))`` (prb.py:85-92) with ``random.random``
  returning the given uniforms in order for that call.
* ``spec.batch_size`` is the default ``num_items`` of ``sample``;
  ``spec.layout`` decodes the columns back into TensorDict rows; the slice
  fields, ``transform``, ``pin_memory`` and ``device`` have no counterpart
  (NumPy on the CPU: those capabilities are not declared), nor do
  ``num_envs``, ``nstep`` and ``gamma`` (the old stack stores single steps;
  its n-step returns are computed outside the buffer, so "transitions" and
  "nstep" are not declared).
* no ``save``/``load``: ``get_state()`` returns the live storage list of
  ``SampleBatch`` objects and the trees' lists (not copies, rb.py:345,
  st.py:164-165) with no serializer of its own; a file format would be the
  adapter's, not RLlib's, so "save_load" is not declared.

Conventions of ``rllib-per`` (``Conventions.notes`` cites each):

* no eps: a new row stores ``max_priority ** alpha`` (prb.py:77-81), an
  update ``priority ** alpha`` (prb.py:188-189): ``eps_rule="none"``;
* a priority of 0 is refused (``assert priority > 0``, prb.py:184):
  ``positive_priorities`` (only on update: the add path checks nothing,
  docs/findings.md);
* alpha > 0 (``assert alpha > 0``, prb.py:49); beta >= 0 with no upper
  bound (``assert beta >= 0.0``, prb.py:127);
* the new-row priority is the raw max over the buffer's life, 1.0 at first
  (prb.py:59, :191): the spec's rule; weights are normalised by the smallest
  probability over the stored slots (prb.py:136-137): the spec's rule;
  draws are independent (prb.py:87-91): the spec's rule.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import random
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.numpy_rows import (
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
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions, ParamRange

SRC = "ray 2.60.0 rllib/utils/replay_buffers"
UNIFORM_CAPABILITIES = frozenset({"random", "bad_input"})
PER_CAPABILITIES = frozenset({"prioritized", "priority_readback", "priority_key", "shared_rng", "bad_input"})
#: Columns RLlib's prioritized sample adds to the rows (prb.py:159-160).
INFO_COLUMNS = ("weights", "batch_indexes")

PER_CONVENTIONS = Conventions(
    eps_rule="none",
    positive_priorities=True,
    param_ranges={"alpha": ParamRange(0.0, math.inf, low_closed=False), "beta": ParamRange(0.0, math.inf)},
    notes={
        "eps_rule": f"no eps: weight ** alpha on add, priority ** alpha on update ({SRC}/"
        "prioritized_replay_buffer.py:80-81, :188-189)",
        "positive_priorities": f"assert priority > 0 in update_priorities ({SRC}/prioritized_replay_buffer.py:184)",
        "param_ranges.alpha": f"assert alpha > 0 ({SRC}/prioritized_replay_buffer.py:49)",
        "param_ranges.beta": f"assert beta >= 0.0, no upper bound ({SRC}/prioritized_replay_buffer.py:127)",
    },
)


class GlobalRandomStream:
    """A private state for Python's *global* ``random`` generator: RLlib's
    buffers draw from it (rb.py:315, prb.py:89) and take no seed. Each buffer
    keeps its own state, seeded with ``spec.seed``; ``with stream.active():``
    swaps it in for one library call, then puts the caller's state back."""

    def __init__(self, seed: int) -> None:
        self.state = random.Random(seed).getstate()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self.state)
        try:
            yield
        finally:
            self.state = random.getstate()
            random.setstate(outer)


def _name(key: tuple[str, ...]) -> str:
    return "/".join(key)


def _modules() -> tuple[Any, Any, Any]:
    rb = importlib.import_module("ray.rllib.utils.replay_buffers.replay_buffer")
    prb = importlib.import_module("ray.rllib.utils.replay_buffers.prioritized_replay_buffer")
    sb = importlib.import_module("ray.rllib.policy.sample_batch")
    return rb, prb, sb


class RLlibBuffer(OwnRandomness):
    """A :class:`BufferUnderTest` over an RLlib ``ReplayBuffer`` or ``PrioritizedReplayBuffer``."""

    LIBRARY = "RLlib"

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        self.prioritized = spec.sampler == "prioritized"
        rb_mod, prb_mod, sb_mod = _modules()
        self._sb = sb_mod
        self._prb_mod = prb_mod
        if self.prioritized:
            self.rb = prb_mod.PrioritizedReplayBuffer(capacity=spec.capacity, storage_unit="timesteps",
                                                      alpha=spec.alpha)
        else:
            self.rb = rb_mod.ReplayBuffer(capacity=spec.capacity, storage_unit="timesteps")
        self.layout: RowLayout | None = layout_from_spec(getattr(spec, "layout", None))
        self.stream = GlobalRandomStream(spec.seed)
        # observe the library's own slots and sampled indices (no copy of its logic)
        self._slots: list[int] = []
        self._drawn: list[int] = []
        add_single, encode = self.rb._add_single_batch, self.rb._encode_sample

        def add_single_batch(item, **kwargs):
            self._slots.append(int(self.rb._next_idx))
            return add_single(item, **kwargs)

        def encode_sample(idxes):
            self._drawn = [int(i) for i in idxes]
            return encode(idxes)

        self.rb._add_single_batch = add_single_batch
        self.rb._encode_sample = encode_sample

    def __repr__(self) -> str:
        return f"RLlibBuffer({type(self.rb).__name__}, {self.spec})"

    # writing
    def _batch(self, arrays: dict[tuple[str, ...], np.ndarray]) -> Any:
        return self._sb.SampleBatch({_name(k): v for k, v in arrays.items()})

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.layout is None and isinstance(data, TensorDictBase) and row_count(data):
            self.layout = layout_from_rows(data)
        arrays = leaves(data)
        n = row_count(data)
        self._slots = []
        if self.prioritized and self.spec.priority_key is not None:
            weights = arrays[(self.spec.priority_key,)]
            for i in range(n):  # one row, one weight (maprb.py:171, :205-224)
                self.rb.add(self._batch({k: v[i: i + 1] for k, v in arrays.items()}), weight=weights[i])
        else:
            self.rb.add(self._batch(arrays))
        return torch.tensor(self._slots, dtype=torch.int64)

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # reading
    def __len__(self) -> int:
        return len(self.rb)

    def _rows(self, batch: Any, n: int) -> TensorDict:
        if self.layout is None:  # nothing written yet
            return TensorDict({}, batch_size=[n])
        if n == 0:  # an empty batch has no columns (sample(0)): decode it, never raise for RLlib
            return rows_from_arrays(self.layout, {key: torch.zeros((0, *shape), dtype=dtype).numpy()
                                                  for key, shape, dtype in self.layout}, 0)
        by_key = {key: np.asarray(batch[_name(key)]) for key, _, _ in self.layout}
        return rows_from_arrays(self.layout, by_key, n)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        self._drawn = []
        with self.stream.active():
            if self.prioritized:
                out = self.rb.sample(batch_size, beta=self.spec.beta)
            else:
                out = self.rb.sample(batch_size)
        if self.prioritized:
            index = torch.as_tensor(np.asarray(out["batch_indexes"], dtype=np.int64))
            info = {"index": index, "weight": torch.as_tensor(np.asarray(out["weights"]))}
        else:
            index = torch.tensor(self._drawn, dtype=torch.int64)
            info = {"index": index}
        return self._rows(out, len(index)), info

    def contents(self) -> TensorDictBase:
        storage = self.rb.get_state()["_storage"]
        if not storage:
            return self._rows({}, 0)
        return self._rows(self._sb.concat_samples(list(storage)), len(storage))

    @property
    def cursor(self) -> int:
        return int(self.rb.get_state()["_next_idx"])

    @property
    def write_count(self) -> int:
        return int(self.rb.stats()["added_count"])

    # priorities
    def update_priority(self, index, priority, generation=None) -> None:
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but RLlib's update_priorities(idxes, priorities) takes no "
                "write generation (capability 'stale_updates' is not declared)"
            )
        if not self.prioritized:  # RLlib's uniform ReplayBuffer has no update_priorities
            self.rb.update_priorities(index, priority)
            return
        self.rb.update_priorities(to_numpy(torch.as_tensor(index)), to_numpy(torch.as_tensor(priority)))

    def _tree(self) -> list:
        return self.rb.get_state()["sum_segment_tree"]

    def stored_priority(self, index) -> torch.Tensor:
        tree = self._tree()
        half = len(tree) // 2  # leaves: the second half (st.py:18-29)
        idx = torch.as_tensor(index, dtype=torch.int64).reshape(-1).tolist()
        return torch.tensor([float(tree[half + i]) for i in idx], dtype=torch.float64)

    @property
    def max_priority(self) -> float:
        return float(self.rb.get_state()["max_priority"])

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        if not self.prioritized:
            return super().indices_from_uniforms(u)
        given = iter(torch.as_tensor(u, dtype=torch.float64).reshape(-1).tolist())
        with mock.patch.object(self._prb_mod.random, "random", lambda: next(given)):
            idx = self.rb._sample_proportional(len(torch.as_tensor(u).reshape(-1)))  # prb.py:85-92
        return torch.tensor(idx, dtype=torch.int64)


def _version() -> str:
    try:
        ray = importlib.import_module("ray")
        _modules()
    except ImportError as err:
        raise ImportError(
            f"ray[rllib] is not installed ({type(err).__name__}: {err}), but should be: install the "
            f"'rllib' dependency group"
        ) from err
    return f"{ray.__version__} (numpy {np.__version__})"


def _make(spec: BufferSpec) -> RLlibBuffer:
    if spec.sampler not in ("random", "prioritized"):
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized' (RLlib)")
    return RLlibBuffer(spec)


def rllib_adapter() -> Adapter:
    """RLlib's old-stack uniform ``ReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="rllib", version=_version(), make=_make, capabilities=UNIFORM_CAPABILITIES,
                   raw=RawFace("rbcheck.harness.adapters.rllib_raw:RLlibRaw"))


def rllib_per_adapter() -> Adapter:
    """RLlib's old-stack ``PrioritizedReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(
        raw=RawFace("rbcheck.harness.adapters.rllib_raw:RLlibRaw"),
        name="rllib-per",
        version=_version(),
        make=_make,
        capabilities=PER_CAPABILITIES,
        conventions=PER_CONVENTIONS,
    )


__all__ = ["GlobalRandomStream", "PER_CONVENTIONS", "RLlibBuffer", "rllib_adapter", "rllib_per_adapter"]
