"""rlox's Rust replay buffers (written against rlox 1.2.0) as BufferUnderTest.

Built-in names: ``rlox`` (``ReplayBuffer``), ``rlox-per``
(``PrioritizedReplayBuffer``), ``rlox-sequence`` (``SequenceReplayBuffer``,
its i.i.d. ``sample``) and ``rlox-mmap`` (``MmapReplayBuffer``). Source lines
below are of the rlox repository, ``crates/rlox-core/src/buffer/`` (the
snapshot read is 1.1.0 plus later commits; the 1.2.0 wheel's Python API,
``rlox/_rlox_core.pyi`` and ``help()``, is the same for these classes).

Mapping (rlox's rows have a fixed schema: ``obs``/``next_obs`` float32 of
``obs_dim``, ``action`` float32 of ``act_dim``, ``reward`` float32, the
``terminated``/``truncated`` flags, and nothing else):

* rows: each row's leaves, as raw bytes (sorted by key,
  ``numpy_rows.pack_rows``, as stable-baselines3's adapter does), after an
  int64 *tag*, the row's write number, padded to 4 bytes and handed over as
  the float32 ``obs`` of ``obs_dim = bytes / 4``; ``next_obs``, ``action``
  (``act_dim=1``), ``reward`` and the flags are zeros. rlox copies ``obs``
  bit for bit (``copy_from_slice`` in ``ReplayBuffer.push_slices``,
  ringbuf.rs:215; ``extend_from_slice`` on sample, ringbuf.rs:319-322; the cold
  file's ``to_le_bytes``, mmap.rs:305-319), so any dtype survives. The buffer is
  built from ``spec.layout`` in ``make`` (else on the first write).
* slots: rlox's ``sample`` returns no index (only ``PrioritizedReplayBuffer``
  does, ``indices``) and nothing exposes ``write_pos``. Its ring writes slot
  ``write_pos`` then ``write_pos = (write_pos + 1) % capacity``
  (ringbuf.rs:223), so the row with tag ``t`` is at slot ``t % capacity``:
  ``extend`` returns those slots, ``info["index"]`` is ``tag % capacity`` of
  each sampled row (for ``rlox-per`` rlox's own ``indices``), ``cursor`` is
  ``write_count % capacity``; ``write_count`` is counted by the adapter.
* ``contents()``: rlox has no read of its rows; the only read is a sample.
  ``contents()`` samples ``len`` rows at a time with seeds of its own (a
  sample changes nothing in rlox: each call seeds a fresh ChaCha8,
  ringbuf.rs:308) until it has seen ``len`` distinct tags, and returns them
  in slot order. A held row a uniform sampler never returns within
  ``len * (ln len + 40)`` draws (a chance below e**-40 per row) is an error
  naming the slots missing; for ``rlox-per`` a row of priority 0 is never
  drawn, so its contents cannot be read (the error says so).
* ``sample``: ``sample(batch_size, seed)`` with a seed drawn from the
  adapter's NumPy generator (seeded with ``spec.seed``): rlox takes the seed
  per call, as its docs say ("use step counter for reproducibility").
  rlox refuses ``batch_size > len`` (ringbuf.rs:302-306, mmap.rs:213-218,
  priority.rs:275-279) although its uniform draws are independent, with
  replacement: for the uniform buffers a larger batch is taken in calls of at
  most ``len`` rows, each with its own seed (the same law: every draw is
  rlox's own uniform draw); ``rlox-per`` is not split (its draws are
  stratified per call), so the refusal shows there (docs/findings.md).
* ``rlox-per``: ``PrioritizedReplayBuffer(capacity, obs_dim, 1, alpha,
  beta)`` (for a ``"random"`` spec too, which the ring properties build: the
  same class, every row of priority 1.0); ``push(..., priority=1.0)`` per row (rlox's default: it has no
  batch push), ``update_priorities(uint64 indices, float64 priorities)``;
  ``info["weight"]`` is rlox's float32 ``weights``. Conventions: no eps
  (``priority.powf(alpha)``, priority.rs:234/366), a new row's priority the
  constant 1.0 (push's default, ``max_priority`` is kept but never used,
  priority.rs:236), stratified draws (``segment = total / batch_size``,
  priority.rs:284-306), weights over the tree's minimum (priority.rs:300-301).
* ``rlox-mmap``: ``MmapReplayBuffer(hot_capacity=max(1, capacity // 2),
  total_capacity=capacity, ..., cold_path=<scratch_dir>/rlox-cold.bin)``:
  the newer rows in memory, the older ones spilled to the cold file
  (mmap.rs:144-148), together the last ``capacity`` rows. ``close()`` is
  rlox's (it deletes the cold file, mmap.rs:247-257); rlox has no way to
  open a cold file again, so ``make(spec.but(reopen=True))`` raises. A
  ``storage="memory"`` spec (ring, ownership, model comparison) gets the same
  class with its cold file in a private temporary directory.
* no ``save``/``load``, no ``shared_rng``; ``bad_input`` is not declared.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.numpy_rows import (
    OwnRandomness,
    RowLayout,
    layout_from_rows,
    layout_from_spec,
    pack_rows,
    row_count,
    row_nbytes,
    skip_renamed_rows,
    unpack_rows,
)
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "rlox 1.2.0"
TAG_BYTES = 8
COLD_FILE = "rlox-cold.bin"
#: contents() gives up after len * (ln len + this) draws without seeing every held row
READ_SLACK = 40.0


def _core():
    try:
        return importlib.import_module("rlox")
    except ImportError as err:
        raise ImportError(
            f"rlox is not installed ({type(err).__name__}: {err}), but should be: install the 'rlox' "
            f"dependency group"
        ) from err


class RloxBuffer(CountedWrites, OwnRandomness):
    """A :class:`BufferUnderTest` over one of rlox's buffers (``kind``)."""

    LIBRARY = "rlox"

    def __init__(self, spec: BufferSpec, kind: str):
        self.spec, self.kind = spec, kind
        self.rb = None
        self.layout: RowLayout | None = None
        self.written = 0
        self.obs_dim = 0
        self.rng = np.random.default_rng(spec.seed)
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._build(layout)

    def __repr__(self) -> str:
        return f"RloxBuffer({self.kind}, {self.spec})"

    # building
    def _build(self, layout: RowLayout) -> None:
        rlox = _core()
        self.layout = layout
        self.obs_dim = -(-(TAG_BYTES + row_nbytes(layout)) // 4)
        cap = self.spec.capacity
        if self.kind == "ReplayBuffer":
            self.rb = rlox.ReplayBuffer(cap, self.obs_dim, 1)
        elif self.kind == "SequenceReplayBuffer":
            self.rb = rlox.SequenceReplayBuffer(cap, self.obs_dim, 1)
        elif self.kind == "PrioritizedReplayBuffer":
            self.rb = rlox.PrioritizedReplayBuffer(cap, self.obs_dim, 1, alpha=self.spec.alpha,
                                                   beta=self.spec.beta)
        else:
            self.rb = rlox.MmapReplayBuffer(max(1, cap // 2), cap, self.obs_dim, 1, cold_path(self.spec))

    def _obs(self, data: TensorDictBase, first_tag: int) -> np.ndarray:
        """``[n, obs_dim]`` float32: each row's tag and bytes (a new array: rlox takes float32 only)."""
        raw = pack_rows(data)
        n = raw.shape[0]
        obs = np.zeros((n, self.obs_dim), np.float32)
        view = obs.view(np.uint8)
        view[:, :TAG_BYTES] = np.arange(first_tag, first_tag + n, dtype=np.int64).reshape(n, 1).view(np.uint8)
        view[:, TAG_BYTES:TAG_BYTES + raw.shape[1]] = raw
        return obs

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        if self.layout is None:
            self._build(layout_from_rows(data))
        n = row_count(data)
        raw_width = pack_rows(data).shape[1] if n else 0
        if n and raw_width != row_nbytes(self.layout):
            raise ValueError(f"rows of {raw_width} bytes, but should be {row_nbytes(self.layout)} (the layout "
                             f"{[k for k, _, _ in self.layout]} the buffer was built for)")
        skip_renamed_rows(data, self.layout, pack_rows(data), "rlox")
        obs = self._obs(data, self.written)
        zeros = np.zeros(n * self.obs_dim, np.float32)
        if self.kind == "ReplayBuffer":
            flags = np.zeros(n, np.uint8)
            self.rb.push_batch(obs.reshape(-1), zeros, np.zeros(n, np.float32), np.zeros(n, np.float32),
                               flags, flags)
        elif self.kind == "MmapReplayBuffer":
            flags = np.zeros(n, np.float32)
            self.rb.push_batch(obs.reshape(-1), zeros, np.zeros(n, np.float32), np.zeros(n, np.float32),
                               flags, flags)
        else:
            action = np.zeros(1, np.float32)
            for row in obs:
                if self.kind == "SequenceReplayBuffer":
                    self.rb.push(row, np.zeros(self.obs_dim, np.float32), action, 0.0, False, False)
                else:
                    self.rb.push(row, action, 0.0, False, False)
                self.written += 1
            return self._slots(np.arange(self.written - n, self.written))
        self.written += n
        return self._slots(np.arange(self.written - n, self.written))

    def _slots(self, tags: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(tags, dtype=np.int64) % self.spec.capacity)

    # reading
    def __len__(self) -> int:
        return 0 if self.rb is None else len(self.rb)

    def _decode(self, obs: np.ndarray) -> tuple[np.ndarray, TensorDict]:
        obs = np.ascontiguousarray(obs, dtype=np.float32).reshape(-1, self.obs_dim)
        raw = obs.view(np.uint8)
        tags = raw[:, :TAG_BYTES].copy().view(np.int64).reshape(-1)
        rows = unpack_rows(self.layout, raw[:, TAG_BYTES:TAG_BYTES + row_nbytes(self.layout)])
        return tags, rows

    def sample(self, batch_size: int | None = None):
        batch_size = self.spec.batch_size if batch_size is None else batch_size
        if self.rb is None:
            raise RuntimeError("sample() on an empty buffer: nothing was written")
        if self.kind == "PrioritizedReplayBuffer":
            out = self.rb.sample(batch_size, int(self.rng.integers(0, 2**63)))
            _tags, rows = self._decode(out["obs"])
            index = torch.as_tensor(np.asarray(out["indices"]).astype(np.int64))
            return rows, {"index": index, "weight": torch.as_tensor(np.asarray(out["weights"]))}
        # rlox refuses batch_size > len (ringbuf.rs:302-306, mmap.rs:213-218) though its draws are i.i.d.
        # with replacement: a larger batch is taken in calls of at most len rows, each seeded anew
        held = len(self)
        sizes = [batch_size] if batch_size <= held or held == 0 else \
            [held] * (batch_size // held) + ([batch_size % held] if batch_size % held else [])
        parts = [self.rb.sample(size, int(self.rng.integers(0, 2**63)))["obs"] for size in sizes]
        tags, rows = self._decode(np.concatenate([np.asarray(p).reshape(-1, self.obs_dim) for p in parts]))
        return rows, {"index": self._slots(tags)}

    def contents(self) -> TensorDictBase:
        n = len(self)
        if n == 0 or self.layout is None:
            return TensorDict({}, batch_size=[0]) if self.layout is None else self._empty()
        seen: dict[int, np.ndarray] = {}
        budget, draws, seed = n * (math.log(n) + READ_SLACK), 0, 0
        obs_rows = None
        while len(seen) < n and draws < budget:
            out = self.rb.sample(n, 2**62 + seed)  # seeds the adapter's sample() stream does not use
            seed, draws = seed + 1, draws + n
            obs_rows = np.ascontiguousarray(out["obs"], dtype=np.float32).reshape(-1, self.obs_dim)
            tags = obs_rows.view(np.uint8)[:, :TAG_BYTES].copy().view(np.int64).reshape(-1)
            for tag, row in zip(tags.tolist(), obs_rows):
                seen.setdefault(tag, row)
        if len(seen) < n:
            held = sorted(t % self.spec.capacity for t in seen)
            missing = sorted(set(range(self.spec.capacity)) - set(held))[:10]
            why = " (rows of priority 0 are never drawn)" if self.kind == "PrioritizedReplayBuffer" else ""
            raise RuntimeError(
                f"contents(): rlox has no read of its rows and sample() returned {len(seen)} distinct rows "
                f"in {draws} draws, but should return all {n} held{why}; slots never drawn include {missing}")
        order = sorted(seen, key=lambda t: t % self.spec.capacity)
        _tags, rows = self._decode(np.stack([seen[t] for t in order]))
        return rows.clone()

    def _empty(self) -> TensorDict:
        td = TensorDict({}, batch_size=[0])
        for key, shape, dtype in self.layout:
            td.set(key if len(key) > 1 else key[0], torch.zeros((0, *shape), dtype=dtype))
        return td

    # priorities
    def update_priority(self, index, priority, generation=None) -> None:
        if self.kind != "PrioritizedReplayBuffer":
            raise NotImplementedError(f"rlox's {self.kind} has no priorities ('prioritized' is not declared)")
        if generation is not None:
            raise NotImplementedError("rlox's update_priorities takes no write generation "
                                      "('stale_updates' is not declared)")
        idx = torch.as_tensor(index).reshape(-1).numpy().astype(np.uint64)
        pri = np.ascontiguousarray(torch.as_tensor(priority, dtype=torch.float64).reshape(-1).numpy())
        self.rb.update_priorities(idx, pri)

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("rlox's sum tree is not readable from Python ('priority_readback' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("rlox keeps max_priority in Rust, unexposed ('priority_readback' is not declared)")

    # storage
    def close(self) -> None:
        if self.kind != "MmapReplayBuffer":
            raise NotImplementedError(f"rlox's {self.kind} has no close ('memmap' is not declared)")
        if self.rb is not None:
            self.rb.close()

    def library_aliasing(self) -> list[str]:
        return []  # rows are repacked into new float32 arrays; rlox copies them in and out (ringbuf.rs:215, 319)


def cold_path(spec: BufferSpec) -> str:
    """``<scratch_dir>/rlox-cold.bin``; a ``storage="memory"`` spec (the properties every column runs)
    gets a private temporary directory, removed at exit."""
    if spec.storage == "memory" or spec.scratch_dir is None:
        import atexit
        import shutil
        import tempfile

        scratch = tempfile.mkdtemp(prefix="rbcheck-rlox-")
        atexit.register(shutil.rmtree, scratch, True)
        return str(Path(scratch) / COLD_FILE)
    Path(spec.scratch_dir).mkdir(parents=True, exist_ok=True)
    return str(Path(spec.scratch_dir) / COLD_FILE)


def _version() -> str:
    from importlib.metadata import version

    _core()
    return version("rlox")


def _maker(kind: str, samplers: tuple[str, ...], storages: tuple[str, ...] = ("memory",)):
    def make(spec: BufferSpec) -> RloxBuffer:
        if spec.sampler not in samplers:
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be one of {samplers} (rlox {kind})")
        if spec.storage not in storages:
            raise ValueError(f"spec.storage={spec.storage!r}, but should be one of {storages} (rlox {kind})")
        if spec.reopen:
            raise NotImplementedError(
                "spec.reopen=True: rlox's MmapReplayBuffer cannot open a cold file again (its only constructor "
                "truncates the file, mmap.rs:349-354, and close() deletes it, mmap.rs:247-257)")
        return RloxBuffer(spec, kind)

    return make


PER_CONVENTIONS = Conventions(
    eps_rule="none",
    new_priority="constant",
    new_priority_value=1.0,
    sampling="stratified",
    notes={
        "eps_rule": "no eps argument: the tree holds priority.powf(alpha) (priority.rs:234, 366)",
        "new_priority": "push(..., priority=1.0) is the Python default (crates/rlox-python/src/buffer.rs:407); "
                        "max_priority is tracked (priority.rs:236) but never given to new rows",
        "sampling": "draw i from [segment*i, segment*(i+1)), segment = total / batch_size (priority.rs:284-306)",
        "weight_normaliser": "weight / ((count * min_leaf / total) ** -beta) (priority.rs:300-301, 335-336)",
    },
)


def rlox_adapter() -> Adapter:
    """rlox's ``ReplayBuffer`` (uniform, with replacement)."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="rlox", version=_version(), make=_maker("ReplayBuffer", ("random",)),
                   capabilities=frozenset({"random"}),
                   raw=RawFace("rbcheck.harness.adapters.rlox_raw:RloxRaw"))


def rlox_per_adapter() -> Adapter:
    """rlox's ``PrioritizedReplayBuffer``."""
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(name="rlox-per", version=_version(), make=_maker("PrioritizedReplayBuffer", ("prioritized", "random")),
                   capabilities=frozenset({"prioritized"}), conventions=PER_CONVENTIONS,
                   raw=RawFace("rbcheck.harness.adapters.rlox_raw:RloxRaw"))


def rlox_sequence_adapter() -> Adapter:
    """rlox's ``SequenceReplayBuffer`` through its i.i.d. ``sample`` (the inner ring, sequence.rs:131-136)."""
    return Adapter(name="rlox-sequence", version=_version(), make=_maker("SequenceReplayBuffer", ("random",)),
                   capabilities=frozenset({"random"}))


def rlox_mmap_adapter() -> Adapter:
    """rlox's ``MmapReplayBuffer``: the older rows in a memory-mapped cold file of ``spec.scratch_dir``."""
    return Adapter(name="rlox-mmap", version=_version(), make=_maker("MmapReplayBuffer", ("random",), ("memmap", "memory")),
                   capabilities=frozenset({"memmap"}))


__all__ = ["RloxBuffer", "rlox_adapter", "rlox_mmap_adapter", "rlox_per_adapter", "rlox_sequence_adapter"]
