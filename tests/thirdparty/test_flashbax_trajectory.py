"""flashbax 0.1.3's trajectory buffer inside its documented limits (passing
tests, docs/findings.md "flashbax's trajectory buffer").

The ``flashbax-trajectory`` and ``flashbax-trajectory-per`` columns meet
flashbax's two documented limits on small streams (a window longer than one
env's ring is refused, ``trajectory_buffer.py:339-342``; nothing is sampled
before ``n`` steps of an env are written, ``:238-243``), which the columns
declare (``incomplete_windows="exclude_until_n_steps"``) and the properties
check in those terms. Here the same oracle also checks every sampled window
on longer streams that respect both limits, and the
rule by which flashbax excludes windows: a step is sampled if and only if
``n - 1`` more steps of its env are held (``:196-204``, ``period=1``).
Skipped where flashbax is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import pytest

pytest.importorskip("flashbax", reason="flashbax is not installed (nox -s thirdparty installs it)")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rbcheck.conformance.test_transitions import Oracle, check_transitions, draw_sample, write  # noqa: E402
from rbcheck.harness.adapters import load_adapter  # noqa: E402
from rbcheck.harness.assertions import fail  # noqa: E402
from rbcheck.harness.transition_streams import transition_setups  # noqa: E402


def full_length(oracle: Oracle, n: int) -> list[bool]:
    """Per held row (by held position): whether ``n - 1`` more rows of its
    env are held after it (``oracle.tr`` links every row written, by id; a
    later row of a held row's env is held too)."""
    out = []
    for row in oracle.held["id"].tolist():
        k = 1
        while k < n and oracle.tr.successor[row] is not None:
            row, k = oracle.tr.successor[row], k + 1
        out.append(k == n)
    return out


@pytest.mark.parametrize("name", ["flashbax-trajectory", "flashbax-trajectory-per"])
@settings(max_examples=12, deadline=None, derandomize=True)
@given(data=st.data())
def test_windows_inside_the_documented_limits_match_the_oracle(name, data):
    impl = load_adapter(name)
    spec, stream = data.draw(transition_setups(impl, nstep=True), label="setup")
    assume(spec.nstep <= spec.capacity // spec.num_envs and stream.steps >= spec.nstep)
    buf, trace = write(impl, spec, stream)
    oracle = Oracle(stream, spec, impl.conventions)
    rows, p = draw_sample(buf, oracle, trace, per_row=32)
    sampleable = full_length(oracle, spec.nstep)
    drawn = set(p.tolist())
    for t, ok in enumerate(sampleable):
        if ok != (t in drawn):
            fail(f"held row id {int(oracle.held['id'][t])} sampled in {len(p)} draws", t in drawn,
                 f"{ok} (sampled iff {spec.nstep - 1} more steps of its env are held)", trace)
    # every sampled window, incomplete ones not skipped: none may be sampled
    check_transitions(impl, spec, oracle, rows, p, trace, skip_incomplete=False)
