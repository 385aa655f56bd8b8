"""flashbax's replay buffers (written against flashbax 0.1.3, JAX's CPU
backend, JAX's default 32-bit mode) as BufferUnderTest.

Four built-in names: ``flashbax`` (``make_flat_buffer``), ``flashbax-item``
(``make_item_buffer``), ``flashbax-per`` (``make_prioritised_flat_buffer``)
and ``flashbax-item-per`` (``make_prioritised_item_buffer``). Files below are
under ``flashbax/buffers/`` of flashbax 0.1.3: ``flat_buffer.py``,
``item_buffer.py``, ``prioritised_flat_buffer.py``,
``prioritised_item_buffer.py``, ``trajectory_buffer.py``,
``prioritised_trajectory_buffer.py`` (``ptb`` below) and ``sum_tree.py``.

flashbax is pure functions over an explicit state (state in, state out):
``buffer = make_*(...)`` is a bundle of functions (``init``, ``add``,
``sample``, ``can_sample``, ``set_priorities``), the data lives in a pytree
``state``. The adapter keeps the current ``state`` and a ``jax.random`` key
and replaces both after every call; the functions are ``jax.jit``-compiled,
as flashbax's README uses them (cached per configuration, so buffers of one
shape share one compilation).

Mapping:

* buffer: ``make_flat_buffer(max_length=capacity, min_length=1,
  sample_batch_size=B, add_sequences=True)`` (flat_buffer.py:148), which is
  a trajectory buffer of one row (``add_batch_size=1``) with
  ``sample_sequence_length=2, period=1`` (flat_buffer.py:113-121): it samples
  *transition pairs* (row i, row i+1) and returns them as
  ``ExperiencePair(first, second)`` (flat_buffer.py:141-143). The item
  buffer is the same with ``sample_sequence_length=1`` (item_buffer.py:79-86):
  each row is an item. The prioritised ones add ``priority_exponent=
  spec.alpha, device="cpu"``. ``B`` is ``spec.batch_size`` (1 when None);
  flashbax fixes the sample batch size when the functions are built, so a
  ``sample(n)`` of another size builds (and caches) the functions for ``n``
  over the same state. flashbax refuses ``B > capacity`` there
  (flat_buffer.py:47, item_buffer.py:30) and a flat capacity below 2
  (flat_buffer.py:58).
* the state is built by ``buffer.init(example_row)`` from ``spec.layout``
  (zeros of each field) in ``make``, else from the first written row.
* a spec row is one time step of the one row of the buffer: slot ``i`` is
  ``state.experience[field][0, i]``.
* ``extend(data)``: ``state = add(state, data)`` with the ``n`` rows as one
  sequence (``add_sequences=True``: the leaves get a leading batch axis of 1,
  flat_buffer.py:127-136), written at ``(current_index + arange(n)) %
  capacity`` (trajectory_buffer.py:141). flashbax asserts the batch's
  dtypes equal the state's (trajectory_buffer.py:130, ptb:492) and ``n <=
  capacity`` (trajectory_buffer.py:135, ptb:498). ``add(row)`` is an extend
  of one row.
* ``len``: ``capacity if state.is_full else state.current_index``
  (trajectory_buffer.py:196); ``cursor``: ``state.current_index``.
  flashbax keeps no write count (the prioritised state's ``running_index``
  is int32, ptb:188): ``write_count`` is counted by the adapter (rows of each
  add flashbax accepted).
* ``contents()``: ``state.experience[field][0, :len]``, slot order.
* ``sample``: ``sample(state, subkey)`` with ``key, subkey =
  jax.random.split(key)`` and ``key = jax.random.PRNGKey(spec.seed)`` at
  first (seeding goes through JAX keys only). The rows are
  ``experience.first`` (flat) or the item (item buffer). The uniform buffers
  return no indices: the adapter repeats the draw of
  ``trajectory_buffer.sample`` (trajectory_buffer.py:196-219: the same key
  splits, ``randint`` over the valid starts, ``(head + start) % capacity``)
  on the same subkey; the rows are flashbax's own, so a repeat that
  disagreed would fail the row-belongs-to-its-index properties. The
  prioritised ones return ``indices`` (the sum tree's item = the slot, with
  one row and ``period=1``, ptb:720-722) and ``probabilities``
  (``leaf / root``, sum_tree.py:240) but no importance weights: the adapter
  computes ``info["weight"] = (len * probability) ** -spec.beta`` in float64
  from flashbax's float32 probabilities, not divided by anything (see
  conventions). ``beta`` is thus the adapter's own parameter: ``make``
  refuses one outside ``[0, 1]`` (NaN included), flashbax has none.
* ``update_priority(index, priority)``: ``state = set_priorities(state,
  index, priority)`` (ptb:740): flashbax stores ``p ** alpha``, and 0 for
  ``p == 0`` (ptb:771-773), with ``set_batch_scan`` on the CPU (ptb:62,
  sum_tree.py:391). No write generation: "stale_updates" is not declared.
* read-back: ``stored_priority`` is ``sum_tree.get_batch(state.sum_tree_state,
  index)`` (sum_tree.py:244), float32 as float64. ``max_priority``: flashbax
  records the largest *stored* value, ``max(1.0, p ** alpha)`` over the
  buffer's life (``max_recorded_priority``, sum_tree.py:74, :383), and gives
  new items exactly that (ptb:443); the adapter returns it as a raw priority,
  ``max_recorded ** (1 / alpha)``, within float32's error (alpha = 0 keeps
  no raw value: the record itself, 1.0, is returned and not compared).
* no ``save``/``load``: the state is a pytree the user checkpoints with
  their own tools (flashbax's ``Vault`` stores experience, not the buffer's
  state); "save_load" is not declared.

The boundary, and what it costs: rows go in as NumPy copies of the torch
tensors turned into JAX arrays (``jnp.asarray``, one host copy; the CPU
backend may share it), and come back as ``np.asarray(jax_array)`` copied
into torch tensors (one copy more). JAX's default mode has no 64-bit types:
int64 and float64 fields are stored as int32 and float32. The adapter
converts them back to the written dtype on the way out, and fails the
calling test with the reason when a value does not survive the narrowing
(an int64 beyond int32, a float64 that float32 rounds): nothing is hidden.

Conventions of the prioritised buffers (``Conventions.notes`` cites each):

* float32 priorities and tree: ``sum_tree.init`` allocates ``jnp.zeros``
  (float32 in JAX's default mode) with no dtype argument in 0.1.3
  (sum_tree.py:71-74);
* no eps (``eps_rule="none"``): flashbax stores ``p ** alpha``, and 0 for a
  priority of exactly 0 (ptb:771-773), and documents that the caller adds
  eps ("priorities: ... Commonly this will be abs(td-error) + eps",
  ptb:751); ``spec.eps`` is not handed over (there is nothing to hand it to);
* no importance weights: the adapter's ``(N P) ** -beta`` is not
  normalised (``weight_normaliser="none"``);
* sampling is stratified: draw k of B falls in the k-th of B equal segments
  of the total mass (``stratified_sample``, sum_tree.py:180-215);
* ``0 <= alpha <= 1`` (``validate_priority_exponent``,
  prioritised_flat_buffer.py:49-54; ptb:819).

How the side-by-side benchmark builds one (``bench/peers*``): ``buf =
load_adapter("flashbax-per").make(BufferSpec(capacity, sampler="prioritized",
batch_size=B, alpha=a, eps=0.0, layout={"obs": ((d,), torch.float32)}))``,
then ``buf.extend(td)``, ``buf.sample()``, ``buf.update_priority(idx, p)``;
to time flashbax without the torch boundary, use ``buf.fns`` (the jitted
``add``/``sample``/``set_priorities``) on ``buf.state`` directly.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

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
)
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions, ParamRange

SRC = "flashbax 0.1.3"
UNIFORM_CAPABILITIES = frozenset({"random", "bad_input"})
PER_CAPABILITIES = frozenset({"prioritized", "priority_readback", "bad_input"})

PER_CONVENTIONS = Conventions(
    priority_dtype=torch.float32,
    eps_rule="none",
    weight_normaliser="none",
    sampling="stratified",
    param_ranges={"alpha": ParamRange(0.0, 1.0)},
    notes={
        "priority_dtype": f"sum_tree.init allocates jnp.zeros with no dtype argument: float32 in JAX's "
        f"default mode ({SRC} buffers/sum_tree.py:71-74)",
        "eps_rule": "no eps: p ** alpha stored, 0 for p == 0; the caller adds eps "
        f"({SRC} buffers/prioritised_trajectory_buffer.py:751, :771-773)",
        "weight_normaliser": "no importance weights: sample returns probabilities (leaf / root, "
        f"{SRC} buffers/sum_tree.py:240); the adapter's (N P) ** -beta is not normalised",
        "sampling": f"stratified_sample: draw k in the k-th of B equal segments ({SRC} buffers/sum_tree.py:180-215)",
        "param_ranges.alpha": f"validate_priority_exponent: 0 <= priority_exponent <= 1 "
        f"({SRC} buffers/prioritised_flat_buffer.py:49-54)",
    },
)

KINDS = {
    # name: (module function, prioritised, sequence length)
    "flat": ("make_flat_buffer", False, 2),
    "item": ("make_item_buffer", False, 1),
    "flat-per": ("make_prioritised_flat_buffer", True, 2),
    "item-per": ("make_prioritised_item_buffer", True, 1),
}


def _jax():
    try:
        return importlib.import_module("jax")
    except ImportError as err:  # pragma: no cover - reported as unavailable by _version
        raise ImportError(f"jax is not installed ({err}), but should be: install the 'flashbax' "
                          f"dependency group") from err


@functools.lru_cache(maxsize=128)
def _functions(kind: str, capacity: int, batch_size: int, alpha: float):
    """flashbax's functions for one configuration, jitted (flashbax validates
    its arguments here and raises ValueError)."""
    jax = _jax()
    fbx = importlib.import_module("flashbax")
    maker, prioritised, _ = KINDS[kind]
    kwargs: dict[str, Any] = {"max_length": capacity, "min_length": 1, "sample_batch_size": batch_size,
                              "add_sequences": True}
    if prioritised:
        kwargs.update(priority_exponent=alpha, device="cpu")
    buffer = getattr(fbx, maker)(**kwargs)
    out = {"buffer": buffer, "init": buffer.init, "add": jax.jit(buffer.add), "sample": jax.jit(buffer.sample)}
    if prioritised:
        out["set_priorities"] = jax.jit(buffer.set_priorities)
    return out


def _nest(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


def _get(tree: dict[str, Any], key: tuple[str, ...]) -> Any:
    for part in key:
        tree = tree[part]
    return tree


class FlashbaxBuffer(OwnRandomness):
    """A :class:`BufferUnderTest` over one of flashbax's buffers and its state."""

    LIBRARY = "flashbax"

    def __init__(self, spec: BufferSpec, kind: str):
        self.spec = spec
        self.kind = kind
        _, self.prioritized, self.seq_len = KINDS[kind]
        if self.prioritized and not (0.0 <= spec.beta <= 1.0):  # NaN fails too
            # flashbax has no beta: it is the adapter's, for its weights (see sample)
            raise ValueError(f"spec.beta={spec.beta!r}, but should be in [0, 1] (flashbax has no beta: "
                             f"the adapter computes the weights (N P) ** -beta)")
        self.batch = check_batch_size(None, spec.batch_size) or 1
        # flashbax validates capacity, batch size and alpha here (ValueError)
        self.fns = _functions(kind, spec.capacity, self.batch, float(spec.alpha))
        jax = _jax()
        self.key = jax.random.PRNGKey(spec.seed)
        self.state: Any = None
        self.layout: RowLayout | None = None
        self.written = 0
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._init(layout)

    def __repr__(self) -> str:
        return f"FlashbaxBuffer({self.kind}, {self.spec})"

    def _init(self, layout: RowLayout) -> None:
        jnp = importlib.import_module("jax.numpy")
        example = {key: jnp.asarray(np.zeros(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))
                   for key, shape, dtype in layout}
        self.layout = layout
        self.state = self.fns["init"](_nest(example))

    # -- the boundary ---------------------------------------------------------
    def _to_jax(self, data: TensorDictBase) -> dict[str, Any]:
        """The rows as JAX arrays, one sequence (flashbax adds the batch axis
        of 1 itself, flat_buffer.py:127-136); fails the test if JAX's 32-bit mode changes a value."""
        jnp = importlib.import_module("jax.numpy")
        out = {}
        for key, value in leaves(data).items():
            arr = jnp.asarray(value)
            back = np.asarray(arr)
            if back.dtype != value.dtype and not np.array_equal(back.astype(value.dtype), value, equal_nan=True):
                import pytest

                pytest.fail(f"field {key}: JAX's 32-bit mode stores {value.dtype} as {back.dtype} and "
                            f"changes its values ({SRC} with jax's default jax_enable_x64=False); "
                            f"not a property of the buffer", pytrace=False)
            out[key] = arr
        return _nest(out)

    def _from_jax(self, tree: Any, n: int, take) -> TensorDict:
        td = TensorDict({}, batch_size=[n])
        for key, shape, dtype in self.layout or ():
            value = np.array(take(_get(tree, key)), copy=True)
            tensor = torch.as_tensor(value).reshape(n, *shape).to(dtype)
            td.set(key if len(key) > 1 else key[0], tensor)
        return td

    # -- writing --------------------------------------------------------------
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.state is None:
            self._init(layout_from_rows(data) if isinstance(data, TensorDictBase) else
                       tuple(sorted((k, v.shape[1:], torch.as_tensor(v).dtype) for k, v in leaves(data).items())))
        n = row_count(data)
        start = self.cursor
        self.state = self.fns["add"](self.state, self._to_jax(data))
        self.written += n
        return (start + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # -- reading --------------------------------------------------------------
    def __len__(self) -> int:
        if self.state is None:
            return 0
        return self.spec.capacity if bool(self.state.is_full) else int(self.state.current_index)

    @property
    def cursor(self) -> int:
        return 0 if self.state is None else int(self.state.current_index)

    @property
    def write_count(self) -> int:
        return self.written

    def contents(self) -> TensorDictBase:
        n = len(self)
        return self._from_jax(self.state.experience, n, lambda x: x[0, :n]) if self.state is not None \
            else TensorDict({}, batch_size=[0])

    def _uniform_index(self, subkey, batch_size: int) -> torch.Tensor:
        """trajectory_buffer.sample's draw (trajectory_buffer.py:196-219), repeated on the same key."""
        jax = _jax()
        jnp = importlib.import_module("jax.numpy")
        capacity = self.spec.capacity
        max_time = jnp.where(self.state.is_full, capacity, self.state.current_index)
        head = jnp.where(self.state.is_full, self.state.current_index, 0)
        max_start = max_time - self.seq_len
        num_valid = jnp.where(max_start >= 0, max_start + 1, 0)
        _, subkey_items = jax.random.split(subkey)
        start = jax.random.randint(subkey_items, (batch_size,), 0, num_valid)
        return torch.as_tensor(np.asarray((head + start) % capacity).astype(np.int64))

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        fns = self.fns if batch_size == self.batch else _functions(
            self.kind, self.spec.capacity, batch_size, float(self.spec.alpha))
        if self.state is None:  # nothing written: flashbax cannot even build a state to sample
            raise RuntimeError("sample() on a buffer with no state: flashbax's init needs an example row")
        jax = _jax()
        key, subkey = jax.random.split(self.key)
        out = fns["sample"](self.state, subkey)
        self.key = key  # the stream moves only when flashbax answered
        experience = out.experience.first if self.seq_len == 2 else out.experience
        rows = self._from_jax(experience, batch_size, lambda x: x)
        if not self.prioritized:
            return rows, {"index": self._uniform_index(subkey, batch_size)}
        index = torch.as_tensor(np.asarray(out.indices).astype(np.int64))
        prob = torch.as_tensor(np.array(out.probabilities, copy=True)).to(torch.float64)
        weight = (len(self) * prob) ** -float(self.spec.beta)
        return rows, {"index": index, "weight": weight}

    # -- priorities -----------------------------------------------------------
    def update_priority(self, index, priority, generation=None) -> None:
        if not self.prioritized:
            raise NotImplementedError("flashbax's uniform buffers have no set_priorities")
        if generation is not None:
            raise NotImplementedError("generation is not None, but flashbax's set_priorities takes no "
                                      "write generation (capability 'stale_updates' is not declared)")
        jnp = importlib.import_module("jax.numpy")
        idx = torch.as_tensor(index)
        pri = torch.as_tensor(priority)
        if idx.device.type == "meta" or pri.device.type == "meta":
            import pytest

            pytest.skip("not applicable: flashbax takes arrays, and a tensor on the meta device has no data")
        self.state = self.fns["set_priorities"](self.state, jnp.asarray(idx.numpy()), jnp.asarray(pri.numpy()))

    def stored_priority(self, index) -> torch.Tensor:
        if self.state is None:  # no row yet, so no state: a fresh tree holds zeros (sum_tree.py:73)
            return torch.zeros(len(torch.as_tensor(index).reshape(-1)), dtype=torch.float64)
        sum_tree = importlib.import_module("flashbax.buffers.sum_tree")
        jnp = importlib.import_module("jax.numpy")
        idx = jnp.asarray(torch.as_tensor(index, dtype=torch.int64).numpy())
        got = sum_tree.get_batch(self.state.sum_tree_state, idx)
        return torch.as_tensor(np.asarray(got)).to(torch.float64)

    @property
    def max_priority(self) -> float:
        if self.state is None:
            return 1.0
        recorded = float(np.asarray(self.state.sum_tree_state.max_recorded_priority))
        if self.spec.alpha == 0:  # max(p ** 0) is 1 whatever p: no raw value (the oracle expects none)
            return recorded
        return float(recorded ** (1.0 / float(self.spec.alpha)))


def _version() -> str:
    try:
        importlib.import_module("flashbax")
    except ImportError as err:
        raise ImportError(
            f"flashbax is not installed ({type(err).__name__}: {err}), but should be: install the "
            f"'flashbax' dependency group"
        ) from err
    from importlib.metadata import version

    return f"{version('flashbax')} (jax {version('jax')}, {_jax().default_backend()})"


def _maker(kind: str):
    def make(spec: BufferSpec) -> FlashbaxBuffer:
        if spec.sampler not in ("random", "prioritized"):
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' or 'prioritized' (flashbax)")
        # a uniform spec on a prioritised column builds its uniform counterpart (as cpprb-per does)
        base = kind.removesuffix("-per")
        return FlashbaxBuffer(spec, base + "-per" if spec.sampler == "prioritized" else base)

    return make


def flashbax_adapter() -> Adapter:
    """flashbax's flat buffer (transition pairs; the rows are the pairs' first elements)."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="flashbax", version=_version(), make=_maker("flat"), capabilities=UNIFORM_CAPABILITIES,
                   raw=RawFace("rbcheck.harness.adapters.flashbax_raw:FlashbaxFlatRaw"))


def flashbax_item_adapter() -> Adapter:
    """flashbax's item buffer (each row an item)."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="flashbax-item", version=_version(), make=_maker("item"),
                   capabilities=UNIFORM_CAPABILITIES,
                   raw=RawFace("rbcheck.harness.adapters.flashbax_raw:FlashbaxItemRaw"))


def flashbax_per_adapter() -> Adapter:
    """flashbax's prioritised flat buffer (float32 sum tree)."""
    return Adapter(name="flashbax-per", version=_version(), make=_maker("flat-per"),
                   capabilities=PER_CAPABILITIES, conventions=PER_CONVENTIONS)


def flashbax_item_per_adapter() -> Adapter:
    """flashbax's prioritised item buffer (float32 sum tree)."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="flashbax-item-per", version=_version(), make=_maker("item-per"),
                   capabilities=PER_CAPABILITIES, conventions=PER_CONVENTIONS,
                   raw=RawFace("rbcheck.harness.adapters.flashbax_raw:FlashbaxItemRaw"))


__all__ = ["FlashbaxBuffer", "PER_CONVENTIONS", "flashbax_adapter", "flashbax_item_adapter",
           "flashbax_item_per_adapter", "flashbax_per_adapter"]
