"""One record per built-in implementation: every fact about it in one place.

A record says what ``rbcheck validate NAME`` loads (``path``, ``module:factory``),
whether it is rbcheck's own, what it is (``about``, one line), the
``[dependency-groups]`` of pyproject.toml it needs and the ``nox -s validate``
environment it runs in, the libraries it drives, the ``bench.peers`` peers that
time those libraries, and the nox sessions of its own. Everything else is
derived from :data:`RECORDS`: the built-in table (``rbcheck.harness.adapters``,
``rbcheck list``), the noxfile's lists (the variants, the groups each session
installs, the validate environments, the peers benchmark's runs), the peers
benchmark's list of peers and the README's list of names (between
:data:`README_BEGIN` and :data:`README_END`, rewritten by
``python -m tools.records --write``). docs/adapters.md, "Adding a library".

This module imports nothing but the standard library: ``rbcheck validate``'s
parent process imports it without torch, and ``noxfile.py`` loads it by file
path in nox's own environment, where rbcheck may not be installed.
"""

from __future__ import annotations

from typing import NamedTuple


class BenchPeer(NamedTuple):
    """A peer of ``python -m bench.peers``: the raw face (``Adapter.raw``, harness/raw_calls.py) of
    its record's adapter, or of the built-in ``builtin`` names, timed under this ``name``."""

    name: str
    #: None: timed in the main run (reports/peers.json), beside the other such peers; else
    #: timed alone, in a run of its own into reports/peers.<part>.json (a library that does
    #: not share a process or an environment well with the others)
    part: str | None = None
    #: further options of that run (a part's peers share one run: their options are joined)
    options: tuple[str, ...] = ()
    #: the built-in whose adapter's raw face is timed (None: the record's own)
    builtin: str | None = None


class Record(NamedTuple):
    name: str  # the built-in name: rbcheck validate NAME, --impl NAME
    path: str  # "module:factory"
    first_party: bool  # rbcheck's own (its failures are rbcheck's bugs), not a third party's
    about: str  # what it is, one line
    groups: tuple[str, ...] = ()  # the [dependency-groups] of pyproject.toml it needs
    env: str = "main"  # the validate environment (nox -s validate) that runs it
    libraries: tuple[str, ...] = ()  # the libraries it drives, as their projects write them
    peers: tuple[BenchPeer, ...] = ()  # bench.peers' peers timing its library (once per library)
    variant: bool = False  # a variant of variants/: its conformance runs in the tests session
    sessions: tuple[str, ...] = ()  # nox sessions of its own, installing its groups
    build: str | None = None  # a repository script to run (with --cache DIR) once its groups are installed


_TORCHRL = {"groups": ("torchrl",), "libraries": ("TorchRL",), "build": "tools/torchrl_build.py"}
_CPPRB = {"groups": ("cpprb",), "libraries": ("cpprb",)}
_TIANSHOU = {"groups": ("tianshou",), "libraries": ("tianshou",)}
_SB3 = {"groups": ("sb3",), "libraries": ("stable-baselines3",)}
_FLASHBAX = {"groups": ("flashbax",), "libraries": ("flashbax",)}
_RLLIB = {"groups": ("rllib",), "libraries": ("RLlib",)}
_RLOX = {"groups": ("rlox",), "libraries": ("rlox",)}
_REVERB = {"groups": ("reverb",), "env": "reverb", "libraries": ("Reverb",)}  # TensorFlow 2.15: its own env
_A = "rbcheck.harness.adapters."


def _records(*records: Record) -> dict[str, Record]:
    table = {r.name: r for r in records}
    if len(table) != len(records):
        raise ValueError(f"built-in names={[r.name for r in records]}, but should each appear once")
    return table


