"""Built-in adapters for the optimized variants (``--impl device`` / ``--impl triton``).

Both wrap :class:`variants.ReplayBuffer` with :func:`buffer_adapter`, using the
variants' components (device storage, batched samplers). ``spec.device``
places the buffer ("cpu" by default, so the suite runs everywhere; "cuda"
needs the ``cuda`` capability, reported unavailable without a GPU).

* ``device``: trees updated and searched with vectorized torch ops.
* ``triton``: the same buffer with the prioritized sampler's trees run by
  Triton kernels (``variants/triton_tree.py``); without CUDA the kernels run
  in Triton's interpreter. If Triton does not import, every capability is
  reported unavailable with the import error.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

from rbcheck.harness.adapters.reference import buffer_adapter, project_version

#: What the variants claim (everything but policy placement, which is not theirs).
CAPABILITIES = frozenset({
    "random", "prioritized", "priority_readback", "slice", "transforms", "pin_memory", "save_load",
    "shared_rng", "stale_updates", "priority_key", "cuda", "bad_input",
})


def _components(backend: str) -> SimpleNamespace:
    from rbcheck import variants

    return SimpleNamespace(
        TensorStorage=variants.DeviceStorage,
        RandomSampler=variants.RandomSampler,
        PrioritizedSampler=functools.partial(variants.PrioritizedSampler, backend=backend),
        SliceSampler=variants.SliceSampler,
    )


def _buffer_cls() -> type:
    from rbcheck.variants import ReplayBuffer

    return ReplayBuffer


def device():
    """The device variant with torch-only tree operations (its raw face: ``variants_raw.DeviceRaw``)."""
    from rbcheck.harness.adapters.variants_raw import DeviceRaw

    adapter = buffer_adapter("device", project_version(), _buffer_cls, CAPABILITIES,
                             components=lambda: _components("torch"), pin_module="rbcheck.reference.pinning")
    adapter.raw = DeviceRaw
    return adapter


def triton():
    """The device variant with Triton kernels for the trees."""
    from rbcheck.variants import (
        triton_tree,  # sets TRITON_INTERPRET before any kernel exists (no CUDA)
    )

    unavailable = {}
    if triton_tree.UNAVAILABLE is not None:
        unavailable = {cap: f"triton does not import ({triton_tree.UNAVAILABLE})"
                       for cap in CAPABILITIES}
    adapter = buffer_adapter("triton", project_version(), _buffer_cls, CAPABILITIES,
                             components=lambda: _components("triton"), unavailable=unavailable,
                             pin_module="rbcheck.reference.pinning")
    if os.environ.get("TRITON_INTERPRET") == "1":
        adapter.scale_limits = INTERPRETED_SCALE_LIMITS  # cost hints (harness.strategies.scale_limit)
    return adapter


#: Cost hints of the triton variant when its kernels run in Triton's
#: interpreter (no CUDA): a prioritized sample call costs ~30-70 ms there, a
#: batch of 4096 ~0.5-0.9 s, and filling a tree of 2**16 leaves ~50 s. The
#: properties run their large cases smaller or skip them, saying why.
INTERPRETED_SCALE_LIMITS = {
    "prioritized_fill": (4097, "Triton's interpreter: writing and updating 2**16 leaves takes ~50 s"),
    "prioritized_sample_calls": (40, "Triton's interpreter: a prioritized sample call costs ~30-70 ms"),
    "sample_batch": (256, "Triton's interpreter: a prioritized sample of 4096 rows costs ~0.5-0.9 s"),
}


__all__ = ["CAPABILITIES", "device", "triton"]
