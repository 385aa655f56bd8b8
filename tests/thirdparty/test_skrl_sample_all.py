"""Executed repro of skrl 2.1.1's ``Memory.sample_all`` on a memory that is
not full (docs/bugs.toml K4; property
test_sample_all::test_sample_all_gives_every_held_row_once_in_slot_order):
it returns the whole allocated memory, rows never written included (a float
field starts filled with NaN, base.py:168-170), although ``len(memory)``
knows how many rows are held (base.py:74-84). A strict xfail stating the
spec's behaviour (reference/sample_all.py). Skipped where skrl is not
installed: ``nox -s thirdparty``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("skrl", reason="skrl is not installed (nox -s thirdparty installs it)")
from skrl.memories.torch import RandomMemory  # noqa: E402

VERSION = "skrl 2.1.1"


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason=f"{VERSION}: sample_all slices tensors_view by memory_size * num_envs, not by len(memory) "
                          "(skrl/memories/torch/base.py:334 with mini_batches > 1, :340 otherwise)")
@pytest.mark.parametrize("mini_batches", [1, 2])
def test_sample_all_of_a_memory_not_full_gives_only_the_rows_written(mini_batches):
    mem = RandomMemory(memory_size=8, num_envs=1, device="cpu", replacement=True)
    mem.create_tensor("x", size=1, dtype=torch.float32)
    for i in range(4):  # one row at a time: skrl's single-row branch
        mem.add_samples(x=torch.tensor([[float(i)]]))
    assert len(mem) == 4
    got = torch.cat([batch[0] for batch in mem.sample_all(["x"], mini_batches=mini_batches)]).flatten().tolist()
    assert got == [0.0, 1.0, 2.0, 3.0], (f"sample_all(mini_batches={mini_batches}) of a memory holding 4 of 8 "
                                         f"rows={got}, but should be [0.0, 1.0, 2.0, 3.0] (rows never written "
                                         f"are NaN)")
