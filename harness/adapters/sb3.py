"""stable-baselines3's ``ReplayBuffer`` (written against stable-baselines3
2.9.2) as a BufferUnderTest, built-in name ``sb3``. Line numbers are of
``stable_baselines3/common/buffers.py``.

SB3's buffer stores transitions of a gymnasium environment in fixed arrays
(``observations``, ``next_observations``, ``actions``, ``rewards``,
``dones``, ``timeouts``) of one dtype each, allocated in the constructor
(:211-228). A row of any layout goes in whole as its raw bytes:

* buffer: ``ReplayBuffer(capacity, observation_space=Box(0, 255,
  (nbytes,), uint8), action_space=Box(-1, 1, (1,), float32), device="cpu",
  n_envs=1)`` with ``nbytes`` the size of one row of ``spec.layout``
  (leaves sorted by key, each ``tensor.numpy().view(uint8)``). SB3 needs the
  size up front: the buffer is built in ``make(spec)`` from ``spec.layout``,
  or on the first write from that batch when the spec has none.
* ``extend(data)``: SB3's ``extend(obs, next_obs, action, reward, done,
  infos)`` (:91, one ``add`` per row, :247) with ``obs = next_obs =`` the
  rows' bytes (whatever leaves ``data`` has: SB3 checks only that the bytes
  fit its array) and zero action / reward / done; the slots written are
  ``pos`` before the call onwards, round the ring (:280-283). ``add(row)``
  is an extend of one row.
* ``len``: ``size()`` (:77); ``cursor``: ``pos`` (:57, public attribute).
  SB3 keeps no count of rows written over its life: ``write_count`` is
  counted by the adapter.
* ``contents()``: ``observations[:size(), 0]`` copied and decoded (slot order).
* ownership: the rows are packed into one new array before SB3 sees them,
  so an edit of the caller's tensors cannot reach SB3 whatever it does; the
  adapter checks at SB3's boundary instead (``library_aliasing``, read by
  test_ownership): neither the packed arrays handed to ``extend`` nor the
  ``observations`` a sample returns may share memory with SB3's storage.
  Returned arrays are handed through without a copy.
* ``sample(batch_size)``: SB3's ``ReplayBuffer.sample`` (:285, :298 ->
  ``BaseBuffer.sample`` :106) returns ``ReplayBufferSamples`` without the
  indices. The adapter repeats its draw, ``batch_inds =
  np.random.randint(0, upper_bound, size=batch_size)`` with ``upper_bound =
  buffer_size if full else pos`` (:113-114), and reads the rows with the
  private ``_get_samples(batch_inds)`` (:307; it draws the env index from
  ``np.random`` too, :309), both on NumPy's global generator with this
  buffer's own state swapped in (seeded with ``spec.seed``; SB3 is seeded
  through NumPy's global seed, ``set_random_seed``). The rows are decoded
  from the returned ``observations``. tests/thirdparty checks that the
  repeat equals SB3's own ``sample`` under the same NumPy state.
* not declared: prioritized sampling (SB3 has none), transforms, save/load
  (SB3 pickles a whole buffer through an algorithm's
  ``save_replay_buffer``; there is no buffer checkpoint), shared_rng.
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
    pack_rows,
    row_nbytes,
    skip_renamed_rows,
    unpack_rows,
)
from rbcheck.harness.protocol import Adapter, BufferSpec

CAPABILITIES = frozenset({"random", "bad_input"})


class SB3Buffer(OwnRandomness):
    """A :class:`BufferUnderTest` over a stable-baselines3 ``ReplayBuffer``."""

    LIBRARY = "SB3"

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        self.rb: Any = None
        self.layout: RowLayout | None = None
        self.written = 0
        self.aliasing: list[str] = []
        self.stream = GlobalNumpyStream(spec.seed)
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._build(layout)
        else:  # SB3 checks its arguments when built: build one now, rebuilt on the first write
            self.rb = self._construct(1)

    def __repr__(self) -> str:
        return f"SB3Buffer({self.spec})"

    def _construct(self, nbytes: int) -> Any:
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        return ReplayBuffer(
            self.spec.capacity,
            spaces.Box(0, 255, (max(nbytes, 1),), np.uint8),
            spaces.Box(-1.0, 1.0, (1,), np.float32),
            device="cpu",
            n_envs=1,
        )

    def _build(self, layout: RowLayout) -> None:
        self.layout = layout
        self.rb = self._construct(row_nbytes(layout))

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.layout is None:
            self._build(layout_from_rows(data))
        raw = pack_rows(data)
        n = len(raw)
        skip_renamed_rows(data, self.layout, raw, "SB3")
        start = int(self.rb.pos)
        zeros = np.zeros((n, 1), np.float32)
        self.rb.extend(raw, raw, zeros, zeros[:, 0], zeros[:, 0], [[{}] for _ in range(n)])
        self._check_boundary("extend", {"obs": raw, "next_obs": raw})
        self.written += n
        return (start + torch.arange(n, dtype=torch.int64)) % self.rb.buffer_size

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # reading
    def __len__(self) -> int:
        return int(self.rb.size())

    def _rows(self, raw: np.ndarray):
        if self.layout is None:
            return TensorDict({}, batch_size=[len(raw)])
        return unpack_rows(self.layout, raw)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        rb = self.rb
        with self.stream.active():
            upper_bound = rb.buffer_size if rb.full else rb.pos  # buffers.py:113
            batch_inds = np.random.randint(0, upper_bound, size=batch_size)  # buffers.py:114
            samples = rb._get_samples(batch_inds)  # buffers.py:307
        index = torch.as_tensor(np.asarray(batch_inds, dtype=np.int64))
        returned = samples.observations.cpu().numpy()
        self._check_boundary("sample", {"observations": returned})
        return self._rows(returned), {"index": index}

    def contents(self) -> TensorDictBase:
        # SB3 has no way to read its rows: the adapter reads its arrays, so it copies them
        return self._rows(self.rb.observations[: self.rb.size(), 0].copy())

    # ownership, checked where SB3 is called (the caller's rows never reach it: they are packed first)
    def _check_boundary(self, call: str, arrays: dict) -> None:
        storage = {name: getattr(self.rb, name) for name in ("observations", "next_observations")}
        for arg, array in arrays.items():
            for name, held in storage.items():
                if np.shares_memory(array, held):
                    self.aliasing.append(f"{call}: {arg} shares memory with ReplayBuffer.{name}")

    def library_aliasing(self) -> list[str]:
        """What SB3 was handed or returned that shares memory with its
        storage, since the last call (then cleared): the hook the ownership
        properties read, since the caller's own tensors never reach SB3."""
        found, self.aliasing = self.aliasing, []
        return found

    @property
    def cursor(self) -> int:
        return int(self.rb.pos)

    @property
    def write_count(self) -> int:
        return self.written

    def update_priority(self, index, priority, generation=None) -> None:
        # SB3's ReplayBuffer has no priorities: AttributeError, SB3's own refusal
        self.rb.update_priorities(index, priority)

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("SB3's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("SB3's ReplayBuffer is uniform (capability 'prioritized' is not declared)")


def _make(spec: BufferSpec) -> SB3Buffer:
    if spec.sampler != "random":
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (SB3's ReplayBuffer is uniform)")
    return SB3Buffer(spec)


def sb3_adapter() -> Adapter:
    """stable-baselines3's uniform ``ReplayBuffer``."""
    try:
        importlib.import_module("stable_baselines3.common.buffers")
    except ImportError as err:
        raise ImportError(
            f"stable-baselines3 is not installed ({type(err).__name__}: {err}), but should be: "
            f"install the 'sb3' dependency group"
        ) from err
    from importlib.metadata import version

    from rbcheck.harness.raw_calls import RawFace

    return Adapter(
        raw=RawFace("rbcheck.harness.adapters.sb3_raw:SB3Raw"),
        name="sb3",
        version=f"{version('stable-baselines3')} (numpy {np.__version__})",
        make=_make,
        capabilities=CAPABILITIES,
    )


__all__ = ["SB3Buffer", "sb3_adapter"]
