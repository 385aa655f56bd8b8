"""Transitions and n-step returns over the rows a ring holds: the spec.

A row is one env step: ``obs``, ``action``, ``reward``, ``terminated``,
``truncated``, ``next_obs`` (the observation after the step; at an episode's
end, its final observation) and ``env`` (the env that took the step; 0 when
the key is absent, several envs' steps may be interleaved).

Contract
--------
:class:`Transitions` is built over the rows a ring holds, **in write order,
oldest first** (:func:`write_order` turns slot order into it). Nothing else is
read: a row overwritten or never written is simply not there. For the held row
at position ``t``:

* :meth:`next_obs`: the true next observation, its own ``next_obs``;
* :meth:`window`: positions ``t = p_0 < p_1 < ... < p_{m-1}``, each the next
  row of the same env after the previous one, with ``m <= n``; it stops after
  the first row that is terminated or truncated (never crossing an episode's
  end) and at the newest held row of the env (never crossing the write cursor
  into a newer or an older, overwritten row);
* :meth:`complete`: whether that window is final: ``n`` rows, or ending an
  episode. An incomplete window is one a later write would still extend; a
  buffer either returns it shortened (the spec) or never samples it;
* :meth:`nstep`: ``sum_{k<m} gamma**k r_{p_k}``, the bootstrap observation
  (``next_obs`` of the window's last row) and the discount ``gamma**m``, or 0
  when the window ends on a terminated row: a truncated episode still
  bootstraps, from its own final observation. With ``terminal="done"`` (a
  buffer that takes a timeout for a termination) a truncated row turns the
  bootstrap off too.

Slices of env steps (:func:`mark_slice_ends`): a slice sampler's slice
ends where the learner's trajectory breaks, so its last row is marked
``truncated`` unless it is terminated (a termination keeps its flags: it
already turns bootstrapping off); its ``next_obs`` is unchanged.

Cost: building is O(N) over the N held rows (one pass links each row to the
next row of its env); each query is O(n). Returns are summed in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase


def write_order(held: int, cursor: int, capacity: int) -> torch.Tensor:
    """The slots of a ring holding ``held`` rows with its writer at
    ``cursor``, oldest first: ``0..held-1`` before the first wrap, else
    ``cursor, cursor+1, ...`` round the ring."""
    if held < capacity:
        return torch.arange(held, dtype=torch.long)
    return (cursor + torch.arange(capacity, dtype=torch.long)) % capacity


@dataclass(frozen=True)
class NStep:
    ret: float  # sum_{k<m} gamma**k r_{t+k}, float64
    obs: torch.Tensor  # the bootstrap observation
    discount: float  # gamma**m, or 0.0 when the window ends on a termination
    length: int  # m


class Transitions:
    """The transitions of rows held in write order (see the module docstring)."""

    def __init__(self, rows: TensorDictBase):
        self.rows = rows
        n = rows.shape[0]
        env = rows.get("env").reshape(n).tolist() if "env" in rows.keys() else [0] * n
        self.terminated = rows.get("terminated").reshape(n).tolist()
        self.truncated = rows.get("truncated").reshape(n).tolist()
        self.reward = rows.get("reward").reshape(n).double().tolist()
        self.successor: list[int | None] = [None] * n
        last: dict[int, int] = {}
        for p, e in enumerate(env):  # one pass: link each row to the next of its env
            if e in last:
                self.successor[last[e]] = p
            last[e] = p

    def __len__(self) -> int:
        return len(self.successor)

    def _check(self, t: int) -> None:
        if not (isinstance(t, int) and 0 <= t < len(self)):
            raise IndexError(f"position t={t!r}, but should be an int in [0, {len(self)}) (the held rows)")

    def next_obs(self, t: int) -> torch.Tensor:
        self._check(t)
        return self.rows.get("next_obs")[t]

    def ends_episode(self, p: int) -> bool:
        return bool(self.terminated[p]) or bool(self.truncated[p])

    def window(self, t: int, n: int) -> list[int]:
        self._check(t)
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"n={n!r}, but should be an int >= 1")
        out = [t]
        while len(out) < n and not self.ends_episode(out[-1]):
            nxt = self.successor[out[-1]]
            if nxt is None:  # the newest row of its env: the write cursor
                break
            out.append(nxt)
        return out

    def complete(self, t: int, n: int) -> bool:
        w = self.window(t, n)
        return len(w) == n or self.ends_episode(w[-1])

    def nstep(self, t: int, n: int, gamma: float, terminal: str = "terminated") -> NStep:
        if terminal not in ("terminated", "done"):
            raise ValueError(f"terminal={terminal!r}, but should be 'terminated' or 'done'")
        if not (0.0 <= gamma <= 1.0):
            raise ValueError(f"gamma={gamma!r}, but should be in [0, 1]")
        w = self.window(t, n)
        ret = sum(gamma**k * self.reward[p] for k, p in enumerate(w))
        last = w[-1]
        off = bool(self.terminated[last]) or (terminal == "done" and bool(self.truncated[last]))
        return NStep(ret, self.rows.get("next_obs")[last], 0.0 if off else gamma ** len(w), len(w))


def nstep_keys(held: TensorDictBase, cursor: int, capacity: int, index: torch.Tensor, n: int,
               gamma: float) -> TensorDict:
    """The n-step keys of the sampled slots ``index`` of a ring whose rows in
    slot order are ``held``: ``nstep_return`` (float64), ``nstep_obs`` and
    ``nstep_discount`` (float64), one row per sampled slot."""
    order = write_order(held.shape[0], cursor, capacity)
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))
    tr = Transitions(held[order])
    out = [tr.nstep(int(position[s]), n, gamma) for s in index.tolist()]
    obs = held.get("next_obs")
    return TensorDict(
        {
            "nstep_return": torch.tensor([o.ret for o in out], dtype=torch.float64),
            "nstep_obs": torch.stack([o.obs for o in out]) if out else obs[:0],
            "nstep_discount": torch.tensor([o.discount for o in out], dtype=torch.float64),
        },
        batch_size=[len(out)],
    )


def mark_slice_ends(rows: TensorDictBase, slice_end: torch.Tensor) -> TensorDictBase:
    """``rows`` (a slice sample of env steps) with ``truncated`` set at each
    slice's last row (``slice_end``) that is not terminated; a new
    TensorDict, the rows' tensors untouched."""
    truncated = rows.get("truncated")
    end = slice_end.to(truncated.device).reshape(truncated.shape)
    if "terminated" in rows.keys():
        end = end & ~rows.get("terminated").bool()
    out = rows.copy()
    out.set("truncated", (truncated.bool() | end).to(truncated.dtype))
    return out


__all__ = ["NStep", "Transitions", "mark_slice_ends", "nstep_keys", "write_order"]