#: The built-in implementations, by name, the reference first (the order of ``rbcheck list``).
RECORDS: dict[str, Record] = _records(
    Record("reference", _A + "reference:reference_adapter", True, "the reference implementation, the spec"),
    Record("device", _A + "variants:device", True, "the optimized variant, torch-only tree operations", variant=True),
    Record("triton", _A + "variants:triton", True, "the optimized variant with Triton kernels for the trees", variant=True),
    Record("torchrl", _A + "torchrl:torchrl_adapter", False, "TorchRL's replay buffers", **_TORCHRL,
           peers=(BenchPeer("torchrl"),), sessions=("history", "asv")),
    Record("torchrl-ray", _A + "torchrl_ray:torchrl_ray_adapter", False, "TorchRL's Ray-served buffer (nox -s ray)",
           groups=("torchrl", "ray"), libraries=("TorchRL", "Ray"), sessions=("ray", "ray_bench"),
           build="tools/torchrl_build.py"),
    Record("example", "rbcheck.harness.examples.list_buffer:adapter", True,
           "the README's own-buffer example (harness/examples/list_buffer.py)"),
    Record("cpprb", _A + "cpprb:cpprb_adapter", False, "cpprb's uniform ReplayBuffer", **_CPPRB,
           peers=(BenchPeer("cpprb"),)),
    Record("cpprb-per", _A + "cpprb:cpprb_per_adapter", False, "cpprb's PrioritizedReplayBuffer", **_CPPRB),
    Record("tianshou", _A + "tianshou:tianshou_adapter", False, "tianshou's uniform ReplayBuffer", **_TIANSHOU,
           peers=(BenchPeer("tianshou"),)),
    Record("tianshou-per", _A + "tianshou:tianshou_per_adapter", False, "tianshou's PrioritizedReplayBuffer",
           **_TIANSHOU),
    Record("sb3", _A + "sb3:sb3_adapter", False, "stable-baselines3's uniform ReplayBuffer", **_SB3,
           peers=(BenchPeer("sb3"),)),
    Record("sb3-transitions", _A + "sb3_transitions:sb3_transitions_adapter", False,
           "stable-baselines3's transitions, with timeouts (invariant 10)", **_SB3),
    Record("sb3-transitions-no-timeouts", _A + "sb3_transitions:sb3_transitions_no_timeouts_adapter", False,
           "stable-baselines3's transitions, without timeouts (invariant 10)", **_SB3),
    Record("sb3-transitions-memopt", _A + "sb3_transitions:sb3_transitions_memopt_adapter", False,
           "stable-baselines3's memory-optimized transitions (invariant 10)", **_SB3),
    Record("sb3-nstep", _A + "sb3_transitions:sb3_nstep_adapter", False,
           "stable-baselines3's n-step buffer, with timeouts (invariant 10)", **_SB3),
    Record("sb3-nstep-no-timeouts", _A + "sb3_transitions:sb3_nstep_no_timeouts_adapter", False,
           "stable-baselines3's n-step buffer, without timeouts (invariant 10)", **_SB3),
    Record("cpprb-next-of", _A + "cpprb_transitions:cpprb_next_of_adapter", False, "cpprb's next_of (invariant 10)",
           **_CPPRB),
    Record("tianshou-obs-next", _A + "tianshou_transitions:tianshou_obs_next_adapter", False,
           "tianshou's obs_next, stored (invariant 10)", **_TIANSHOU),
    Record("tianshou-ignore-obs-next", _A + "tianshou_transitions:tianshou_ignore_obs_next_adapter", False,
           "tianshou's obs_next, derived (ignore_obs_next; invariant 10)", **_TIANSHOU),
    Record("torchrl-next", _A + "torchrl_transitions:torchrl_next_adapter", False,
           "TorchRL's (\"next\", ...) keys (invariant 10)", **_TORCHRL),
    Record("torchrl-multistep", _A + "torchrl_transitions:torchrl_multistep_adapter", False,
           "TorchRL's MultiStep (invariant 10)", **_TORCHRL),
    Record("torchrl-her", _A + "torchrl_her:torchrl_her_adapter", False,
           "TorchRL's HERReplayBuffer (issue 42)", **_TORCHRL),
    Record("torchrl-offline-to-online", _A + "torchrl_her:torchrl_offline_to_online_adapter", False,
           "TorchRL's OfflineToOnlineReplayBuffer (issue 42)", **_TORCHRL),
    Record("sb3-her", _A + "sb3_her:sb3_her_adapter", False, "stable-baselines3's HerReplayBuffer (issue 42)",
           **_SB3),
    Record("tianshou-her", _A + "tianshou_her:tianshou_her_adapter", False, "tianshou's HERReplayBuffer (issue 42)",
           **_TIANSHOU),
    Record("flashbax", _A + "flashbax:flashbax_adapter", False, "flashbax's flat buffer, on JAX's CPU backend",
           **_FLASHBAX, peers=(BenchPeer("flashbax", part="flashbax", builtin="flashbax-item"),
                                BenchPeer("flashbax-flat", part="flashbax"))),
    Record("flashbax-item", _A + "flashbax:flashbax_item_adapter", False, "flashbax's item buffer", **_FLASHBAX),
    Record("flashbax-per", _A + "flashbax:flashbax_per_adapter", False, "flashbax's prioritised flat buffer",
           **_FLASHBAX),
    Record("flashbax-item-per", _A + "flashbax:flashbax_item_per_adapter", False,
           "flashbax's prioritised item buffer", **_FLASHBAX),
    Record("skrl", _A + "skrl:skrl_adapter", False, "skrl's RandomMemory (PyTorch)", groups=("skrl",),
           libraries=("skrl",)),
    Record("rllib", _A + "rllib:rllib_adapter", False, "RLlib's old-stack uniform ReplayBuffer", **_RLLIB,
           peers=(BenchPeer("rllib", part="rllib", options=("--capacity", "262144")),)),
    Record("rllib-per", _A + "rllib:rllib_per_adapter", False, "RLlib's old-stack PrioritizedReplayBuffer", **_RLLIB),
    Record("d3rlpy", _A + "d3rlpy:d3rlpy_adapter", False,
           "d3rlpy's ReplayBuffer(FIFOBuffer), in a validate environment of its own", groups=("d3rlpy",),
           env="d3rlpy", libraries=("d3rlpy",)),
    Record("reverb", _A + "reverb:reverb_adapter", False,
           "DeepMind Reverb's served table, Uniform with MinSize (a local server)", **_REVERB),
    Record("reverb-prioritized", _A + "reverb:reverb_prioritized_adapter", False,
           "DeepMind Reverb's served table, Prioritized with SampleToInsertRatio", **_REVERB),
    Record("reverb-queue", _A + "reverb:reverb_queue_adapter", False,
           "DeepMind Reverb's served table, Fifo/Lifo/heap selectors and Queue", **_REVERB),
    Record("rlox", _A + "rlox:rlox_adapter", False, "rlox's uniform ReplayBuffer (Rust)", **_RLOX,
           peers=(BenchPeer("rlox"),)),
    Record("rlox-per", _A + "rlox:rlox_per_adapter", False, "rlox's PrioritizedReplayBuffer (Rust)", **_RLOX),
    Record("rlox-sequence", _A + "rlox:rlox_sequence_adapter", False,
           "rlox's SequenceReplayBuffer, its i.i.d. sample (Rust)", **_RLOX),
    Record("rlox-mmap", _A + "rlox:rlox_mmap_adapter", False,
           "rlox's MmapReplayBuffer, older rows in a memory-mapped cold file (Rust)", **_RLOX),
    Record("rlox-her", _A + "rlox_her:rlox_her_adapter", False, "rlox's HERBuffer (Rust; issue 42)", **_RLOX),
    Record("cpprb-nstep", _A + "cpprb_transitions:cpprb_nstep_adapter", False, "cpprb's Nstep (invariant 10)",
           **_CPPRB),
    Record("cpprb-mmap", _A + "cpprb_mmap:cpprb_mmap_adapter", False,
           "cpprb's uniform ReplayBuffer with mmap_prefix (issue 41)", **_CPPRB),
    Record("tianshou-nstep", _A + "tianshou_transitions:tianshou_nstep_adapter", False,
           "tianshou's Algorithm.compute_nstep_return on the buffer's samples (invariant 10)", **_TIANSHOU),
    Record("flashbax-trajectory", _A + "flashbax_trajectory:flashbax_trajectory_adapter", False,
           "flashbax's trajectory buffer, n-step windows (invariant 10)", **_FLASHBAX),
    Record("flashbax-trajectory-pairs", _A + "flashbax_trajectory:flashbax_trajectory_pairs_adapter", False,
           "flashbax's trajectory buffer, (obs, next obs) pairs (invariant 10)", **_FLASHBAX),
    Record("flashbax-trajectory-per", _A + "flashbax_trajectory:flashbax_trajectory_per_adapter", False,
           "flashbax's prioritised trajectory buffer, n-step windows (invariant 10)", **_FLASHBAX),
    Record("torchrl-samplers", _A + "torchrl_samplers:torchrl_samplers_adapter", False,
           "TorchRL's samplers without replacement, consuming, slice epochs, prioritized slices, staleness, "
           "iteration (issue 40)", **_TORCHRL),
    Record("torchrl-prefetch", _A + "torchrl_samplers:torchrl_prefetch_adapter", False,
           "TorchRL's prefetch=N (issue 40)", **_TORCHRL),
    Record("torchrl-slices", _A + "torchrl_transitions:torchrl_slices_adapter", False,
           "TorchRL's SliceSampler end flags (invariant 10)", **_TORCHRL),
    Record("torchrl-memmap", _A + "torchrl_storages:torchrl_memmap_adapter", False,
           "TorchRL's LazyMemmapStorage(scratch_dir=...), edits, close/reopen (issue 41)", **_TORCHRL),
    Record("torchrl-compressed", _A + "torchrl_storages:torchrl_compressed_adapter", False,
           "TorchRL's CompressedListStorage and its checkpointer (issue 41)", **_TORCHRL),
    Record("torchrl-writers", _A + "torchrl_storages:torchrl_writers_adapter", False,
           "TorchRL's TensorDictMaxValueWriter, ImmutableDatasetWriter and rb[idx] = rows (issue 41)", **_TORCHRL),
    Record("torchrl-ckpt-flat", _A + "torchrl_storages:torchrl_flat_checkpointer_adapter", False,
           "TorchRL's FlatStorageCheckpointer (issue 41)", **_TORCHRL),
    Record("torchrl-ckpt-nested", _A + "torchrl_storages:torchrl_nested_checkpointer_adapter", False,
           "TorchRL's NestedStorageCheckpointer (issue 41)", **_TORCHRL),
    Record("torchrl-ckpt-h5", _A + "torchrl_storages:torchrl_h5_checkpointer_adapter", False,
           "TorchRL's H5StorageCheckpointer (issue 41)", **_TORCHRL),
    Record("rllib-episodes", _A + "rllib_episodes:rllib_episodes_adapter", False,
           "RLlib's new-stack EpisodeReplayBuffer, sampled as n-step transitions (invariant 10)", **_RLLIB),
    Record("rllib-episodes-per", _A + "rllib_episodes:rllib_episodes_per_adapter", False,
           "RLlib's new-stack PrioritizedEpisodeReplayBuffer, as n-step transitions (invariant 10)", **_RLLIB),
)

