"""The raw faces of the ``flashbax-item`` and ``flashbax`` adapters (``Adapter.raw``,
harness/raw_calls.py), on JAX's CPU backend, driven as flashbax's README does: ``add`` and
``set_priorities`` jitted with the state donated, ``sample`` jitted, each call waited for
(``block_until_ready``: JAX dispatches asynchronously).

* :class:`FlashbaxItemRaw`: ``make_item_buffer`` / ``make_prioritised_item_buffer``
  (``add_sequences=True``: an ``add`` of n rows is one call), each row one item. A new item gets
  the largest priority so far: an ``add`` with the rows' own priorities is ``add`` then
  ``set_priorities`` of their slots, one jitted function. flashbax returns sampling
  probabilities, not weights: the timed ``sample`` computes ``(N P) ** -beta`` over the batch's
  largest (jitted with it), as its users do (``conventions``: batch_max). No eps (``p ** alpha``).
* :class:`FlashbaxFlatRaw`: ``make_flat_buffer`` (uniform only): its sample is a batch of
  transition pairs (row i, row i + 1, never across the write head); the rows checked are the
  pairs' first rows, and the timed sample returns both.

No checkpoint of its own: the state is a pytree a user saves with their own tools (``Vault``
stores experience, not the buffer's state)."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from rbcheck.harness.adapters.flashbax import PER_CONVENTIONS
from rbcheck.harness.raw_calls import RawCalls


class FlashbaxItemRaw(RawCalls):
    """flashbax's item buffers (module docstring)."""

    flat = False
    conventions = dataclasses.replace(PER_CONVENTIONS, weight_normaliser="batch_max",
                                      notes={**PER_CONVENTIONS.notes, "weight_normaliser":
                                             "(N P) ** -beta over the batch's largest, computed by the caller"})
    unsupported = {op: "no checkpoint of its own: the state is a pytree the user saves with their own tools "
                       "(Vault stores experience, not the buffer's state)" for op in ("save", "load")}

    @classmethod
    def unavailable(cls):
        jax = importlib.import_module("jax")
        if jax.default_backend() != "cpu":
            return f"JAX's backend is {jax.default_backend()}, but should be cpu (JAX_PLATFORMS=cpu)"
        return None

    def __init__(self, spec):
        super().__init__(spec)
        import jax
        import jax.numpy as jnp

        self.fns = self._fns(1)  # sample functions: built per batch size (sample)
        example = {"obs": jnp.zeros(self.width, jnp.float32), "action": jnp.zeros(2, jnp.float32),
                   "reward": jnp.zeros((), jnp.float32)}
        self.buffer = self.fns["buffer"].init(example)  # the state: a pytree
        self.key, self.samplers_by_batch = jax.random.PRNGKey(spec.seed), {}

    def _fns(self, batch):
        import flashbax as fbx
        import jax
        import jax.numpy as jnp

        capacity, prioritized, flat, beta = self.spec.capacity, self.prioritized, self.flat, self.spec.beta
        if flat:
            buffer = fbx.make_flat_buffer(max_length=capacity, min_length=2, sample_batch_size=batch,
                                          add_sequences=True)
        elif prioritized:
            buffer = fbx.make_prioritised_item_buffer(max_length=capacity, min_length=1, sample_batch_size=batch,
                                                      add_sequences=True, priority_exponent=self.spec.alpha,
                                                      device="cpu")
        else:
            buffer = fbx.make_item_buffer(max_length=capacity, min_length=1, sample_batch_size=batch,
                                          add_sequences=True)

        def extend(state, rows, priority):
            slots = (state.current_index + jnp.arange(priority.shape[0])) % capacity
            return buffer.set_priorities(buffer.add(state, rows), slots, priority)

        def sample(state, key):
            key, sub = jax.random.split(key)
            out = buffer.sample(state, sub)
            if flat:  # transition pairs (row i, row i + 1): the rows are the first
                return out.experience.first, None, None, key
            if not prioritized:
                return out.experience, None, None, key
            size = jnp.where(state.is_full, capacity, state.current_index)
            weight = (size * out.probabilities) ** -beta
            return out.experience, out.indices, weight / weight.max(), key

        fns = {"buffer": buffer, "sample": jax.jit(sample)}
        if prioritized:
            fns["extend"] = jax.jit(extend, donate_argnums=0)
            fns["set_priorities"] = jax.jit(buffer.set_priorities, donate_argnums=0)
        else:
            fns["extend"] = jax.jit(buffer.add, donate_argnums=0)
        return fns

    def prepare(self, rows, priority):
        import jax
        import jax.numpy as jnp

        data = {k: jnp.asarray(rows[k]) for k in ("obs", "action", "reward")}
        priority = jnp.asarray(priority.astype(np.float32)) if priority is not None and self.prioritized else None
        return jax.block_until_ready((data, priority))

    def add(self, prepared):
        import jax

        data, priority = prepared
        fn = self.fns["extend"]
        self.buffer = jax.block_until_ready(fn(self.buffer, data, priority) if priority is not None
                                            else fn(self.buffer, data))

    def sample(self, batch):
        import jax

        if batch not in self.samplers_by_batch:  # flashbax fixes the batch size when it builds its functions
            self.samplers_by_batch[batch] = self._fns(batch)["sample"]
        rows, index, weight, self.key = jax.block_until_ready(self.samplers_by_batch[batch](self.buffer, self.key))
        return {"obs": rows["obs"], "action": rows["action"], "reward": rows["reward"], "index": index,
                "weight": weight}

    def rows_at(self, slots):
        exp = self.buffer.experience
        return {k: np.asarray(exp[k][0])[slots] for k in ("obs", "action", "reward")}

    def priority_at(self, slots):
        from flashbax.buffers import sum_tree

        return np.asarray(sum_tree.get_batch(self.buffer.sum_tree_state, slots.astype(np.int32)), dtype=np.float64)

    def prepare_update(self, index, raw):
        import jax.numpy as jnp

        return jnp.asarray(index.astype(np.int32)), jnp.asarray(raw.astype(np.float32))

    def update_priorities(self, index, priority):
        import jax

        self.buffer = jax.block_until_ready(self.fns["set_priorities"](self.buffer, index, priority))


class FlashbaxFlatRaw(FlashbaxItemRaw):
    """flashbax's ``make_flat_buffer`` (module docstring)."""

    flat, samplers = True, ("random",)

    def priority_at(self, slots):
        return None


__all__ = ["FlashbaxFlatRaw", "FlashbaxItemRaw"]
