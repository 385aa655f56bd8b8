"""Adapters for buffers shaped like the reference ``ReplayBuffer``.

:func:`buffer_adapter` wraps any class with the reference buffer's public
shape -- ``ReplayBuffer(capacity, *, storage, sampler, transform, batch_size,
pin_memory, priority_key, generator)`` with ``extend / add / sample /
update_priority / dumps / loads / cursor / write_count`` and ``storage`` /
``sampler`` / ``writer`` attributes -- into a :class:`BufferUnderTest`. The
reference uses it (:func:`reference_adapter`) and so do the variants, which
pass their own buffer class and components.

Nothing here imports ``reference`` at module import time: an adapter can be
listed (``--impl``, the report header) even while a backend is broken, and
the import error then shows up where a buffer is built.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from tensordict import TensorDictBase

from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec, Conventions

#: Components a spec is built from; a variant may replace any of them.
COMPONENT_NAMES = ("TensorStorage", "RandomSampler", "PrioritizedSampler", "SliceSampler",
                   "WithoutReplacementSampler", "ConsumingSampler", "ConsumingWriter",
                   "MemmapStorage", "MaxValueWriter", "ImmutableWriter", "CompressedStorage",
                   "SliceWithoutReplacementSampler", "PrioritizedSliceSampler", "StalenessSampler",
                   "HindsightReplayBuffer", "MixingReplayBuffer")


def _reference_components() -> SimpleNamespace:
    ref = importlib.import_module("rbcheck.reference")
    return SimpleNamespace(**{n: getattr(ref, n) for n in COMPONENT_NAMES})


def _attr(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj._name`` (buffers differ in what they make public)."""
    for candidate in (name, "_" + name):
        if hasattr(obj, candidate):
            return getattr(obj, candidate)
    raise AttributeError(f"{type(obj).__name__}.{name} is missing, but should exist")


def cuda_unavailable_reason() -> str | None:
    """Why "cuda" cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no CUDA device on this machine)"
    return None


class ShapedBuffer:
    """A :class:`BufferUnderTest` over one buffer with the reference's shape."""

    def __init__(self, buffer: Any, spec: BufferSpec):
        self.buffer = buffer
        self.spec = spec

    def __repr__(self) -> str:
        return f"ShapedBuffer({type(self.buffer).__module__}.{type(self.buffer).__qualname__}, {self.spec})"

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        return self.buffer.extend(data)

    def add(self, row: TensorDictBase) -> int:
        return int(self.buffer.add(row))

    # reading
    def __len__(self) -> int:
        return len(self.buffer)

    def sample(self, batch_size: int | None = None):
        rows, info = self.buffer.sample(batch_size)
        if self.spec.nstep is not None:  # capability "nstep": the spec's windows (reference/transitions.py)
            from rbcheck.reference.transitions import nstep_keys

            keys = nstep_keys(self.contents(), self.cursor, self.spec.capacity, info["index"].cpu(),
                              self.spec.nstep, self.spec.gamma)
            rows = rows.clone()
            rows.update(keys.to(rows.device))
        return rows, info

    def contents(self) -> TensorDictBase:
        storage = _attr(self.buffer, "storage")
        index = torch.arange(len(storage), dtype=torch.long)
        # leaf by leaf: TensorDict.clone() on a TensorDict with a device adds 0 to every float
        # leaf (tensordict 0.14.3 base.py:13187, torch._foreach_add(vals, 0)), turning -0.0 into 0.0
        return storage.get(index).apply(torch.clone)

    @property
    def cursor(self) -> int:
        return int(self.buffer.cursor)

    @property
    def write_count(self) -> int:
        return int(self.buffer.write_count)

    # priorities
    def _prioritized(self) -> Any:
        sampler = _attr(self.buffer, "sampler")
        if not hasattr(sampler, "sum_tree"):
            raise NotImplementedError(
                f"sampler={type(sampler).__name__}, but should be a prioritized sampler "
                f"(spec.sampler={self.spec.sampler!r})"
            )
        return sampler

    def update_priority(self, index, priority, generation=None) -> None:
        if generation is None:
            self.buffer.update_priority(index, priority)
        else:
            self.buffer.update_priority(index, priority, generation=generation)

    def stored_priority(self, index) -> torch.Tensor:
        tree = self._prioritized().sum_tree
        return tree.leaf(torch.as_tensor(index, dtype=torch.long)).to(torch.float64)

    @property
    def max_priority(self) -> float:
        return self._prioritized().max_priority

    # shared randomness
    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        if hasattr(self.buffer, "indices_from_uniforms"):
            return self.buffer.indices_from_uniforms(u)
        sampler = _attr(self.buffer, "sampler")
        if not hasattr(sampler, "indices_from_uniforms"):
            raise NotImplementedError(
                f"{type(sampler).__name__}.indices_from_uniforms is missing, but should exist "
                f"for capability 'shared_rng'"
            )
        return sampler.indices_from_uniforms(u, len(self.buffer))

    # iteration
    def iterate(self):
        return iter(self.buffer)

    def sample_all(self, mini_batches: int = 1) -> list[TensorDictBase]:  # capability "sample_all"
        return self.buffer.sample_all(mini_batches)

    # staleness (issue 40): the learner's version, against which each row's staleness counts
    def set_consumer_version(self, version: int) -> None:
        _attr(self.buffer, "sampler").set_consumer_version(version)

    # edits and disk storages (issue 41)
    def set(self, index, rows) -> None:
        self.buffer.set(index, rows)

    def close(self) -> None:
        """Close a disk storage (its files and manifest); a storage in memory has nothing to release."""
        from rbcheck.reference.memmap_reopen import close_buffer

        if hasattr(_attr(self.buffer, "storage"), "close"):
            close_buffer(self.buffer)

    # checkpoints
    def save(self, path: Path) -> None:
        self.buffer.dumps(path)

    def load(self, path: Path) -> None:
        self.buffer.loads(path)


