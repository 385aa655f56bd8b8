"""Built-in adapters and the loader behind ``pytest --impl NAME``.

``NAME`` is either a built-in name (see :data:`BUILTIN`) or a factory path
``"pkg.module:factory"`` where ``factory()`` returns a
:class:`rbcheck.harness.protocol.Adapter`. Built-ins are imported lazily, so naming
``reference`` never imports TorchRL and an optional backend that is missing
only breaks its own name.

:data:`BUILTIN` is the one table of built-in implementations, the records of
:mod:`rbcheck.harness.records` (one per built-in: a name, where its factory
lives, whether it is rbcheck's own (the reference, a variant, the README's
example) or a third party's (:func:`is_first_party`), its dependency groups,
validate environment, libraries and benchmark peers).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from rbcheck.harness.records import RECORDS, Record

if TYPE_CHECKING:  # imported where an adapter is loaded: the table alone needs no torch (rbcheck validate's parent)
    from rbcheck.harness.protocol import Adapter


#: The built-in implementations, by name: the records themselves (a record's ``path`` is its
#: "module:factory", ``first_party`` whether it is rbcheck's own). A new built-in is one record there.
BUILTIN: dict[str, Record] = RECORDS

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
    known = adapter.known_failures
    if known is not None and not Path(known).is_absolute() and getattr(module, "__file__", None):
        # a relative known-failures file is the factory's module's (its directory), wherever the run is
        from dataclasses import replace

        adapter = replace(adapter, known_failures=Path(module.__file__).resolve().parent / known)
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


__all__ = ["BUILTIN", "AdapterLoadError", "Record", "builtin_names", "builtin_table", "is_first_party",
           "load_adapter"]
