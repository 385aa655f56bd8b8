"""Sampling without replacement, in epochs.

Contract
--------
* An EPOCH is a permutation of the slots held when it starts, ``0 .. n0-1`` with ``n0 =
  len(storage)``: in slot order when ``shuffle=False``, else ``argsort(draw_uniforms(n0,
  generator))`` (stable; ``random_sampler.draw_uniforms``, every sampler's draw). Batches are
  consecutive pieces of it, so within an epoch every slot is drawn at most once, and exactly
  once unless ``drop_last`` drops the tail.
* An epoch starts at the first ``sample`` when none is in progress: the first one, or once the
  previous one is used up. With ``drop_last=False`` the last batch of an epoch holds what is left
  (``n0 % B`` rows when ``B`` does not divide ``n0``; all ``n0`` when ``B > n0``). With
  ``drop_last=True`` a tail shorter than ``B`` is never returned: the next ``sample`` starts a
  new epoch, and ``B > len(storage)`` then raises ValueError (nothing changed).
* Writes during an epoch (the declared rule): the epoch keeps its permutation. A slot the ring
  overwrote is still drawn once in it (its current row); slots first written after the epoch
  started wait for the next epoch.
* ``batches_left(size, B)``: how many more batches end the epoch in progress (the next epoch's
  count when none is, ``size`` rows): what iterating the buffer yields (``iteration.py``).
* The state is the parameters, the epoch's permutation and the position in it, so a save and
  load mid-epoch resumes the same epoch.

Replacement law: without, within a batch and across the batches of an epoch.

Cost: O(n0) when an epoch starts (the permutation), O(B) per batch; memory O(capacity).
"""

from __future__ import annotations

import torch

from rbcheck.reference.arguments import check_int
from rbcheck.reference.random_sampler import check_not_empty, draw_uniforms


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}, but should be True or False")
    return value


class WithoutReplacementSampler:
    """Epochs over the held slots, consumed in batches (see module doc)."""

    replacement = "without"

    def __init__(self, drop_last: bool = False, shuffle: bool = True):
        self.drop_last, self.shuffle = check_flag("drop_last", drop_last), check_flag("shuffle", shuffle)
        self.epoch = torch.zeros(0, dtype=torch.long)  # the permutation of the epoch in progress
        self.position = 0  # rows of it drawn so far

    def left(self, batch_size: int) -> int:
        """Rows of the epoch in progress still to be drawn in batches of ``batch_size`` (0: none
        in progress: used up, or only a tail shorter than the batch with ``drop_last``)."""
        rest = len(self.epoch) - self.position
        return 0 if self.drop_last and rest < batch_size else rest

    def batches_left(self, size: int, batch_size: int) -> int:
        """Batches until the epoch in progress ends (a new one of ``size`` rows if none is)."""
        rows = self.left(check_int("batch_size", batch_size)) or size
        return rows // batch_size if self.drop_last else -(-rows // batch_size)

    def sample(self, storage, batch_size: int, generator: torch.Generator, cursor: int = 0) -> dict:
        """``{"index": int64[<= batch_size]}``; ``cursor`` is unused."""
        check_int("batch_size", batch_size)
        check_not_empty(storage)
        if self.left(batch_size) == 0:  # start an epoch over the slots held now
            n = len(storage)
            if self.drop_last and batch_size > n:
                raise ValueError(f"batch_size={batch_size}, but should be <= len(buffer)={n} "
                                 "with drop_last=True (no full batch in an epoch)")
            self.epoch = torch.argsort(draw_uniforms(n, generator), stable=True) if self.shuffle else torch.arange(n)
            self.position = 0
        index = self.epoch[self.position:self.position + batch_size].clone()
        self.position += len(index)
        return {"index": index}

    def on_write(self, index, priority=None) -> None:
        """Nothing to track: new slots wait for the next epoch, rewritten ones keep their turn."""

    def state_dict(self) -> dict:
        return {"type": "WithoutReplacementSampler", "drop_last": self.drop_last, "shuffle": self.shuffle,
                "epoch": self.epoch.clone(), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Replace the state; ValueError before any change if invalid."""
        if state.get("type") != "WithoutReplacementSampler":
            raise ValueError(f"sampler type={state.get('type')!r}, but should be 'WithoutReplacementSampler'")
        drop_last, shuffle = check_flag("drop_last", state["drop_last"]), check_flag("shuffle", state["shuffle"])
        epoch = state["epoch"]
        if not (isinstance(epoch, torch.Tensor) and epoch.dtype == torch.long and epoch.dim() == 1):
            raise ValueError(f"epoch={epoch!r:.80}, but should be a 1-D int64 tensor")
        if len(epoch) and not torch.equal(torch.sort(epoch).values, torch.arange(len(epoch))):
            raise ValueError(f"epoch={epoch[:8].tolist()}..., but should be a permutation of 0 .. {len(epoch) - 1}")
        position = check_int("position", state["position"], 0, len(epoch) + 1)
        self.drop_last, self.shuffle, self.epoch, self.position = drop_last, shuffle, epoch.clone(), position
