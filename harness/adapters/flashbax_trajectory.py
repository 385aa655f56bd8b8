"""flashbax's trajectory buffer (``make_trajectory_buffer``, flashbax 0.1.3,
JAX's CPU backend, JAX's default 32-bit mode) for invariant 10, the
transitions properties. Line numbers are of
``flashbax/buffers/trajectory_buffer.py`` unless said otherwise.

The trajectory buffer stores, per env (flashbax's "add batch" row), a ring of
time steps, and samples *sequences*: ``L`` consecutive steps of one env.
It knows nothing of episodes: a sequence may run from one episode into the
next, and the README leaves that to the user ("The user is expected to
handle the case of final to first timestep", "Important Considerations",
sections "Sequential Data Addition" and "Handling Episode Truncation").

Three built-in names (group ``flashbax``):

* ``flashbax-trajectory-pairs``: ``L = 2``, the flat buffer's configuration
  (``flat_buffer.py:113-121``) with one add row per env: the pair's second
  step gives the next observation (``next_obs = second["obs"]``, as the
  README's quickstart reads ``batch.experience.second['obs']``). Capability
  ``transitions`` and ``env_id``, every field declared.
* ``flashbax-trajectory``: ``L = spec.nstep`` (1 without one): the sampled
  sequence is the n-step window (``nstep_form="window"``): ``window_id`` are
  the ids of its steps, -1 after the first step whose returned
  ``terminated`` or ``truncated`` is set (the mask the README asks the user
  to apply; computed from the flags flashbax returned, nothing else).
  Capabilities ``transitions``, ``nstep``, ``env_id``; fields obs, action,
  reward, terminated, truncated (the sequence's first step: a sequence's
  next step is the next episode's first at an episode's end, so ``next_obs``
  is not claimed here; the pairs column checks it).
* ``flashbax-trajectory-per``: the same over ``make_prioritised_trajectory_buffer``
  (``prioritised_trajectory_buffer.py:863``, ``ptb`` below) with
  ``priority_exponent=spec.alpha, device="cpu"``. No priority is ever set:
  each new item (a start whose sequence is now written, ``ptb:315-410``)
  gets the max recorded priority, 1.0 (``ptb:413-452``), and an item whose
  sequence a write overwrote gets 0 (``get_invalid_indices``, ``ptb:565``):
  the column checks that bookkeeping through the windows it samples
  (``indices`` and ``probabilities`` are returned, not used).

Mapping of the spec (``BufferSpec``) to flashbax:

* buffer: ``make_trajectory_buffer(add_batch_size=E, sample_batch_size=B,
  sample_sequence_length=L, period=1, min_length_time_axis=L,
  max_length_time_axis=capacity // E)`` (:350) with ``E = spec.num_envs``:
  ``capacity`` counts rows, ``E`` per time step (the README's "Effective
  Buffer Size": ``batch * time`` steps); ``make`` refuses a capacity that
  is not a multiple of ``E``. flashbax refuses ``L > capacity // E``
  (:339-342, ``ValueError``). ``B`` is fixed when the functions are built
  (:416-421): a ``sample(n)`` builds and caches the functions for ``n``
  over the same state (one jit compilation per shape).
* a spec row is one step of one env: row ``r`` of a stream (steps of ``E``
  envs interleaved, env order) is ``state.experience[field][r % E, t]``;
  the spec's slot of it is ``t * E + r % E`` (``capacity`` rows in
  ``capacity // E`` time steps).
* ``extend(data)``: ``k * E`` rows, ``k`` steps of the ``E`` envs; the
  leaves are reshaped ``[k, E, ...] -> [E, k, ...]`` and ``state =
  add(state, batch)`` writes them at time ``(current_index + arange(k)) %
  T`` (:141). flashbax asserts the batch's shape prefix and dtypes
  (:129-130) and ``k <= T`` (:135-137). Every key of the row is stored
  except ``next_obs``: flashbax stores time steps, not transitions (its
  next observation is the next step's ``obs``).
* ``len``: ``E * (T if state.is_full else state.current_index)`` (:151);
  ``cursor``: ``E * state.current_index``; ``write_count``: rows of the
  adds flashbax accepted, counted by the adapter (flashbax keeps none).
* ``contents()``: ``experience[field]`` transposed to ``[T, E]`` and
  flattened (slot order), the first ``len`` rows.
* ``sample(n)``: first ``buffer.can_sample(state)`` (:238-243), as the
  README's quickstart does: ``RuntimeError`` when False (fewer than ``L``
  steps written; flashbax's ``sample`` would index an empty range). Then
  ``sample(state, subkey)`` (:161-236) with ``key, subkey =
  jax.random.split(key)`` and ``key = jax.random.PRNGKey(spec.seed)`` at
  first (seeding goes through JAX keys only; the key moves only when
  flashbax answered). The rows are the sequences' first steps;
  ``info["index"]`` is the slot of each, ``id % capacity`` from the
  returned ``id`` (the stream's write order; flashbax returns no indices).
  A start is drawn among the ``max_time - L + 1`` starts whose sequence
  ends at or before the newest step (:196-204, ``period=1``): a step within
  ``L - 1`` of the newest one of its env is not sampled yet, even a
  complete window that ends its episode there, until ``L - 1`` more steps
  are written (``incomplete_windows="exclude_until_n_steps"``; with the
  construction's refusal of ``L > capacity // E``, the properties check both).

The boundary, and what it costs: rows go in as NumPy views of the torch
tensors turned into JAX arrays (``jnp.asarray``: one host copy), reshaped
and transposed by JAX (one more); samples come back as ``np.asarray`` of
JAX's arrays copied into torch tensors (one copy). JAX's default mode has
no 64-bit types: the stream's int64 ids and counters are stored as int32
and widened back (a value int32 cannot hold fails the calling test, as in
``flashbax.py``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.flashbax import SRC, FlashbaxBuffer, _get, _jax, _nest
from rbcheck.harness.adapters.numpy_rows import (
    OwnRandomness,
    RowLayout,
    check_batch_size,
    layout_from_rows,
)
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

STEP_KEYS = ("obs", "action", "reward", "terminated", "truncated")
README = "flashbax README, 'Important Considerations'"


def not_applicable(data: TensorDictBase) -> None:
    """Rows that are not env steps: not a question for this column (the
    ``flashbax`` and ``flashbax-item`` columns answer them)."""
    missing = [k for k in (*STEP_KEYS, "id") if k not in data.keys()]
    if missing:
        import pytest

        pytest.skip(f"not applicable: this column stores env steps ({', '.join(STEP_KEYS)}, id); rows without "
                    f"{missing} are checked by the 'flashbax-item' column")


@functools.lru_cache(maxsize=128)
def _functions(envs: int, time: int, batch_size: int, seq_len: int, alpha: float | None = None):
    """flashbax's trajectory-buffer functions for one configuration, jitted
    (flashbax validates its arguments here and raises ValueError); the
    prioritised one where ``alpha`` is given."""
    jax = _jax()
    fbx = importlib.import_module("flashbax")
    kwargs: dict[str, Any] = dict(add_batch_size=envs, sample_batch_size=batch_size, sample_sequence_length=seq_len,
                                  period=1, min_length_time_axis=seq_len, max_length_time_axis=time)
    if alpha is None:
        buffer = fbx.make_trajectory_buffer(**kwargs)
    else:
        buffer = fbx.make_prioritised_trajectory_buffer(**kwargs, priority_exponent=alpha, device="cpu")
    return {"buffer": buffer, "init": buffer.init, "add": jax.jit(buffer.add), "sample": jax.jit(buffer.sample),
            "can_sample": jax.jit(buffer.can_sample)}


class FlashbaxTrajectoryBuffer(OwnRandomness):
    """A transitions :class:`BufferUnderTest` over flashbax's trajectory buffer."""

    LIBRARY = "flashbax"
    _to_jax = FlashbaxBuffer._to_jax  # the boundary check of JAX's 32-bit mode, shared

    def __init__(self, spec: BufferSpec, *, pairs: bool, prioritised: bool = False):
        self.spec, self.pairs = spec, pairs
        self.alpha = float(spec.alpha) if prioritised else None
        self.envs = spec.num_envs
        if not (isinstance(self.envs, int) and self.envs >= 1):
            raise ValueError(f"spec.num_envs={self.envs!r}, but should be an int >= 1")
        if not (isinstance(spec.capacity, int) and spec.capacity >= self.envs and spec.capacity % self.envs == 0):
            raise ValueError(f"spec.capacity={spec.capacity!r}, but should be a positive multiple of "
                             f"spec.num_envs={self.envs} (flashbax stores capacity // num_envs steps per env)")
        self.time = spec.capacity // self.envs
        self.seq_len = 2 if pairs else (spec.nstep or 1)
        self.batch = check_batch_size(None, spec.batch_size) or 1
        # flashbax validates the sequence length against the time axis here (ValueError, :339-342)
        self.fns = _functions(self.envs, self.time, self.batch, self.seq_len, self.alpha)
        self.key = _jax().random.PRNGKey(spec.seed)
        self.state: Any = None
        self.layout: RowLayout | None = None
        self.written = 0

    def __repr__(self) -> str:
        kind = ("pairs" if self.pairs else f"window {self.seq_len}") + (" prioritised" if self.alpha is not None else "")
        return f"FlashbaxTrajectoryBuffer({kind}, {self.spec})"

    # -- writing --------------------------------------------------------------
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        n, e = len(data), self.envs
        if n % e:
            raise ValueError(f"len(data)={n}, but should be a multiple of num_envs={e} (one row per env and step)")
        steps = data.exclude("next_obs")
        if self.state is None:
            self.layout = layout_from_rows(steps)
            jnp = importlib.import_module("jax.numpy")
            example = {key: jnp.asarray(np.zeros(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))
                       for key, shape, dtype in self.layout}
            self.state = self.fns["init"](_nest(example))
        jnp = importlib.import_module("jax.numpy")
        tree = self._to_jax(steps)  # leaves [k * E, ...]
        batch = _nest({key: jnp.swapaxes(_get(tree, key).reshape(n // e, e, *shape), 0, 1)
                       for key, shape, _ in self.layout or ()})
        start = self.cursor
        self.state = self.fns["add"](self.state, batch)
        self.written += n
        return (start + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # -- reading --------------------------------------------------------------
    def __len__(self) -> int:
        if self.state is None:
            return 0
        return self.envs * (self.time if bool(self.state.is_full) else int(self.state.current_index))

    @property
    def cursor(self) -> int:
        return 0 if self.state is None else self.envs * int(self.state.current_index)

    @property
    def write_count(self) -> int:
        return self.written

    def _rows(self, tree: Any, n: int, take) -> TensorDict:
        td = TensorDict({}, batch_size=[n])
        for key, shape, dtype in self.layout or ():
            value = np.array(take(_get(tree, key)), copy=True)
            td.set(key if len(key) > 1 else key[0], torch.as_tensor(value).reshape(n, *shape).to(dtype))
        return td

    def contents(self) -> TensorDictBase:
        n = len(self)
        if self.state is None:
            return TensorDict({}, batch_size=[0])

        def slot_order(x):
            x = np.asarray(x)
            return np.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])[:n]

        return self._rows(self.state.experience, n, slot_order)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        fns = self.fns if batch_size == self.batch else _functions(self.envs, self.time, batch_size, self.seq_len, self.alpha)
        if self.state is None or not bool(fns["can_sample"](self.state)):
            raise RuntimeError(f"buffer.can_sample(state) is False: fewer than sample_sequence_length="
                               f"{self.seq_len} steps per env written ({SRC} buffers/trajectory_buffer.py:238-243)")
        key, subkey = _jax().random.split(self.key)
        seq = fns["sample"](self.state, subkey).experience  # leaves [B, L, ...]
        self.key = key
        rows = self._rows(seq, batch_size, lambda x: np.asarray(x)[:, 0])
        if self.pairs:
            rows.set("next_obs", torch.as_tensor(np.array(np.asarray(_get(seq, ("obs",)))[:, 1], copy=True)))
        else:
            ids = torch.as_tensor(np.asarray(_get(seq, ("id",))).astype(np.int64)).reshape(batch_size, self.seq_len)
            ends = torch.as_tensor(np.asarray(_get(seq, ("terminated",))) | np.asarray(_get(seq, ("truncated",))))
            ends = ends.reshape(batch_size, self.seq_len).bool()
            # a step after the first end flag belongs to the next episode: masked, as the README asks
            after_end = torch.cumsum(ends.long(), 1) - ends.long() > 0
            rows.set("window_id", torch.where(after_end, torch.full_like(ids, -1), ids))
        return rows, {"index": rows["id"].long() % self.spec.capacity}

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("flashbax's trajectory buffer is uniform (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("flashbax's trajectory buffer is uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("flashbax's trajectory buffer is uniform (capability 'prioritized' is not declared)")


SEQUENCE_NOTE = (f"a step within sample_sequence_length - 1 of the newest step of its env is not a valid start, "
                 f"even where its episode ended earlier ({SRC} buffers/trajectory_buffer.py:196-204, :238-243), "
                 f"and a sequence longer than one env's ring is refused at construction (:339-342)")


def _adapter(name: str, *, pairs: bool, prioritised: bool = False) -> Adapter:
    from rbcheck.harness.adapters.flashbax import _version

    version = _version()
    if pairs:
        conventions = Conventions(notes={
            "transition_fields": f"next_obs is the pair's second step's obs ({README}; "
                                 f"{SRC} buffers/flat_buffer.py:113-121, :138-143)",
        })
        caps = {"transitions", "env_id"}
    else:
        conventions = Conventions(
            transition_fields=STEP_KEYS, nstep_form="window", incomplete_windows="exclude_until_n_steps",
            notes={
                "transition_fields": "the sequence's first step; its next step is the next episode's first at "
                                     f"an episode's end ({README}, 'Sequential Data Addition')",
                "nstep_form": f"sample returns sequences of sample_sequence_length = n steps "
                              f"({SRC} buffers/trajectory_buffer.py:226-235)",
                "incomplete_windows": SEQUENCE_NOTE,
            })
        caps = {"transitions", "nstep", "env_id"}

    def make(spec: BufferSpec) -> FlashbaxTrajectoryBuffer:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (the trajectory buffer is "
                             f"uniform)")
        return FlashbaxTrajectoryBuffer(spec, pairs=pairs, prioritised=prioritised)

    return Adapter(name=name, version=version, make=make, capabilities=frozenset(caps), conventions=conventions)


def flashbax_trajectory_adapter() -> Adapter:
    """flashbax's trajectory buffer: sequences of n steps as n-step windows."""
    return _adapter("flashbax-trajectory", pairs=False)


def flashbax_trajectory_pairs_adapter() -> Adapter:
    """flashbax's trajectory buffer: sequences of 2 steps as (obs, next obs)."""
    return _adapter("flashbax-trajectory-pairs", pairs=True)


def flashbax_trajectory_per_adapter() -> Adapter:
    """flashbax's prioritised trajectory buffer (new items at the max recorded
    priority, so uniform over the valid items): sequences of n steps as n-step windows."""
    return _adapter("flashbax-trajectory-per", pairs=False, prioritised=True)


__all__ = ["FlashbaxTrajectoryBuffer", "flashbax_trajectory_per_adapter", "flashbax_trajectory_adapter", "flashbax_trajectory_pairs_adapter"]
