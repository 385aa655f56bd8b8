"""The buffers and the observable state of the checkpoint properties
(``rbcheck/conformance/test_checkpoint_faults.py`` and
``test_checkpoint_user_files.py``): :func:`source` (the buffer saved),
:func:`target` (the buffer loaded into), :func:`snapshot` (everything a load
must restore or leave alone) and :func:`difference` (the first observable
that differs, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import fail
from rbcheck.harness.oracle import reads_back
from rbcheck.harness.protocol import BufferSpec

__all__ = ["rows", "spec_for", "source", "target", "made", "DRAWS", "snapshot", "untouched", "difference",
           "first_difference"]


def rows(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"obs": torch.stack([x.float(), x.float() / 3], 1), "action": x,
                       "episode": x // 3}, batch_size=[n])


def spec_for(impl) -> BufferSpec:
    sampler = "prioritized" if impl.has("prioritized") else "random"
    return BufferSpec(capacity=8, sampler=sampler, alpha=0.7, beta=0.5, eps=1e-3, seed=11)


def source(impl, spec: BufferSpec, extra: int = 0, trace=None, var: str | None = None):
    """The buffer whose checkpoint is damaged (``extra`` rows more: state B).
    With a ``trace``, a recording buffer (:func:`made`)."""
    buf = made(impl, spec, trace, var)
    buf.extend(_rows(trace, 6))
    if spec.sampler == "prioritized":
        buf.update_priority(torch.tensor([1, 4]), impl.conventions.priorities([5.0, 0.5]))
    buf.sample(3)
    if extra:
        buf.extend(_rows(trace, extra, 50))
    return buf


def target(impl, spec: BufferSpec, trace=None, var: str | None = "target"):
    """A buffer holding other rows, loaded into (recording, with a ``trace``)."""
    buf = made(impl, spec.but(seed=spec.seed + 1), trace, var)
    buf.extend(_rows(trace, 3, 100))
    return buf


def made(impl, spec: BufferSpec, trace=None, var: str | None = None):
    """``impl.make(spec)``; with a ``trace``, recording its calls: as the
    snippet's own ``buf`` when ``var`` is None (``spec`` is then the trace's),
    else as ``var = load_adapter(...).make(spec)``."""
    if trace is None:
        return impl.make(spec)
    return trace.wrap(impl.make(spec)) if var is None else trace.make(spec, var)


def _rows(trace, n: int, start: int = 0) -> TensorDict:
    """:func:`rows`, named ``rows(n, start)`` in the trace's snippet."""
    data = rows(n, start)
    if trace is not None:
        trace.need("from rbcheck.harness.checkpoint_state import rows")
        trace.name(data, f"rows({n})" if start == 0 else f"rows({n}, {start})")
    return data


#: Draws of the snapshot's sample: at capacity 8, every held slot is drawn
#: (and its write generation seen) but with a negligible probability.
DRAWS = 64


def snapshot(buf, spec: BufferSpec, impl) -> dict:
    """What a refused load must leave and a load must restore: length,
    cursor, write count, contents, stored priorities and max priority (with
    ``priority_readback``), and for a seedable adapter the generator and the
    write generations, seen in one sample of ``DRAWS`` taken LAST (its
    indices, weights and ``info["generation"]``). The sample moves the
    generator: compare snapshots of buffers at the same point of their lives
    (:func:`untouched` builds the one that never saw the load)."""
    state = {"len": len(buf), "cursor": buf.cursor, "write_count": buf.write_count}
    if len(buf):
        for key, value in buf.contents().items(include_nested=True, leaves_only=True):
            state[f"contents[{key!r}]"] = value
    if reads_back(spec, impl):  # capability "priority_readback"
        state["stored_priority"] = buf.stored_priority(torch.arange(spec.capacity))
        state["max_priority"] = buf.max_priority
    if len(buf) and impl.conventions.seedable:
        try:
            _, info = buf.sample(DRAWS)
        except Exception as err:  # noqa: BLE001 - compared like any other observable
            state[f"sample({DRAWS})"] = f"<raised {type(err).__name__}>"
        else:  # ".index" sorts first: a moved generator is named as such
            state[f"sample({DRAWS}).index"] = info["index"]
            for key, value in info.items():
                if isinstance(value, torch.Tensor) and key != "index":
                    state[f"sample({DRAWS}).info[{key!r}]"] = value
    return state


def untouched(build: Callable, spec: BufferSpec, impl) -> dict:
    """The snapshot of a buffer ``build()`` makes, never loaded into or
    saved from. Two are built: when they differ (a seedable adapter whose
    draws do not follow the seed), that fails here, as such, instead of
    being blamed on a load."""
    first, second = snapshot(build(), spec, impl), snapshot(build(), spec, impl)
    diff = difference(second, first)
    if diff:
        fail("two untouched buffers of one spec and seed: the second one's", diff,
             "the first one's (conventions.seedable=True: the draws follow the seed)")
    return first


def difference(got: dict, want: dict) -> str | None:
    """The first observable that differs (bit for bit, types included), or None."""
    for key in sorted(set(got) | set(want)):
        if key not in got or key not in want:
            return f"{key} present in only one of them"
        a, b = got[key], want[key]
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
                return f"{key}={a}, expected {b}"
            if not torch.equal(a.cpu().reshape(-1).view(torch.uint8) if a.numel() else a.cpu(),
                               b.cpu().reshape(-1).view(torch.uint8) if b.numel() else b.cpu()):
                return f"{key}{first_difference(a, b)}"
        elif type(a) is not type(b) or a != b:
            return f"{key}={a!r}, expected {b!r}"
    return None


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """``"=<a>, expected <b>"`` for short tensors of one shape and dtype, else
    the first entry that differs bit for bit and how many do."""
    if a.numel() <= 8:
        return f"={a}, expected {b}"
    flat_a, flat_b = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
    differ = (flat_a.view(torch.uint8).reshape(flat_a.numel(), -1)
              != flat_b.view(torch.uint8).reshape(flat_b.numel(), -1)).any(dim=1)
    i = int(torch.nonzero(differ)[0])
    return (f"[{i}]={flat_a[i].item()!r}, expected {flat_b[i].item()!r} "
            f"({int(differ.sum())} of {differ.numel()} entries differ)")
