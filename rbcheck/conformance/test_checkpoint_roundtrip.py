"""Seed invariant 1: save -> load round-trips exactly, and the checkpoint is
plain JSON metadata plus tensors, with no pickle anywhere."""

from __future__ import annotations

import json
import math
import pickletools
import re
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import (
    Trace,
    assert_same,
    assert_td_equal,
    assert_tensor_equal,
    fail,
)
from rbcheck.harness.oracle import PriorityOracle, reads_back
from rbcheck.harness.stateful import declared_samplers, replay
from rbcheck.harness.strategies import layouts, operations, specs

pytestmark = pytest.mark.requires("save_load")

#: the first bytes of a zip archive (what torch.save writes)
ZIP_HEADER = b"PK\x03\x04"
PLAIN = (str, int, float, bool, type(None))
#: ``str(tensor)`` ("tensor([1., 2.])"); a dtype's name ("torch.uint8", as
#: tensordict's memmap metadata writes it) is plain data, not a tensor.
STRINGIFIED_TENSOR = re.compile(r"\btensor\(")


def _draw_filled_buffer(impl, data):
    spec = data.draw(specs(declared_samplers(impl), conventions=impl.conventions), label="spec")
    layout = data.draw(layouts(), label="layout")
    spec = spec.but(layout=layout.spec_layout())
    ops = data.draw(
        operations(spec.capacity, prioritized=spec.sampler == "prioritized", conventions=impl.conventions),
        label="operations",
    )
    trace = Trace(impl, spec)
    layout = trace.source("layout", layout)
    buf = trace.wrap(impl.make(spec))
    oracle = PriorityOracle(spec, impl.conventions) if spec.sampler == "prioritized" else None
    next_id = replay(buf, layout, ops, trace, conventions=impl.conventions, oracle=oracle)
    can_sample = oracle is None or bool((oracle.leaves() > 0).any())  # eps = 0 and all 0: no draw
    return spec, layout, trace, buf, next_id, can_sample


def _checkpoint_path(tmp: str, trace: Trace) -> Path:
    """``tmp / 'ckpt'``, named ``path`` in the snippet (which makes its own ``tmp``)."""
    trace.directory(tmp)
    return trace.let("path", Path(tmp) / "ckpt", "tmp / 'ckpt'")


def _compare_state(what: str, got, want, spec, trace: Trace, impl) -> None:
    assert_same(f"len({what})", len(got), len(want), trace)
    assert_same(f"{what}.cursor", got.cursor, want.cursor, trace)
    assert_same(f"{what}.write_count", got.write_count, want.write_count, trace)
    if len(want):
        assert_td_equal(f"{what}.contents()", got.contents(), want.contents(), trace)
    if reads_back(spec, impl):  # capability "priority_readback"
        slots = torch.arange(spec.capacity)
        assert_tensor_equal(
            f"{what}.stored_priority(all slots)",
            got.stored_priority(slots),
            want.stored_priority(slots),
            trace,
        )
        assert_same(f"{what}.max_priority", got.max_priority, want.max_priority, trace)


@pytest.mark.conventions("seedable")
@given(data=st.data())
def test_save_load_round_trips_exactly(impl, data):
    """exact: after save(path) and load(path) into a fresh buffer (optionally
    one that already holds other rows), length, cursor, write count, contents
    (bit-identical, same dtypes and devices), stored priorities (all slots,
    bit-identical), max priority (a float stays a float) and the RNG are the
    same: the next samples and the next write slots are identical. An
    adapter declaring ``seedable=False`` gets every check but the next
    samples (its cell says so: ``[convention: seedable=False]``)."""
    spec, layout, trace, buf, next_id, can_sample = _draw_filled_buffer(impl, data)
    dirty = data.draw(st.booleans(), label="load into a buffer that already holds rows")
    k = data.draw(st.integers(1, 6), label="next sample size")
    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint_path(tmp, trace)
        buf.save(path)
        fresh = trace.make(spec.but(seed=spec.seed + 1), "buf2")
        if dirty:
            fresh.extend(layout.batch(10_000, 1))
        fresh.load(path)
        _compare_state("loaded", fresh, buf, spec, trace, impl)
        if len(buf) and can_sample and impl.conventions.seedable:
            for round_ in range(2):
                trace.note(f"round {round_}")
                rows_a, info_a = buf.sample(k)
                rows_b, info_b = fresh.sample(k)
                assert_td_equal("loaded.sample() rows", rows_b, rows_a, trace)
                if sorted(info_b) != sorted(info_a):
                    fail("sorted(loaded.sample() info)", sorted(info_b), sorted(info_a), trace)
                for key in sorted(info_a):
                    assert_tensor_equal(
                        f"loaded.sample() info[{key!r}]", info_b[key], info_a[key], trace
                    )
        n = min(3, spec.capacity)
        assert_tensor_equal(
            "loaded.extend(...) slots",
            fresh.extend(layout.batch(next_id, n)).cpu(),
            buf.extend(layout.batch(next_id, n)).cpu(),
            trace,
        )


