"""Fuzzing the checkpoint's metadata against every variant (differential, exact).

A checkpoint written by the reference is decoded, one to three of its values
are changed -- a key deleted or added, a number moved off by one, negated,
made huge or given another type, a list shortened or reversed, a tensor given
another dtype or shape or one changed element -- and the result is written
back as a well-formed checkpoint (valid JSON, checksums recomputed), so the
load gets past the file checks and reaches the state's own validation, where
the variants' load paths differ from the reference's.

The same fuzzed checkpoint is loaded into the reference and into each
variant, each holding other rows than the checkpoint's (every slot differs).
Then:

* either both refuse it, with ``CheckpointError``, and each buffer's whole
  state (rows, writer, trees, generator) is bit for bit as before,
* or both accept it, their states are equal bit for bit, and their next
  samples are equal.

Any other exception, a refusal by one side only, or a refused load that
changed something fails, with the mutation that caused it.
"""

from __future__ import annotations

import copy
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.adapters import load_adapter
from rbcheck.reference import CheckpointError
from rbcheck.reference.checkpoint import read_checkpoint, save_checkpoint

from .common import VARIANTS, cpu, specs
from .common import rows as _rows

SPECS = specs(6)


def rows(n: int, start: int = 0) -> TensorDict:
    return _rows(n, start, done=False)


def same(a, b) -> bool:
    """Deep equality of nested states, tensors bit for bit (NaN equals itself)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                b.contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------
# mutations of a decoded state
# --------------------------------------------------------------------------


def paths(obj, prefix=()):
    """Every position in the nested state: ``(path, value)``, containers included."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from paths(obj[k], (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, (*prefix, i))


def replaced(obj, path, value, delete=False):
    """A copy of ``obj`` with ``path`` set to ``value`` (or deleted)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        if delete and not rest:
            del out[head]
        else:
            out[head] = replaced(obj[head], rest, value, delete)
        return out
    out = list(obj)
    if delete and not rest:
        del out[head]
    else:
        out[head] = replaced(obj[head], rest, value, delete)
    return out


def tensor_mutations(t: torch.Tensor):
    # a 0-d tensor (an earlier mutation's "0-d") cannot be sliced: its empty is 1-d
    empty = t[:0].clone() if t.dim() else torch.empty(0, dtype=t.dtype)
    out = {"as list": t.tolist(), "0-d": torch.tensor(0, dtype=t.dtype), "empty": empty}
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8):
        if dtype != t.dtype:
            out[f"as {dtype}"] = t.to(dtype)
    if t.dim():
        out["first row dropped"] = t[1:].clone()
        out["a row added"] = torch.cat([t, t[:1]])
        out["a trailing dim"] = t.unsqueeze(-1).clone()
    if t.numel():
        flat = t.clone().reshape(-1)
        if t.dtype == torch.bool:
            flat[0] = ~flat[0]
            out["element 0 flipped"] = flat.reshape(t.shape)
        else:
            for name, v in (("+1", flat[0] + 1), ("= -1", -1), ("= 0", 0)):
                f = flat.clone()
                if t.dtype == torch.uint8 and name == "= -1":
                    v = 255
                f[0] = v
                out[f"element 0 {name}"] = f.reshape(t.shape)
            if t.is_floating_point():
                for name, v in (("nan", float("nan")), ("inf", float("inf"))):
                    f = flat.clone()
                    f[-1] = v
                    out[f"last element {name}"] = f.reshape(t.shape)
    return out


def value_mutations(v):
    """``{description: new value}`` for one position (None: delete it)."""
    if isinstance(v, torch.Tensor):
        return tensor_mutations(v)
    common = {"None": None, "a string": "x", "a list": [], "a dict": {}}
    if isinstance(v, bool):
        return {**common, "negated": not v, "as int": int(v)}
    if isinstance(v, int):
        return {**common, "+1": v + 1, "-1": v - 1, "0": 0, "negative": -v - 1, "2**63": 2**63,
                "as float": float(v), "as string": str(v), "True": True}
    if isinstance(v, float):
        out = {**common, "doubled": 2 * v, "negated": -v, "0.0": 0.0, "1e308": 1e308,
               "as string": repr(v)}
        if math.isfinite(v):
            out["as int"] = int(v)
        return out
    if isinstance(v, str):
        return {**common, "emptied": "", "changed": v + "x", "an int": 1}
    if isinstance(v, dict):
        return {"a key added": {**v, "unexpected": 1}, "emptied": {}, "a list": list(v.values())}
    if isinstance(v, list):
        out = {"emptied": [], "None": None}
        if v:
            out["last dropped"] = v[:-1]
            out["first repeated"] = [copy.deepcopy(v[0]), *v]  # a copy: no shared tensors
            if len(v) > 1:
                out["reversed"] = v[::-1]
        return out
    return common


@st.composite
def mutations(draw, state):
    """A fuzzed state and a description of what was changed."""
    done = []
    for step in range(draw(st.integers(1, 3), label="mutations")):
        where = list(paths(state))[1:]  # not the root itself
        path, value = draw(st.sampled_from(where), label=f"position {step}")
        options = value_mutations(value)
        kinds = sorted(options) + ["deleted"]
        kind = draw(st.sampled_from(kinds), label=f"mutation {step}")
        if kind == "deleted":
            state = replaced(state, path, None, delete=True)
        else:
            state = replaced(state, path, options[kind])
        done.append(f"state{''.join(f'[{p!r}]' for p in path)} {kind}")
    return state, done


class _Holder:
    """What ``save_checkpoint`` needs of a buffer: a state dict."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def _state(buf) -> dict:
    return cpu(buf.buffer.state_dict())


