"""The ``triton`` sampler's checked ``update_priority`` on CUDA, replayed from a CUDA graph.

Contract
--------
* ``graphed_store(sampler, index, raw) -> bool``: the part of ``update_priority`` after
  its checks (``(raw + eps) ** alpha`` into the leaves of both trees and their parents,
  ``vector_tree.update_pair``) run as one graph replay: the caller's ``index`` and
  ``raw`` are copied into the graph's own input tensors, then the graph runs the same
  kernels that the eager path launches one by one (the transform, the stable sort, the
  single-launch tree update), so the trees get the same bits. False (nothing done, the
  caller runs the part eagerly): not the ``triton`` backend on CUDA, ``GRAPHS`` off, the
  current stream being captured, the first call of a batch size (a size is captured
  the second time it is seen, so a one-off size costs no capture), or graphs given up
  for these trees (a capture failed, or more than ``EVICTIONS`` graphs were dropped:
  a caller cycling through more sizes than ``LIMIT`` would capture on every call).
* One graph per ``(batch size, both trees' storage, the update kernel's completion
  counter, alpha, eps)``, kept on the sum tree (trees replaced by a load take their
  graphs with them; a tree whose storage or counter moved gets a new one), at most
  ``LIMIT`` per tree, the least recently used dropped first.
* A capture runs the part three times eagerly on a side stream (torch's warm-up),
  then captures it on the trees' device. The part is idempotent (the same leaves set
  to the same values, the same parents recomputed), so the warm-up leaves the trees as
  one update would, and a warm-up or capture that fails midway is repaired by the
  eager run that follows. torch's capture synchronises the device and empties its
  cache allocator's free blocks first: a capture is a pause, once per size. The
  capture is ``thread_local``: another thread's CUDA work does not break it. Like the
  rest of ``update_priority`` this is not for concurrent callers on one buffer
  (docs/concurrency.md): they share each graph's inputs.
* Only the update is graphed. The sample returns rows that a later replay would
  overwrite, and its weights' divisor and row count are host numbers that change
  between calls: both would need copies that cost what a graph saves.

Cost: a replay is two copies and one graph launch; profiled on an H200, the whole
update issues 10 launches and copies with the graph, 35 without; a capture, once per
size, costs three eager runs, a device synchronisation and the capture itself (which
runs nothing). Memory per graph: its inputs and the
transformed values (1.5 MiB at 65536) and its private pool (the min tree's values,
the sorted keys and order, the sort's scratch: a few MiB at 65536 by their sizes, not
measured).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from rbcheck.variants.vector_tree import update_pair

#: ``update_priority``'s checked path on CUDA replays a graph; False: eager (kept to measure).
GRAPHS = True
#: Graphs kept per tree (one per batch size in use).
LIMIT = 8
#: Graphs dropped for lack of room after which a tree's updates stay eager.
EVICTIONS = 16


def transform_and_update(sampler, index: torch.Tensor, raw: torch.Tensor, value: torch.Tensor,
                         keep: torch.Tensor | None = None) -> None:
    """The part of an update after its checks, graphed or not: ``(raw + eps) ** alpha``
    into ``value``, then both trees (entries where ``keep`` is False left out)."""
    torch.add(raw, sampler.eps, out=value).pow_(sampler.alpha)  # == (raw + eps) ** alpha
    update_pair(sampler.sum_tree, sampler.min_tree, index, value, keep)


def capture(fn, device) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn()`` on ``device``, after three eager warm-up calls on a side
    stream (as torch asks); the current stream waits for the side stream whatever happens."""
    with torch.cuda.device(device):
        here = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(here)
        try:
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
        finally:
            here.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            fn()
    return graph


def applies(sampler, index: torch.Tensor, raw: torch.Tensor) -> bool:
    """Whether this update may run from a graph (the switch on, the ``triton`` backend on
    CUDA, no capture of the caller's in progress, graphs not given up for these trees)."""
    return (GRAPHS and sampler.backend == "triton" and index.is_cuda and raw.is_cuda
            and not getattr(sampler.sum_tree, "_graphs_off", False)
            and not torch.cuda.is_current_stream_capturing())


def graphed_store(sampler, index: torch.Tensor, raw: torch.Tensor) -> bool:
    """See the module doc; ``index`` int64 and ``raw`` float64, checked, on the trees' device."""
    if not applies(sampler, index, raw):
        return False
    tree, other = sampler.sum_tree, sampler.min_tree
    from rbcheck.variants.triton_tree import _counter

    key = (len(index), tree.raw_nodes.data_ptr(), other.raw_nodes.data_ptr(), _counter(tree).data_ptr(),
           sampler.alpha, sampler.eps)
    graphs = tree.__dict__.setdefault("_update_graphs", OrderedDict())
    entry = graphs.get(key)
    if entry is None:
        seen = tree.__dict__.setdefault("_update_sizes_seen", OrderedDict())
        if seen.pop(key, None) is None:  # a first sighting: eager, remembered
            seen[key] = True
            if len(seen) > LIMIT:
                seen.popitem(last=False)
            return False
        inputs = index.clone(), raw.clone(), torch.empty_like(raw)
        try:
            graph = capture(lambda: transform_and_update(sampler, *inputs), index.device)
        except Exception:  # a torch or Triton that cannot capture this: eager from now on
            tree._graphs_off = True
            graphs.clear()
            return False
        graphs[key] = inputs, graph
        if len(graphs) > LIMIT:
            graphs.popitem(last=False)
            tree._graph_evictions = getattr(tree, "_graph_evictions", 0) + 1
            if tree._graph_evictions > EVICTIONS:  # sizes cycle faster than graphs pay off
                tree._graphs_off = True
                graphs.clear()
        return True  # the warm-up runs did the update (a capture runs nothing)
    graphs.move_to_end(key)
    (static_index, static_raw, _value), graph = entry
    static_index.copy_(index)
    static_raw.copy_(raw)
    graph.replay()
    return True
