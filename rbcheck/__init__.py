"""rbcheck: a property-based correctness and benchmark harness for RL replay buffers.

One installed namespace:

* ``rbcheck.reference``: the small, readable replay buffer that is the spec;
* ``rbcheck.variants``: optimized implementations checked against it;
* ``rbcheck.harness``: the implementation-under-test protocol, adapters,
  strategies, assertions, the stateful model comparison and the report;
* ``rbcheck.conformance``: the conformance properties (a pytest suite).

In the repository the first three live in the top-level folders
``reference/``, ``variants/`` and ``harness/``; ``pyproject.toml`` maps them
into this namespace (README, "Layout").
"""

__version__ = "0.1.0"
