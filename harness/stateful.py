"""The stateful model comparison: the implementation under test against the reference.

``make_state_machine(impl, model)`` returns a Hypothesis
``RuleBasedStateMachine`` class. Each rule performs the same operation on the
implementation (``self.sut``) and on the reference (``self.model``): extend,
add, sample, update_priority (with and without write generations), and
save + load. After every step the invariants compare the two exactly:
length, cursor, write count, contents (bit-identical); a sample's rows must
be the stored rows at the returned slots. Priorities are compared with the
independent oracle (:class:`rbcheck.harness.oracle.PriorityOracle`) under the
adapter's declared conventions: stored priorities and max priority (with
"priority_readback", to the declared dtype's tolerance) and every sample's
weights (to the weight tolerance), so a buffer with float32 trees or its
own weight normaliser is held to its own rules, not the reference's.
Priorities reach both buffers in ``conventions.priority_dtype``.

Rules are capability-aware: prioritized rules exist only when the adapter
declares "prioritized", generation-carrying updates only with
"stale_updates", save + load only with "save_load" (its next-sample
comparison only when the adapter is seedable), index comparisons under
shared uniforms only with "shared_rng". Rules are guarded with
``precondition`` (never ``assume``) and every rule ``note``\\ s the call it
makes, so a failing run prints a replayable program.

Run it with :func:`run_against_model` (the conformance test does).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rbcheck.harness.assertions import (
    Trace,
    assert_close,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
    priority_tolerance,
)
from rbcheck.harness.oracle import PriorityOracle, model_spec
from rbcheck.harness.protocol import Adapter, Conventions
from rbcheck.harness.strategies import (
    capacities,
    layouts,
    priorities,
    scale_limit,
    specs,
    training_batch_sizes,
)

#: priorities drawn per update of a sample; a longer sample repeats them along it
TILE = 16
#: fixed uniforms used to compare index mapping when "shared_rng" is declared
PROBE_UNIFORMS = torch.tensor(
    [0.0, 1e-12, 0.1, 0.25, 0.3333, 0.5, 0.6180339887, 0.75, 0.9, 0.999999, 1 - 2**-53],
    dtype=torch.float64,
)


def make_state_machine(
    impl: Adapter, model: Adapter, *, max_capacity: int = 10
) -> type[RuleBasedStateMachine]:
    """A state machine class comparing ``impl`` against ``model`` (the reference)."""
    prioritized = impl.has("prioritized")
    conventions = impl.conventions
    readback = prioritized and impl.has("priority_readback")
    seedable = conventions.seedable
    # the samplers the adapter declares (a prioritized-only buffer is not
    # driven through a uniform spec it never claimed)
    samplers = declared_samplers(impl)
    with_generations = prioritized and impl.has("stale_updates")
    can_save = impl.has("save_load")
    shared_rng = impl.has("shared_rng")
    # rings of a real run (up to 2**16 slots) beside the small ones that wrap
    spec_strategy = specs(samplers, capacity=capacities(1, max_capacity, large=True), conventions=conventions)
    # batches from one row to a training loop's thousands (or the adapter's cost hint)
    hint = scale_limit(impl, "sample_batch")
    sample_sizes = training_batch_sizes(hint[0] if hint else 4096)

    class BufferMatchesModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.sut = None
            self.model = None
            self.spec = None
            self.next_id = 0
            self.samples: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
            self.oracle: PriorityOracle | None = None
            self.tmp = Path(tempfile.mkdtemp(prefix="rbcheck-stateful-"))
            self.saves = 0

        # -- helpers ------------------------------------------------------
        def _do(self, text: str) -> None:
            note(text)
            self.trace.op(text)

        @property
        def is_prioritized(self) -> bool:
            return self.spec is not None and self.spec.sampler == "prioritized"

        def _len(self) -> int:
            return len(self.model)

        # -- setup --------------------------------------------------------
        @initialize(spec=spec_strategy, layout=layouts(max_fields=3))
        def create(self, spec, layout) -> None:
            self.spec, self.layout = spec, layout
            self.trace = Trace(impl, spec)
            self.trace.let("layout", layout)
            note(f"layout = {layout!r}")
            note(f"buf = load_adapter({self.trace.adapter!r}).make({spec!r})")
            self.sut = impl.make(spec)
            self.model = model.make(model_spec(spec, conventions))
            if spec.sampler == "prioritized":
                self.oracle = PriorityOracle(spec, conventions)

        # -- writes -------------------------------------------------------
        @rule(n=st.integers(1, max_capacity))
        def extend(self, n: int) -> None:
            n = min(n, self.spec.capacity)
            batch = self.layout.batch(self.next_id, n)
            self._do(f"buf.extend(layout.batch({self.next_id}, {n}))")
            self.next_id += n
            got = self.sut.extend(batch.clone())
            want = self.model.extend(batch.clone())
            assert_tensor_equal(
                "extend(...) slots", torch.as_tensor(got).cpu(), want.cpu(), self.trace
            )
            if self.oracle is not None:
                self.oracle.write(n)

        @rule()
        def add(self) -> None:
            row = self.layout.row(self.next_id)
            self._do(f"buf.add(layout.row({self.next_id}))")
            self.next_id += 1
            got = self.sut.add(row.clone())
            want = self.model.add(row.clone())
            assert_same("add(...) slot", int(got), int(want), self.trace)
            if self.oracle is not None:
                self.oracle.write(1)

        # -- reads --------------------------------------------------------
        def _can_sample(self) -> bool:
            if self.model is None or len(self.model) == 0:
                return False
            return self.oracle is None or bool((self.oracle.leaves() > 0).any())

        @precondition(lambda self: self._can_sample())
        @rule(batch_size=sample_sizes)
        def sample(self, batch_size: int) -> None:
            self._do(f"rows, info = buf.sample({batch_size})")
            rows, info = self.sut.sample(batch_size)
            self._check_sample(rows, info, batch_size)

        def _check_sample(self, rows, info, batch_size: int) -> None:
            if "index" not in info:
                fail("sorted(info)", sorted(info), "a dict with 'index'", self.trace)
            index = info["index"]
            if index.dtype != torch.int64 or tuple(index.shape) != (batch_size,):
                fail(
                    "info['index'] dtype/shape",
                    f"<{index.dtype}{list(index.shape)}>",
                    f"torch.int64[{batch_size}]",
                    self.trace,
                )
            index = index.cpu()
            n = self._len()
            if bool(((index < 0) | (index >= n)).any()):
                fail("info['index']", index, f"slots in [0, len(buf)={n})", self.trace)
            stored = self.model.contents()[index]
            assert_td_equal("sample rows", rows, stored, self.trace, check_device=False)
            if self.is_prioritized:
                leaves = self.oracle.leaves()
                if bool((leaves[index] <= 0).any()):
                    fail(
                        "expected stored priority of sampled slots",
                        leaves[index],
                        "> 0 (0 is never sampled)",
                        self.trace,
                    )
                if "weight" not in info:
                    fail("sorted(info)", sorted(info), "a dict with 'weight'", self.trace)
                weight = torch.as_tensor(info["weight"])
                tol = self.oracle.weight_tolerance(index, weight.dtype)
                want = self.oracle.weights(index)
                assert_close("info['weight']", weight, want, self.trace, tol=tol)
                generation = info.get("generation")
                self.samples.append(
                    (index, None if generation is None else generation.cpu(), self.oracle.serials(index))
                )

        # -- priorities ---------------------------------------------------
        @precondition(lambda self: self.is_prioritized and len(self.samples) > 0)
        @rule(data=st.data(), with_generation=st.booleans())
        def update_sampled(self, data, with_generation: bool) -> None:
            which = data.draw(st.integers(0, len(self.samples) - 1), label="which sample")
            index, generation, serials = self.samples[which]
            k = min(len(index), TILE)  # a long sample's priorities: k drawn, repeated along it
            raw = data.draw(st.lists(priorities(conventions=conventions), min_size=k, max_size=k),
                            label="priorities")
            raw = conventions.priorities((raw * -(-len(index) // k))[:len(index)])
            use_gen = with_generation and with_generations and generation is not None
            gen_text = f", generation=torch.tensor({generation.tolist()})" if use_gen else ""
            self._do(
                f"buf.update_priority(torch.tensor({index.tolist()}), "
                f"torch.tensor({raw.tolist()}, dtype={raw.dtype}){gen_text})"
            )
            self.oracle.update(index, raw, serials if use_gen else None)
            if use_gen:
                self.sut.update_priority(index.clone(), raw.clone(), generation.clone())
                self.model.update_priority(index.clone(), raw.clone(), generation.clone())
            else:
                self.sut.update_priority(index.clone(), raw.clone())
                self.model.update_priority(index.clone(), raw.clone())

        @precondition(
            lambda self: self.is_prioritized and self.model is not None and len(self.model) > 0
        )
        @rule(data=st.data())
        def update_any(self, data) -> None:
            n = self._len()
            index = data.draw(
                st.lists(st.integers(0, n - 1), min_size=1, max_size=5), label="slots"
            )
            raw = data.draw(
                st.lists(priorities(conventions=conventions), min_size=len(index), max_size=len(index)),
                label="priorities"
            )
            index = torch.tensor(index, dtype=torch.int64)
            raw = conventions.priorities(raw)
            self._do(
                f"buf.update_priority(torch.tensor({index.tolist()}), "
                f"torch.tensor({raw.tolist()}, dtype={raw.dtype}))"
            )
            self.oracle.update(index, raw)
            self.sut.update_priority(index.clone(), raw.clone())
            self.model.update_priority(index.clone(), raw.clone())

        # -- checkpoints --------------------------------------------------
        @precondition(lambda self: can_save and self._can_sample())
        @rule(k=st.integers(1, 4))
        def save_then_load_into_fresh_buffer(self, k: int) -> None:
            path = self.tmp / f"ckpt{self.saves}"
            self.saves += 1
            make = f"load_adapter({self.trace.adapter!r}).make({self.spec!r})"
            self._do(
                f"buf.save({str(path)!r}); buf.sample({k}); buf = {make}; buf.load({str(path)!r})"
            )
            self.sut.save(path)
            rows_a, info_a = self.sut.sample(k)
            fresh = impl.make(self.spec)
            fresh.load(path)
            rows_b, info_b = fresh.sample(k)
            if not seedable:  # convention: the next draws cannot be replayed
                info_a = {}
            else:
                assert_td_equal("sample after load: rows", rows_b, rows_a, self.trace)
            for key in sorted(info_a):
                if key not in info_b:
                    fail("sorted(info) after load", sorted(info_b), sorted(info_a), self.trace)
                assert_tensor_equal(
                    f"sample after load: info[{key!r}]", info_b[key], info_a[key], self.trace
                )
            self.sut = fresh  # carry on with the loaded copy; the invariants check it

        # -- invariants ---------------------------------------------------
        @invariant()
        def same_length_cursor_write_count(self) -> None:
            if self.model is None:
                return
            assert_same("len(buf)", int(len(self.sut)), int(len(self.model)), self.trace)
            assert_same("buf.cursor", int(self.sut.cursor), int(self.model.cursor), self.trace)
            assert_same(
                "buf.write_count",
                int(self.sut.write_count),
                int(self.model.write_count),
                self.trace,
            )

        @invariant()
        def same_contents(self) -> None:
            if self.model is None or len(self.model) == 0:
                return
            assert_td_equal(
                "buf.contents()",
                self.sut.contents(),
                self.model.contents(),
                self.trace,
                check_device=False,
            )

        @invariant()
        def priorities_match_oracle(self) -> None:
            if not readback or not self.is_prioritized or len(self.model) == 0:
                return
            slots = torch.arange(self._len())
            got = self.sut.stored_priority(slots)
            tol = priority_tolerance(conventions.priority_dtype, self.spec.alpha)
            assert_close("buf.stored_priority(all slots)", got, self.oracle.leaves(), self.trace, tol=tol)
            want_max = self.oracle.max_priority()
            if want_max is not None:
                assert_close(
                    "buf.max_priority",
                    torch.tensor([float(self.sut.max_priority)]),
                    torch.tensor([want_max]),
                    self.trace,
                    tol=tol,
                )
            if type(self.sut.max_priority) is not float:
                fail(
                    "type(buf.max_priority)",
                    type(self.sut.max_priority).__name__,
                    "float",
                    self.trace,
                )

        @invariant()
        def same_indices_for_same_uniforms(self) -> None:
            if not shared_rng or not self._can_sample():
                return
            got = self.sut.indices_from_uniforms(PROBE_UNIFORMS.clone())
            want = self.model.indices_from_uniforms(PROBE_UNIFORMS.clone())
            assert_tensor_equal(
                "buf.indices_from_uniforms(PROBE_UNIFORMS)",
                torch.as_tensor(got).cpu(),
                want.cpu(),
                self.trace,
            )

        def teardown(self) -> None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    BufferMatchesModel.__name__ = f"BufferMatchesModel_{impl.name}"
    return BufferMatchesModel


def run_against_model(impl: Adapter, model: Adapter, *, max_steps: int = 25) -> None:
    """Run the state machine under the active Hypothesis profile, with at most
    ``max_steps`` steps per program."""
    current = settings()
    machine = make_state_machine(impl, model)
    run_state_machine_as_test(
        machine,
        settings=settings(
            current,
            stateful_step_count=min(current.stateful_step_count, max_steps),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# --------------------------------------------------------------------------
# plain replays for the example-style properties
# --------------------------------------------------------------------------


def declared_samplers(
    impl: Adapter, among: tuple[str, ...] = ("random", "prioritized")
) -> tuple[str, ...]:
    """The samplers of ``among`` that ``impl`` can build (``random`` is assumed)."""
    return tuple(s for s in among if impl.has(s)) or ("random",)


def replay(
    buf, layout, ops, trace: Trace, *, first_id: int = 0, conventions: Conventions | None = None,
    oracle: PriorityOracle | None = None,
) -> int:
    """Apply ``ops`` (from :func:`rbcheck.harness.strategies.operations`) to ``buf``,
    recording each call on ``trace`` (a recording buffer, ``trace.wrap``,
    writes its own calls); returns the next unused row id.
    Priorities go in ``conventions.priority_dtype``; ``oracle`` (if given)
    follows the writes and updates, and a sample is left out while every
    expected priority is 0 (eps = 0: nothing can be drawn)."""
    from rbcheck.harness.repro import Recorded

    conventions = conventions or Conventions()
    by_hand = not isinstance(buf, Recorded)
    next_id = first_id
    last_index = None
    for op in ops:
        kind = op[0]
        if kind == "extend":
            n = op[1]
            if by_hand:
                trace.op(f"buf.extend(layout.batch({next_id}, {n}))")
            buf.extend(layout.batch(next_id, n))
            next_id += n
            if oracle is not None:
                oracle.write(n)
        elif kind == "add":
            if by_hand:
                trace.op(f"buf.add(layout.row({next_id}))")
            buf.add(layout.row(next_id))
            next_id += 1
            if oracle is not None:
                oracle.write(1)
        elif kind == "sample":
            if oracle is not None and not bool((oracle.leaves() > 0).any()):
                continue  # every priority is 0: sampling must refuse (test_bad_input checks it)
            if by_hand:
                trace.op(f"rows, info = buf.sample({op[1]})")
            _, info = buf.sample(op[1])
            last_index = info["index"].cpu()
        elif kind == "update":
            if last_index is None:
                continue
            k = min(op[1], len(last_index))
            index, raw = last_index[:k].clone(), conventions.priorities(op[2][:k])
            if by_hand:
                trace.op(f"buf.update_priority(torch.tensor({index.tolist()}), "
                         f"torch.tensor({raw.tolist()}, dtype={raw.dtype}))")
            buf.update_priority(index, raw)
            if oracle is not None:
                oracle.update(index, raw)
        else:  # pragma: no cover - strategies only emit the kinds above
            raise ValueError(f"op={op!r}, but should be extend/add/sample/update")
    return next_id
