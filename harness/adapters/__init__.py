"""Built-in adapters and the loader behind ``pytest --impl NAME``.

``NAME`` is either a built-in name (see :data:`BUILTIN`) or a factory path
``"pkg.module:factory"`` where ``factory()`` returns a
:class:`rbcheck.harness.protocol.Adapter`. Built-ins are imported lazily, so naming
``reference`` never imports TorchRL and an optional backend that is missing
only breaks its own name.

:data:`BUILTIN` is the one table of built-in implementations: a name, where
its factory lives, and whether it is rbcheck's own (the reference, a variant,
the README's example) or a third party's (:func:`is_first_party`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # imported where an adapter is loaded: the table alone needs no torch (rbcheck validate's parent)
    from rbcheck.harness.protocol import Adapter


class Builtin(NamedTuple):
    path: str  # "module:factory"
    first_party: bool  # rbcheck's own (its failures are rbcheck's bugs), not a third party's


#: The built-in implementations, by name.
BUILTIN: dict[str, Builtin] = {
    "reference": Builtin("rbcheck.harness.adapters.reference:reference_adapter", True),
    "device": Builtin("rbcheck.harness.adapters.variants:device", True),
    "triton": Builtin("rbcheck.harness.adapters.variants:triton", True),
    "torchrl": Builtin("rbcheck.harness.adapters.torchrl:torchrl_adapter", False),
    # TorchRL's Ray-served buffer (needs the 'ray' dependency group: nox -s ray)
    "torchrl-ray": Builtin("rbcheck.harness.adapters.torchrl_ray:torchrl_ray_adapter", False),
    # the README's own-buffer example (harness/examples/list_buffer.py)
    "example": Builtin("rbcheck.harness.examples.list_buffer:adapter", True),
    # third-party buffers (each its own dependency group; docs/findings.md)
    "cpprb": Builtin("rbcheck.harness.adapters.cpprb:cpprb_adapter", False),
    "cpprb-per": Builtin("rbcheck.harness.adapters.cpprb:cpprb_per_adapter", False),
    "tianshou": Builtin("rbcheck.harness.adapters.tianshou:tianshou_adapter", False),
    "tianshou-per": Builtin("rbcheck.harness.adapters.tianshou:tianshou_per_adapter", False),
    "sb3": Builtin("rbcheck.harness.adapters.sb3:sb3_adapter", False),
    # stable-baselines3's transitions and n-step buffers (invariant 10; group sb3)
    "sb3-transitions": Builtin("rbcheck.harness.adapters.sb3_transitions:sb3_transitions_adapter", False),
    "sb3-transitions-no-timeouts": Builtin(
        "rbcheck.harness.adapters.sb3_transitions:sb3_transitions_no_timeouts_adapter", False),
    "sb3-transitions-memopt": Builtin("rbcheck.harness.adapters.sb3_transitions:sb3_transitions_memopt_adapter",
                                      False),
    "sb3-nstep": Builtin("rbcheck.harness.adapters.sb3_transitions:sb3_nstep_adapter", False),
    "sb3-nstep-no-timeouts": Builtin("rbcheck.harness.adapters.sb3_transitions:sb3_nstep_no_timeouts_adapter",
                                     False),
    # cpprb's next_of (invariant 10; group cpprb)
    "cpprb-next-of": Builtin("rbcheck.harness.adapters.cpprb_transitions:cpprb_next_of_adapter", False),
    # tianshou's obs_next, stored or derived (invariant 10; group tianshou)
    "tianshou-obs-next": Builtin("rbcheck.harness.adapters.tianshou_transitions:tianshou_obs_next_adapter", False),
    "tianshou-ignore-obs-next": Builtin(
        "rbcheck.harness.adapters.tianshou_transitions:tianshou_ignore_obs_next_adapter", False),
    # TorchRL's ("next", ...) keys and MultiStep (invariant 10; group torchrl)
    "torchrl-next": Builtin("rbcheck.harness.adapters.torchrl_transitions:torchrl_next_adapter", False),
    "torchrl-multistep": Builtin("rbcheck.harness.adapters.torchrl_transitions:torchrl_multistep_adapter", False),
    "flashbax": Builtin("rbcheck.harness.adapters.flashbax:flashbax_adapter", False),
    "flashbax-item": Builtin("rbcheck.harness.adapters.flashbax:flashbax_item_adapter", False),
    "flashbax-per": Builtin("rbcheck.harness.adapters.flashbax:flashbax_per_adapter", False),
    "flashbax-item-per": Builtin("rbcheck.harness.adapters.flashbax:flashbax_item_per_adapter", False),
    "skrl": Builtin("rbcheck.harness.adapters.skrl:skrl_adapter", False),
    # RLlib's old-stack buffers (the 'rllib' dependency group; ray[rllib])
    "rllib": Builtin("rbcheck.harness.adapters.rllib:rllib_adapter", False),
    "rllib-per": Builtin("rbcheck.harness.adapters.rllib:rllib_per_adapter", False),
    # d3rlpy's ReplayBuffer(FIFOBuffer) (the 'd3rlpy' group, its own validate environment)
    "d3rlpy": Builtin("rbcheck.harness.adapters.d3rlpy:d3rlpy_adapter", False),
    # cpprb's Nstep (invariant 10; group cpprb)
    "cpprb-nstep": Builtin("rbcheck.harness.adapters.cpprb_transitions:cpprb_nstep_adapter", False),
    # tianshou's Algorithm.compute_nstep_return on the buffer's samples (invariant 10; group tianshou)
    "tianshou-nstep": Builtin("rbcheck.harness.adapters.tianshou_transitions:tianshou_nstep_adapter", False),
    # flashbax's trajectory buffer for invariant 10 (group flashbax)
    "flashbax-trajectory": Builtin("rbcheck.harness.adapters.flashbax_trajectory:flashbax_trajectory_adapter", False),
    "flashbax-trajectory-pairs": Builtin(
        "rbcheck.harness.adapters.flashbax_trajectory:flashbax_trajectory_pairs_adapter", False),
    "flashbax-trajectory-per": Builtin(
        "rbcheck.harness.adapters.flashbax_trajectory:flashbax_trajectory_per_adapter", False),
    # TorchRL's SliceSampler end flags (invariant 10; group torchrl)
    "torchrl-slices": Builtin("rbcheck.harness.adapters.torchrl_transitions:torchrl_slices_adapter", False),
    # RLlib's new-stack episode buffers, sampled as n-step transitions (invariant 10; group rllib)
    "rllib-episodes": Builtin("rbcheck.harness.adapters.rllib_episodes:rllib_episodes_adapter", False),
    "rllib-episodes-per": Builtin("rbcheck.harness.adapters.rllib_episodes:rllib_episodes_per_adapter", False),
}

KNOWN_FAILURES_DIR = Path(__file__).resolve().parent.parent / "known_failures"


class AdapterLoadError(RuntimeError):
    """An ``--impl`` name that could not be turned into an Adapter."""


def is_first_party(name: str) -> bool:
    """Whether ``name`` is one of rbcheck's own implementations; third-party
    built-ins and ``pkg.module:factory`` are not."""
    return name in BUILTIN and BUILTIN[name].first_party


def builtin_table() -> dict[str, str]:
    """Every built-in name with its ``module:factory`` path."""
    return {name: entry.path for name, entry in BUILTIN.items()}


def builtin_names() -> list[str]:
    """Built-in names, the reference first."""
    return list(builtin_table())


def _resolve(path: str, name: str) -> Adapter:
    from rbcheck.harness.protocol import Adapter

    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise AdapterLoadError(
            f"impl={name!r}, but should be a built-in name ({', '.join(builtin_names())}) "
            f"or 'pkg.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise AdapterLoadError(
            f"impl={name!r}: module {module_name!r} could not be imported "
            f"({type(err).__name__}: {err}), but should be importable from the current directory "
            f"or the installed packages"
        ) from err
    factory = module
    for part in attr.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError as err:
            raise AdapterLoadError(
                f"impl={name!r}: module {module_name!r} has no attribute {attr!r}, "
                f"but should define a factory function returning an Adapter"
            ) from err
    if isinstance(factory, Adapter):
        adapter = factory
    elif callable(factory):
        adapter = factory()
    else:
        raise AdapterLoadError(
            f"impl={name!r}: {attr!r} is a {type(factory).__name__}, "
            f"but should be a factory function returning an Adapter"
        )
    if not isinstance(adapter, Adapter):
        raise AdapterLoadError(
            f"impl={name!r}: {attr}() returned a {type(adapter).__name__}, "
            f"but should return a harness.protocol.Adapter"
        )
    return adapter


def load_adapter(name: str) -> Adapter:
    """Turn a built-in name or ``"pkg.module:factory"`` into an Adapter.

    Raises :class:`AdapterLoadError` with a message that names what was asked
    for and what is allowed.
    """
    if not isinstance(name, str) or not name.strip():
        raise AdapterLoadError(
            f"impl={name!r}, but should be a built-in name ({', '.join(builtin_names())}) "
            f"or 'pkg.module:factory'"
        )
    name = name.strip()
    adapter = _load(name)
    if not adapter.source:
        adapter.source = name
    return adapter


def _load(name: str) -> Adapter:
    if name in BUILTIN:
        adapter = _resolve(BUILTIN[name].path, name)
        if adapter.known_failures is None:
            candidate = KNOWN_FAILURES_DIR / f"{name}.txt"
            if candidate.exists():
                adapter.known_failures = candidate
        return adapter
    if ":" not in name:
        raise AdapterLoadError(
            f"impl={name!r}, but should be a built-in name ({', '.join(BUILTIN)}) "
            f"or 'pkg.module:factory'"
        )
    return _resolve(name, name)


__all__ = ["BUILTIN", "Builtin", "AdapterLoadError", "builtin_names", "builtin_table", "is_first_party",
           "load_adapter"]
