"""The registry of mutants: deliberately broken implementations that the
conformance suite must catch (tests/meta/test_mutants_caught.py).

A mutant is a factory returning an adapter, declared once with what it
breaks and which properties must catch it::

    @mutant(bug="priorities transformed twice on add",
            catches=("test_priorities::test_transform_applied_once",),
            reproduces="pytorch/rl #2534")
    def priority_transformed_twice_on_add():
        return adapter("priority_transformed_twice_on_add", ...)

``catches`` names conformance properties as ``<file stem>::<test name>``;
each is checked against the suite when the mutant is declared, so a renamed
property fails at import instead of making a meta test vacuous. ``control``
is the correct implementation that must pass the same properties:
``"reference"``, or a factory marked with :func:`control` when the mutant
declares a convention (a float32 tree, say), so that each catch is the
mutant's bug and never the convention.

The modules of this package group mutants by the class of bug they plant;
:func:`discover` imports them all. Nothing here ships in the wheel.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

REFERENCE = "reference"
#: What a mutant is: a plain one (one bug planted in a copy of the
#: reference), a historic one (modelled on a public issue: ``reproduces``
#: set), a convention one (declares a convention and still breaks the
#: invariant it qualifies), or a concurrency one (a shared buffer with one
#: race; run by tests/meta/test_concurrent_mutants_caught.py).
KINDS = ("plain", "historic", "convention", "concurrency")


@dataclass(frozen=True)
class Mutant:
    factory: str  # the factory's name in its module
    bug: str  # the bug class it plants
    files: tuple[str, ...]  # conformance files to run (relative to rbcheck/conformance)
    targets: tuple[str, ...]  # test names; at least one must fail
    control: str = REFERENCE  # "reference" or the control's adapter string (module:factory)
    reproduces: str = ""  # the public issue / PR a historic mutant is modelled on
    needs_cuda: bool = False  # observable only on a CUDA buffer (--rbcheck-device cuda)
    module: str = ""  # the module that defines the factory
    kind: str = "plain"  # one of KINDS
    in_process: bool = False  # cheap: its properties are called in the meta test's own process

    @property
    def impl(self) -> str:
        """The adapter string of the mutant (``--impl``)."""
        return f"{self.module}:{self.factory}"


#: Every declared mutant, in declaration order.
MUTANTS: list[Mutant] = []


@functools.cache
def _property_ids() -> frozenset[str]:
    from rbcheck.checks import properties

    return frozenset(properties())


def _adapter_string(fn: Callable | str) -> str:
    return fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__name__}"


def control(fn: Callable) -> Callable:
    """Mark a factory as a control (a correct implementation declaring a
    convention); it is referred to by ``mutant(control=fn)``."""
    fn.rbcheck_control = True
    return fn


def mutant(*, bug: str, catches: tuple[str, ...], control: Callable | str = REFERENCE,
           reproduces: str = "", needs_cuda: bool = False, kind: str | None = None,
           in_process: bool = False) -> Callable[[Callable], Callable]:
    """Declare the decorated factory a mutant (see the module docstring).
    ``kind`` defaults to "historic" when ``reproduces`` is given, else "plain"."""
    kind = kind or ("historic" if reproduces else "plain")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}, but should be one of {KINDS}")
    if isinstance(catches, str) or not catches:
        raise ValueError(f"catches={catches!r}, but should be a non-empty tuple of property ids")
    known = _property_ids()
    unknown = [c for c in catches if c not in known]
    if unknown:
        raise ValueError(f"catches={unknown}, but should name properties of the suite "
                         f"(<file stem>::<test name>, `rbcheck list`)")
    if not isinstance(control, str) and not getattr(control, "rbcheck_control", False):
        raise ValueError(f"control={control!r}, but should be 'reference' or a factory marked @control")

    def declare(fn: Callable) -> Callable:
        if any(m.factory == fn.__name__ for m in MUTANTS):
            raise ValueError(f"mutant {fn.__name__!r} is declared twice, but should be once")
        files = tuple(sorted({c.split("::")[0] + ".py" for c in catches}))
        targets = tuple(dict.fromkeys(c.split("::")[1] for c in catches))
        MUTANTS.append(Mutant(fn.__name__, bug, files, targets, _adapter_string(control), reproduces,
                              needs_cuda, fn.__module__, kind, in_process))
        return fn

    return declare


def discover() -> tuple[Mutant, ...]:
    """Import every module of this package; every declared mutant."""
    import tests.mutants as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in ("registry", "base"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    return tuple(MUTANTS)


def all_mutants() -> tuple[Mutant, ...]:
    """Every declared mutant, of every kind."""
    return discover()


def historic() -> tuple[Mutant, ...]:
    """The mutants modelled on a public issue (``reproduces`` set)."""
    return tuple(m for m in discover() if m.reproduces)


def of_kind(*kinds: str) -> tuple[Mutant, ...]:
    """The declared mutants of the given kinds (:data:`KINDS`)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"kinds={unknown}, but should be among {KINDS}")
    return tuple(m for m in discover() if m.kind in kinds)