def make_components(spec: BufferSpec, components: Any) -> tuple[Any, Any]:
    """``(storage, sampler)`` for ``spec`` from a namespace of component classes."""
    storage = make_storage(spec, components)
    if spec.sampler == "random":
        sampler = components.RandomSampler()
    elif spec.sampler == "prioritized":
        sampler = components.PrioritizedSampler(spec.capacity, spec.alpha, spec.beta, spec.eps)
    elif spec.sampler == "slice":
        sampler = components.SliceSampler(
            num_slices=spec.num_slices,
            slice_len=spec.slice_len,
            episode_key=spec.episode_key,
            strict_length=spec.strict_length,
        )
    elif spec.sampler == "without_replacement":
        sampler = components.WithoutReplacementSampler(drop_last=spec.drop_last, shuffle=spec.shuffle)
    elif spec.sampler == "consuming":
        sampler = components.ConsumingSampler(spec.capacity, spec.max_sample_count)
    elif spec.sampler in ("slice_without_replacement", "prioritized_slice", "staleness"):  # issue 40
        sampler = issue40_sampler(spec, components)
    else:
        raise ValueError(
            f"spec.sampler={spec.sampler!r}, but should be 'random', 'prioritized', 'slice', "
            f"'without_replacement', 'consuming', 'slice_without_replacement', 'prioritized_slice' or 'staleness'"
        )
    return storage, sampler


def issue40_sampler(spec: BufferSpec, components: Any) -> Any:
    """The slice-epoch, prioritized-slice or staleness sampler ``spec`` names."""
    slices = dict(num_slices=spec.num_slices, slice_len=spec.slice_len, episode_key=spec.episode_key,
                  strict_length=spec.strict_length)
    if spec.sampler == "slice_without_replacement":
        return components.SliceWithoutReplacementSampler(**slices, drop_last=spec.drop_last, shuffle=spec.shuffle)
    if spec.sampler == "prioritized_slice":
        return components.PrioritizedSliceSampler(spec.capacity, spec.alpha, spec.beta, spec.eps, **slices)
    return components.StalenessSampler(spec.max_staleness)


