"""The independent priority oracle: what a prioritized buffer must hold and
return, computed in float64 from the raw priorities the test handed over,
under the adapter's declared :class:`~rbcheck.harness.protocol.Conventions`.

Nothing here calls the implementation or the reference: the properties feed
the oracle the same writes and updates they make on the buffer, then compare
what the buffer shows (stored priorities, weights, sampling frequencies) with
what the oracle says, in the declared convention's own terms.

* Inputs are rounded to ``conventions.priority_dtype`` first
  (:meth:`Conventions.priorities`), eps too: the expected values are those of
  an exact computation on the numbers the buffer actually received.
* ``leaf_i = (raw_i + eps) ** alpha`` with eps from
  :meth:`Conventions.effective_eps` (0 under ``eps_rule="none"``: ``raw ** alpha``);
  ``P_i = leaf_i / sum_j leaf_j`` over the N held slots.
* under ``positive_priorities`` the buffer refuses a raw 0: the oracle
  refuses to be handed one (a property that forgot the convention would
  otherwise expect a write the buffer never made).
* weights: ``(N P_i) ** -beta`` divided by ``max_j (N P_j) ** -beta`` over the
  held slots with ``P_j > 0`` ("buffer_min"), over the batch ("batch_max"), or
  not divided ("none").
* draws: B independent draws with probabilities ``P`` ("independent"), or draw
  ``k`` of a batch of B from the k-th of B equal segments of the cumulative
  mass ("stratified": :meth:`PriorityOracle.stratified_probabilities`).
"""

from __future__ import annotations

import math

import torch

from rbcheck.harness.assertions import Tolerance, Trace, priority_tolerance, weight_tolerance
from rbcheck.harness.protocol import BufferSpec, Conventions

__all__ = ["PriorityOracle", "model_spec", "stratified_probabilities", "transform"]


def transform(raw: torch.Tensor, eps: float, alpha: float) -> torch.Tensor:
    """``(raw + eps) ** alpha`` in float64 (``0 ** 0 == 1``)."""
    return (raw.to(torch.float64) + eps) ** alpha


def stratified_probabilities(probs: torch.Tensor, batch: int) -> torch.Tensor:
    """``[batch, n]``: the probability that draw ``k`` of a stratified batch
    picks slot ``i``: ``batch * |[k/batch, (k+1)/batch) & [c_{i-1}, c_i)|``
    with ``c`` the cumulative sum of ``probs`` (normalised to 1)."""
    p = probs.to(torch.float64)
    p = p / p.sum()
    upper = torch.cumsum(p, 0)
    upper[-1] = 1.0
    lower = torch.cat([torch.zeros(1, dtype=torch.float64), upper[:-1]])
    k = torch.arange(batch, dtype=torch.float64).unsqueeze(1)
    seg_lo, seg_hi = k / batch, (k + 1) / batch
    overlap = (torch.minimum(seg_hi, upper) - torch.maximum(seg_lo, lower)).clamp_min(0.0)
    out = overlap * batch
    return out / out.sum(dim=1, keepdim=True)


