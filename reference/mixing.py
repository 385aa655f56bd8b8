"""Offline-to-online mixing: a fixed offline dataset beside an online ring (the spec).

Contract
--------
:class:`MixingReplayBuffer` is the ring of ``buffer.py`` (the *online*
buffer: ``extend`` writes there, round robin, and nowhere else) plus an
*offline* dataset given at construction, copied once and never written
again. ``sample(B)`` decides for each of the ``B`` draws, independently with
probability ``offline_fraction``, whether it comes from the offline dataset
(uniform over its rows) or from the online ring (uniform over its held
rows); while the ring is empty every draw is offline. The batch is the
offline rows, then the online rows; ``info["index"]`` holds the online slots
and -1 for offline rows, ``info["offline"]`` marks the offline rows.

``len`` counts both sources. ``cursor``, ``write_count`` and
``dumps``/``loads`` are the online ring's: the offline dataset is not part of
the buffer's state (the same dataset is given to the buffer a checkpoint is
loaded into).

:func:`offline_rows` is the suite's offline dataset: ``n`` rows with negative
ids ``-1 .. -n`` and the keys of ``strategies.Layout`` rows (``id``, ``obs``).

Cost: ``sample`` O(B * row size); the offline dataset is held once (O(its size)).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.random_sampler import draw_uniforms


def check_mix_spec(size, fraction) -> None:
    """Refuse mixing arguments outside their ranges (ValueError naming them)."""
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        raise ValueError(f"offline_size={size!r}, but should be an int >= 1 (rows of the offline dataset)")
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and math.isfinite(fraction)
            and 0.0 <= fraction <= 1.0):
        raise ValueError(f"offline_fraction={fraction!r}, but should be a number in [0, 1]")


def offline_rows(n: int) -> TensorDict:
    """The suite's offline dataset of ``n`` rows: ``id = -1 - k`` and ``obs = [id, id / 2]``."""
    check_mix_spec(n, 0.5)
    ids = -1 - torch.arange(n, dtype=torch.int64)
    return TensorDict({"id": ids, "obs": torch.stack([ids, ids], 1).float() / torch.tensor([1.0, 2.0])},
                      batch_size=[n])


class MixingReplayBuffer(ReplayBuffer):
    """An online ring and a fixed offline dataset, mixed per draw (see the module doc)."""

    def __init__(self, capacity=None, *, offline: TensorDictBase, offline_fraction=0.5, **kwargs):
        if not isinstance(offline, TensorDictBase) or offline.batch_dims != 1:
            raise ValueError(f"offline={type(offline).__name__}, but should be a TensorDict of batch size [n]")
        check_mix_spec(int(offline.shape[0]), offline_fraction)
        super().__init__(capacity, **kwargs)
        self.offline = offline.clone()  # a copy of its own: never written after this line
        self.offline_fraction = float(offline_fraction)

    def __len__(self) -> int:
        return len(self.offline) + len(self.storage)

    def sample(self, batch_size: int | None = None) -> tuple[TensorDictBase, dict]:
        batch_size = self.batch_size if batch_size is None else batch_size
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"batch_size={batch_size!r}, but should be an int >= 1")
        u = draw_uniforms(2 * batch_size, self.generator).reshape(batch_size, 2)
        from_offline = (u[:, 0] < self.offline_fraction) if len(self.storage) else torch.ones(batch_size, dtype=torch.bool)
        k = int(from_offline.sum())
        pick = (u[from_offline, 1] * len(self.offline)).long().clamp_(max=len(self.offline) - 1)
        parts, index = [self.offline[pick].clone()], [torch.full((k,), -1, dtype=torch.long)]
        if k < batch_size:
            online, info = super().sample(batch_size - k)
            parts.append(online)
            index.append(info["index"])
        offline = torch.zeros(batch_size, dtype=torch.bool)
        offline[:k] = True
        return torch.cat(parts, 0), {"index": torch.cat(index), "offline": offline}


__all__ = ["MixingReplayBuffer", "check_mix_spec", "offline_rows"]
