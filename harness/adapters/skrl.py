"""skrl's ``RandomMemory`` (written against skrl 2.1.1, its PyTorch memories)
as BufferUnderTest.

One built-in name: ``skrl``. Files below are under ``skrl/memories/torch/``
of skrl 2.1.1: ``base.py`` (``Memory``) and ``random.py`` (``RandomMemory``).

Mapping (nothing emulated; the rows stay torch tensors, no conversion):

* buffer: ``RandomMemory(memory_size=spec.capacity, num_envs=1,
  device="cpu", replacement=True)`` (random.py:10-49). ``replacement=True``
  because the spec's "random" sampler draws with replacement; skrl's default
  ``replacement=False`` is ``randperm(size)[:batch_size]`` (random.py:75),
  a different sampler, not declared here. One environment, so the slot of a
  row is its memory index (``tensors_view`` flattens ``(memory_size,
  num_envs)``, base.py:166).
* fields: one ``create_tensor(name, size=numel, dtype=dtype)`` per leaf of the
  rows (base.py:121), named ``"/".join(key)``: skrl stores every field as
  ``(memory_size, num_envs, data_size)`` and takes rows as ``(n, data_size)``
  (base.py:190-196), so a row's field of shape ``s`` is handed over flattened
  to ``numel(s)`` (1 for a scalar, skrl's own ``size=1``) and read back
  reshaped: a view, no copy. Built in ``make(spec)`` from ``spec.layout``,
  else from the first write. A float field starts filled with NaN
  (base.py:168-170).
* ``extend(data)``: ``add_samples(**{name: tensor})`` (base.py:190) with the
  ``n`` rows: for ``n == 1`` its "multi environment" branch (``shape[0] ==
  num_envs``, base.py:222-227), otherwise its "single environment - multi
  sample" branch (base.py:235-249). It returns nothing: the slots written
  are ``(memory_index + arange(n)) % capacity`` read before the call.
  ``add(row)`` is an extend of one row.
* ``len``: ``len(memory)`` (base.py:74-84); ``cursor``: ``memory_index``
  (base.py:57). skrl keeps no count of rows written over its life:
  ``write_count`` is counted by the adapter.
* ``contents()``: ``tensors_view[name][:len]``, slot order (a copy).
* ``sample(batch_size)``: ``sample(names, batch_size=batch_size)``
  (random.py:48) returns ``[[tensor, ...]]``; ``info["index"]`` is
  ``get_sampling_indexes()`` (base.py:342, set by random.py:80). skrl draws
  with ``torch.randint`` on torch's *global* generator (random.py:71) and
  has no seed argument; a user seeds it with ``torch.manual_seed`` (skrl's
  ``set_seed``). Each buffer keeps its own state of that generator, seeded
  with ``spec.seed``, swapped in for the length of one ``sample`` call.
* ``sample_all(mini_batches)``: ``sample_all(names, mini_batches=k)``
  (base.py:309): the whole allocated memory in slot order (``tensors_view``),
  for ``k > 1`` split into ``k`` slices of ``(memory_size * num_envs) // k``
  rows, the remainder dropped (base.py:331-336), for ``k == 1`` the whole
  view (base.py:337). Handed back as skrl returns it (a list of batches).
* no priorities, no ``save``/``load`` (``Memory.save`` exports the tensors,
  ``load`` reads them back without the ring position: not a checkpoint of
  the state, base.py:349-416): "prioritized" and "save_load" are not
  declared.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.numpy_rows import (
    OwnRandomness,
    RowLayout,
    layout_from_rows,
    layout_from_spec,
)
from rbcheck.harness.protocol import Adapter, BufferSpec

SRC = "skrl 2.1.1"
CAPABILITIES = frozenset({"random", "bad_input", "sample_all"})


class GlobalTorchStream:
    """A private state of torch's global CPU generator (what skrl's
    ``RandomMemory.sample`` draws from), swapped in for one call."""

    def __init__(self, seed: int) -> None:
        self.state = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        outer = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(outer)


def _name(key: tuple[str, ...]) -> str:
    return "/".join(key)


class SkrlBuffer(OwnRandomness):
    """A :class:`BufferUnderTest` over a skrl ``RandomMemory``."""

    LIBRARY = "skrl"

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        memories = importlib.import_module("skrl.memories.torch")
        self.memory = memories.RandomMemory(memory_size=spec.capacity, num_envs=1, device="cpu",
                                            replacement=True)
        self.layout: RowLayout | None = None
        self.written = 0
        self.stream = GlobalTorchStream(spec.seed)
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._build(layout)

    def __repr__(self) -> str:
        return f"SkrlBuffer(RandomMemory, {self.spec})"

    def _build(self, layout: RowLayout) -> None:
        self.layout = layout
        for key, shape, dtype in layout:
            numel = 1
            for d in shape:
                numel *= d
            self.memory.create_tensor(_name(key), size=numel, dtype=dtype)

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.layout is None:
            self._build(layout_from_rows(data))
        n = data.batch_size[0] if data.batch_dims else 1
        start = int(self.memory.memory_index)
        tensors = {_name(k if isinstance(k, tuple) else (k,)): v.flatten(1) if v.ndim > 1 else v.unsqueeze(-1)
                   for k, v in data.items(include_nested=True, leaves_only=True)}
        self.memory.add_samples(**tensors)
        self.written += n
        return (start + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # reading
    def __len__(self) -> int:
        return len(self.memory)

    @property
    def cursor(self) -> int:
        return int(self.memory.memory_index)

    @property
    def write_count(self) -> int:
        return self.written

    def _rows(self, values: list[torch.Tensor], n: int) -> TensorDict:
        td = TensorDict({}, batch_size=[n])
        for (key, shape, _dtype), value in zip(self.layout or (), values, strict=True):
            td.set(key if len(key) > 1 else key[0], value.reshape(n, *shape).clone())
        return td

    def contents(self) -> TensorDictBase:
        n = len(self)
        if self.layout is None:
            return TensorDict({}, batch_size=[n])
        return self._rows([self.memory.tensors_view[_name(k)][:n] for k, _, _ in self.layout], n)

    def sample(self, batch_size: int | None = None):
        batch_size = self.spec.batch_size if batch_size is None else batch_size
        names = [_name(k) for k, _, _ in self.layout or ()]
        with self.stream.active():
            out = self.memory.sample(names, batch_size=batch_size)
        index = torch.as_tensor(self.memory.get_sampling_indexes()).to(torch.int64).reshape(-1)
        return self._rows(out[0], len(index)), {"index": index}

    def sample_all(self, mini_batches: int = 1) -> list[TensorDictBase]:
        names = [_name(k) for k, _, _ in self.layout or ()]
        batches = self.memory.sample_all(names, mini_batches=mini_batches)
        return [self._rows(values, len(values[0])) for values in batches]

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("skrl's RandomMemory has no priorities (capability 'prioritized' is not declared)")


def _version() -> str:
    try:
        importlib.import_module("skrl.memories.torch")
    except ImportError as err:
        raise ImportError(
            f"skrl is not installed ({type(err).__name__}: {err}), but should be: install the 'skrl' dependency group"
        ) from err
    from importlib.metadata import version

    return version("skrl")


def _make(spec: BufferSpec) -> SkrlBuffer:
    if spec.sampler != "random":
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (skrl RandomMemory)")
    return SkrlBuffer(spec)


def skrl_adapter() -> Adapter:
    """skrl's ``RandomMemory`` (PyTorch), sampling with replacement."""
    return Adapter(name="skrl", version=_version(), make=_make, capabilities=CAPABILITIES)


__all__ = ["SkrlBuffer", "skrl_adapter"]
