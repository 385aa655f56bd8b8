"""Which tests run for an implementation: the capabilities a test or a
buffer description needs, the skip reason when one is not declared or cannot
run here, the conventions a test checks its invariant under, and the copy of
an adapter that builds its buffers on another device."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec

#: Skip reason of exact-replay properties for an adapter declaring seedable=False.
SEED_SKIP = "convention: not seedable (exact replay of draws needs a seed)"


def declared_conventions(item: pytest.Item, adapter: Adapter) -> dict[str, str]:
    """The adapter's deviations from the spec among the conventions ``item``
    declares it checks under (``@pytest.mark.conventions``)."""
    names: set[str] = set()
    for mark in item.iter_markers("conventions"):
        names.update(mark.args)
    deviations = adapter.conventions.deviations(notes=False)
    return {k: v for k, v in deviations.items() if k.split(".", 1)[0] in names}


def capability_skip_reason(adapter: Adapter, capabilities: tuple[str, ...]) -> str | None:
    """The skip reason for a test needing ``capabilities``, or None to run it."""
    for cap in capabilities:
        if cap not in CAPABILITIES:
            raise ValueError(
                f"requires({cap!r}): capability={cap!r}, but should be one of {sorted(CAPABILITIES)}"
            )
    for cap in capabilities:
        if cap in adapter.unavailable:
            return f"unavailable: {cap}: {adapter.unavailable[cap]}"
    for cap in capabilities:
        if cap not in adapter.capabilities:
            return f"not declared: {cap}"
    return None


def spec_capabilities(spec: BufferSpec) -> tuple[str, ...]:
    """Capabilities a :class:`BufferSpec` needs to be built."""
    needed = []
    if spec.sampler in ("random", "prioritized", "slice", "without_replacement", "consuming",
                        "slice_without_replacement", "prioritized_slice", "staleness"):
        needed.append(spec.sampler)
    if spec.prefetch:
        needed.append("prefetch")
    if spec.priority_key is not None and spec.sampler == "prioritized":
        needed.append("priority_key")
    if spec.transform is not None:
        needed.append("transforms")
    if spec.pin_memory:
        needed.append("pin_memory")
    if str(spec.device).startswith("cuda"):
        needed.append("cuda")
    if spec.storage in ("memmap", "compressed"):  # issue 41: storages and writers
        needed.append(spec.storage)
    if spec.writer in ("max_value", "immutable"):
        needed.append(f"{spec.writer}_writer")
    if spec.sampler in ("fifo", "lifo", "min_heap", "max_heap") or spec.remover != "fifo":  # issue 42
        needed.append("selector")
    if spec.max_times_sampled:
        needed.append("max_times_sampled")
    if spec.rate_limiter is not None:
        needed.append("rate_limiter")
    if "random" in needed and ("max_times_sampled" in needed or "rate_limiter" in needed):
        needed.remove("random")  # a served table's uniform selector is part of those capabilities
    needed += [name for name in ("her", "mixing") if getattr(spec, name) is not None]  # issue 42
    return tuple(needed)


def on_device(adapter: Adapter, device: str) -> Adapter:
    """The adapter with every spec on the default device ("cpu") moved to
    ``device``; a test building one is skipped with the reason when the
    adapter cannot run there. The reference model stays on the CPU."""

    def make(spec: BufferSpec):
        if spec.device == "cpu":
            spec = spec.but(device=device)
        reason = capability_skip_reason(adapter, spec_capabilities(spec))
        if reason:
            pytest.skip(reason)
        return adapter.make(spec)

    return replace(adapter, make=make)


def skip_reason_of(adapter: Adapter, item: pytest.Item) -> str | None:
    """Why ``item`` is skipped for ``adapter`` (a capability its ``requires``
    marks name is not declared or cannot run here; an exact-replay test of an
    adapter that is not seedable), or None to run it. A mark naming an
    unknown capability is a ValueError."""
    for mark in item.iter_markers("requires"):
        reason = capability_skip_reason(adapter, tuple(mark.args))
        if reason:
            return reason
    if not adapter.conventions.seedable and item.get_closest_marker("exact_replay"):
        return SEED_SKIP
    return None
