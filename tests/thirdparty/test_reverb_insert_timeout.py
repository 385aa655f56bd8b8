"""Executed repro of Reverb finding R1 (docs/findings.md), dm-reverb 0.14.0:
an insert whose ``TrajectoryWriter.flush(timeout_ms=...)`` times out is not
withdrawn; the server inserts it once the rate limiter admits it. The spec
(reference/served_table.py) says a call not admitted in time changes nothing.
Skipped where dm-reverb is not installed: ``nox -s thirdparty`` runs it in
Reverb's own environment (TensorFlow 2.15)."""

from __future__ import annotations

import numpy as np
import pytest

reverb = pytest.importorskip("reverb", reason="dm-reverb is not installed (nox -s thirdparty installs it in its own "
                                              "environment)")
portpicker = pytest.importorskip("portpicker")

VERSION = "dm-reverb 0.14.0"




def insert(client, i: int, timeout_ms: int) -> bool:
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    try:
        writer.append({"id": np.int64(i)})
        writer.create_item("q", 1.0, {"id": writer.history["id"][-1:]})
        writer.flush(timeout_ms=timeout_ms)
        return True
    except reverb.errors.DeadlineExceededError:
        return False
    finally:
        writer.close()


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason=f"{VERSION}: the server inserts with an infinite rate-limiter timeout "
                          "(reverb/cc/reverb_service_impl.cc:207, table->InsertOrAssign(item)); the writer's "
                          "flush timeout bounds only the wait for confirmation (trajectory_writer.h:158-170)")
def test_a_timed_out_insert_changes_nothing():
    port = portpicker.pick_unused_port()
    server = reverb.Server(tables=[reverb.Table.queue("q", max_size=1)], port=port)
    try:
        client = reverb.Client(f"localhost:{port}")
        assert insert(client, 0, 5000)  # the queue holds one item
        assert not insert(client, 1, 100)  # refused by Queue(1): flush times out
        got = [int(s[0].data[0]) for s in client.sample("q", num_samples=1)]  # makes room
        assert got == [0]
        size = client.server_info()["q"].current_size
        assert size == 0, f"table size after the timed-out insert and one sample={size}, but should be 0"
    finally:
        server.stop()