def issue42_buffer(spec: BufferSpec, components: Any, kwargs: dict) -> tuple[type, dict]:
    """The class and arguments of a hindsight (``spec.her``) or mixing (``spec.mixing``) buffer."""
    if spec.her is not None and spec.mixing is not None:
        raise ValueError(f"spec.her={spec.her!r} with spec.mixing={spec.mixing!r}, but should be one of them")
    if spec.her is not None:
        strategy, ratio = spec.her
        return components.HindsightReplayBuffer, dict(kwargs, her_strategy=strategy, her_ratio=ratio)
    from rbcheck.reference.mixing import offline_rows

    size, fraction = spec.mixing
    return components.MixingReplayBuffer, dict(kwargs, offline=offline_rows(size), offline_fraction=fraction)


def make_storage(spec: BufferSpec, components: Any) -> Any:
    """The storage ``spec.storage`` names (issue 41): "memory", or "memmap" (files of
    ``spec.scratch_dir``; ``spec.reopen``: the files a closed buffer left there)."""
    if spec.reopen and spec.storage != "memmap":
        raise ValueError(f"spec.reopen=True with storage={spec.storage!r}, but should be storage='memmap'")
    if spec.storage == "memory":
        return components.TensorStorage(spec.capacity, device=spec.device)
    if spec.storage == "compressed":  # rows kept compressed (reference/compressed_storage.py)
        return components.CompressedStorage(spec.capacity, device=spec.device)
    if spec.storage == "memmap":
        if spec.scratch_dir is None:
            raise ValueError("spec.scratch_dir=None, but should be a directory for storage='memmap'")
        return components.MemmapStorage(spec.capacity, spec.scratch_dir, device=spec.device, reopen=spec.reopen)
    raise ValueError(f"spec.storage={spec.storage!r}, but should be 'memory', 'compressed' or 'memmap'")


def make_writer(spec: BufferSpec, components: Any) -> Any:
    """The writer ``spec.writer`` names (issue 41); None: the buffer's own round-robin one."""
    if spec.writer == "round_robin":
        return None
    if spec.writer == "max_value":
        return components.MaxValueWriter(spec.capacity, spec.value_key)
    if spec.writer == "immutable":
        return components.ImmutableWriter(spec.capacity)
    raise ValueError(f"spec.writer={spec.writer!r}, but should be 'round_robin', 'max_value' or 'immutable'")


def patch_module_pin_step(module_name: str) -> Callable[[Callable], Any]:
    """A ``patch_pin_step`` hook for a buffer that looks up
    ``<module>.pin_sample`` and ``<module>.require_accelerator`` at call time.

    Inside the returned context manager the accelerator precondition is
    lifted (so ``pin_memory=True`` can be built on a CPU-only machine) and
    the pin step is ``recorder(sample, info) -> (sample, info)``.
    """

    @contextlib.contextmanager
    def patch(recorder: Callable) -> Iterator[Callable]:
        module = importlib.import_module(module_name)
        with mock.patch.object(module, "pin_sample", recorder), mock.patch.object(
            module, "require_accelerator", lambda *args, **kwargs: None
        ):
            yield recorder

    return patch


