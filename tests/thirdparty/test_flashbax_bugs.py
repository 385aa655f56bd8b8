"""Executed repros of the flashbax 0.1.3 bugs in docs/findings.md (strict
xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern), on JAX's CPU backend in its default 32-bit mode. Skipped where
flashbax is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flashbax", reason="flashbax is not installed (nox -s thirdparty installs it)")
import flashbax as fbx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

VERSION = "flashbax 0.1.3"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def item_per(capacity: int, batch: int):
    buffer = fbx.make_prioritised_item_buffer(max_length=capacity, min_length=1, sample_batch_size=batch,
                                              add_sequences=True, priority_exponent=1.0)
    state = buffer.init({"x": jnp.zeros(())})
    return buffer, buffer.add(state, {"x": jnp.arange(float(capacity))})


@bug("the float32 sum tree propagates each update as a delta added to every ancestor "
     "(buffers/sum_tree.py:276-296, set_batch_scan :391): rounding accumulates in the root, so after "
     "many updates the root is far above the leaves' sum and draws land on zero-priority items "
     "(instadeepai/flashbax#52)")
def test_zero_priority_items_are_never_sampled_after_many_updates():
    buffer, state = item_per(1000, 256)
    set_priorities, sample = jax.jit(buffer.set_priorities), jax.jit(buffer.sample)
    rng = np.random.default_rng(0)
    for _ in range(300):
        index = rng.integers(0, 1000, 256)
        state = set_priorities(state, jnp.asarray(index), jnp.asarray(rng.uniform(0, 1000, 256), jnp.float32))
    index = jnp.arange(1000)
    state = set_priorities(state, index, jnp.where(index == 999, 1e-3, 0.0).astype(jnp.float32))
    drawn = np.asarray(sample(state, jax.random.PRNGKey(1)).indices)
    assert set(drawn.tolist()) == {999}, f"drawn {sorted(set(drawn.tolist()))[:8]}, root {state.sum_tree_state.nodes[0]}"


@bug("set_priorities takes an index >= capacity without a word: with a capacity that is not a power "
     "of two it lands on a padding leaf of the tree (buffers/sum_tree.py:270-296, mode='drop' drops only "
     "indices outside the node array), and sample then returns that index")
def test_index_past_capacity_is_refused_or_never_sampled():
    buffer, state = item_per(5, 5)
    try:
        state = buffer.set_priorities(state, jnp.array([6]), jnp.array([100.0]))
    except Exception:  # noqa: BLE001 - refused: what the spec asks
        return
    drawn = np.asarray(buffer.sample(state, jax.random.PRNGKey(0)).indices)
    assert (drawn < 5).all(), f"drawn {drawn.tolist()} from a buffer of capacity 5"


@bug("a newly added item gets jnp.full_like(newly_valid_item_indices, fill_value=max_recorded_priority) "
     "(buffers/prioritised_trajectory_buffer.py:443-445): the array takes the int32 dtype of the indices, "
     "so the max recorded priority is truncated to an integer (7.25 -> 7, 0.9 stays 1.0 only because "
     "the record starts at 1.0)")
def test_new_item_gets_the_max_recorded_priority_exactly():
    buffer = fbx.make_prioritised_item_buffer(max_length=4, min_length=1, sample_batch_size=1,
                                              add_sequences=True, priority_exponent=1.0)
    state = buffer.init({"x": jnp.zeros(())})
    state = buffer.add(state, {"x": jnp.zeros(1)})
    state = buffer.set_priorities(state, jnp.array([0]), jnp.array([7.25]))
    state = buffer.add(state, {"x": jnp.ones(1)})
    from flashbax.buffers import sum_tree

    stored = np.asarray(sum_tree.get_batch(state.sum_tree_state, jnp.array([0, 1])))
    assert stored.tolist() == [7.25, 7.25], f"stored {stored.tolist()}"


@bug("set_priorities checks nothing (buffers/prioritised_trajectory_buffer.py:740-776): NaN, infinite and "
     "negative priorities are stored, and a NaN, or a negative p ** alpha, makes the root NaN and every "
     "probability with it")
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0], ids=["nan", "inf", "negative"])
def test_bad_priority_is_refused(bad):
    buffer, state = item_per(4, 4)
    try:
        state = buffer.set_priorities(state, jnp.array([0]), jnp.array([bad], jnp.float32))
    except Exception:  # noqa: BLE001 - refused: what the spec asks
        return
    raise AssertionError(f"set_priorities(index=[0], priority=[{bad}]) was taken (root "
                         f"{float(state.sum_tree_state.nodes[0])}), but should be refused")