MAIN = "main"  # the validate session's own environment: every built-in no other environment takes
BASE_GROUP = "test"  # the group every validate environment and the thirdparty session install first


def _records_or_default(records):
    return RECORDS if records is None else records


def _unique(items) -> tuple:
    return tuple(dict.fromkeys(items))


# --- what the noxfile derives -------------------------------------------------------------------


def variants(records=None) -> tuple[str, ...]:
    """The built-ins of variants/: the tests session runs the conformance suite on each."""
    return tuple(r.name for r in _records_or_default(records).values() if r.variant)


def third_party_groups(records=None) -> tuple[str, ...]:
    """The groups of the third-party built-ins of validate's main environment, in the records'
    order: what validate's main environment, the thirdparty and the bench sessions install."""
    return _unique(g for r in _records_or_default(records).values() if not r.first_party and r.env == MAIN
                   for g in r.groups)


def validate_envs(records=None) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """``nox -s validate``'s environments: name -> (the groups it installs, the built-in names it
    validates). "main" installs :func:`third_party_groups` and validates every built-in no other
    environment lists (its names: empty); each other environment, in the records' order, installs
    its built-ins' groups."""
    records = _records_or_default(records)
    envs = {MAIN: ((BASE_GROUP, *third_party_groups(records)), ())}
    for env in _unique(r.env for r in records.values() if r.env != MAIN):
        mine = [r for r in records.values() if r.env == env]
        envs[env] = ((BASE_GROUP, *_unique(g for r in mine for g in r.groups)), tuple(r.name for r in mine))
    return envs


