"""With or without replacement is a declared law of every sampler
(harness/sampler_laws.py): the spec's law (``SPEC_REPLACEMENT``), or the
adapter's declaration (``Conventions.replacement``), checked in its own terms.

Four held rows of equal priority, batches of two, 2000 batches per sampler:

* ``"with"``: the draws are independent: the pair (draw 0, draw 1) of a
  batch and the pair (last draw of a batch, first draw of the next) are
  uniform over the 16 ordered pairs of slots, repeats included;
* ``"without_in_batch"``: a batch never repeats a slot (exact), its pair is
  uniform over the 12 ordered pairs of distinct slots, and consecutive
  batches are independent (the second pair uniform over 16);
* ``"without"``: a batch never repeats a slot, and every two consecutive
  batches from the first (an epoch of four slots) hold each slot once (exact).

Slice sampling is left out (its draws are trajectories, checked in
test_sampling_distributions), and so is a prioritized sampler declaring
``sampling="stratified"`` (its draws are independent but not identically
distributed; test_sampling_distributions checks it in its own terms).
"""

from __future__ import annotations

import pytest
import torch

from rbcheck.harness.assertions import Trace, assert_chi_square, fail
from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.sampler_laws import replacement_of
from rbcheck.harness.strategies import Field, Layout

#: probability that one distributional check fails on a correct implementation
FALSE_ALARM = 1e-4
LAYOUT = Layout((Field(("obs",), (2,), "float32"),))
HELD, BATCHES = 4, 2000
SAMPLERS = ("random", "prioritized", "without_replacement", "consuming")


def pairs(buf, trace: Trace, what: str) -> tuple[torch.Tensor, torch.Tensor, list]:
    """``(within, across, batches)``: counts [4, 4] of (draw 0, draw 1) of each
    batch and of (last draw, next batch's first draw), and the batches."""
    within = torch.zeros(HELD, HELD, dtype=torch.float64)
    across = torch.zeros(HELD, HELD, dtype=torch.float64)
    batches, last = [], None
    for _ in range(BATCHES):
        index = torch.as_tensor(buf.sample(2)[1]["index"]).cpu()
        if index.dtype != torch.int64 or index.shape != (2,) or bool(((index < 0) | (index >= HELD)).any()):
            fail(f"info['index'] of a batch of 2 {what}", index, f"int64[2] of held slots in [0, {HELD})", trace)
        within[index[0], index[1]] += 1
        if last is not None:
            across[last, index[0]] += 1
        last = int(index[1])
        batches.append(index.tolist())
    return within, across, batches


@pytest.mark.conventions("replacement", "sampling")
def test_samplers_draw_with_or_without_replacement_as_declared(impl):
    """distributional (chi-square, false-alarm rate 1e-4 per check) and exact
    (no repeat where the law forbids one, epochs): each sampler the adapter
    declares draws with or without replacement, within a batch and across
    batches, as its declared law says (module doc)."""
    ran = []
    for sampler in SAMPLERS:
        if not impl.has(sampler) or (sampler == "prioritized" and impl.conventions.sampling != "independent"):
            continue
        law = replacement_of(impl.conventions, sampler)
        spec = BufferSpec(capacity=HELD, sampler=sampler, max_sample_count=2**30, shuffle=True, seed=4242,
                          layout=LAYOUT.spec_layout())
        trace = Trace(impl, spec)
        layout = trace.source("layout", LAYOUT)
        buf = trace.wrap(impl.make(spec))
        buf.extend(layout.batch(0, HELD))
        what = f"(sampler {sampler!r}, declared {law!r})"
        within, across, batches = pairs(buf, trace, what)
        ran.append(sampler)
        uniform = torch.full((HELD, HELD), 1.0 / HELD**2, dtype=torch.float64)
        distinct = (1 - torch.eye(HELD, dtype=torch.float64)) / (HELD * (HELD - 1))
        repeats = [b for b in batches if b[0] == b[1]]
        if law != "with" and repeats:
            fail(f"batches repeating a slot {what}", f"<{len(repeats)} of {BATCHES}, e.g. {repeats[0]}>",
                 "none (without replacement in a batch)", trace)
        if law == "without":
            for k in range(0, BATCHES - 1, 2):
                epoch = sorted(batches[k] + batches[k + 1])
                if epoch != list(range(HELD)):
                    fail(f"slots of batches {k} and {k + 1} (one epoch of {HELD}) {what}", epoch,
                         str(list(range(HELD))), trace)
        assert_chi_square(f"(draw 0, draw 1) of a batch {what}", within.flatten(),
                          (uniform if law == "with" else distinct).flatten(), trace, false_alarm=FALSE_ALARM)
        if law != "without":
            assert_chi_square(f"(last draw of a batch, first draw of the next) {what}", across.flatten(),
                              uniform.flatten(), trace, false_alarm=FALSE_ALARM)
    if not ran:
        pytest.skip(f"no sampler among {SAMPLERS} declared (or only a stratified prioritized one)")
