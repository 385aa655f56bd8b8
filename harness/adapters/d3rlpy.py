"""d3rlpy's ``ReplayBuffer`` over a ``FIFOBuffer``, sampled through its
``BasicTransitionPicker`` (written against d3rlpy 2.8.1), built-in name
``d3rlpy``. Line numbers are of ``d3rlpy/dataset/<file>.py`` in 2.8.1.

d3rlpy keeps *episodes* (arrays of observations, actions, rewards and a
``terminated`` flag, ``components.py:320-386``). Its buffer holds no rows:
a ``FIFOBuffer(limit)`` is a ``deque(maxlen=limit)`` of ``(episode,
transition index)`` pairs (``buffers.py:74-111``), so ``limit`` counts
transitions, and a transition is read out of its episode by a *transition
picker* when it is sampled (``replay_buffer.py:471-474``). The spec's fields
map to it as follows:

* buffer: ``ReplayBuffer(FIFOBuffer(limit=spec.capacity),
  transition_picker=BasicTransitionPicker(), observation_signature=
  Signature([uint8], [(nbytes,)]), action_signature=Signature([float32],
  [(1,)]), reward_signature=Signature([float32], [(1,)]),
  action_space=CONTINUOUS, action_size=1)`` (``replay_buffer.py:342-454``),
  with ``nbytes`` the size of one row of ``spec.layout`` (leaves sorted by
  key, each as its raw bytes, as for stable-baselines3): a row of any layout
  is one observation. Built in ``make(spec)`` from ``spec.layout``, or on the
  first write when the spec has none.
* ``extend(data)``: one d3rlpy ``Episode(observations=<the rows' bytes>,
  actions=0, rewards=0, terminated=True)`` handed to d3rlpy's
  ``append_episode`` (``replay_buffer.py:464-466``: ``buffer.append(episode,
  i)`` for each of its ``transition_count`` transitions, which is ``size()``
  for a terminated episode, ``components.py:384-386``). Each row is one
  transition, held from the call on: a terminated episode has no pending
  last step (the online ``append`` path, ``writers.py:351-372``, holds a
  step back until the next one gives it its next observation). ``add(row)``
  is an extend of one row.
* slots: the FIFO's deque is in write order, oldest first; the ``k``-th row
  written over the buffer's life lives in slot ``k % capacity``, so deque
  position ``i`` is slot ``(write_count - len + i) % capacity``. d3rlpy
  keeps no count of what it was handed: ``write_count`` is counted by the
  adapter, ``cursor`` is ``write_count % capacity``.
* ``len``: ``ReplayBuffer.transition_count`` (``replay_buffer.py:543``, the
  deque's length, ``buffers.py:104``).
* ``contents()``: each held pair through the transition picker,
  ``transition_picker(episode, index).observation`` (the picker returns the
  row itself, ``transition_pickers.py:52``), in slot order.
* ``sample(batch_size)``: d3rlpy's own ``sample_transition_batch``
  (``replay_buffer.py:476-479``: ``sample_transition`` per row, each one
  ``np.random.randint(transition_count)`` on NumPy's global generator, then
  the picker, ``:471-474``); the rows are decoded from the returned
  ``TransitionMiniBatch.transitions`` (the picker's ``Transition`` objects,
  before the mini-batch casts observations to float32,
  ``mini_batch.py:97-106``). d3rlpy does not return which transitions it
  drew: the adapter repeats the draws from the same generator state to
  name the slots (``info["index"]``). NumPy's global generator carries a
  per-buffer state seeded with ``spec.seed`` (d3rlpy is seeded through
  ``np.random.seed``, ``d3rlpy.seed``); ``Signature.sample`` draws from it
  when the buffer is built (``components.py:44-53``, ``writers.py:282-325``),
  so construction happens under that state too.
* transitions (capability ``"transitions"``; the suite's env-step streams,
  rows with ``terminated``, ``truncated`` and ``next_obs``): written through
  d3rlpy's online path, the one its ``fit_online`` loop uses, one
  ``ReplayBuffer.append(observation, action, reward)`` per step
  (``replay_buffer.py:456-462`` -> ``ExperienceWriter.write``,
  ``writers.py:351-372``) and ``clip_episode(terminated)`` at an episode's
  end (``writers.py:374-400``: ``True`` for a termination, ``False`` for a
  truncation). The observation is the row's bytes without ``action``,
  ``reward`` and ``next_obs`` (so it carries the step's ``id``); the
  ``next_obs`` handed in is dropped, since d3rlpy's online path has no place
  for it: the picker derives it. A sample is d3rlpy's
  ``sample_transition_batch`` with ``BasicTransitionPicker``
  (``transition_pickers.py:49-72``): ``obs`` from ``observation``,
  ``action``, ``reward``, ``terminated`` from ``terminal``, ``next_obs`` from
  ``next_observation`` (the next step's observation, zeros at a
  termination). ``truncated`` is not returned (d3rlpy has no such flag:
  declared in ``transition_fields``). ``info["index"]`` is ``id %
  capacity``. Declared, each checked in its own terms by the transitions
  properties: ``capacity_counts="complete_transitions"`` (the FIFO's limit
  counts transitions, ``buffers.py:85-95``, and a step becomes one only
  when the next step of its episode is written, ``writers.py:364-372`` with
  ``transition_count = size() - 1`` while running, ``:236-238``, or when
  ``clip_episode(True)`` ends it, ``:391-395``; ``clip_episode(False)``
  appends nothing, so a truncated episode's last step is never held) and
  ``terminal_next_obs="zeros"`` (``transition_pickers.py:53-56``). The
  rest is judged in docs/findings.md (real bug D4: a one-step episode).
* not declared: prioritized sampling (d3rlpy has none), transforms,
  save/load (``dump``/``load`` write the episodes to HDF5 and rebuild a new
  buffer, ``replay_buffer.py:493-530``: the FIFO's position and which
  transitions of a partly evicted episode were held are not saved),
  shared_rng, and ``slice``: d3rlpy's trajectory slicer
  (``trajectory_slicers.py:39-98``) ends a slice at a uniformly drawn
  transition and pads the missing front with zeros (``masks`` mark the
  padding), reading the episode's own arrays, which outlive the eviction of
  their transitions from the FIFO; the slice properties ask for slices
  drawn from the rows held, of the requested length or the episode's, with
  no padding rows, so a slice sample cannot be expressed as rows of this
  buffer without rewriting it in the adapter (docs/findings.md, d3rlpy).
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
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

CAPABILITIES = frozenset({"random", "bad_input", "transitions"})
#: The keys of an env-step stream (capability "transitions"): a spec whose layout has them is one.
STEP_KEYS = frozenset({"id", "obs", "action", "reward", "terminated", "truncated", "next_obs"})
#: What d3rlpy's BasicTransitionPicker returns (transition_pickers.py:63-72): no truncated flag.
TRANSITION_FIELDS = ("obs", "action", "reward", "terminated", "next_obs")


class D3rlpyBuffer(OwnRandomness):
    """A :class:`BufferUnderTest` over d3rlpy's ``ReplayBuffer(FIFOBuffer)``."""

    LIBRARY = "d3rlpy"

    def __init__(self, spec: BufferSpec):
        self.spec = spec
        self.rb: Any = None
        self.layout: RowLayout | None = None
        self.written = 0
        self.stream = GlobalNumpyStream(spec.seed)
        layout = layout_from_spec(getattr(spec, "layout", None))
        if layout is not None:
            self._build(layout)
        else:  # d3rlpy checks its arguments when built: build one now, rebuilt on the first write
            self.rb = self._construct(1)

    def __repr__(self) -> str:
        return f"D3rlpyBuffer({self.spec})"

    def _construct(self, nbytes: int) -> Any:
        from d3rlpy.constants import ActionSpace
        from d3rlpy.dataset import BasicTransitionPicker, FIFOBuffer, ReplayBuffer, Signature

        with self.stream.active():  # Signature.sample draws from np.random (components.py:44-53)
            return ReplayBuffer(
                FIFOBuffer(limit=self.spec.capacity),
                transition_picker=BasicTransitionPicker(),
                observation_signature=Signature(dtype=[np.dtype(np.uint8)], shape=[(nbytes,)]),
                action_signature=Signature(dtype=[np.dtype(np.float32)], shape=[(1,)]),
                reward_signature=Signature(dtype=[np.dtype(np.float32)], shape=[(1,)]),
                action_space=ActionSpace.CONTINUOUS,
                action_size=1,
            )

    def _build(self, layout: RowLayout) -> None:
        self.layout = layout
        self.rb = self._construct(row_nbytes(layout))

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        from d3rlpy.dataset import Episode

        if self.layout is None:
            self._build(layout_from_rows(data))
        raw = pack_rows(data)
        n = len(raw)
        skip_renamed_rows(data, self.layout, raw, "d3rlpy")
        zeros = np.zeros((n, 1), np.float32)
        episode = Episode(observations=raw, actions=zeros, rewards=zeros.copy(), terminated=True)
        start = self.written
        self.rb.append_episode(episode)  # replay_buffer.py:464-466
        self.written += n
        return (start + torch.arange(n, dtype=torch.int64)) % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    # reading
    def __len__(self) -> int:
        return int(self.rb.transition_count)

    def _first_slot(self) -> int:
        return (self.written - len(self)) % self.spec.capacity if self.spec.capacity > 0 else 0

    def _rows(self, observations: list[np.ndarray]) -> TensorDict:
        if self.layout is None:
            return TensorDict({}, batch_size=[len(observations)])
        raw = np.stack(observations) if observations else np.zeros((0, row_nbytes(self.layout)), np.uint8)
        return unpack_rows(self.layout, raw)

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.stream.active():
            before = np.random.get_state()
            batch = self.rb.sample_transition_batch(batch_size)  # replay_buffer.py:476-479
            after = np.random.get_state()
            # the same draws again, to name the transitions d3rlpy picked (replay_buffer.py:472)
            np.random.set_state(before)
            held = self.rb.transition_count
            drawn = [np.random.randint(held) for _ in range(len(batch.transitions))]
            np.random.set_state(after)
        first = self._first_slot()
        index = torch.tensor([(first + i) % self.spec.capacity for i in drawn], dtype=torch.int64)
        return self._rows([t.observation for t in batch.transitions]), {"index": index}

    def contents(self) -> TensorDictBase:
        buffer, picker, n = self.rb.buffer, self.rb.transition_picker, len(self)
        first = self._first_slot()
        by_slot: list[np.ndarray] = [np.empty(0)] * n
        for i in range(n):
            episode, index = buffer[i]  # buffers.py:110
            by_slot[(first + i) % self.spec.capacity] = picker(episode, index).observation
        return self._rows(by_slot)

    @property
    def cursor(self) -> int:
        return self.written % self.spec.capacity if self.spec.capacity > 0 else 0

    @property
    def write_count(self) -> int:
        return self.written

    def update_priority(self, index, priority, generation=None) -> None:
        # d3rlpy's ReplayBuffer has no priorities: AttributeError, d3rlpy's own refusal
        self.rb.update_priorities(index, priority)

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("d3rlpy's ReplayBuffer is uniform (capability 'prioritized' is not declared)")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("d3rlpy's ReplayBuffer is uniform (capability 'prioritized' is not declared)")


