"""The operations the harness drives on a buffer (:class:`BufferUnderTest`),
re-exported by :mod:`rbcheck.harness.protocol`, where the rest of the
adapter protocol lives (``BufferSpec``, ``Adapter``, ``CAPABILITIES``,
``Conventions``). The full method contract is in docs/adapters.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase


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
    ) -> None:
        """Set raw priorities (``conventions.priority_dtype``) of int64 slots."""

    # --- read-back (capability "priority_readback") --------------------------
    def stored_priority(self, index: torch.Tensor) -> torch.Tensor:
        """The transformed priorities ``(p + eps) ** alpha`` held for slots, float64."""

    @property
    def max_priority(self) -> float:
        """The largest raw priority seen (under ``new_priority="max_seen"``),
        as a Python float."""

    # --- shared randomness (capability "shared_rng") -----------------------
    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        """Map float64 uniforms in [0, 1) to slots the way ``sample`` does."""

    # --- iteration (capability "iteration") ----------------------------------
    def iterate(self) -> Iterator[tuple[TensorDictBase, dict[str, torch.Tensor]]]:
        """The batches of ``spec.batch_size`` that repeated ``sample()`` would
        return, in order: one epoch with sampler "without_replacement"
        (then it stops), endless otherwise."""

    # --- the whole buffer at once (capability "sample_all"; skrl) ------------
    def sample_all(self, mini_batches: int = 1) -> list[TensorDictBase]:
        """Every held row once, in slot order, never a slot not written, in
        ``mini_batches`` batches of ``len // mini_batches`` rows (the tail dropped)."""

    # --- edits (capability "edit") and disk storages ("memmap"; issue 41) --
    def set(self, index: torch.Tensor, rows: TensorDictBase) -> None:
        """Replace the held rows at int64 slots ``index`` (each below ``len``) in
        place; nothing else changes (length, cursor, write count, priorities)."""

    def close(self) -> None:
        """Release the files of ``spec.scratch_dir``: ``make(spec.but(reopen=True))``
        then gives the same contents, length, cursor and write count."""

    # --- checkpoints (capability "save_load") ------------------------------
    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None:
        """Replace this buffer's whole state with the checkpoint at ``path``."""
