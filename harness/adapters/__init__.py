"""Built-in adapters and the loader behind ``pytest --impl NAME``.

``NAME`` is either a built-in name (see :data:`BUILTIN`) or a factory path
``"pkg.module:factory"`` where ``factory()`` returns a
:class:`rbcheck.harness.protocol.Adapter`. Built-ins are imported lazily, so naming
``reference`` never imports TorchRL and an optional backend that is missing
only breaks its own name.

The variants' names are listed here; a variant added later registers itself
without touching this file: if the ``variants`` package defines
``ADAPTERS = {"name": "pkg.module:factory", ...}``, those names are
built-ins too (a name already here wins).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from rbcheck.harness.protocol import Adapter

#: Built-in implementation names -> ``"module:factory"``.
BUILTIN: dict[str, str] = {
    "reference": "rbcheck.harness.adapters.reference:reference_adapter",
    "device": "rbcheck.harness.adapters.variants:device",
    "triton": "rbcheck.harness.adapters.variants:triton",
    "torchrl": "rbcheck.harness.adapters.torchrl:torchrl_adapter",
    # TorchRL's Ray-served buffer (needs the 'ray' dependency group: nox -s ray)
    "torchrl-ray": "rbcheck.harness.adapters.torchrl_ray:torchrl_ray_adapter",
    # the README's own-buffer example (harness/examples/list_buffer.py)
    "example": "rbcheck.harness.examples.list_buffer:adapter",
    # third-party buffers (each its own dependency group; docs/findings.md)
    "cpprb": "rbcheck.harness.adapters.cpprb:cpprb_adapter",
    "cpprb-per": "rbcheck.harness.adapters.cpprb:cpprb_per_adapter",
    "tianshou": "rbcheck.harness.adapters.tianshou:tianshou_adapter",
    "tianshou-per": "rbcheck.harness.adapters.tianshou:tianshou_per_adapter",
    "sb3": "rbcheck.harness.adapters.sb3:sb3_adapter",
}

KNOWN_FAILURES_DIR = Path(__file__).resolve().parent.parent / "known_failures"


#: Adapter objects handed to ``rbcheck.check_buffer``, by the name its
#: in-process pytest run passes as ``--impl`` (removed after the run).
INJECTED: dict[str, Adapter] = {}


class AdapterLoadError(RuntimeError):
    """An ``--impl`` name that could not be turned into an Adapter."""


def _variant_entries() -> dict[str, str]:
    try:
        variants = importlib.import_module("rbcheck.variants")
    except Exception:  # a broken variants package must not hide the other built-ins
        return {}
    entries = getattr(variants, "ADAPTERS", None)
    if not isinstance(entries, dict):
        return {}
    return {str(k): str(v) for k, v in entries.items() if k not in BUILTIN}


def builtin_table() -> dict[str, str]:
    """Every built-in name with its ``module:factory`` path."""
    return {**BUILTIN, **_variant_entries()}


def builtin_names() -> list[str]:
    """Built-in names, the reference first."""
    return list(builtin_table())


def _resolve(path: str, name: str) -> Adapter:
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
    if name in INJECTED:
        return INJECTED[name]
    table = BUILTIN if name in BUILTIN else builtin_table()
    if name in table:
        adapter = _resolve(table[name], name)
        if adapter.known_failures is None:
            candidate = KNOWN_FAILURES_DIR / f"{name}.txt"
            if candidate.exists():
                adapter.known_failures = candidate
        return adapter
    if ":" not in name:
        raise AdapterLoadError(
            f"impl={name!r}, but should be a built-in name ({', '.join(table)}) "
            f"or 'pkg.module:factory'"
        )
    return _resolve(name, name)


__all__ = ["BUILTIN", "AdapterLoadError", "builtin_names", "builtin_table", "load_adapter"]
