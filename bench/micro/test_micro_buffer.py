"""Micro-benchmarks of every replay-buffer operation, one pytest-benchmark
group per operation and size so implementations sit side by side.

Each test builds/fills its buffer outside the timed region, makes one untimed
call whose result is checked against the reference (``bench/workload.py``),
and only then times the operation. Parameters (implementation, capacity,
batch size, row width) come from ``conftest.py``, which runs the cases
implementation by implementation in this file's order, so operations on the
same kind of buffer (save/load after uniform sampling, update_priority after
prioritized sampling) reuse one filled buffer.
"""

from __future__ import annotations

import shutil

import torch

from bench import workload as wl


def test_extend(bench):
    buf = bench.entry("extend")["buf"]
    n = bench.batch_size
    data = wl.make_rows(n, bench.width, start=bench.capacity, device=bench.device)
    cursor, count = buf.cursor, buf.write_count
    if cursor != count % bench.capacity:  # the reference writer's ring
        wl.fail("cursor", cursor, f"write_count % capacity = {count % bench.capacity}", call=bench.where)
    index = bench.call_checked(lambda: buf.extend(data))
    expected = (cursor + torch.arange(n)) % bench.capacity
    if not torch.equal(torch.as_tensor(index).to("cpu"), expected):
        wl.fail("extend() slots", torch.as_tensor(index)[:5].tolist(), f"{expected[:5].tolist()}... (ring from the cursor)", call=bench.where)
    if buf.write_count != count + n or len(buf) != bench.capacity:
        wl.fail("(write_count, len)", (buf.write_count, len(buf)), (count + n, bench.capacity), call=bench.where)
    wl.check_rows_match(data.to("cpu"), buf.contents().to("cpu"), expected, bench.where)
    bench.time(lambda: buf.extend(data))


def test_add(bench):
    buf = bench.entry("add")["buf"]
    row = wl.make_rows(1, bench.width, start=bench.capacity, device=bench.device)[0]
    cursor = buf.cursor
    slot = bench.call_checked(lambda: buf.add(row))
    if int(slot) != cursor:
        wl.fail("add() slot", int(slot), cursor, call=bench.where)
    stored = buf.contents()[int(slot)]
    for key, value in row.items(True, True):
        if not torch.equal(stored.get(key).to("cpu"), value.to("cpu")):
            wl.fail(f"stored row[{key!r}]", "different", "the added row", call=bench.where)
    bench.time(lambda: buf.add(row))


def _sample(bench):
    entry = bench.entry()
    buf, b = entry["buf"], bench.batch_size
    rows, info = bench.call_checked(lambda: buf.sample(b))
    bench.check_sample(entry, rows, info)
    bench.time(lambda: buf.sample(b))


def test_sample_random(bench):
    _sample(bench)


def test_save(bench):
    buf = bench.entry()["buf"]
    path = bench.ckpt_path("save")
    try:
        bench.call_checked(lambda: buf.save(path))
        copy = bench.fresh()
        copy.load(path)
        wl.check_same_state(copy, buf, bench.where, prioritized=False)
        del copy
        bench.time(lambda: buf.save(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_load(bench):
    source = bench.entry()["buf"]
    path = bench.ckpt_path("load")
    try:
        source.save(path)
        target = bench.fresh()
        bench.call_checked(lambda: target.load(path))
        wl.check_same_state(target, source, bench.where, prioritized=False)
        bench.time(lambda: target.load(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_sample_prioritized(bench):
    _sample(bench)


def test_update_priority(bench):
    entry = bench.entry()
    buf, b, dev = entry["buf"], bench.batch_size, bench.device
    g = torch.Generator().manual_seed(11)
    index = torch.randperm(bench.capacity, generator=g)[:b]
    priority = torch.rand(b, generator=g) * 3.0 + 0.01
    index_d, priority_d = index.to(dev), priority.to(dev)
    original = wl.raw_priorities(bench.capacity).to(torch.float32)[index].to(dev)
    try:
        bench.call_checked(lambda: buf.update_priority(index_d, priority_d))
        want = wl.reference_stored_after_update(bench.capacity, index, priority)
        wl.check_priorities(buf.stored_priority(index_d), want, bench.where,
                            wl.priority_dtype(bench.adapter))
        bench.time(lambda: buf.update_priority(index_d, priority_d))
    finally:  # leave the buffer as the other benchmarks expect it
        buf.update_priority(index_d, original)


def test_sample_slice(bench):
    _sample(bench)
