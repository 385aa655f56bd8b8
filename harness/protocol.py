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
  (names in :data:`CAPABILITIES`). A property needing a capability that is not listed is
  skipped with the reason shown; a listed capability that misbehaves fails.
* ``Adapter.unavailable`` maps a capability to the reason it cannot run *here*
  (e.g. an ImportError text). Such properties are reported as "unavailable",
  never as passing.
* ``Adapter.conventions`` (a :class:`Conventions`) declares where the buffer
  follows a documented rule of its own instead of the spec's: the priority
  dtype, the eps rule, the priority of new rows, the weight normaliser, the
  sampling scheme, whether it can be seeded and the allowed parameter ranges.
  The defaults are the spec's rules. A declaration never turns a violation
  into a pass: the invariant is checked in the convention's own terms, and
  the report shows the deviation next to the results it affects.

Data model: a buffer stores rows of a ``TensorDict`` with batch size ``[n]``.
Indices are int64 slot numbers in ``[0, capacity)``. Priorities passed in are
*raw* (before ``(p + eps) ** alpha``), in ``conventions.priority_dtype`` (see
:meth:`Conventions.priorities`); ``stored_priority`` (capability
``"priority_readback"``) returns the transformed value the tree holds, as
float64. The full method contract is in docs/adapters.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from rbcheck.harness.buffer_protocol import BufferUnderTest
from rbcheck.harness.her_laws import check_hindsight
from rbcheck.harness.sampler_laws import check_replacement, check_sampler_rules

#: Capability names an adapter may declare.
CAPABILITIES = frozenset(
    {
        "random",  # uniform sampling with replacement
        "prioritized",  # proportional prioritized sampling with weights, update_priority
        "priority_readback",  # stored_priority(index) and max_priority can be read
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
        "concurrent",  # safe to share: writers, samplers, updates and saves at once (threads or processes)
        "transitions",  # rows are env steps; a sample returns next_obs and the flags (Conventions.transition_fields)
        "nstep",  # with spec.nstep: a sample returns the n-step return, bootstrap obs and discount (or the window)
        "env_id",  # takes several envs' steps interleaved (spec.num_envs > 1; each row's "env" key)
        "without_replacement",  # spec.sampler="without_replacement": epochs, drop_last, shuffle (issue 40)
        "consuming",  # spec.sampler="consuming": max_sample_count draws per row, consumed slots rewritten first
        "iteration",  # iterate(): the batches of repeated sample() (one epoch without replacement)
        "prefetch",  # spec.prefetch=N: the same samples as without prefetching
        "slice_without_replacement",  # spec.sampler="slice_without_replacement": epochs of slice starts
        "prioritized_slice",  # spec.sampler="prioritized_slice": slice starts by their step's priority
        "staleness",  # spec.sampler="staleness": rows weighted 1/(staleness+1), spec.max_staleness; set_consumer_version
        "sample_all",  # sample_all(mini_batches): every held row once, in slot order, split; the tail dropped (skrl)
        # storages and writers (issue 41; reference/memmap_storage.py, max_value_writer.py, writer.py)
        "memmap",  # spec.storage="memmap": rows in files of spec.scratch_dir only; close() and spec.reopen
        "max_value_writer",  # spec.writer="max_value": holds the top-capacity rows by spec.value_key
        "immutable_writer",  # spec.writer="immutable": every write and edit refused, nothing changed
        "edit",  # set(index, rows): edits held rows in place, nothing else changes
        # served replay, Reverb's model (issue 42; harness/adapters/served.py): extend/sample take timeout=
        "selector",  # spec.sampler "fifo"/"lifo"/"min_heap"/"max_heap" and spec.remover: the declared order
        "max_times_sampled",  # spec.max_times_sampled=k: an item leaves after its k-th draw
        "rate_limiter",  # spec.rate_limiter: calls admitted by Reverb's rule, from any thread; TimeoutError
        "compressed",  # spec.storage="compressed": rows kept compressed, read back bit for bit (any dtype/shape)
        # hindsight relabelling, offline-to-online mixing (issue 42; reference/her.py, mixing.py, harness/her_laws.py)
        "her",  # spec.her=(strategy, ratio): a sampled row relabelled with a goal of its own finished episode
        "mixing",  # spec.mixing=(offline_size, fraction): a fixed offline dataset beside the online ring
    }
)


