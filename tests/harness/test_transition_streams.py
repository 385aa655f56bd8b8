"""Which env steps a buffer holds (``Stream.held``), under the spec's
``capacity_counts="rows"`` and d3rlpy's ``"complete_transitions"``."""

from __future__ import annotations

import pytest

from rbcheck.conformance.test_transitions import Oracle
from rbcheck.harness.protocol import BufferSpec, Conventions
from rbcheck.harness.transition_streams import LAYOUT, TERMINATED, TRUNCATED, Stream

# one env: episode 0 = ids 0, 1 (terminated); episode 1 = ids 2, 3 (truncated); id 4 running
ONE_ENV = Stream(1, ((0,), (TERMINATED,), (0,), (TRUNCATED,), (0,)))


def ids(rows) -> list[int]:
    return rows["id"].tolist()


def test_rows_holds_the_last_capacity_rows_written():
    assert ids(ONE_ENV.held(3)) == [2, 3, 4]
    assert ids(ONE_ENV.held(8, "rows")) == [0, 1, 2, 3, 4]


def test_complete_transitions_holds_neither_a_truncated_last_step_nor_the_pending_one():
    assert ids(ONE_ENV.held(8, "complete_transitions")) == [0, 1, 2]
    assert ids(ONE_ENV.held(2, "complete_transitions")) == [1, 2]  # completed at 1, 1 and 3: the last two


def test_complete_transitions_orders_by_completion_over_several_envs():
    # env 0: ids 0 (running), 2 (terminated); env 1: ids 1 (terminated), 3 (running)
    stream = Stream(2, ((0, TERMINATED), (TERMINATED, 0)))
    assert ids(stream.held(8, "complete_transitions")) == [0, 1, 2]
    assert ids(stream.held(2, "complete_transitions")) == [0, 2]  # 1 completed first, then 0 and 2 at id 2


def test_unknown_counts_and_nstep_with_complete_transitions_are_refused():
    with pytest.raises(ValueError, match="counts='episodes', but should be"):
        ONE_ENV.held(2, "episodes")
    spec = BufferSpec(capacity=4, layout=LAYOUT, nstep=2)
    with pytest.raises(ValueError, match="capacity_counts='complete_transitions' with spec.nstep=2, but should be"):
        Oracle(ONE_ENV, spec, Conventions(capacity_counts="complete_transitions"))
