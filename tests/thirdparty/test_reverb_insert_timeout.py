"""Reverb R1 (docs/bugs.toml, a documented convention), dm-reverb 0.14.0,
executed: an insert whose ``TrajectoryWriter.flush(timeout_ms=...)`` times
out is not withdrawn; the server inserts it once the rate limiter admits it.
``flush``'s docstring says so ("although the block is interrupted, the
insertion of the items will proceed in the background",
reverb/trajectory_writer.py:403-406): the server's insert stream calls
``table->InsertOrAssign(item)`` with an infinite timeout
(reverb/cc/reverb_service_impl.cc:207). The spec (reference/served_table.py)
says a timed-out call changes nothing; the Reverb adapters declare
``Conventions.timed_out_insert="lands_later"`` and test_rate_limiter checks
them in those terms. Nothing here sleeps: the landed insert is observed by a
sample that waits for it (up to ``LONG_MS``); were it withdrawn, that sample
would time out and the test fail. Skipped where dm-reverb is not installed:
``nox -s "thirdparty_env(env='reverb')"`` runs it in Reverb's own environment."""

from __future__ import annotations

import numpy as np
import pytest

reverb = pytest.importorskip("reverb", reason="dm-reverb is not installed (nox -s thirdparty installs it in its own "
                                              "environment)")
tf = pytest.importorskip("tensorflow")
portpicker = pytest.importorskip("portpicker")

LONG_MS, SHORT_MS = 10_000, 100


def insert(client, i: int, timeout_ms: int) -> bool:
    """One item through a trajectory writer: True when its flush confirmed it, False on DeadlineExceeded."""
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


def sample_ids(address: str, timeout_ms: int) -> list[int]:
    """One sample, waiting at most ``timeout_ms`` on the rate limiter: [id], or [] when it timed out."""
    ds = reverb.TrajectoryDataset.from_table_signature(address, "q", max_in_flight_samples_per_worker=1,
                                                       num_workers_per_iterator=1, max_samples=1,
                                                       rate_limiter_timeout_ms=timeout_ms)
    return [int(s.data["id"].numpy()[0]) for s in ds.take(1)]


def test_a_timed_out_insert_lands_once_admitted():
    port = portpicker.pick_unused_port()
    table = reverb.Table.queue("q", max_size=1, signature={"id": tf.TensorSpec([1], tf.int64)})
    server = reverb.Server(tables=[table], port=port)
    try:
        address = f"localhost:{port}"
        client = reverb.Client(address)
        assert insert(client, 0, LONG_MS), "the first insert into an empty Queue(1) was not confirmed"
        assert not insert(client, 1, SHORT_MS), "an insert into a full Queue(1) was confirmed, but should time out"
        assert sample_ids(address, LONG_MS) == [0]  # makes room: the timed-out insert is admitted now
        got = sample_ids(address, LONG_MS)
        assert got == [1], (f"the next sample={got}, but should be [1]: the timed-out insert lands once admitted "
                            f"(documented, trajectory_writer.py:403-406)")
    finally:
        server.stop()
