"""The ``triton`` sampler's checked ``update_priority`` on CUDA, replayed from a CUDA graph.

Contract
--------
* ``graphed_store(sampler, index, raw) -> bool``: the part of ``update_priority`` after
  its checks (``(raw + eps) ** alpha`` into the leaves of both trees and their parents,
  ``vector_tree.update_pair``) run as one graph replay: the caller's ``index`` and
  ``raw`` are copied into the graph's own input tensors, then the graph runs the same
  kernels that the eager path launches one by one (the transform, the stable sort, the
  single-launch tree update), so the trees get the same bits. False (nothing done):
  not the ``triton`` backend on CUDA, ``GRAPHS`` off, the current stream already being
  captured, or the capture failed once for these trees (they then stay eager).
* One graph per ``(batch size, dtype, both trees' storage, alpha, eps)``, kept on the sum
  tree (trees replaced by a load take their graphs with them; a tree whose storage moved
  gets a new one), at most ``LIMIT`` per tree, the least recently used dropped first.
* The capture runs the part three times eagerly on a side stream (torch's warm-up)
  and once under capture. The part is idempotent (the same leaves set to the same
  values, the same parents recomputed), so the warm-up leaves the trees as one update
  would. The capture is ``thread_local``: another thread's CUDA work does not break it.
* Only the update is graphed. The sample returns rows that a later replay would
  overwrite, and its weights' divisor and row count are host numbers that change
  between calls: both would need copies that cost what a graph saves.

Cost: a replay is two copies and one graph launch, against 21-28 launches and copies
eagerly (profiled on an H200: 10 per whole update instead of 28-35); a capture, once
per size, costs three eager runs and the capture itself (which runs nothing). Memory:
each graph's private pool (its temporaries: the sorted keys and order, the transformed
values; about 2-3 MiB at 65536 by their sizes, not measured).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

#: ``update_priority``'s checked path on CUDA replays a graph; False: eager (kept to measure).
GRAPHS = True
#: Graphs kept per tree (one per batch size in use).
LIMIT = 8


def _part(sampler, index: torch.Tensor, raw: torch.Tensor, value: torch.Tensor) -> None:
    from rbcheck.variants.vector_tree import update_pair

    torch.add(raw, sampler.eps, out=value).pow_(sampler.alpha)  # == (raw + eps) ** alpha
    update_pair(sampler.sum_tree, sampler.min_tree, index, value)


def _capture(sampler, index: torch.Tensor, raw: torch.Tensor):
    inputs = index.clone(), raw.clone(), torch.empty_like(raw)
    side = torch.cuda.Stream(device=index.device)
    side.wait_stream(torch.cuda.current_stream(index.device))
    with torch.cuda.stream(side):
        for _ in range(3):
            _part(sampler, *inputs)
    torch.cuda.current_stream(index.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        _part(sampler, *inputs)
    return inputs, graph


def graphed_store(sampler, index: torch.Tensor, raw: torch.Tensor) -> bool:
    """See the module doc; ``index`` int64 and ``raw`` float64, checked, on the trees' device."""
    tree, other = sampler.sum_tree, sampler.min_tree
    if not (GRAPHS and sampler.backend == "triton" and index.is_cuda and raw.is_cuda) \
            or getattr(tree, "_graphs_failed", False) or torch.cuda.is_current_stream_capturing():
        return False
    key = (len(index), raw.dtype, tree.nodes.data_ptr(), other.nodes.data_ptr(), sampler.alpha, sampler.eps)
    graphs = tree.__dict__.setdefault("_update_graphs", OrderedDict())
    entry = graphs.get(key)
    if entry is None:
        try:
            entry = _capture(sampler, index, raw)
        except Exception:  # a torch or Triton that cannot capture this: eager from now on
            tree._graphs_failed = True
            graphs.clear()
            return False
        graphs[key] = entry
        if len(graphs) > LIMIT:
            graphs.popitem(last=False)
        return True  # the warm-up runs did the update (a capture runs nothing)
    graphs.move_to_end(key)
    (static_index, static_raw, _value), graph = entry
    static_index.copy_(index)
    static_raw.copy_(raw)
    graph.replay()
    return True
