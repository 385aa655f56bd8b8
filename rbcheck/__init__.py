"""rbcheck: a property-based correctness and benchmark harness for RL replay buffers.

From a user's own test suite::

    import rbcheck

    def test_my_buffer():
        rbcheck.check_buffer(my_adapter(), expected_failures=[rbcheck.ExpectedFailure(
            "test_ring_eviction::test_ring_eviction_matches_reference_and_closed_form",
            message="^AssertionError: .*but should be",  # the pattern of its failure message
            reason="why (a link)",
        )])

    @rbcheck.parametrize_with_checks(my_adapter)
    def test_rbcheck(check):
        check()

From a shell: ``rbcheck validate my_package.my_module:adapter`` (``rbcheck --help``).

One installed namespace:

* ``rbcheck.reference``: the small, readable replay buffer that is the spec;
* ``rbcheck.variants``: optimized implementations checked against it;
* ``rbcheck.harness``: the implementation-under-test protocol, adapters,
  strategies, assertions, the stateful model comparison and the report;
* ``rbcheck.conformance``: the conformance properties (a pytest suite).

In the repository the first three live in the top-level folders
``reference/``, ``variants/`` and ``harness/``; ``pyproject.toml`` maps them
into this namespace (docs/design.md, "The parts").

Importing ``rbcheck`` is light (no torch, no hypothesis): pytest imports it
for ``-p rbcheck``, and the names below load on first use.
"""

# `-p rbcheck` without plugin autoloading imports this package as the plugin
from rbcheck.plugin import pytest_addoption, pytest_configure  # noqa: F401

__version__ = "0.1.0"

_LAZY = {"check_buffer", "parametrize_with_checks", "properties", "ConformanceError", "ExpectedFailure",
         "RunAbortedError"}
__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        from rbcheck import checks

        return getattr(checks, name)
    raise AttributeError(f"module 'rbcheck' has no attribute {name!r}")
