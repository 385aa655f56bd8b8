"""The implementation-under-test protocol.

An *adapter* wraps one replay-buffer implementation (the reference, a variant,
TorchRL, or a user's own) so the conformance suite and the benchmarks can
drive it without importing a concrete backend. A user wires their own buffer
in by writing a module with a factory function that returns an ``Adapter``
and running ``pytest --impl pkg.module:factory``.

Contract
--------
* ``Adapter.make(spec)`` builds a fresh, empty buffer described by a
  :class:`BufferSpec` and returns an object following :class:`BufferUnderTest`.
* ``Adapter.capabilities`` lists what the implementation claims to support
  (names in :data:`CAPABILITIES`). A property needing a capability that is not
  listed is skipped with the reason shown; a listed capability that misbehaves
  fails.
* ``Adapter.unavailable`` maps a capability to the reason it cannot run *here*
  (e.g. an ImportError text). Such properties are reported as "unavailable",
  never as passing.

Data model: a buffer stores rows of a ``TensorDict`` with batch size ``[n]``.
Indices are int64 slot numbers in ``[0, capacity)``. Priorities passed in are
*raw* (before ``(p + eps) ** alpha``); ``stored_priority`` returns the
transformed value the tree holds, as float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase

#: Capability names an adapter may declare.
CAPABILITIES = frozenset(
    {
        "random",  # uniform sampling with replacement
        "prioritized",  # proportional prioritized sampling with weights
        "slice",  # trajectory slice sampling
        "transforms",  # a transform applied to each sample
        "pin_memory",  # the pin step runs last, after transforms, on info too
        "save_load",  # save(path) / load(path) round trip
        "policy_copy",  # policy placement without a raw deepcopy traceback
        "cuda",  # storage / sampling on a CUDA device
        "shared_rng",  # indices_from_uniforms: same masses -> same indices
        "stale_updates",  # update_priority ignores slots overwritten since sampled
        "priority_key",  # a priority carried in the data is used on extend
        "bad_input",  # invalid arguments raise and leave the buffer unchanged
    }
)


@dataclass(frozen=True)
class BufferSpec:
    """What buffer to build. Fields irrelevant to ``sampler`` are ignored."""

    capacity: int
    sampler: str = "random"  # "random" | "prioritized" | "slice"
    batch_size: int | None = None
    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-8
    priority_key: str | None = None  # data key carrying raw priorities on extend
    num_slices: int | None = None
    slice_len: int | None = None
    episode_key: str = "episode"
    strict_length: bool = True
    transform: Callable[[TensorDictBase], TensorDictBase] | None = None
    pin_memory: bool = False
    device: str = "cpu"
    seed: int = 0

    def but(self, **changes: Any) -> BufferSpec:
        return replace(self, **changes)


@runtime_checkable
class BufferUnderTest(Protocol):
    """The operations the harness drives. Optional ones raise
    ``NotImplementedError`` when the matching capability is not declared."""

    # --- writing -----------------------------------------------------------
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Write a batch of rows; return the int64 slots written, in order."""

    def add(self, row: TensorDictBase) -> int:
        """Write one row (no batch dimension); return its slot."""

    # --- reading -----------------------------------------------------------
    def __len__(self) -> int: ...

    def sample(self, batch_size: int | None = None) -> tuple[TensorDictBase, dict[str, torch.Tensor]]:
        """Return ``(rows, info)``. ``info["index"]`` holds the slots; for a
        prioritized buffer ``info["weight"]`` the importance weights and
        ``info["generation"]`` (if ``stale_updates``) the slots' write
        generations at sampling time."""

    def contents(self) -> TensorDictBase:
        """All stored rows in slot order ``0 .. len-1`` (a copy)."""

    @property
    def cursor(self) -> int:
        """The next slot the writer will write."""

    @property
    def write_count(self) -> int:
        """Rows written over the buffer's life."""

    # --- priorities (capability "prioritized") -----------------------------
    def update_priority(
        self, index: torch.Tensor, priority: torch.Tensor, generation: torch.Tensor | None = None
    ) -> None: ...

    def stored_priority(self, index: torch.Tensor) -> torch.Tensor:
        """The transformed priorities ``(p + eps) ** alpha`` held for slots, float64."""

    @property
    def max_priority(self) -> float:
        """The largest raw priority seen, as the implementation records it."""

    # --- shared randomness (capability "shared_rng") -----------------------
    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        """Map float64 uniforms in [0, 1) to slots the way ``sample`` does."""

    # --- checkpoints (capability "save_load") ------------------------------
    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None:
        """Replace this buffer's whole state with the checkpoint at ``path``."""


@dataclass
class Adapter:
    """One implementation under test."""

    name: str
    version: str
    make: Callable[[BufferSpec], BufferUnderTest]
    capabilities: frozenset[str] = frozenset()
    unavailable: dict[str, str] = field(default_factory=dict)
    #: Policy placement hook for the "policy_copy" capability:
    #: ``place_policy(policy, device, allow_in_place) -> policy``.
    place_policy: Callable[[Any, torch.device, bool], Any] | None = None
    #: The single pinning step (capability "pin_memory"): a function the
    #: buffer calls last, which tests may replace to record what it is handed.
    #: ``patch_pin_step(recorder) -> context manager``.
    patch_pin_step: Callable[[Callable], Any] | None = None
    #: Test ids this implementation is known to fail: a path to a text file.
    known_failures: Path | None = None

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            raise ValueError(
                f"capabilities={sorted(unknown)} are unknown, but should be among {sorted(CAPABILITIES)}"
            )

    def has(self, capability: str) -> bool:
        return capability in self.capabilities and capability not in self.unavailable
