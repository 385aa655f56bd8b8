"""TorchRL's replay buffer (torchrl 0.6.0 to 0.14.1) as a BufferUnderTest.

Mapping (read from TorchRL's source, nothing emulated):

* buffer: ``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity,
  device=...), sampler=..., transform=..., batch_size=..., pin_memory=...,
  generator=torch.Generator().manual_seed(seed), priority_key=...)``;
  ``priority_key=None`` in the spec keeps TorchRL's default ``"td_error"``.
* samplers: ``RandomSampler()``; ``PrioritizedSampler(capacity, alpha, beta,
  eps)`` (TorchRL's default float32 trees); ``SliceSampler(num_slices=...,
  slice_len=..., traj_key=spec.episode_key, strict_length=...)``.
* ``sample`` calls ``sample(batch_size, return_info=True, include_info=False)``;
  the info dict is passed through and, in addition, TorchRL's importance
  weights are also given as ``"weight"`` and a tuple index is unpacked into a
  tensor.
* TorchRL's tensordict writer writes an ``"index"`` column into the stored
  rows and into the caller's TensorDict (``TensorDictReplayBuffer.extend`` /
  ``add`` -> ``_set_index_in_td``). The adapter hands TorchRL the caller's
  own TensorDict (no copy: what TorchRL does to it is seen by
  test_ownership, and judged in docs/findings.md) and leaves the
  bookkeeping column out of ``contents()`` and of samples, unless the caller
  writes an ``"index"`` key of its own (then nothing is hidden: TorchRL
  overwrites it).
* ``update_priority(index, priority)`` maps to TorchRL's; TorchRL takes no
  write generation, so a call with ``generation`` raises NotImplementedError
  and "stale_updates" is not declared. There is no way to feed TorchRL given
  uniforms, so "shared_rng" is not declared.
* ``stored_priority`` reads the sum tree's leaves (a one-element read comes
  back from the C++ tree as a Python float, shape ``[]``; it is reshaped to
  the index's shape). ``max_priority`` is the raw max TorchRL records,
  ``PrioritizedSampler._max_priority[0]`` (1.0 before any), in every release
  (``default_priority`` is that raw max only since the #2211 fix; before, it
  was already transformed).
* ``save`` / ``load``: ``dumps`` / ``loads``.
* pin step: TorchRL pins what ``_sample`` returns through
  ``torchrl.data.replay_buffers.utils._pin_memory`` (each of sample and info;
  only objects with ``.pin_memory`` whose ``device`` is cpu). The patch hook
  keeps that decision and replaces only the pinning call by
  ``recorder(obj, {})``.
* policy placement: the collectors' ``_get_policy_and_device`` (TorchRL has
  no ``allow_in_place`` switch; the argument is ignored).

Conventions (``Adapter.conventions``; each checked in its own terms):

* ``priority_dtype=torch.float32``: ``PrioritizedSampler(..., dtype=torch.float)``
  keeps ``SumSegmentTreeFp32`` / ``MinSegmentTreeFp32`` trees
  (https://github.com/pytorch/rl/blob/v0.14.1/torchrl/data/replay_buffers/samplers/prioritized.py#L184).
* ``param_ranges``: alpha >= 0 and beta >= 0 are checked at construction
  (same file, L189-L194); eps > 0: documented as "added to priorities to ensure
  no experience has zero priority" (L94), and ``sample`` raises "non-positive p_min" when
  a held priority is 0 (L497), but not checked (eps = 0 is a bad-input case).
* everything else is the spec's rule: ``(p + eps) ** alpha`` in
  ``update_priority``; new rows get the raw max seen (``max_priority_within_buffer``
  defaults to False); weights ``(p_i / p_min) ** -beta`` over the stored
  slots (the min tree), i.e. the spec's ``buffer_min``; iid draws from the
  seeded ``generator``.

Releases (the history, ``nox -s history``): what differs, and how the
adapter maps it (never by skipping):

=========  ==============================================================
release    mapping
=========  ==============================================================
0.14.1     collectors' ``BaseCollector``; weights ``info["priority_weight"]``
0.9.2      collectors' ``DataCollectorBase`` (no ``BaseCollector`` yet);
           weights ``info["_weight"]``; ``default_priority`` returns the
           transformed max (the #2211 double transform, reported, not mapped)
0.8.1      as 0.9.2; ``sampler_metadata.json`` dumps ``_max_priority`` as a
           tensor (the JSON crash, pytorch/rl #3055, reported)
0.6.0      as 0.8.1; shipped binary named ``_torchrl.so``
=========  ==============================================================

All of them need ``torchrl._torchrl``; where the shipped binary does not load
against the installed torch, the repository's ``tools/torchrl_build.py``
rebuilds it (from 0.14.1's ``csrc/`` for releases without sources) and the
version string says so. Known failures: ``known_failures/torchrl-<release>.txt``
when it exists, else ``known_failures/torchrl.txt``.

Capabilities that TorchRL has but that cannot run here are listed in
``unavailable`` with the error they raise, found by trying them when the
adapter is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import math
import re
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from tensordict import TensorDictBase

from rbcheck.harness.adapters.reference import cuda_unavailable_reason
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions, ParamRange

CAPABILITIES = frozenset(
    {
        "random",
        "prioritized",
        "priority_readback",
        "slice",
        "transforms",
        "pin_memory",
        "save_load",
        "policy_copy",
        "cuda",
        "priority_key",
        "bad_input",
    }
)

BOOKKEEPING_KEY = "index"
SOURCE = "https://github.com/pytorch/rl/blob/v0.14.1/torchrl/data/replay_buffers/samplers/prioritized.py"
#: TorchRL's own rules where they differ from the spec (module doc, "Conventions").
CONVENTIONS = Conventions(
    priority_dtype=torch.float32,
    param_ranges={
        "alpha": ParamRange(0.0, math.inf),
        "beta": ParamRange(0.0, math.inf),
        # eps is "added to priorities to ensure no experience has zero priority":
        # sample() raises "non-positive p_min" once any held priority is 0
        "eps": ParamRange(0.0, math.inf, low_closed=False),
    },
    notes={
        "priority_dtype": f"PrioritizedSampler(dtype=torch.float) keeps float32 sum/min trees ({SOURCE}#L184)",
        "param_ranges.alpha": f"alpha >= 0 is checked at construction ({SOURCE}#L189-L194)",
        "param_ranges.beta": f"beta >= 0 is checked at construction ({SOURCE}#L189-L194)",
        "param_ranges.eps": f"eps > 0 is documented ({SOURCE}#L94: 'added to priorities to ensure no "
                            "experience has zero priority'; sample() raises 'non-positive p_min' "
                            "otherwise, L497) but not checked",
    },
)


def _strip_paths(text: str) -> str:
    """Drop directories from file paths in an error text (keep the file name)."""
    return re.sub(r"(?<![\w:/.])(?:/[^/\s:]+)+/([^/\s:]+)", r"\1", text)


def _error_text(err: BaseException) -> str:
    return _strip_paths(f"{type(err).__name__}: {err}")


#: Names TorchRL's releases give the importance weights in the info dict.
WEIGHT_KEYS = ("priority_weight", "_weight")
KNOWN_FAILURES_DIR = Path(__file__).resolve().parent.parent / "known_failures"


def probe_prioritized() -> str | None:
    """Why TorchRL's PrioritizedSampler cannot be built and run here, or None
    (it builds one, writes a priority and reads it back)."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    try:
        sampler = PrioritizedSampler(2, alpha=0.6, beta=0.4)
        sampler.update_priority(torch.tensor([0]), torch.tensor([1.0]))
        float(torch.as_tensor(sampler._sum_tree.query(0, 2)))
    except Exception as err:
        why = _error_text(err)
        try:
            importlib.import_module("torchrl._torchrl")
        except Exception as cause:
            why += f" (cause: the C++ extension torchrl._torchrl does not load: {_error_text(cause)})"
        build = extension_record()
        if build and build.get("status") == "build_failed":
            why += f"; {build.get('line')}"
        return why
    return None


