"""Staleness-aware sampling (issue 40, reference/staleness_sampler.py).

Each row carries its policy version (``policy_version``); the learner sets
``consumer_version`` (``set_consumer_version``). The declared rule: a row's
staleness is ``s = consumer_version - version``; with ``max_staleness >= 0``
rows with ``s > max_staleness`` are never drawn (none left: an error); each
draw picks an eligible row with probability ``(1 / (s + 1)) / sum`` over the
eligible rows, independently (with replacement), in batches of every size:
smaller than, equal to and larger than the eligible count.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, assert_chi_square, assert_tensor_equal, fail
from rbcheck.harness.protocol import BufferSpec

pytestmark = pytest.mark.requires("staleness")
#: probability that one distributional case fails on a correct implementation
FALSE_ALARM = 1e-4
DRAWS = 20000
CASES = [  # (policy versions of the held rows, consumer_version, max_staleness, batch sizes)
    ((0, 1, 2, 3, 4, 4), 4, -1, (3, 6, 40)),  # no gate; a batch of exactly the held rows too
    ((0, 0, 1, 2, 5, 6, 6, 3), 6, 3, (3, 5, 64)),  # the gate keeps staleness 0..3: 5 rows
    ((7, 2, 7, 9, 8, 3, 9), 9, 2, (4, 5, 16)),
]


def rows(versions) -> TensorDict:
    n = len(versions)
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32).unsqueeze(-1),
                       "policy_version": torch.tensor(versions, dtype=torch.int64)}, [n])


def build(impl, versions, consumer: int, max_staleness: int, seed: int, trace: Trace | None = None,
          var: str = "buf"):
    """A recorded buffer holding ``rows(versions)`` at ``consumer``'s version
    (on ``trace`` as ``var`` when given, else on a new trace as ``buf``)."""
    spec = BufferSpec(capacity=len(versions), sampler="staleness", max_staleness=max_staleness, seed=seed)
    if trace is None:
        trace = Trace(impl, spec)
        buf = trace.wrap(impl.make(spec))
    else:
        buf = trace.make(spec, var)
    trace.need("from rbcheck.conformance.test_staleness import rows")
    buf.extend(trace.name(rows(versions), f"rows({list(versions)})"))
    buf.set_consumer_version(consumer)
    return buf, trace


def test_staleness_draws_follow_the_declared_weighting(impl):
    """distributional (chi-square, false-alarm rate 1e-4 per batch size) and
    exact (probability 0 beyond the gate): 20000 draws in batches of each
    size, smaller than, equal to and larger than the eligible count, follow
    ``1 / (s + 1)`` over the eligible rows; a batch of exactly the eligible
    count is not a permutation of them (draws are independent)."""
    for versions, consumer, gate, sizes in CASES:
        staleness = torch.tensor([consumer - v for v in versions], dtype=torch.float64)
        eligible = (staleness <= gate) if gate >= 0 else torch.ones(len(versions), dtype=torch.bool)
        weight = torch.where(eligible, 1.0 / (staleness + 1.0), torch.zeros(()))
        for size in sizes:
            buf, trace = build(impl, versions, consumer, gate, seed=size)
            counts = torch.zeros(len(versions), dtype=torch.float64)
            for _ in range(-(-DRAWS // size)):
                index = torch.as_tensor(buf.sample(size)[1]["index"]).cpu().reshape(-1)
                if len(index) != size or bool(((index < 0) | (index >= len(versions))).any()):
                    fail(f"info['index'] of buf.sample({size})", index[:8], f"{size} held slots", trace)
                counts += torch.bincount(index, minlength=len(versions)).double()
            assert_chi_square(f"slots drawn in batches of {size} ({int(eligible.sum())} eligible rows, staleness "
                              f"{staleness.long().tolist()}, max_staleness={gate})", counts, weight, trace,
                              false_alarm=FALSE_ALARM)


def test_no_eligible_row_is_an_error(impl):
    """exact: when every row is staler than ``max_staleness``, a sample raises
    (no batch of stale rows)."""
    buf, trace = build(impl, (0, 1, 2), 10, 3, seed=0)
    try:
        rows_, info = buf.sample(2)
    except Exception:  # noqa: BLE001 - the refusal asked for
        return
    fail("buf.sample(2) with every row's staleness > max_staleness=3", torch.as_tensor(info["index"]).cpu(),
         "an error", trace)


@pytest.mark.exact_replay
def test_staleness_draws_replay_from_the_seed(impl):
    """exact (seedable): two buffers built from one spec (one seed) and fed
    the same rows give the same draws."""
    versions, consumer = (0, 1, 2, 3, 4, 5, 6, 7), 7
    first, trace = build(impl, versions, consumer, -1, 5)
    second, _ = build(impl, versions, consumer, -1, 5, trace=trace, var="twin")
    for k in range(8):
        assert_tensor_equal(f"info['index'] of sample {k} of twins with one seed",
                            torch.as_tensor(first.sample(4)[1]["index"]).cpu(),
                            torch.as_tensor(second.sample(4)[1]["index"]).cpu(), trace)