def _plain(value, where: str, trace: Trace) -> None:
    """Only dict/list/str/int/float/bool/None, finite floats, str keys, and no
    stringified tensors (``"tensor(...)"``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                fail(f"type of key {key!r} in {where}", type(key).__name__, "str", trace)
            _plain(item, f"{where}[{key!r}]", trace)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]", trace)
    elif not isinstance(value, PLAIN):
        fail(f"type({where})", type(value).__name__, "a plain JSON type", trace)
    elif isinstance(value, float) and not math.isfinite(value):
        fail(where, value, "a finite number (JSON has no NaN/inf)", trace)
    elif isinstance(value, str) and STRINGIFIED_TENSOR.search(value):
        fail(where, value, "plain data, not a stringified tensor", trace)


def is_pickle(blob: bytes) -> bool:
    """True when ``blob`` parses as one complete pickle stream (any protocol):
    a PROTO header 0x80 <2..5> or a protocol-0/1 opcode, then opcodes up to
    the final STOP."""
    if not blob or (blob[0] == 0x80 and (len(blob) < 2 or blob[1] not in range(2, 6))):
        return False
    try:
        last = None
        for op, _, pos in pickletools.genops(blob):
            last = (op.name, pos)
    except Exception:
        return False
    return last is not None and last[0] == "STOP" and last[1] == len(blob) - 1


#: opcodes that make a pickle import or call something (what makes loading it unsafe)
_IMPORTING = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX"}


def embedded_pickle(blob: bytes, limit: int = 20_000) -> int | None:
    """The offset of a complete pickle stream (protocol 2 to 5) that imports
    or calls something, found anywhere inside ``blob`` (e.g. a pickle stored
    as a byte dataset inside an HDF5 or npz container), or None. A stream
    must parse from its PROTO header to its STOP and hold an importing opcode,
    so tensor bytes that merely contain 0x80 0x04 do not count."""
    start, tried = 0, 0
    while tried < limit:
        i = blob.find(b"\x80", start)
        if i < 0 or i + 1 >= len(blob):
            return None
        start, tried = i + 1, tried + 1
        if blob[i + 1] not in range(2, 6):
            continue
        names = set()
        try:
            for op, _, _pos in pickletools.genops(blob[i:]):
                names.add(op.name)
                if op.name == "STOP":
                    break
        except Exception:  # noqa: BLE001 - not a pickle stream at this offset
            continue
        if "STOP" in names and names & _IMPORTING:
            return i
    return None


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


@given(data=st.data())
def test_checkpoint_metadata_is_plain_json(impl, data):
    """exact: saving succeeds, at least one .json file exists, and every .json
    file of the checkpoint decodes with the json module (no NaN/Infinity) and
    holds only plain types (no stringified tensors). After load, scalar state
    keeps its Python type (cursor/write_count int, max_priority float) and
    every column its dtype. (Pickles are test_checkpoint_holds_no_pickle's.)"""
    spec, layout, trace, buf, _, _ = _draw_filled_buffer(impl, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint_path(tmp, trace)
        buf.save(path)
        files = [p for p in Path(tmp).rglob("*") if p.is_file()]
        json_files = [p for p in files if p.suffix == ".json"]
        if not json_files:
            fail(
                "checkpoint .json files",
                [p.name for p in files],
                "at least one metadata .json",
                trace,
            )
        for p in json_files:
            rel = p.relative_to(tmp).as_posix()
            try:
                meta = json.loads(p.read_text(encoding="utf-8"), parse_constant=_reject_constant)
            except ValueError as err:
                fail(f"json.loads({rel})", f"<{type(err).__name__}: {err}>", "plain JSON", trace)
            _plain(meta, rel, trace)
        fresh = trace.make(spec, "buf2")
        fresh.load(path)
        assert_same("type(loaded.cursor)", type(fresh.cursor).__name__, "int", trace)
        assert_same("type(loaded.write_count)", type(fresh.write_count).__name__, "int", trace)
        if reads_back(spec, impl):
            assert_same(
                "type(loaded.max_priority)", type(fresh.max_priority).__name__, "float", trace
            )
        if len(buf):
            got, want = fresh.contents(), buf.contents()
            for key, value in want.items(include_nested=True, leaves_only=True):
                assert_same(
                    f"loaded.contents()[{key!r}].dtype",
                    str(got.get(key).dtype),
                    str(value.dtype),
                    trace,
                )


@given(data=st.data())
def test_checkpoint_holds_no_pickle(impl, data):
    """exact: no file of the checkpoint is a pickle (one complete pickle
    stream, any protocol) or holds one (an importing pickle stream embedded
    anywhere, e.g. in an HDF5 dataset, as tianshou's checkpoints do), is a
    torch.save zip archive, or is named like one (.pt, .pth, .pkl, .pickle)."""
    spec, layout, trace, buf, _, _ = _draw_filled_buffer(impl, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint_path(tmp, trace)
        buf.save(path)
        for p in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
            rel = p.relative_to(tmp).as_posix()
            blob = p.read_bytes()
            if is_pickle(blob):
                fail(
                    f"format of {rel}",
                    "<a pickle stream>",
                    "JSON or safetensors, never pickle",
                    trace,
                )
            inside = embedded_pickle(blob)
            if inside is not None and blob[:4] != ZIP_HEADER:
                fail(
                    f"format of {rel}",
                    f"<a pickle stream inside it, at byte {inside}>",
                    "JSON or safetensors, never pickle (not even embedded in a container)",
                    trace,
                )
            if blob[:4] == ZIP_HEADER:
                fail(
                    f"header of {rel}",
                    blob[:4],
                    "a JSON or safetensors file, not a torch.save zip",
                    trace,
                )
            if p.suffix in (".pt", ".pth", ".pkl", ".pickle"):
                fail("checkpoint file", rel, "no torch.save / pickle files", trace)