def session_builtins(session: str, records=None) -> tuple[str, ...]:
    """The built-ins that name ``session`` as a nox session of their own."""
    return tuple(r.name for r in _records_or_default(records).values() if session in r.sessions)


def session_groups(session: str, records=None) -> tuple[str, ...]:
    """The groups of the built-ins that name ``session`` as a nox session of their own."""
    records = _records_or_default(records)
    return _unique(g for name in session_builtins(session, records) for g in records[name].groups)


def builds(groups, records=None) -> tuple[str, ...]:
    """The build scripts of the built-ins whose groups are all among ``groups`` (installed)."""
    installed = set(groups)
    return _unique(r.build for r in _records_or_default(records).values()
                   if r.build and r.groups and set(r.groups) <= installed)


def peer_names(records=None) -> tuple[str, ...]:
    """Every peer of ``python -m bench.peers``, in the records' order."""
    return tuple(p.name for r in _records_or_default(records).values() for p in r.peers)


def peer_builtins(records=None) -> dict[str, str]:
    """Every peer of ``python -m bench.peers`` -> the built-in whose adapter's raw face it times."""
    return {p.name: p.builtin or r.name for r in _records_or_default(records).values() for p in r.peers}


def peer_runs(records=None) -> list[tuple[str | None, tuple[str, ...], tuple[str, ...]]]:
    """The runs of the bench session's peers benchmark: (part, peers, options), the main run
    (part None, every peer without a part) first, then each part in the records' order."""
    peers = [p for r in _records_or_default(records).values() for p in r.peers]
    runs = []
    for part in _unique(p.part for p in peers):
        mine = [p for p in peers if p.part == part]
        runs.append((part, tuple(p.name for p in mine), tuple(o for p in mine for o in p.options)))
    runs.sort(key=lambda run: run[0] is not None)  # stable: the main run first
    return runs


