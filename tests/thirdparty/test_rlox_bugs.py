"""Executed repros of the rlox 1.2.0 bugs in docs/findings.md (strict
xfails stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern). Source lines are of crates/rlox-core/src/buffer/; the panics'
own messages name the same lines. A Rust panic reaches Python as
``pyo3_runtime.PanicException``, a BaseException (no ``except Exception``
catches it): each call is wrapped to turn it into the AssertionError the
xfail expects. Skipped where rlox is not installed: ``nox -s thirdparty``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rlox", reason="rlox is not installed (nox -s thirdparty installs it)")
import rlox  # noqa: E402

VERSION = "rlox 1.2.0"
ACTION = np.zeros(1, np.float32)


def bug(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"{VERSION}: {reason}")


def call(what: str, fn):
    """``fn()``; a Rust panic (a BaseException) becomes an AssertionError naming it."""
    try:
        return fn()
    except Exception:
        raise
    except BaseException as err:  # noqa: BLE001 - pyo3's PanicException is no Exception
        raise AssertionError(f"{what} panicked ({type(err).__name__}: {err}), but should return "
                             f"or raise an Exception") from None


def per(priorities: list[float]) -> rlox.PrioritizedReplayBuffer:
    buf = rlox.PrioritizedReplayBuffer(len(priorities), 1, 1, alpha=1.0, beta=1.0)
    for i in range(len(priorities)):
        buf.push(np.array([i], np.float32), ACTION, 0.0, False, False)
    buf.update_priorities(np.arange(len(priorities), dtype=np.uint64), np.array(priorities, np.float64))
    return buf


@bug("with every held priority 0 (accepted by push and update_priorities, priority.rs:200-204, :355-358) "
     "sample panics: segment = total / batch_size is 0 and rng.random_range(lo..hi) is an empty range "
     "(priority.rs:284, :304-306)")
def test_sample_with_every_priority_zero_is_an_error_not_a_panic():
    buf = per([0.0, 0.0])
    try:
        call("sample(1) with every priority 0", lambda: buf.sample(1, 0))
    except AssertionError:
        raise
    except Exception:  # noqa: BLE001 - a clear error is the spec's answer
        return


@bug("a held priority of 0 makes tree_min_prob fall back to 1/count (priority.rs:376-386), not the "
     "smallest non-zero probability: max_weight is too small and weights exceed 1")
def test_weights_are_at_most_one_when_a_priority_is_zero():
    out = per([0.0, 1.0, 2.0, 4.0]).sample(4, 1)
    weights = np.asarray(out["weights"], np.float64)
    # held probabilities 0, 1/7, 2/7, 4/7: the largest weight over the slots that can be drawn is 1
    assert weights.max() <= 1.0 + 1e-6, f"weights={weights.tolist()}, but should be at most 1"


@bug("MmapReplayBuffer::new accepts total_capacity == hot_capacity (mmap.rs:78), and the first spill "
     "writes a record into a cold file of 0 records: a slice out of range panics (mmap.rs:305; then "
     "% cold_capacity of 0, :325)")
def test_mmap_with_no_cold_room_keeps_the_last_rows(tmp_path):
    buf = rlox.MmapReplayBuffer(1, 1, 1, 1, str(tmp_path / "cold.bin"))
    for i in range(2):
        call(f"push of row {i}", lambda i=i: buf.push(np.array([i], np.float32), ACTION, 0.0, False, False))
    assert len(buf) == 1
    assert call("sample(1)", lambda: buf.sample(1, 0))["obs"].ravel().tolist() == [1.0]


@bug("a cold file truncated under the buffer is not noticed: the next push writes through the old "
     "map (mmap.rs:298-305), and sample maps the short file again and slices past its end: a panic "
     "(mmap.rs:414), not an error naming the file")
def test_truncated_cold_file_is_a_clear_error(tmp_path):
    path = tmp_path / "cold.bin"
    buf = rlox.MmapReplayBuffer(1, 4, 1, 1, str(path))
    for i in range(4):
        buf.push(np.array([i], np.float32), ACTION, 0.0, False, False)
    import os

    os.truncate(path, 1)
    try:
        call("push after the truncation", lambda: buf.push(np.zeros(1, np.float32), ACTION, 0.0, False, False))
        call("sample(4) after the truncation", lambda: buf.sample(4, 0))
    except AssertionError:
        raise
    except Exception as err:  # noqa: BLE001 - a clear error naming the file is the spec's answer
        assert "cold.bin" in str(err), f"error={err!s}, but should name the file"
        return
    raise AssertionError("push and sample after the cold file was truncated returned, but should raise")


@bug("an I/O error of the cold file (a full disk) is raised as 'I/O error: File too large (os error 27)': "
     "mmap.rs:349-357 hands the std::io::Error on with ?, adding no path, so the error names neither the "
     "file nor its directory")
def test_full_disk_error_names_the_cold_file(tmp_path):
    from rbcheck.harness.disk_checks import disk_full_reason, file_size_limit

    if disk_full_reason():
        pytest.skip(disk_full_reason())
    path = tmp_path / "cold.bin"
    try:
        with file_size_limit(64 * 1024):  # a full disk for this process: no file past 64 KiB
            buf = call("MmapReplayBuffer(hot 1, total 256, obs 1024)",
                       lambda: rlox.MmapReplayBuffer(1, 256, 1024, 1, str(path)))
            for i in range(256):
                call(f"push of row {i}", lambda: buf.push(np.zeros(1024, np.float32), ACTION, 0.0, False, False))
    except AssertionError:
        raise
    except Exception as err:  # noqa: BLE001 - refused: the error must say which file
        assert "cold.bin" in str(err) or str(tmp_path) in str(err), \
            f"error={err!s}, but should name the cold file or its directory [{path}]"
        return
    raise AssertionError(f"256 rows of 4 KiB written under a 64 KiB file limit, but the write should be refused [{path}]")
