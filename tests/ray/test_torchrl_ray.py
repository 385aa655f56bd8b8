"""The TorchRL-Ray adapter itself (nox -s ray): Ray stays on this machine,
writers really run in other processes, buffers are fresh TorchRL buffers even
when an actor is reused, and shutdown leaves no Ray process behind."""

from __future__ import annotations

import os
import time

import pytest
import torch

ray = pytest.importorskip("ray", reason="ray is not installed (the 'ray' dependency group: nox -s ray)")
pytest.importorskip("torchrl", reason="torchrl is not installed (the 'torchrl' dependency group)")

from rbcheck.harness.adapters import load_adapter, torchrl_ray  # noqa: E402
from rbcheck.harness.concurrency import Workload, WriterJob, run_workload  # noqa: E402
from rbcheck.harness.concurrency_checks import make_rows  # noqa: E402
from rbcheck.harness.protocol import BufferSpec  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    yield load_adapter("torchrl-ray")
    torchrl_ray.shutdown()


def test_declares_concurrent_and_runs_it_here(adapter):
    assert "concurrent" in adapter.capabilities
    assert "concurrent" not in adapter.unavailable and "random" not in adapter.unavailable
    assert "ray" in adapter.version


def test_ray_listens_on_loopback_only(adapter):
    buf = adapter.make(BufferSpec(capacity=4))
    try:
        addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
        assert addresses == {"127.0.0.1"}, f"Ray node addresses={addresses}, but should be {{'127.0.0.1'}}"
        assert ray.cluster_resources().get("CPU") == (os.cpu_count() or 1)
    finally:
        buf.close()


def test_writers_run_in_other_processes(adapter):
    buf = adapter.make(BufferSpec(capacity=16))
    try:

        @ray.remote(num_cpus=0)
        def pid_of_a_task() -> int:
            return os.getpid()

        assert ray.get(pid_of_a_task.remote(), timeout=120) != os.getpid()
        handle = buf.spawn_writer(WriterJob(0, (3, 2), (0.0,), 2))
        assert handle.join_result(120) == [[0, 1, 2], [3, 4]]
        assert len(buf) == 5 and buf.write_count == 5
    finally:
        buf.close()


def test_a_reused_actor_holds_a_fresh_buffer(adapter):
    first = adapter.make(BufferSpec(capacity=8))
    first.extend(make_rows(0, 0, 6, 2))
    first.close()
    second = adapter.make(BufferSpec(capacity=4))
    try:
        assert (len(second), second.write_count, second.cursor) == (0, 0, 0)
        second.extend(make_rows(1, 0, 5, 2))
        assert (len(second), second.write_count, second.cursor) == (4, 5, 1)
    finally:
        second.close()


def test_a_reused_actor_too_busy_to_rebuild_is_replaced_by_a_fresh_one(adapter, monkeypatch):
    """A reused actor whose rebuild does not come back within REUSE_TIMEOUT_S (here 0 s:
    never) is killed and the buffer gets a fresh actor, with a fresh buffer in it."""
    first = adapter.make(BufferSpec(capacity=8))
    first.extend(make_rows(0, 0, 6, 2))
    reused = first.owner
    first.close()  # its actor goes back to the idle pool
    assert reused in torchrl_ray._idle
    monkeypatch.setattr(torchrl_ray, "REUSE_TIMEOUT_S", 0.0)
    second = adapter.make(BufferSpec(capacity=4))
    try:
        assert second.owner is not reused and reused not in torchrl_ray._idle
        assert not reused.is_alive
        assert (len(second), second.write_count, second.cursor) == (0, 0, 0)
        second.extend(make_rows(1, 0, 5, 2))
        assert (len(second), second.write_count, second.cursor) == (4, 5, 1)
    finally:
        second.close()


def test_a_run_is_bounded_and_reports_a_hang(adapter):
    buf = adapter.make(BufferSpec(capacity=8))
    try:
        record = run_workload(buf, Workload(writers=((2,),), delays=(5.0,)), timeout=1.0)
        assert any("still running" in e for e in record.errors), record.errors
    finally:
        buf.close()


def test_shutdown_leaves_no_ray_process(adapter):
    buf = adapter.make(BufferSpec(capacity=4))
    buf.close()
    node = ray._private.worker.global_worker.node
    pids = [p.process.pid for procs in node.all_processes.values() for p in procs]
    assert pids
    torchrl_ray.shutdown()
    assert not ray.is_initialized()
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.2)
    assert not alive, f"Ray processes still alive after shutdown={alive}, but should be none"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_an_error_raised_in_the_actor_comes_back_as_raised(adapter):
    """Ray wraps an actor's error in a class made anew for every raise; the
    adapter hands back the actor's own error (stable, so Hypothesis sees one
    bug, not a FlakyFailure) and the rows stay out of the info."""
    buf = adapter.make(BufferSpec(capacity=4, sampler="prioritized", alpha=0.6, beta=0.4, eps=1e-3))
    try:
        buf.extend(make_rows(0, 0, 4, 2))
        rows, info = buf.sample(2)
        assert "priority_weight" not in rows.keys() and "weight" in info
        raised = []
        for _ in range(2):
            with pytest.raises(RuntimeError) as caught:  # TorchRL's trees are float32
                buf.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0], dtype=torch.float64))
            raised.append(caught.value)
        assert [type(e) for e in raised] == [RuntimeError, RuntimeError], (
            f"error classes={[type(e) for e in raised]}, but should be the actor's RuntimeError each time")
        assert all(e.__context__ is None for e in raised)
    finally:
        buf.close()