# --------------------------------------------------------------------------
# conventions: documented rules of a real buffer that differ from the spec
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamRange:
    """An interval of allowed values for alpha, beta or eps, e.g.
    ``ParamRange(0.0, math.inf, low_closed=False)`` for tianshou's ``alpha > 0``."""

    low: float
    high: float
    low_closed: bool = True
    high_closed: bool = True

    def __post_init__(self) -> None:
        if not (self.low <= self.high) or math.isnan(self.low) or math.isnan(self.high):
            raise ValueError(f"ParamRange low={self.low!r}, high={self.high!r}, but should have low <= high")

    def contains(self, x: float) -> bool:
        """Whether ``x`` is allowed (NaN never is; an infinite end is never closed)."""
        if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x):
            return False
        above = x > self.low or (self.low_closed and x == self.low and math.isfinite(x))
        below = x < self.high or (self.high_closed and x == self.high and math.isfinite(x))
        return above and below

    def describe(self) -> str:
        """Interval notation: ``[0, 1]``, ``(0, inf)``."""
        left = "[" if self.low_closed and math.isfinite(self.low) else "("
        right = "]" if self.high_closed and math.isfinite(self.high) else ")"
        return f"{left}{self.low:g}, {self.high:g}{right}"


#: The spec's own ranges (reference.prioritized_sampler.check_param).
SPEC_PARAM_RANGES: Mapping[str, ParamRange] = {
    "alpha": ParamRange(0.0, math.inf),
    "beta": ParamRange(0.0, 1.0),
    "eps": ParamRange(0.0, math.inf),
}

#: Allowed values of each string convention; the first is the spec's rule.
EPS_RULES = ("add", "finfo_on_update", "none")
NEW_PRIORITIES = ("max_seen", "max_held", "constant")
WEIGHT_NORMALISERS = ("buffer_min", "batch_max", "none")
SAMPLING_SCHEMES = ("independent", "stratified")
#: What a "transitions" buffer may return (the first five are the step's own
#: row; next_obs is the true next observation, or the final one at an episode's end).
TRANSITION_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
NSTEP_FORMS = ("return", "window")
INCOMPLETE_WINDOWS = ("shorten", "exclude", "exclude_until_n_steps")
TERMINAL_FLAGS = ("terminated", "done")
PRIORITY_DTYPES = (torch.float64, torch.float32)
#: What an n-step buffer's capacity counts: env steps (spec) or rows whose
#: window is complete (a step enters the ring only once it is; cpprb's Nstep).
NSTEP_RINGS = ("steps", "completed_windows")
CAPACITY_COUNTS = ("rows", "complete_transitions")
TERMINAL_NEXT_OBS = ("final", "zeros")
EVICTIONS = ("ring", "whole_episodes")