# --- the README's list of names -----------------------------------------------------------------

README_BEGIN = "<!-- built-in names: generated from harness/records.py by `python -m tools.records --write` -->"
README_END = "<!-- end of the built-in names -->"
OWN = "rbcheck's own"


def readme_block(records=None, width: int = 100) -> str:
    """The README's list of built-in names: rbcheck's own, then each library's (by the first
    library a built-in drives, in the records' order), wrapped at ``width``; no markers."""
    groups: dict[str, list[str]] = {}
    for r in _records_or_default(records).values():
        label = OWN if r.first_party else (r.libraries[0] if r.libraries else r.name)
        groups.setdefault(label, []).append(f"`{r.name}`")
    text = "; ".join(f"{label} {', '.join(names)}" for label, names in groups.items()) + "."
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def readme_with_block(text: str, records=None) -> str:
    """``text`` (README.md) with its list of names replaced by :func:`readme_block`: the lines
    after the line that :data:`README_BEGIN` ends, up to :data:`README_END` (which follows the
    list's last line, after a space: the list stays one paragraph with the sentence around it)."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README markers {README_BEGIN!r} ... {README_END!r}, but should both be there, in order")
    return f"{text[:begin + len(README_BEGIN)]}\n{readme_block(records)} {text[end:]}"


__all__ = ["BASE_GROUP", "MAIN", "OWN", "README_BEGIN", "README_END", "RECORDS", "BenchPeer", "Record", "builds",
           "peer_builtins", "peer_names", "peer_runs", "readme_block", "readme_with_block", "session_builtins", "session_groups",
           "third_party_groups", "validate_envs", "variants"]
