"""Repros recorded as the calls are made (harness/repro.py, ``Trace.wrap``):
each call on a recorded buffer is written with its arguments rendered
exactly or by name, and the snippet runs in a fresh namespace doing what
the property did; failures are classified by their type, not their text."""

from __future__ import annotations

import torch

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.failure import PropertyFailure, Trace
from rbcheck.harness.plugin.results import failure_fields, is_verdict
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.repro import render_tensor
from rbcheck.harness.strategies import EpisodeLayout, Field, Layout


def _trace(spec):
    impl = load_adapter("reference")
    return impl, Trace(impl, spec)


def test_calls_are_recorded_with_their_arguments_and_the_snippet_replays_them(tmp_path):
    spec = BufferSpec(capacity=4, sampler="prioritized", seed=3)
    impl, trace = _trace(spec)
    layout = trace.source("layout", Layout((Field(("a",), (2,), "float32"),)))
    trace.directory(tmp_path)
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, 3))
    buf.extend(layout.batch(10, 6)[1:3].clone())  # a run of a named batch's rows, by value
    rows, info = buf.sample(2)
    buf.update_priority(info["index"], torch.tensor([0.5, -0.0], dtype=torch.float64))
    try:
        buf.update_priority(info["index"], torch.tensor([float("inf"), 1.0], dtype=torch.float64))
    except ValueError:
        pass
    buf.save(tmp_path / "ckpt")
    twin = trace.make(spec, "twin")
    twin.load(tmp_path / "ckpt")
    trace.note("the twin holds what buf held")
    snippet = trace.snippet()
    assert "buf.extend(layout.batch(0, 3))" in snippet
    assert "buf.extend(layout.batch(10, 6)[1:3])" in snippet
    assert "torch.tensor([0.5, -0.0], dtype=torch.float64)" in snippet
    assert "try: buf.update_priority(" in snippet and "# raised ValueError" in snippet
    assert "buf.save(tmp / 'ckpt')" in snippet and "twin.load(tmp / 'ckpt')" in snippet
    assert "# the twin holds what buf held" in snippet
    namespace: dict = {}
    exec(compile(snippet, "<repro>", "exec"), namespace)
    assert torch.equal(namespace["twin"].contents()["id"], buf.contents()["id"])


def test_values_are_exact_or_named_never_a_wrong_literal():
    _, trace = _trace(BufferSpec(capacity=2))
    for t in (torch.tensor([1.5, float("nan"), -0.0, float("inf")], dtype=torch.bfloat16),
              torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8), torch.empty(0, 3), torch.arange(5),
              torch.tensor(True)):
        text = render_tensor(t)
        back = eval(text, {"torch": torch, "nan": float("nan"), "inf": float("inf")})
        assert back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back.view(-1)[t.view(-1) == t.view(-1)], t.view(-1)[t.view(-1) == t.view(-1)])
    big = torch.randn(70000)
    assert render_tensor(torch.randn(70000)) is None
    assert trace.render(big) == "arg1" and "arg1 = ...  # <tensor shape=[70000]" in trace.snippet()
    named = trace.name(torch.zeros(3), "zeros")
    assert trace.render(named) == "zeros"
    named.add_(1)  # changed since it was named: the name would be wrong, so it is written out
    assert trace.render(named) == "torch.tensor([1.0, 1.0, 1.0], dtype=torch.float32)"


def test_iterators_are_written_as_far_as_they_were_consumed_and_runs_as_loops():
    spec = BufferSpec(capacity=8, sampler="without_replacement", batch_size=2)
    impl, trace = _trace(spec)
    episodes = trace.source("episodes", EpisodeLayout((3, 6)))
    buf = trace.wrap(impl.make(spec))
    buf.extend(episodes.batch()[0:8])
    it = buf.iterate()
    next(it), next(it)
    for _ in range(3):
        buf.sample(2)
    snippet = trace.snippet()
    assert "buf.extend(episodes.batch()[0:8])" in snippet
    assert "for _ in range(3): buf.sample(2)" in snippet
    assert "list(itertools.islice(buf.iterate(), 2))" in snippet
    exec(compile(snippet, "<repro>", "exec"), {})


def test_failures_are_classified_by_type_not_by_their_text():
    """A PropertyFailure is a verdict whatever it says; an AssertionError or a
    buffer's ValueError that happens to say "but should be" is not one."""
    verdict = PropertyFailure("len(buf)", "3", "4", call="extend(...)")
    lookalike = AssertionError("len(buf)=3, but should be 4")
    assert is_verdict(verdict) and not is_verdict(lookalike) and not is_verdict(ValueError("x, but should be y"))
    fields = failure_fields(lookalike)
    assert "what" not in fields and fields["message"] == "AssertionError: len(buf)=3, but should be 4"
    fields = failure_fields(verdict)
    assert (fields["what"], fields["got"], fields["expected"], fields["call"]) == ("len(buf)", "3", "4", "extend(...)")


def test_meta_tensors_are_written_by_shape_and_dtype():
    """A meta tensor (a bad input of test_bad_input) has no values to write and
    cannot be copied to the CPU: it is written as ``torch.empty`` on meta."""
    t = torch.zeros(2, 3, dtype=torch.float64, device="meta")
    assert render_tensor(t) == "torch.empty([2, 3], dtype=torch.float64, device='meta')"
    back = eval(render_tensor(t), {"torch": torch})
    assert back.device.type == "meta" and back.shape == t.shape and back.dtype == t.dtype


def test_a_bound_call_is_written_with_its_target_and_its_results_are_named():
    """``trace.bind("rows, info")`` writes the next recorded call as an
    assignment and names its results; an observer (``contents()``,
    ``stored_priority``) that is bound, or asked for with ``trace.bind()``,
    is written too (unbound observers stay out of the snippet)."""
    spec = BufferSpec(capacity=4, sampler="prioritized", seed=3)
    impl, trace = _trace(spec)
    layout = trace.source("layout", Layout((Field(("a",), (2,), "float32"),)))
    buf = trace.wrap(impl.make(spec))
    buf.extend(layout.batch(0, 3))
    trace.bind("rows, info")
    rows, info = buf.sample(2)
    buf.update_priority(info["index"], torch.tensor([0.5, 2.0], dtype=torch.float64))
    buf.contents()  # not bound: an observer, left out
    trace.bind("c")
    c = buf.contents()
    trace.op("c['a'].add_(1)")
    c["a"].add_(1)
    trace.bind()
    buf.stored_priority(info["index"])
    buf.stored_priority(info["index"])  # not bound again: left out
    snippet = trace.snippet()
    assert "rows, info = buf.sample(2)" in snippet
    assert "buf.update_priority(torch.tensor(" in snippet  # info['index'] by value: only info is named
    assert snippet.count("buf.contents()") == 1 and "c = buf.contents()" in snippet
    assert snippet.count("buf.stored_priority(") == 1
    assert trace.render(rows) == "rows"
    namespace: dict = {}
    exec(compile(snippet, "<repro>", "exec"), namespace)
    assert torch.equal(namespace["c"]["a"], c["a"]) and torch.equal(namespace["info"]["index"], info["index"])
