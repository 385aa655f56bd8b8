"""``update_priority``'s fast path on the CPU: the same checks and bits, less Python.

``PrioritizedSampler._update_native`` makes one native call (``native.update_whole``:
the index and priority checks, ``+ eps``, the pow as torch computes it, the overflow
check, both trees, then the max priority). Before it, on every update, it checks every
argument of that call, the trees and the max priority tensor too (CPU, contiguous:
torch's getters), looks up its workspaces (``kept``) and whether the pow may run in C
(``torch_pow.in_c``), through four Python calls. Called cold, as between the other
calls of a training loop, each of those lookups misses the cache; what they cost
beside the native call is measured in docs/benchmarks.md ("eighth run").

``try_update(sampler, index, priority)`` makes the same call with what does not change
between updates bound once per sampler (``_UpdatePlan``: the trees and the max priority
tensor, their addresses, ``alpha``, ``eps``, the pow's function, the native calls).
Every update still:

* checks the batch as ``_update_native`` does: two tensors, an int64 index of one
  dimension, float32 or float64 priorities of its shape, both on the CPU and
  contiguous, 1 to ``torch_pow.GRAIN - 1`` of them;
* checks that every bound object is still the sampler's and at the same address (a
  tree replaced by ``load_state_dict`` or moved in place by ``share_memory_()``,
  another ``alpha`` or ``eps``, other native calls): if not, it binds again;
* leaves the checks of values to the native call (indices in range, priorities
  finite and >= 0, no transform overflowing: nothing changes when one fails).

None when it does not apply (the caller, ``_update_native``, goes on with its general
path); False when a check in C failed (nothing changed: the full path runs and raises
the reference's error). The
native call and its arguments are ``_update_native``'s, so the state afterwards is
the same bit for bit (tests/variants/test_update_fast_path.py).

Applies to the ``torch`` backend's CPU trees with the native calls loaded, when
``torch_pow.agrees(alpha)``. Cost: O(1) Python around ``update_whole``'s
O(k log capacity).
"""

from __future__ import annotations

import torch

from rbcheck.variants import native
from rbcheck.variants.native import torch_pow
from rbcheck.variants.vector_tree import kept

#: Set to False to turn the fast path off (the tests compare both paths).
ENABLED = True
#: Set to False to skip ``try_update``'s Python checks of the arguments and of the bound plan
#: (for the ablation of bench/check_costs.py ONLY, with a plan an earlier update bound and
#: arguments of its kind). The checks of values in C stay.
CHECKS = True


class _UpdatePlan:
    """What every fast update of one sampler reuses (see module doc); made again by
    ``bind`` when any of it is no longer the sampler's. Holds the bound tensors
    themselves, so an identity check can never match another object."""

    __slots__ = ("sum", "min", "high", "at", "alpha", "eps", "vector_pow", "size", "capacity", "calls")

    def __reduce__(self):
        """A copy or a pickle of the sampler carries no plan (its addresses are this
        sampler's memory): the next update binds its own."""
        return _no_plan, ()


def _no_plan() -> None:
    return None


def bind(sampler) -> _UpdatePlan | None:
    """A plan for ``sampler`` as it is now, kept on it; None (and none kept) when the fast
    path does not apply: the ``triton`` backend, trees or max priority off the CPU or not
    contiguous float64, no native calls, or a pow that may not run in C."""
    calls = native._state.get("calls") or native.calls()
    nodes = (sampler.sum_tree.raw_nodes, sampler.min_tree.raw_nodes, sampler._max_priority)
    if calls is None or sampler.backend != "torch" or not torch_pow.agrees(sampler.alpha) or not all(
            t.is_cpu and t.is_contiguous() and t.dtype == torch.float64 for t in nodes):
        sampler.__dict__.pop("_update_plan", None)
        return None
    plan = _UpdatePlan()
    plan.sum, plan.min, plan.high = nodes
    plan.at = tuple(t.data_ptr() for t in nodes)
    plan.alpha, plan.eps = sampler.alpha, sampler.eps
    plan.vector_pow = torch_pow.vector_pow() or 0
    plan.size, plan.capacity, plan.calls = sampler.sum_tree.size, sampler.capacity, calls
    sampler._update_plan = plan
    return plan


def _current(sampler, plan: _UpdatePlan) -> bool:
    """Whether every object ``plan`` holds is still the sampler's, where it was."""
    high = sampler._max_priority
    return (sampler.sum_tree._nodes is plan.sum and sampler.min_tree._nodes is plan.min and high is plan.high
            and sampler.alpha == plan.alpha and sampler.eps == plan.eps
            and native._state.get("calls") is plan.calls
            and (plan.sum.data_ptr(), plan.min.data_ptr(), high.data_ptr()) == plan.at)


def try_update(sampler, index, priority) -> bool | None:
    """``update_priority(index, priority)`` without generations, as ``_update_native``
    makes it (one native call): True when done; False when a check in C failed; None
    when the fast path does not apply. Nothing changed unless True."""
    if not ENABLED or CHECKS and (not (type(index) is torch.Tensor and type(priority) is torch.Tensor)
                                  or index.dtype is not torch.long or index.dim() != 1
                                  or (priority.dtype is not torch.float64 and priority.dtype is not torch.float32)
                                  or priority.shape != index.shape or not (index.is_cpu and priority.is_cpu)
                                  or not (index.is_contiguous() and priority.is_contiguous())):
        return None
    n = index.shape[0]
    if CHECKS and not 1 <= n < torch_pow.GRAIN:
        return None
    plan = sampler.__dict__.get("_update_plan")
    if plan is None or CHECKS and not _current(sampler, plan):
        plan = bind(sampler)
        if plan is None:
            return None
    value, high = sampler.work.get(("update", n)) or kept(  # _update_native's workspaces
        sampler.work, ("update", n), lambda: (torch.empty(n, dtype=torch.float64), torch.empty(1, dtype=torch.float64)))
    code = plan.calls.update_whole(
        index.data_ptr(), n, plan.capacity, priority.data_ptr(), int(priority.dtype is torch.float32), plan.eps,
        value.data_ptr(), plan.at[2], high.data_ptr(), plan.alpha, plan.vector_pow, plan.at[0], plan.at[1],
        plan.size)
    if code < 0:
        raise MemoryError("native tree update: out of memory")
    if code:
        return False  # a check failed (nothing changed): the full path raises the reference's error
    sum_tree, min_tree = sampler.sum_tree, sampler.min_tree
    sum_tree._stale = sum_tree._stale or sum_tree.has_shadow  # mark_stale(), inlined
    min_tree._stale = min_tree._stale or min_tree.has_shadow
    return True
