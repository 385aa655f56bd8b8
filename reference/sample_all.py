"""Reading the whole buffer at once, in mini-batches (skrl's ``Memory.sample_all``).

Contract
--------
``sample_all(storage, held, mini_batches)`` returns ``mini_batches`` batches that
together hold every held row exactly once, in slot order (slot 0 first), and
never a slot not written yet: with ``n = held`` rows (slots ``0 .. n-1``; a
ring that has wrapped holds every slot), each batch has ``n // mini_batches``
rows, batch ``i`` the slots ``i * size .. (i + 1) * size - 1``; the last
``n % mini_batches`` rows (the tail, in slot order) are dropped, so every
batch has the same size. ``mini_batches`` is an int in ``[1, n]`` (a batch is
never empty); anything else is a ``ValueError`` naming it. Nothing is drawn:
the generator, the sampler and the rows are left as they were.

Cost: one gather of ``n - n % mini_batches`` rows; O(1) besides.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rbcheck.reference.arguments import check_int


def sample_all(storage, held: int, mini_batches: int = 1) -> list[TensorDictBase]:
    """The held rows in slot order, in ``mini_batches`` equal batches (module docstring)."""
    if held < 1:
        raise ValueError(f"len(buffer)={held}, but should be >= 1 for sample_all (nothing is held)")
    check_int("mini_batches", mini_batches, 1, held + 1)
    size = held // mini_batches
    return [storage.get(torch.arange(i * size, (i + 1) * size, dtype=torch.long)) for i in range(mini_batches)]


__all__ = ["sample_all"]