def buffer_adapter(
    name: str,
    version: str,
    buffer_cls: type | Callable[[], type],
    capabilities: Iterable[str],
    *,
    components: Any = None,
    unavailable: dict[str, str] | None = None,
    place_policy: Callable | None = None,
    pin_module: str | None = "rbcheck.reference.pinning",
    known_failures: Path | None = None,
    conventions: Conventions | None = None,
) -> Adapter:
    """An :class:`Adapter` for ``buffer_cls``, a class with the reference
    ``ReplayBuffer``'s public shape.

    ``buffer_cls`` may be a zero-argument callable returning the class (so
    the import happens on first use). ``components`` is a namespace with
    any of :data:`COMPONENT_NAMES` (any missing one is taken from
    ``reference``), or a
    zero-argument callable returning one. ``cuda`` is reported unavailable
    automatically when no CUDA device is present. ``conventions`` declares
    documented deviations from the spec (default: none).
    """
    capabilities = frozenset(capabilities)
    unavailable = dict(unavailable or {})
    if "cuda" in capabilities and "cuda" not in unavailable:
        why = cuda_unavailable_reason()
        if why:
            unavailable["cuda"] = why

    def resolve_cls() -> type:
        if isinstance(buffer_cls, type):
            return buffer_cls
        return buffer_cls()

    def resolve_components() -> SimpleNamespace:
        given = components() if callable(components) and not isinstance(components, SimpleNamespace) else components
        merged = {}
        fallback = None
        for component in COMPONENT_NAMES:
            value = getattr(given, component, None) if given is not None else None
            if value is None:
                fallback = fallback or _reference_components()
                value = getattr(fallback, component)
            merged[component] = value
        return SimpleNamespace(**merged)

    def make(spec: BufferSpec) -> ShapedBuffer:
        from rbcheck.harness.adapters.served import served_buffer, served_spec

        if served_spec(spec):  # issue 42: a served table (Reverb's model)
            return served_buffer(spec, components)
        cls = resolve_cls()
        parts = resolve_components()
        storage, sampler = make_components(spec, parts)
        kwargs: dict[str, Any] = dict(
            storage=storage,
            sampler=sampler,
            transform=spec.transform,
            batch_size=spec.batch_size,
            pin_memory=spec.pin_memory,
            generator=spec.seed,
        )
        if spec.priority_key is not None:  # None: the implementation's default key
            kwargs["priority_key"] = spec.priority_key
        if spec.sampler == "consuming":  # the writer reuses the slots the sampler consumed
            kwargs["writer"] = parts.ConsumingWriter(spec.capacity, sampler)
        if spec.prefetch:
            kwargs["prefetch"] = spec.prefetch
        writer = make_writer(spec, parts)  # issue 41: storages and writers
        if writer is not None:
            kwargs["writer"] = writer
        if spec.her is not None or spec.mixing is not None:  # issue 42: hindsight relabelling, mixing
            cls, kwargs = issue42_buffer(spec, parts, kwargs)
        buffer = cls(spec.capacity, **kwargs)
        if spec.reopen:
            from rbcheck.reference.memmap_reopen import reopened

            reopened(buffer)
        return ShapedBuffer(buffer, spec)

    return Adapter(
        name=name,
        version=version,
        make=make,
        capabilities=capabilities,
        unavailable=unavailable,
        place_policy=place_policy,
        patch_pin_step=patch_module_pin_step(pin_module) if pin_module else None,
        known_failures=known_failures,
        conventions=conventions or Conventions(),
    )


def project_version() -> str:
    """The installed rbcheck version, or the source tree's when not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("rbcheck")
    except PackageNotFoundError:
        return "0.1.0+source"


def _place_policy(policy: Any, device: torch.device, allow_in_place: bool = True) -> Any:
    from rbcheck.reference.policy import place_policy

    return place_policy(policy, device, allow_in_place)


def _reference_buffer_cls() -> type:
    from rbcheck.reference.buffer import ReplayBuffer

    return ReplayBuffer


def reference_adapter() -> Adapter:
    """The reference implementation: declares every capability but
    "concurrent" (it is not thread-safe; ``reference-locked``, the reference
    behind one lock, is the spec of a shared buffer: harness/concurrency.py)
    and no convention (its rules are the spec's)."""
    return buffer_adapter(
        "reference",
        project_version(),
        _reference_buffer_cls,
        CAPABILITIES - {"concurrent"},
        components=_reference_components,
        place_policy=_place_policy,
        pin_module="rbcheck.reference.pinning",
    )


__all__ = [
    "ShapedBuffer",
    "buffer_adapter",
    "cuda_unavailable_reason",
    "make_components",
    "make_storage",
    "make_writer",
    "patch_module_pin_step",
    "project_version",
    "reference_adapter",
]
