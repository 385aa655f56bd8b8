"""A save killed at any moment leaves the previous checkpoint loadable and
bit-identical (exact).

* Deterministic: a forked writer is SIGKILLed at its k-th filesystem
  operation (an audit hook counts opens, mkdirs, renames, removals), for
  every k of a save. Before the ``CURRENT`` swap the directory loads as the
  previous checkpoint, after it as the new one, bit for bit (``state_dict``:
  storage, writer and generations, trees, max priority, generator); the
  next save cleans the leftovers.
* Random: a forked writer saves a ~24 MB buffer over and over and is
  SIGKILLed at random moments, mid-write included; the directory then loads
  exactly as one of the last two saves.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import time

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.checkpoint_damage import FS_EVENTS, interrupted_save, interrupted_save_here
from rbcheck.reference import PrioritizedSampler, ReplayBuffer, checkpoint

from ..unit.test_buffer import same

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def rows(n: int, start: int = 0, width: int = 4) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"obs": x.float()[:, None].expand(n, width).clone(), "act": x,
                       "episode": x // 4}, batch_size=[n])


def prioritized(capacity: int = 16, seed: int = 1) -> ReplayBuffer:
    return ReplayBuffer(capacity, sampler=PrioritizedSampler(capacity, 0.6, 0.4), generator=seed)


class Saving:
    """The ``save`` that :func:`interrupted_save` calls."""

    def __init__(self, rb):
        self.rb = rb

    def save(self, path):
        self.rb.dumps(path)


def operations_of_a_save(rb, path) -> list[str]:
    """The audited filesystem events of one save, in order (in a forked child)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.close(read)
            events = []
            sys.addaudithook(lambda event, args: events.append(event) if event in FS_EVENTS else None)
            rb.dumps(path)
            os.write(write, ",".join(events).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        events = pipe.read().split(",")
    os.waitpid(pid, 0)
    return events


#: The fork (a SIGKILLed child) and the in-process kill used once CUDA is
#: initialised (the folder put back as it was on disk at the kill).
INTERRUPTERS = pytest.mark.parametrize("interrupt", [interrupted_save, interrupted_save_here],
                                       ids=["forked", "in-process"])


@INTERRUPTERS
def test_kill_at_every_filesystem_operation(tmp_path, interrupt):
    """exact: for every k, a save SIGKILLed at its k-th filesystem operation
    leaves the previous checkpoint (k before the pointer swap) or the new one
    (after it), bit-identical; the next save leaves one clean checkpoint. The
    in-process kill gives the same outcomes as the forked one."""
    a = prioritized()
    a.extend(rows(20))
    a.sample(5)
    a.update_priority(torch.tensor([2, 9]), torch.tensor([7.0, 0.0]))
    b = prioritized()
    b.load_state_dict(a.state_dict())
    b.extend(rows(3, 100))
    b.sample(2)
    state_a, state_b = a.state_dict(), b.state_dict()
    a.dumps(tmp_path / "probe")
    events = operations_of_a_save(b, tmp_path / "probe")
    swap = events.index("os.rename") + 1  # the k at which the kill lands just before os.replace
    assert 5 <= swap < len(events), events
    for k in range(1, len(events) + 2):
        path = tmp_path / f"k{k}"
        a.dumps(path)
        outcome = interrupt(Saving(b), path, k, kill=True)
        assert outcome == ("completed" if k > len(events) else "interrupted"), (k, outcome, events)
        loaded = prioritized(seed=99)
        loaded.loads(path)
        want = state_a if k <= swap else state_b
        assert same(loaded.state_dict(), want), f"killed at operation {k} ({events[k - 1:k]}): wrong state"
        (s1, i1), (s2, i2) = loaded.sample(4), _twin(want).sample(4)  # the generator came back too
        assert (s1 == s2).all() and same(i1, i2)
        b.dumps(path)  # the next save succeeds and removes every leftover
        names = sorted(p.name for p in path.iterdir())
        assert names[0] == "CURRENT" and len(names) == 2 and names[1].startswith("ckpt-"), names


class DeleteThenWrite(Saving):
    """Not atomic: removes the previous checkpoint, then writes the new one."""

    def save(self, path):
        shutil.rmtree(path)
        self.rb.dumps(path)


@INTERRUPTERS
def test_a_kill_finds_a_save_that_is_not_atomic(tmp_path, interrupt):
    """The injected kill can fail: a save that deletes the previous
    checkpoint before writing the new one, killed at some filesystem
    operation, leaves a folder that does not load."""
    a, b = prioritized(), prioritized(seed=2)
    a.extend(rows(5))
    b.extend(rows(7))
    broken = []
    for k in range(1, 40):
        path = tmp_path / f"k{k}"
        a.dumps(path)
        if interrupt(DeleteThenWrite(b), path, k, kill=True) != "interrupted":
            break
        try:
            prioritized(seed=3).loads(path)
        except Exception:  # noqa: BLE001 - whatever the reader's refusal is
            broken.append(k)
    assert broken, "a kill at some operation of a delete-then-write save should leave nothing loadable"


def _twin(state) -> ReplayBuffer:
    rb = prioritized(seed=42)
    rb.load_state_dict(state)
    return rb


WIDTH, CAPACITY = 3072, 2048  # 24 MiB of observations


def test_sigkill_at_random_moments_during_large_saves(tmp_path):
    """exact: a writer saving a large buffer again and again, SIGKILLed at
    random moments (mid-write included), leaves a checkpoint that loads as
    exactly one of the two most recent saves."""
    base = ReplayBuffer(CAPACITY, generator=3)
    base.extend(rows(CAPACITY, 0, WIDTH))
    rng = random.Random(1234)
    path = tmp_path / "ckpt"
    for round_ in range(3):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer: saves until killed, never returns into pytest
            try:
                os.close(read)
                torch.set_num_threads(1)
                for i in range(1, 10**6):
                    base.add(rows(1, 10_000 * (round_ + 1) + i, WIDTH)[0])
                    base.dumps(path)
                    os.write(write, f"{i}\n".encode())
            finally:
                os._exit(1)
        os.close(write)
        with os.fdopen(read) as pipe:
            first = int(pipe.readline())  # one complete save, then kill at a random moment
            time.sleep(rng.uniform(0.0, 0.25))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            done = [first] + [int(line) for line in pipe.read().split()]
        last = done[-1]
        loaded = ReplayBuffer(CAPACITY)
        loaded.loads(path)
        assert loaded.write_count - base.write_count in (last, last + 1), (loaded.write_count, last)
        expected = ReplayBuffer(CAPACITY, generator=3)
        expected.load_state_dict(base.state_dict())
        for i in range(1, loaded.write_count - base.write_count + 1):
            expected.add(rows(1, 10_000 * (round_ + 1) + i, WIDTH)[0])
        assert same(loaded.state_dict(), expected.state_dict())
        base = expected  # the next round continues from what is on disk
        assert len(list(path.glob("ckpt-*"))) <= 2
    assert checkpoint.read_checkpoint(path)["writer"]["write_count"] == base.write_count
