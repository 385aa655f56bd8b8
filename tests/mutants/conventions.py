"""Declared conventions never hide a violation: each mutant declares a
convention (float32 trees, a batch_max normaliser, an alpha range, stratified
sampling) and still breaks the invariant it qualifies; the controls declare
the same convention correctly and must pass.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import Conventions, ParamRange
from rbcheck.reference.arguments import check_index, last_occurrence
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.sum_tree import MinTree, SumTree
from tests.mutants.base import adapter
from tests.mutants.registry import control, mutant

#: What the float32-tree adapters claim: no checkpoints (the reference's
#: loader wants float64 trees) and no shared uniforms (float32 sums map
#: masses to other slots at the boundaries, legitimately).
FLOAT32_CAPABILITIES = frozenset(
    {"random", "prioritized", "priority_readback", "priority_key", "stale_updates"}
)


FLOAT32 = Conventions(
    priority_dtype=torch.float32,
    notes={"priority_dtype": "float32 leaves and sums, like TorchRL's SumSegmentTreeFp32"},
)


class _Float32Tree:
    """A reference tree whose nodes (leaves and partial sums/minima) are float32."""

    dtype = torch.float32

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.nodes = self.nodes.to(self.dtype)

    def update(self, index, value) -> None:
        index = check_index(index, self.capacity)
        value = torch.as_tensor(value).to("cpu", self.dtype)
        if len(index) == 0:
            return
        keep = last_occurrence(index, self.capacity)
        self.nodes[self.size + index[keep]] = value[keep]
        parent = torch.unique((index + self.size) // 2)
        while parent[0] >= 1:
            self.nodes[parent] = self.combine(self.nodes[2 * parent], self.nodes[2 * parent + 1])
            parent = torch.unique(parent // 2)


class Float32SumTree(_Float32Tree, SumTree):
    pass


class Float32MinTree(_Float32Tree, MinTree):
    pass


class Float32TreeSampler(PrioritizedSampler):
    """The reference sampler with float32 trees: the priority is rounded to
    float32 and transformed ONCE in float32 arithmetic (correct)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8):
        super().__init__(capacity, alpha, beta, eps)
        self.sum_tree, self.min_tree = Float32SumTree(capacity), Float32MinTree(capacity)

    def transform(self, raw32: torch.Tensor) -> torch.Tensor:
        return (raw32 + self.eps) ** self.alpha

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(raw32)

    def _store(self, index: torch.Tensor, raw: torch.Tensor) -> None:
        raw32 = raw.to(torch.float32)
        value = self.leaf_value(raw32)
        self.sum_tree.update(index, value)
        self.min_tree.update(index, torch.where(value > 0, value, torch.full_like(value, math.inf)))
        if raw.numel():
            self.max_priority = max(self.max_priority, float(raw32.max()))


def _float32_adapter(name: str, sampler: type, conventions: Conventions = FLOAT32):
    return buffer_adapter(
        name,
        "0",
        ReplayBuffer,
        FLOAT32_CAPABILITIES,
        components=SimpleNamespace(PrioritizedSampler=sampler),
        pin_module=None,
        conventions=conventions,
    )


@control
def float32_tree():
    """The control (not a mutant): a correct buffer with float32 trees that
    declares priority_dtype=float32. The suite must pass it."""
    return _float32_adapter("float32-tree", Float32TreeSampler)


class Float32TwiceSampler(Float32TreeSampler):
    """float32 trees that transform a priority twice on every path, as
    TorchRL 0.6-0.9's PrioritizedSampler did (the writer's transformed max
    fed back through the transform)."""

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(self.transform(raw32))


@mutant(bug="a float32-tree buffer that transforms a priority twice (TorchRL 0.6-0.9)",
        catches=("test_priority_transform::test_updated_priority_is_transformed_once",),
        control=float32_tree,
        kind="convention")
def float32_tree_transformed_twice():
    return _float32_adapter("mutant-float32-tree-transformed-twice", Float32TwiceSampler)


class BFloat16LeavesSampler(Float32TreeSampler):
    """Declares float32 but keeps its leaves in bfloat16 (8 significant bits):
    off by up to 2**-9 relative, far more than float32's own error."""

    def leaf_value(self, raw32: torch.Tensor) -> torch.Tensor:
        return self.transform(raw32).to(torch.bfloat16).to(torch.float32)


@mutant(bug="a declared float32 dtype hiding bfloat16 leaves (error far above float32's)",
        catches=("test_priority_transform::test_updated_priority_is_transformed_once",),
        control=float32_tree,
        kind="convention")
def float32_declared_bfloat16_kept():
    return _float32_adapter("mutant-float32-declared-bfloat16-kept", BFloat16LeavesSampler)