class D3rlpyTransitions(D3rlpyBuffer):
    """Env steps through d3rlpy's online path (the module docstring,
    "transitions"): ``append`` per step, ``clip_episode`` at an episode's end."""

    OWN = ("action", "reward", "next_obs")  # not in the observation: d3rlpy's own arguments, or derived

    def __init__(self, spec: BufferSpec):
        layout = {k: v for k, v in spec.layout.items() if k not in self.OWN}
        self.action_shape = tuple(spec.layout["action"][0]) or (1,)
        super().__init__(spec.but(layout=layout))
        self.spec = spec

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        raw = pack_rows(data.exclude(*self.OWN))
        action = data["action"].detach().cpu().numpy().astype(np.float32).reshape(len(raw), *self.action_shape)
        reward = data["reward"].detach().cpu().numpy().astype(np.float32).reshape(len(raw), 1)
        terminated, truncated = data["terminated"].cpu().numpy(), data["truncated"].cpu().numpy()
        for k in range(len(raw)):
            self.rb.append(raw[k], action[k], reward[k])  # replay_buffer.py:456-462
            if terminated[k] or truncated[k]:
                self.rb.clip_episode(bool(terminated[k]))  # writers.py:374-400
        self.written += len(raw)
        return data["id"].reshape(-1).long() % self.spec.capacity

    def _transitions(self, transitions) -> TensorDict:
        rows = self._rows([t.observation for t in transitions])
        n = len(transitions)
        following = self._rows([t.next_observation for t in transitions])
        rows.set("action", torch.as_tensor(np.stack([t.action for t in transitions]) if n else
                                           np.zeros((0, *self.action_shape), np.float32)))
        rows.set("reward", torch.as_tensor(np.array([np.asarray(t.reward).reshape(-1)[0] for t in transitions],
                                                    dtype=np.float32)))
        rows.set("terminated", torch.tensor([bool(t.terminal) for t in transitions], dtype=torch.bool))
        rows.set("next_obs", following["obs"])
        return rows

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        with self.stream.active():
            batch = self.rb.sample_transition_batch(batch_size)  # replay_buffer.py:476-479
        rows = self._transitions(batch.transitions)
        return rows, {"index": rows["id"].reshape(-1).long() % self.spec.capacity}

    def contents(self) -> TensorDictBase:
        buffer, picker = self.rb.buffer, self.rb.transition_picker
        rows = self._transitions([picker(*buffer[i]) for i in range(len(self))])
        return rows[torch.argsort(rows["id"].reshape(-1) % self.spec.capacity)] if len(rows) else rows