class PriorityOracle:
    """Raw priorities of each slot, as the buffer received them; the expected
    leaves, max priority, probabilities and weights follow from them."""

    def __init__(self, spec: BufferSpec, conventions: Conventions | None = None) -> None:
        self.conventions = conventions or Conventions()
        self.spec = spec
        dtype = self.conventions.priority_dtype
        self.alpha = float(spec.alpha)
        self.beta = float(spec.beta)
        self.eps = float(self.conventions.priorities(self.conventions.effective_eps(spec.eps)))
        self.capacity = spec.capacity
        self.dtype = dtype
        self.raw = torch.full((spec.capacity,), math.nan, dtype=torch.float64)
        #: which write filled each slot (-1: never written), for stale updates
        self.serial = torch.full((spec.capacity,), -1, dtype=torch.int64)
        self.size = 0
        self.written = 0
        self.max_seen = 1.0

    # -- inputs -----------------------------------------------------------
    def rounded(self, raw) -> torch.Tensor:
        """``raw`` as the buffer receives it (rounded to the declared dtype), in float64."""
        return self.conventions.priorities(raw).to(torch.float64).reshape(-1)

    def new_row_priority(self) -> float:
        """The raw priority a row written without one gets now."""
        rule = self.conventions.new_priority
        if rule == "max_seen":
            return self.max_seen
        if rule == "max_held":
            held = self.raw[: self.size]
            return float(held.max()) if self.size else 1.0
        return float(self.rounded([self.conventions.new_priority_value])[0])

    def write(self, n: int, raw=None) -> torch.Tensor:
        """``n`` rows written by the round-robin writer, with their raw
        priorities or (``raw=None``) the new-row priority; returns the slots
        they go to (the ring: ``(cursor + k) % capacity``)."""
        slots = (self.written + torch.arange(n, dtype=torch.int64)) % self.capacity
        if raw is None:
            values = torch.full((n,), self.new_row_priority(), dtype=torch.float64)
        else:
            values = self.rounded(raw)
        self._set(slots, values)
        self.serial[slots] = self.written + torch.arange(n, dtype=torch.int64)
        self.written += n
        self.size = min(self.capacity, self.written)
        return slots

    def serials(self, slots) -> torch.Tensor:
        """Which write filled each of ``slots`` (keep it with a sample to
        tell later which of its slots were overwritten since)."""
        return self.serial[torch.as_tensor(slots, dtype=torch.int64).reshape(-1).cpu()].clone()

    def update(self, slots, raw, sampled_serials: torch.Tensor | None = None) -> torch.Tensor:
        """``update_priority(slots, raw)``; with ``sampled_serials`` (from
        :meth:`serials` at sampling time) entries whose slot was overwritten
        since are skipped, as a generation-carrying update must. Returns the
        mask of entries applied."""
        slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1).cpu()
        values = self.rounded(raw)
        keep = torch.ones(len(slots), dtype=torch.bool)
        if sampled_serials is not None:
            keep = self.serial[slots] == sampled_serials
        self._set(slots[keep], values[keep])
        return keep

    def _set(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        if self.conventions.positive_priorities and bool((values <= 0).any()):
            raise ValueError(
                f"raw priorities={values.tolist()}, but should be > 0 for a buffer declaring "
                f"positive_priorities (it refuses 0: draw with strategies.priorities(conventions=...))"
            )
        for slot, value in zip(slots.tolist(), values.tolist(), strict=True):  # last write wins
            self.raw[slot] = value
        if len(values):
            self.max_seen = max(self.max_seen, float(values.max()))

    # -- expectations -----------------------------------------------------
    def leaves(self) -> torch.Tensor:
        """Expected stored priorities of the held slots ``0 .. size-1``, float64
        (under ``eps_rule="none"`` a raw 0 stores 0 whatever alpha: never drawn)."""
        raw = self.raw[: self.size]
        out = transform(raw, self.eps, self.alpha)
        if self.conventions.eps_rule == "none":
            out = torch.where(raw == 0, torch.zeros_like(out), out)
        return out

    def max_priority(self) -> float | None:
        """Expected ``max_priority`` read-back: the raw max seen ("max_seen"),
        the raw max held ("max_held"); None where the convention defines none
        ("constant"), or where it has no effect (``eps_rule="none"`` at alpha 0)."""
        rule = self.conventions.new_priority
        if self.conventions.eps_rule == "none" and self.alpha == 0:
            # p ** 0 is 1 for every p > 0: the max has no effect on what is stored or
            # drawn, and a buffer that records the transformed max (flashbax) keeps no raw one
            return None
        if rule == "max_seen":
            return self.max_seen
        if rule == "max_held":
            return self.new_row_priority()
        return None

    def probabilities(self) -> torch.Tensor:
        """``P_i`` over the held slots (float64, sums to 1)."""
        leaves = self.leaves()
        return leaves / leaves.sum()

    def draw_probabilities(self, batch: int) -> torch.Tensor:
        """``[batch, size]``: the probability that draw ``k`` of a batch picks
        slot ``i``, under the declared sampling scheme."""
        probs = self.probabilities()
        if self.conventions.sampling == "stratified":
            return stratified_probabilities(probs, batch)
        return probs.unsqueeze(0).expand(batch, -1).clone()

    def weight_tolerance(self, index: torch.Tensor, weight_dtype: torch.dtype) -> Tolerance:
        """The weights' tolerance for a sample at ``index``:
        :func:`~rbcheck.harness.assertions.weight_tolerance` plus what the
        leaves' own error (:func:`priority_tolerance`, whose absolute part
        weighs on tiny leaves) becomes through ``** -beta``:
        ``beta * (err(leaf_i) + err(leaf_norm))`` per sampled entry, with
        ``err(x) = rtol + atol / x``."""
        index = torch.as_tensor(index, dtype=torch.int64).cpu()
        base = weight_tolerance(self.dtype, max(self.size, 1), weight_dtype)
        leaf = priority_tolerance(self.dtype, self.alpha)
        leaves = self.leaves()
        positive = leaves[leaves > 0]
        rel = leaf.rtol + leaf.atol / leaves[index].clamp_min(1e-300)
        rule = self.conventions.weight_normaliser
        if rule == "buffer_min" and len(positive):
            norm = leaf.rtol + leaf.atol / positive.min()
        elif rule == "batch_max":
            norm = leaf.rtol + leaf.atol / leaves[index].clamp_min(1e-300).min()
        else:
            norm = torch.tensor(0.0, dtype=torch.float64)
        rtol = base.rtol + self.beta * (rel + norm)
        return Tolerance(rtol, base.atol, f"{base.bound} + beta * (leaf errors: {leaf.bound})")

    def weights(self, index: torch.Tensor) -> torch.Tensor:
        """Expected importance weights of the sampled ``index`` (float64)."""
        index = torch.as_tensor(index, dtype=torch.int64).cpu()
        probs = self.probabilities()
        n = self.size
        raw_w = (n * probs) ** (-self.beta)
        rule = self.conventions.weight_normaliser
        if rule == "buffer_min":
            norm = (n * probs[probs > 0].min()) ** (-self.beta)
        elif rule == "batch_max":
            norm = raw_w[index].max()
        else:
            norm = torch.tensor(1.0, dtype=torch.float64)
        return raw_w[index] / norm


def model_spec(spec: BufferSpec, conventions: Conventions) -> BufferSpec:
    """The spec to build the reference model from, for a buffer under
    ``conventions``: eps = 0 under ``eps_rule="none"`` (the reference then
    stores ``p ** alpha`` as such a buffer does, so the two map the same
    uniforms to the same slots); ``spec`` itself otherwise."""
    if spec.sampler == "prioritized" and conventions.eps_rule == "none":
        return spec.but(eps=0.0)
    return spec


def reads_back(spec: BufferSpec, adapter) -> bool:
    """Whether a snapshot of a buffer of ``adapter`` built from ``spec`` can
    include its stored priorities and max priority: a prioritized spec, and
    the adapter declares ``"priority_readback"``."""
    return spec.sampler == "prioritized" and adapter.has("priority_readback")


def start_prioritized(impl, spec: BufferSpec, layout, fill: int = 0, record: bool = False):
    """A fresh buffer of ``impl`` built from ``spec``, its trace (with
    ``layout`` bound) and its oracle, after ``fill`` rows written by one
    extend (none by default). Returns ``(trace, buf, oracle)``; with
    ``record``, ``(trace, buf, oracle, layout)``: the buffer records its calls
    (``trace.wrap``) and the layout is the trace's source of rows."""
    trace = Trace(impl, spec)
    if record:
        layout = trace.source("layout", layout)
        buf = trace.wrap(impl.make(spec))
    else:
        trace.let("layout", layout)
        buf = impl.make(spec)
    oracle = PriorityOracle(spec, impl.conventions)
    if fill:
        if not record:
            trace.op(f"buf.extend(layout.batch(0, {fill}))")
        buf.extend(layout.batch(0, fill))
        oracle.write(fill)
    return (trace, buf, oracle, layout) if record else (trace, buf, oracle)
