"""The scaffolding every broken buffer is built on: the reference with one of
its components (or its policy placement) replaced.

Each mutant is a copy of the reference (``rbcheck.reference.ReplayBuffer`` or
one of its components, subclassed) made into an adapter by
``rbcheck.harness.adapters.reference.buffer_adapter``, so it differs from the
reference in exactly one place. Run one by hand with::

    python -m pytest rbcheck/conformance --impl tests.mutants.<module>:<factory>

from the repository's root (``tests`` is the repository's package, not the
installed one).
"""

from __future__ import annotations

from types import SimpleNamespace

from rbcheck.harness.adapters.reference import buffer_adapter
from rbcheck.harness.protocol import CAPABILITIES
from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.policy import place_policy as reference_place_policy


def place_policy(policy, device, allow_in_place=True):
    """The reference's policy placement (what a mutant keeps unless it breaks it)."""
    return reference_place_policy(policy, device, allow_in_place)


def adapter(name: str, buffer_cls=ReplayBuffer, *, place_policy=place_policy,
            conventions=None, prefix: str = "mutant", **components) -> object:
    """An adapter named ``<prefix>-<name>`` over ``buffer_cls`` with the
    reference components replaced by ``components`` (``PrioritizedSampler=...``)."""
    return buffer_adapter(
        f"{prefix}-{name}", "0", buffer_cls, CAPABILITIES,
        components=SimpleNamespace(**components), place_policy=place_policy,
        pin_module="rbcheck.reference.pinning", conventions=conventions,
    )


def historic(name: str, buffer_cls=ReplayBuffer, **kwargs) -> object:
    """The adapter of a historic mutant (one modelled on a public issue):
    named ``historic-<name>``."""
    return adapter(name, buffer_cls, prefix="historic", **kwargs)


def with_writer(writer_cls: type) -> type:
    """The reference buffer with ``writer_cls`` in place of its writer."""

    class Buffer(ReplayBuffer):
        def __init__(self, capacity=None, **kwargs):
            super().__init__(capacity, **kwargs)
            self.writer = writer_cls(self.capacity)

    Buffer.__qualname__ = Buffer.__name__ = f"{writer_cls.__name__}Buffer"
    return Buffer