def _make(spec: BufferSpec) -> D3rlpyBuffer:
    if spec.sampler != "random":
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (d3rlpy's ReplayBuffer "
                         f"samples transitions uniformly)")
    if spec.layout is not None and STEP_KEYS <= {k for k in spec.layout if isinstance(k, str)}:
        return D3rlpyTransitions(spec)
    return D3rlpyBuffer(spec)


def d3rlpy_adapter() -> Adapter:
    """d3rlpy's ``ReplayBuffer`` with a ``FIFOBuffer`` and its ``BasicTransitionPicker``."""
    try:
        importlib.import_module("d3rlpy.dataset")
    except ImportError as err:
        raise ImportError(
            f"d3rlpy is not installed ({type(err).__name__}: {err}), but should be: "
            f"install the 'd3rlpy' dependency group"
        ) from err
    from importlib.metadata import version

    return Adapter(
        name="d3rlpy",
        version=f"{version('d3rlpy')} (numpy {np.__version__})",
        make=_make,
        capabilities=CAPABILITIES,
        conventions=Conventions(
            transition_fields=TRANSITION_FIELDS,
            capacity_counts="complete_transitions",
            terminal_next_obs="zeros",
            notes={"transition_fields": "BasicTransitionPicker returns observation, action, reward, "
                   "next_observation, terminal: no truncated flag (d3rlpy/dataset/transition_pickers.py:63-72)",
                   "capacity_counts": "FIFOBuffer(limit) is a deque(maxlen=limit) of (episode, index) transitions "
                   "(d3rlpy/dataset/buffers.py:85-95); a step is appended once the next step of its episode is "
                   "written (writers.py:364-372, transition_count = size() - 1 while running, :236-238) or at "
                   "clip_episode(True) (:391-395); clip_episode(False) appends nothing, so a truncated episode's "
                   "last step is never held",
                   "terminal_next_obs": "BasicTransitionPicker: the terminal step's next_observation is "
                   "create_zero_observation(observation) (d3rlpy/dataset/transition_pickers.py:53-56)"},
        ),
    )


__all__ = ["D3rlpyBuffer", "d3rlpy_adapter"]