@dataclass(frozen=True)
class Conventions:
    """Documented rules an adapter's buffer follows instead of the spec's.

    The defaults ARE the spec (the reference declares nothing). Each field:

    * ``priority_dtype``: the dtype the buffer takes priorities in and keeps
      its trees in. The suite hands every priority over in this dtype
      (:meth:`priorities`) and compares stored priorities, sums and weights
      with a tolerance tied to its own error (``harness.assertions``).
    * ``eps_rule``: ``"add"`` (spec: stored ``(p + eps) ** alpha`` on every
      path) or ``"finfo_on_update"`` (no eps argument: the buffer uses
      ``finfo(priority_dtype).eps`` in place of ``spec.eps``; tianshou) or
      ``"none"`` (no eps at all: the buffer stores ``p ** alpha``; a raw 0
      stores 0 and is never drawn).
    * ``new_priority``: the raw priority a row written without one gets:
      ``"max_seen"`` (spec: the largest raw priority over the buffer's life,
      1.0 at first), ``"max_held"`` (the largest raw priority among the rows
      held now, 1.0 when none) or ``"constant"`` (``new_priority_value``).
    * ``weight_normaliser``: ``w_i = (N P_i) ** -beta`` divided by
      ``"buffer_min"`` (spec: ``max_j (N P_j) ** -beta`` over the stored
      slots), ``"batch_max"`` (the largest weight of the batch; tianshou's
      default) or ``"none"`` (not divided).
    * ``sampling``: ``"independent"`` (spec: B iid draws) or ``"stratified"``
      (draw k from the k-th of B equal segments of the total mass; cpprb).
    * ``seedable``: False when ``spec.seed`` cannot fix the draws; exact
      replay properties are then skipped with the reason
      "convention: not seedable", distributional ones still run.
    * ``param_ranges``: allowed ``"alpha"``, ``"beta"``, ``"eps"`` (missing
      names: the spec's range). Strategies draw over the whole declared range;
      bad-input properties try its complement.
    * ``transition_fields`` (capability ``"transitions"``): which of
      :data:`TRANSITION_FIELDS` a sample returns (spec: all six).
    * ``nstep_form`` (capability ``"nstep"``): ``"return"`` (spec: the keys
      ``nstep_return``, ``nstep_obs`` and ``nstep_discount``) or ``"window"``
      (``window_id``: the ids of the window's rows, -1 after its end).
    * ``incomplete_windows``: a slot whose n-step window is not complete yet
      (it reaches the newest row of its env before n steps and before the
      episode's end) is ``"shorten"``-ed (spec: the window stops at the newest
      row and bootstraps from its next_obs) or ``"exclude"``-d (never sampled).
      ``"exclude_until_n_steps"``: a buffer of fixed-length sequences (flashbax)
      samples a slot only once ``n`` steps of its env, from it on, are held,
      even where its episode's end completed its window earlier; so where
      ``n > capacity // num_envs`` nothing can ever be sampled, and the buffer
      may refuse to be built (any exception from ``make``; a refusal for a
      smaller ``n`` is a failure). Every other slot is still checked as
      excluded: sampling one fails.
    * ``terminal_flag``: what the returned ``terminated`` means and what turns
      bootstrapping off: ``"terminated"`` (spec; a truncated step bootstraps
      from its own final observation) or ``"done"`` (terminated or truncated:
      a timeout is taken as a termination). Checked in its own terms.
    * ``positive_priorities``: True when the buffer refuses a raw priority
      of 0 (spec: 0 is allowed, such a row is never drawn). Valid-input
      properties then draw priorities > 0 (``strategies.priorities``), and
      the bad-input case ``priority_zero`` checks that a 0 is refused like
      any bad input: an exception, and nothing changed.
    * ``nstep_ring`` (capability ``"nstep"``): what the ring's capacity
      counts. ``"steps"`` (spec: the last ``capacity`` steps written) or
      ``"completed_windows"`` (a step enters the ring only once its n-step
      window is complete, n steps or its episode's end, so the ring holds the
      last ``capacity`` such steps and its window may reach steps written
      after the ring's newest; requires ``incomplete_windows="exclude"``).
      The windows are still checked against the oracle, over every step written.
    * ``capacity_counts`` (capability ``"transitions"``): what the capacity
      counts, so which env steps are held. ``"rows"`` (spec: every step is a
      row from its write on; the last ``capacity`` written are held) or
      ``"complete_transitions"`` (a step is held only once its transition is
      complete: the next step of its episode has been written, or the step
      terminated; the last step of a truncated episode never is, its final
      observation is never handed in; the last ``capacity`` steps in the order
      they completed are held; d3rlpy's online path). Not defined with
      ``nstep`` (the oracle refuses the pair).
    * ``terminal_next_obs`` (capability ``"transitions"``): a *terminated*
      step's ``next_obs``: ``"final"`` (spec: its own final observation) or
      ``"zeros"`` (all zeros; the buffer never had the final observation and
      ``terminated`` keeps the learner from reading it). Truncated steps are
      not concerned: their own final observation is required under both.
    * ``eviction`` (capability ``"transitions"``): which rows the buffer
      holds after a stream of steps: ``"ring"`` (spec: the last ``capacity``
      rows written) or ``"whole_episodes"`` (an episode buffer: ``capacity``
      counts timesteps and the oldest episodes are dropped whole, so fewer
      rows may be held, or more while a single episode is held). Checked in
      its own terms: the rows the buffer reports holding (``contents()["id"]``)
      are, for each episode, a run of its newest steps; every episode with a
      dropped row began before the first held row of every held episode (the
      oldest are the ones dropped); more than ``capacity`` of them only while
      they belong to one episode; and every sampled row is one of them, with
      windows over the held rows.
    * ``replacement``: sampler -> how it draws, where it differs from the
      spec's law (``harness/sampler_laws.py``: the laws and the check).
    * ``sampler_rules``: rule -> value where a sampler's rule differs from the
      spec's (``sampler_laws.SAMPLER_RULES``: ``slice_epoch``, ``epoch_on_growth``).
    * ``notes``: convention name -> one line citing the library's source or
      docs; shown in the report. ``"param_ranges.eps"`` (say) annotates one
      declared range; ``"param_ranges"`` every declared range without its own.
    """

    priority_dtype: torch.dtype = torch.float64
    eps_rule: str = "add"
    new_priority: str = "max_seen"
    new_priority_value: float = 1.0
    weight_normaliser: str = "buffer_min"
    sampling: str = "independent"
    seedable: bool = True
    param_ranges: Mapping[str, ParamRange] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    transition_fields: tuple[str, ...] = TRANSITION_FIELDS
    nstep_form: str = "return"
    incomplete_windows: str = "shorten"
    terminal_flag: str = "terminated"
    positive_priorities: bool = False
    nstep_ring: str = "steps"
    capacity_counts: str = "rows"
    terminal_next_obs: str = "final"
    eviction: str = "ring"
    replacement: Mapping[str, str] = field(default_factory=dict)
    sampler_rules: Mapping[str, str] = field(default_factory=dict)
    hindsight: Mapping[str, str] = field(default_factory=dict)  # issue 42: harness/her_laws.py

    def __post_init__(self) -> None:
        choices = {
            "priority_dtype": PRIORITY_DTYPES,
            "eps_rule": EPS_RULES,
            "new_priority": NEW_PRIORITIES,
            "weight_normaliser": WEIGHT_NORMALISERS,
            "sampling": SAMPLING_SCHEMES,
            "nstep_form": NSTEP_FORMS,
            "incomplete_windows": INCOMPLETE_WINDOWS,
            "terminal_flag": TERMINAL_FLAGS,
            "nstep_ring": NSTEP_RINGS,
            "capacity_counts": CAPACITY_COUNTS,
            "terminal_next_obs": TERMINAL_NEXT_OBS,
            "eviction": EVICTIONS,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"Conventions.{name}={value!r}, but should be one of {[str(a) for a in allowed]}"
                )
        if self.nstep_ring == "completed_windows" and self.incomplete_windows != "exclude":
            raise ValueError(
                f"Conventions.incomplete_windows={self.incomplete_windows!r} with nstep_ring='completed_windows', "
                f"but should be 'exclude' (a step enters such a ring only once its window is complete)"
            )
        if not isinstance(self.positive_priorities, bool):
            raise ValueError(
                f"Conventions.positive_priorities={self.positive_priorities!r}, but should be True or False"
            )
        check_replacement(self.replacement)
        check_sampler_rules(self.sampler_rules)
        check_hindsight(self.hindsight)
        unknown = set(self.param_ranges) - set(SPEC_PARAM_RANGES)
        if unknown:
            raise ValueError(
                f"Conventions.param_ranges keys={sorted(unknown)}, but should be among {sorted(SPEC_PARAM_RANGES)}"
            )
        for name, value in self.param_ranges.items():
            if not isinstance(value, ParamRange):
                raise ValueError(
                    f"Conventions.param_ranges[{name!r}]={value!r}, but should be a ParamRange"
                )
        if not (isinstance(self.new_priority_value, (int, float)) and math.isfinite(self.new_priority_value)
                and self.new_priority_value >= 0):
            raise ValueError(
                f"Conventions.new_priority_value={self.new_priority_value!r}, but should be a finite number >= 0"
            )
        bad_fields = [f for f in self.transition_fields if f not in TRANSITION_FIELDS]
        if isinstance(self.transition_fields, str) or bad_fields:
            raise ValueError(
                f"Conventions.transition_fields={self.transition_fields!r}, but should be a tuple of "
                f"names among {list(TRANSITION_FIELDS)}"
            )
        known = {f.name for f in fields(self)} | {f"param_ranges.{name}" for name in self.param_ranges}
        unknown_notes = set(self.notes) - known
        if unknown_notes:
            raise ValueError(
                f"Conventions.notes keys={sorted(unknown_notes)}, but should name Conventions fields "
                f"(or 'param_ranges.<name>' of a declared range)"
            )

    # -- what the suite uses -------------------------------------------------
    def priorities(self, raw: Any) -> torch.Tensor:
        """THE one conversion of raw priorities for a buffer: ``raw`` (numbers
        or a tensor) as a tensor of ``priority_dtype``. Oracles start from
        ``priorities(raw).double()``: the inputs after rounding."""
        return torch.as_tensor(raw, dtype=torch.float64).to(self.priority_dtype)

    def param_range(self, name: str) -> ParamRange:
        """The declared range of ``"alpha"``, ``"beta"`` or ``"eps"`` (the spec's if undeclared)."""
        if name not in SPEC_PARAM_RANGES:
            raise ValueError(f"param name={name!r}, but should be one of {sorted(SPEC_PARAM_RANGES)}")
        return self.param_ranges.get(name, SPEC_PARAM_RANGES[name])

    def effective_eps(self, eps: float) -> float:
        """The eps the buffer adds for a spec with ``eps``: the spec's under
        ``"add"``, ``finfo(priority_dtype).eps`` under ``"finfo_on_update"``,
        0 under ``"none"``."""
        if self.eps_rule == "finfo_on_update":
            return float(torch.finfo(self.priority_dtype).eps)
        if self.eps_rule == "none":
            return 0.0
        return float(eps)

    def admits(self, raw: float) -> bool:
        """Whether a finite raw priority >= 0 is a valid input: any under the
        spec, only those > 0 under ``positive_priorities``."""
        return raw > 0 if self.positive_priorities else raw >= 0

    def deviations(self, notes: bool = True) -> dict[str, str]:
        """The fields that differ from the spec, rendered (``{"priority_dtype":
        "float32", ...}``), with the note if one is given (and ``notes``).
        Empty for the spec."""
        spec = Conventions()
        out: dict[str, str] = {}
        for f in fields(self):
            if f.name in ("notes", "param_ranges", "new_priority_value"):
                continue
            value = getattr(self, f.name)
            if value == getattr(spec, f.name):
                continue
            if f.name == "priority_dtype":
                text = str(value).replace("torch.", "")
            elif f.name == "new_priority" and value == "constant":
                text = f"constant {self.new_priority_value:g}"
            elif f.name == "transition_fields":
                text = ",".join(value)
            else:
                text = str(value)
            out[f.name] = text
        for name in sorted(self.param_ranges):
            declared = self.param_ranges[name]
            if declared != SPEC_PARAM_RANGES[name]:
                out[f"param_ranges.{name}"] = declared.describe()
        for key in list(out) if notes else ():
            note = self.notes.get(key) or self.notes.get(key.split(".", 1)[0])
            if note:
                out[key] += f" ({note})"
        return out

    def describe(self) -> str:
        """One line for a report header: ``"spec"`` or ``"priority_dtype=float32; ..."``."""
        dev = self.deviations()
        return "; ".join(f"{k}={v}" for k, v in dev.items()) if dev else "spec (no deviations)"


