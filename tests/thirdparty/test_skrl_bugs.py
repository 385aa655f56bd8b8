"""Executed repros of the skrl 2.1.1 bugs in docs/findings.md (strict
xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern). Skipped where skrl is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("skrl", reason="skrl is not installed (nox -s thirdparty installs it)")
from skrl.memories.torch import RandomMemory  # noqa: E402

VERSION = "skrl 2.1.1"


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def memory(capacity: int, *names: str) -> RandomMemory:
    mem = RandomMemory(memory_size=capacity, num_envs=1, device="cpu", replacement=True)
    for name in names:
        mem.create_tensor(name, size=1, dtype=torch.float32)
    return mem


@bug("add_samples' single-environment multi-sample branch advances memory_index inside the loop over "
     "the fields (skrl/memories/torch/base.py:235-249): the second field is written after the first, "
     "so one row's fields land in different slots")
def test_rows_of_two_fields_stay_together():
    mem = memory(4, "a", "b")
    rows = torch.arange(3.0).reshape(3, 1)
    mem.add_samples(a=rows, b=rows)
    assert len(mem) == 3
    assert torch.equal(mem.tensors_view["a"][:3], rows) and torch.equal(mem.tensors_view["b"][:3], rows)


@bug("a multi-sample add that wraps sets memory_index = remaining_samples but never filled = True "
     "(skrl/memories/torch/base.py:243-247, :265-267): len() forgets the rows it holds")
def test_wrapping_batch_fills_the_memory():
    mem = memory(4, "a")
    mem.add_samples(a=torch.arange(6.0).reshape(6, 1))
    assert len(mem) == 4
    assert sorted(mem.tensors_view["a"].flatten().tolist()) == [2.0, 3.0, 4.0, 5.0]


@bug("no check of the arguments: memory_size 0 or negative builds a memory (base.py:50-57), "
     "sample(batch_size=0) returns an empty batch (random.py:71), a row of another dtype is cast by "
     "copy_ (base.py:226-246)")
@pytest.mark.parametrize("case", ["capacity_zero", "batch_size_zero", "wrong_dtype"])
def test_bad_arguments_are_refused(case):
    def call():
        if case == "capacity_zero":
            return memory(0, "a")
        mem = memory(4, "a")
        mem.add_samples(a=torch.ones(2, 1))
        if case == "batch_size_zero":
            return mem.sample(["a"], batch_size=0)
        return mem.add_samples(a=torch.ones(2, 1, dtype=torch.float64))

    try:
        call()
    except Exception:  # noqa: BLE001 - any refusal will do
        return
    raise AssertionError(f"{case} was accepted, but should be refused")