def _source_state(sampler: str) -> dict:
    ref = load_adapter("reference").make(SPECS[sampler])
    ref.extend(rows(5))
    if sampler == "prioritized":
        ref.update_priority(torch.tensor([1, 3]), torch.tensor([4.0, 0.0]))
    ref.sample(2)
    ref.extend(rows(3, 5))  # wraps the ring
    with tempfile.TemporaryDirectory() as tmp:
        ref.save(Path(tmp) / "ckpt")
        return read_checkpoint(Path(tmp) / "ckpt")


SOURCES = {name: _source_state(name) for name in SPECS}


def _targets(sampler: str):
    impls = {name: load_adapter(name) for name in ("reference", *VARIANTS)}
    out = {}
    for name, impl in impls.items():
        if not impl.has("save_load") or not impl.has(sampler):
            continue
        buf = impl.make(SPECS[sampler].but(seed=77))
        buf.extend(rows(4, 100))  # every slot differs from the checkpoint's rows
        out[name] = buf
    return out


def next_sample(buf, k: int = 4):
    """``("rows", rows, info)`` of the next sample on the CPU, or ``("error", type,
    message)`` when sampling raises (e.g. a loaded slice_len that does not divide k)."""
    try:
        rows_, info = buf.sample(k)
    except (ValueError, RuntimeError) as error:
        return ["error", type(error).__name__, str(error)]
    return ["rows", cpu(rows_.to_dict()), cpu(dict(info))]


@pytest.mark.parametrize("sampler", sorted(SPECS))
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_checkpoint_is_refused_alike_or_loaded_alike(sampler, data):
    """exact, differential: a checkpoint with fuzzed values loads into every
    variant exactly as into the reference, or is refused by all with
    CheckpointError and every buffer unchanged."""
    state, done = data.draw(mutations(SOURCES[sampler]), label="fuzzed state")
    note(f"mutations: {done}")
    tmp = Path(tempfile.mkdtemp(prefix="rbcheck-fuzz-"))
    try:
        try:
            save_checkpoint(_Holder(state), tmp / "ckpt")
        except CheckpointError:
            return  # not encodable (e.g. a non-finite number): no file to load
        outcome = {}
        for name, buf in _targets(sampler).items():
            before = _state(buf)
            try:
                buf.load(tmp / "ckpt")
            except CheckpointError as error:
                after = _state(buf)
                assert same(after, before), (
                    f"{name}: a refused load ({error}) left the state changed, but should leave it "
                    f"as before; mutations {done}")
                outcome[name] = ("refused", str(error))
            except Exception as error:  # noqa: BLE001 - the failure being looked for
                raise AssertionError(
                    f"{name}: load raised {type(error).__name__}: {error}, but should raise "
                    f"CheckpointError; mutations {done}") from error
            else:
                outcome[name] = ("loaded", buf)
        ref_kind = outcome["reference"][0]
        if ref_kind == "loaded":  # the reference's state and next sample, once
            ref = outcome["reference"][1]
            ref_state = _state(ref)
            ref_next = next_sample(ref)
        for name, (kind, detail) in outcome.items():
            assert kind == ref_kind, (
                f"{name}: load {kind}, but should be {ref_kind} as on the reference "
                f"({outcome['reference'][1] if ref_kind == 'refused' else 'loaded'}); mutations {done}")
            if kind == "loaded" and name != "reference":
                assert same(_state(detail), ref_state), (
                    f"{name}: state after load differs from the reference's; mutations {done}")
                assert same(next_sample(detail), ref_next), (
                    f"{name}: next sample after load differs from the reference's; mutations {done}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