#: The record ``tools/torchrl_build.py`` leaves in the torchrl package it rebuilt.
MARKER = "_rbcheck_extension.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_marker(package: Path) -> dict | None:
    """What ``tools/torchrl_build.py`` did to the torchrl at ``package``, or
    None. A "rebuilt" record whose binary is no longer in place (torchrl
    reinstalled) is stale and ignored."""
    try:
        marker = json.loads((package / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("status") == "rebuilt":
        names = marker.get("replaced") or []
        if not names or not all((package / n).exists() and sha256_of(package / n) == marker.get("sha256")
                                for n in names):
            return None
    return marker


def extension_record() -> dict | None:
    """What ``tools/torchrl_build.py`` did to this torchrl, or None."""
    spec = importlib.util.find_spec("torchrl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return read_marker(Path(next(iter(spec.submodule_search_locations))))


def known_failures_file(release: str) -> Path | None:
    """``torchrl-<release>.txt`` if there is one, else ``torchrl.txt`` (0.14.1)."""
    for name in (f"torchrl-{release}.txt", "torchrl.txt"):
        if (KNOWN_FAILURES_DIR / name).exists():
            return KNOWN_FAILURES_DIR / name
    return None


class TorchRLBuffer:
    """A :class:`BufferUnderTest` over a TorchRL ``TensorDictReplayBuffer``."""

    def __init__(self, rb: Any, spec: BufferSpec):
        self.rb = rb
        self.spec = spec
        # Hide TorchRL's "index" column unless the caller writes one itself
        # (a buffer filled by ``load`` keeps hiding it).
        self._hide_index = True
        # ids of the caller's TensorDicts TorchRL wrote "index" into (not the caller's own key)
        self._tagged: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"TorchRLBuffer({self.rb.__class__.__name__}, {self.spec})"

    def _note_keys(self, data: TensorDictBase) -> None:
        tagged = self._tagged.get(id(data))
        if BOOKKEEPING_KEY in data.keys() and (tagged is None or tagged() is not data):
            self._hide_index = False

    def _note_tagged(self, data: TensorDictBase, had_index: bool) -> None:
        """Remember a TensorDict TorchRL wrote "index" into, so a later write
        of the same object does not take that column for the caller's own."""
        if not had_index and BOOKKEEPING_KEY in data.keys():
            self._tagged = {k: ref for k, ref in self._tagged.items() if ref() is not None}
            self._tagged[id(data)] = weakref.ref(data)

    def _visible(self, data: TensorDictBase) -> TensorDictBase:
        if self._hide_index and BOOKKEEPING_KEY in data.keys():
            return data.exclude(BOOKKEEPING_KEY)
        return data

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        self._note_keys(data)
        had = BOOKKEEPING_KEY in data.keys()
        index = self.rb.extend(data)  # the caller's own TensorDict: TorchRL writes "index" into it
        self._note_tagged(data, had)
        return torch.as_tensor(index, dtype=torch.long)

    def add(self, row: TensorDictBase) -> int:
        self._note_keys(row)
        had = BOOKKEEPING_KEY in row.keys()
        slot = int(self.rb.add(row))
        self._note_tagged(row, had)
        return slot

    # reading
    def __len__(self) -> int:
        return len(self.rb)

    def sample(self, batch_size: int | None = None):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="include_info is going to be deprecated")
            data, info = self.rb.sample(batch_size, return_info=True, include_info=False)
        info = dict(info)
        index = info.get("index")
        if isinstance(index, tuple) and len(index) == 1:
            info["index"] = index[0]
        for key in WEIGHT_KEYS:  # 0.14.1: "priority_weight"; 0.6.0 - 0.9.2: "_weight"
            if key in info:
                info["weight"] = info[key]
                break
        return self._visible(data), info

    def contents(self) -> TensorDictBase:
        index = torch.arange(len(self.rb.storage), dtype=torch.long)
        # leaf by leaf: TensorDict.clone() of a TensorDict with a device turns -0.0 into 0.0
        # (tensordict 0.14.3 base.py:13187, torch._foreach_add(vals, 0) as a copy)
        return self._visible(self.rb.storage.get(index)).apply(torch.clone)

    @property
    def cursor(self) -> int:
        return int(self.rb.writer._cursor)  # TorchRL has no public cursor

    @property
    def write_count(self) -> int:
        return int(self.rb.write_count)

    # priorities
    def _sampler(self) -> Any:
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        sampler = self.rb.sampler
        if not isinstance(sampler, PrioritizedSampler):
            raise NotImplementedError(
                f"sampler={type(sampler).__name__}, but should be a PrioritizedSampler"
            )
        return sampler

    def update_priority(self, index, priority, generation=None) -> None:
        if generation is not None:
            raise NotImplementedError(
                "generation is not None, but TorchRL's update_priority(index, priority) "
                "takes no write generation (capability 'stale_updates' is not declared)"
            )
        self.rb.update_priority(index, priority)

    def stored_priority(self, index) -> torch.Tensor:
        tree = self._sampler()._sum_tree
        index = torch.as_tensor(index, dtype=torch.long)
        # the C++ tree gives a Python float for a one-element index (shape [])
        values = torch.as_tensor(tree[index], dtype=torch.float64)
        return values.reshape(index.shape)

    @property
    def max_priority(self) -> float:
        raw = self._sampler()._max_priority[0]  # (max, its slot); None before any
        return 1.0 if raw is None else float(raw)

    def indices_from_uniforms(self, u: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "TorchRL samplers draw their own randomness; there is no way to hand them "
            "uniforms (capability 'shared_rng' is not declared)"
        )

    # checkpoints
    def save(self, path: Path) -> None:
        self.rb.dumps(path)

    def load(self, path: Path) -> None:
        self.rb.loads(path)


def _make(spec: BufferSpec) -> TorchRLBuffer:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        RandomSampler,
        SliceSampler,
    )

    if spec.sampler == "random":
        sampler = RandomSampler()
    elif spec.sampler == "prioritized":
        sampler = PrioritizedSampler(spec.capacity, alpha=spec.alpha, beta=spec.beta, eps=spec.eps)
    elif spec.sampler == "slice":
        sampler = SliceSampler(
            num_slices=spec.num_slices,
            slice_len=spec.slice_len,
            traj_key=spec.episode_key,
            strict_length=spec.strict_length,
        )
    else:
        raise ValueError(
            f"spec.sampler={spec.sampler!r}, but should be 'random', 'prioritized' or 'slice'"
        )
    kwargs: dict[str, Any] = dict(
        storage=LazyTensorStorage(spec.capacity, device=spec.device),
        sampler=sampler,
        batch_size=spec.batch_size,
        pin_memory=spec.pin_memory,
        generator=torch.Generator().manual_seed(spec.seed),
    )
    if spec.transform is not None:
        kwargs["transform"] = spec.transform
    if spec.priority_key is not None:
        kwargs["priority_key"] = spec.priority_key
    return TorchRLBuffer(TensorDictReplayBuffer(**kwargs), spec)


def _patch_pin_step(recorder: Callable) -> Any:
    utils = importlib.import_module("torchrl.data.replay_buffers.utils")

    def pin_step(output: Any) -> Any:
        # TorchRL's own decision (utils._pin_memory), with the pinning call
        # replaced by the recorder.
        if hasattr(output, "pin_memory") and output.device == torch.device("cpu"):
            pinned, _ = recorder(output, {})
            return pinned
        return output

    @contextlib.contextmanager
    def patch() -> Iterator[Callable]:
        with mock.patch.object(utils, "_pin_memory", pin_step):
            yield recorder

    return patch()


def collector_base() -> type:
    """The collectors' base class: ``BaseCollector`` (0.14.1) or
    ``DataCollectorBase`` (0.6.0 - 0.9.2)."""
    collectors = importlib.import_module("torchrl.collectors")
    for name in ("BaseCollector", "DataCollectorBase"):
        if hasattr(collectors, name):
            return getattr(collectors, name)
    raise ImportError("torchrl.collectors has neither BaseCollector nor DataCollectorBase, "
                      "but should have one of them")


def _place_policy(policy: Any, device: Any, allow_in_place: bool = True) -> Any:
    device = torch.device(device)
    fake_collector = SimpleNamespace(policy_device=device, trust_policy=True)
    placed, _ = collector_base()._get_policy_and_device(
        fake_collector, policy=policy, policy_device=device
    )
    return placed


def torchrl_adapter() -> Adapter:
    """TorchRL, with what cannot run here marked unavailable (with the error)."""
    try:
        torchrl = importlib.import_module("torchrl")
    except ImportError as err:
        raise ImportError(
            f"torchrl is not installed ({_error_text(err)}), but should be: install the "
            f"'torchrl' dependency group"
        ) from err
    unavailable: dict[str, str] = {}
    why = probe_prioritized()
    if why:
        unavailable["prioritized"] = why
        unavailable["priority_key"] = f"needs a PrioritizedSampler: {why}"
    cuda = cuda_unavailable_reason()
    if cuda:
        unavailable["cuda"] = cuda
    release = str(torchrl.__version__).split("+", 1)[0]
    version = f"{torchrl.__version__} (torch {torch.__version__})"
    build = extension_record()
    if build and build.get("status") == "rebuilt":
        version = f"{torchrl.__version__} (torch {torch.__version__}; {build['line']})"
    from rbcheck.harness.raw_calls import RawFace

    return Adapter(
        raw=RawFace("rbcheck.harness.adapters.torchrl_raw:TorchRLRaw"),
        name="torchrl",
        version=version,
        make=_make,
        capabilities=CAPABILITIES,
        unavailable=unavailable,
        place_policy=_place_policy,
        patch_pin_step=_patch_pin_step,
        known_failures=known_failures_file(release),
        conventions=CONVENTIONS,
    )


__all__ = ["TorchRLBuffer", "probe_prioritized", "torchrl_adapter"]