class BatchMaxSampler(Float32TreeSampler):
    """float32 trees whose weights are divided by the batch's largest weight
    (``weight_normaliser="batch_max"``, correct); ``reduce`` names the batch
    statistic divided by."""

    reduce = "max"

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        out = super().sample(storage, batch_size, generator, cursor)
        total, n = self.sum_tree.total(), len(storage)
        w = (n * self.sum_tree.leaf(out["index"]).double() / total) ** -self.beta
        out["weight"] = (w / getattr(w, self.reduce)()).to(torch.float32)
        return out


class BatchMaxWrongSampler(BatchMaxSampler):
    """Declares weight_normaliser="batch_max" but divides by the batch's
    SMALLEST weight: wrong in batch_max terms too (weights >= 1)."""

    reduce = "min"


BATCH_MAX = Conventions(priority_dtype=torch.float32, weight_normaliser="batch_max")


@control
def batch_max_control():
    """The control for the batch_max mutant: float32 trees whose weights are
    correctly divided by the batch's largest weight, declared as such."""
    return _float32_adapter("batch-max-control", BatchMaxSampler, BATCH_MAX)


@mutant(bug="a declared batch_max normaliser hiding weights divided by the batch minimum",
        catches=("test_sampling_distributions::test_weights_are_normalised_as_declared",),
        control=batch_max_control,
        kind="convention")
def batch_max_declared_but_divided_by_batch_min():
    return _float32_adapter("mutant-batch-max-declared-but-divided-by-batch-min", BatchMaxWrongSampler,
                            BATCH_MAX)


class PositiveAlphaSampler(PrioritizedSampler):
    """The reference sampler refusing alpha = 0, as tianshou does (``alpha > 0``)."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-8):
        if not (isinstance(alpha, (int, float)) and alpha > 0):
            raise ValueError(f"alpha={alpha!r}, but should be > 0")
        super().__init__(capacity, alpha, beta, eps)


POSITIVE_ALPHA = Conventions(
    param_ranges={"alpha": ParamRange(0.0, math.inf, low_closed=False)},
    notes={"param_ranges": "alpha > 0, as tianshou asserts"},
)


def _reference_with(name: str, conventions: Conventions, **components):
    made = adapter(name, **components)
    made.name, made.conventions = name, conventions
    return made


@control
def positive_alpha_control():
    """The control: declares alpha in (0, inf) and refuses alpha = 0."""
    return _reference_with("positive-alpha-control", POSITIVE_ALPHA, PrioritizedSampler=PositiveAlphaSampler)


@mutant(bug="a declared parameter range (alpha > 0) the buffer does not enforce",
        catches=("test_bad_input::test_parameters_outside_the_declared_range_are_refused",),
        control=positive_alpha_control,
        kind="convention")
def alpha_range_declared_not_enforced():
    """Declares alpha in (0, inf) but builds a buffer with alpha = 0."""
    return _reference_with("mutant-alpha-range-declared-not-enforced", POSITIVE_ALPHA)


STRATIFIED = Conventions(sampling="stratified")


class StratifiedSampler(PrioritizedSampler):
    """Draw k of a batch of B from the k-th of B equal segments of the mass
    (``u_k = (k + U_k) / B``), as the PER paper's proportional variant does."""

    def sample(self, storage, batch_size, generator, cursor=0) -> dict:
        plain = self.indices_from_uniforms
        strata = torch.arange(batch_size, dtype=torch.float64)
        self.indices_from_uniforms = lambda u, size=None: plain((strata + u) / batch_size)
        try:
            return super().sample(storage, batch_size, generator, cursor)
        finally:
            del self.indices_from_uniforms


@control
def stratified_control():
    """The control: a stratified sampler that declares sampling="stratified"."""
    return _reference_with("stratified-control", STRATIFIED, PrioritizedSampler=StratifiedSampler)


@mutant(bug="a stratified sampler declaring independent draws (the spec)",
        catches=("test_sampling_distributions::test_draws_within_a_batch_are_independent",),
        kind="convention")
def stratified_sampler_declared_independent():
    """Stratifies its batches but declares the spec's independent draws."""
    return _reference_with("mutant-stratified-sampler-declared-independent", Conventions(),
                           PrioritizedSampler=StratifiedSampler)


@mutant(bug="a declared stratified scheme hiding independent draws",
        catches=("test_sampling_distributions::test_prioritized_sampling_matches_closed_form",),
        control=stratified_control,
        kind="convention")
def stratified_declared_sampled_independently():
    """Declares sampling="stratified" but draws every slot of a batch from
    the whole mass (the plain reference sampler)."""
    return _reference_with("mutant-stratified-declared-sampled-independently", STRATIFIED)