@dataclass(frozen=True)
class BufferSpec:
    """What buffer to build. Fields irrelevant to ``sampler`` are ignored."""

    capacity: int
    sampler: str = "random"  # "random" | "prioritized" | "slice" | "without_replacement" | "consuming"
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
    #: The row layout: key (a string, or a tuple for a nested key) -> (per-row
    #: shape, dtype). The suite sets it on every spec it builds for data it
    #: knows, so a buffer that allocates its fields up front can do so in
    #: ``make(spec)``; None when the rows are not known in advance.
    layout: Mapping[Any, tuple[tuple[int, ...], torch.dtype]] | None = None
    #: Transitions (capabilities "transitions", "env_id", "nstep"): how many
    #: envs' steps are interleaved (each write is one step of every env, in
    #: env order; capacity counts rows), and the n-step window's n (None: no
    #: n-step keys) and discount.
    num_envs: int = 1
    nstep: int | None = None
    gamma: float = 0.99
    #: Issue 40 (harness/sampler_laws.py): "without_replacement"'s drop_last and shuffle,
    #: "consuming"'s max_sample_count, and the batches drawn ahead (0: none).
    drop_last: bool = False
    shuffle: bool = True
    max_sample_count: int = 1
    prefetch: int = 0
    max_staleness: int = -1  # "staleness": rows staler than this are never drawn (-1: no gate)
    #: Issue 41 (capabilities "memmap", "max_value_writer", "immutable_writer"):
    #: "memory", "compressed" (capability "compressed": rows kept compressed,
    #: reference/compressed_storage.py) or "memmap" (rows in files of ``scratch_dir``, a str path, and
    #: nowhere else); ``reopen``: build from the files a closed buffer of this spec
    #: left there (``close()``); writer "round_robin", "max_value" (keeps the
    #: top-capacity rows by ``value_key``, one number a row) or "immutable".
    storage: str = "memory"
    scratch_dir: str | None = None
    reopen: bool = False
    writer: str = "round_robin"
    value_key: str = "value"
    #: Issue 42, served tables (harness/adapters/served.py): sampler/remover "fifo"|"lifo"|"min_heap"|"max_heap"
    remover: str = "fifo"
    max_times_sampled: int = 0
    rate_limiter: tuple[float, int, float, float] | None = None  # (spi, min_size, min_diff, max_diff)
    #: Issue 42 ("her", "mixing"): (strategy, ratio), reward reference.her.goal_reward; (offline_size, fraction)
    her: tuple[str, float] | None = None
    mixing: tuple[int, float] | None = None

    def but(self, **changes: Any) -> BufferSpec:
        return replace(self, **changes)


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
    #: Documented rules that differ from the spec (the default: none).
    conventions: Conventions = field(default_factory=Conventions)
    #: The string ``load_adapter`` built it from (a built-in name or ``"pkg.module:factory"``): what a
    #: repro snippet loads. Set by ``load_adapter``; empty for an adapter built by hand.
    source: str = ""
    raw: Callable[[BufferSpec], Any] | None = None  # the library's own calls to time: harness/raw_calls.py

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            raise ValueError(
                f"capabilities={sorted(unknown)} are unknown, but should be among {sorted(CAPABILITIES)}"
            )
        if not isinstance(self.conventions, Conventions):
            raise ValueError(
                f"conventions={self.conventions!r}, but should be a harness.protocol.Conventions"
            )

    def has(self, capability: str) -> bool:
        return capability in self.capabilities and capability not in self.unavailable
