"""rbcheck's pytest entry point: opt-in, and light.

Installing rbcheck registers this module with pytest (the ``pytest11`` entry
point), so it is loaded into every pytest session of the environment. It only
adds rbcheck's command-line options; it imports neither torch nor hypothesis
and prints nothing. The real plugin is registered only when a session asks
for it: ``rbcheck.harness.pytest_plugin`` holds its hooks and fixtures (the
header, the ``requires`` and ``conventions`` markers), and the package
``rbcheck.harness.plugin`` what they do (the run context, the Hypothesis
profiles, known failures, skips by capability, the results file). It is on
with:

* ``-p rbcheck`` (on the command line or in the project's ``addopts``), or
* ``--impl NAME``, or the environment variable ``RBCHECK_IMPL``.

Without plugin autoloading (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), ``-p rbcheck``
imports the ``rbcheck`` package, which re-exports these two hooks.
"""

from __future__ import annotations

import os

DEFAULT_IMPL = "reference"
DEFAULT_PROFILE = "dev"
PROFILES = ("ci", "dev", "thorough")
REAL_PLUGIN = "rbcheck.harness.pytest_plugin"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("rbcheck", "rbcheck: the replay buffer under test (-p rbcheck or --impl)")
    group.addoption(
        "--impl",
        dest="rbcheck_impl",
        default=None,
        help="implementation under test: a built-in name or pkg.module:factory "
        f"(env RBCHECK_IMPL, default {DEFAULT_IMPL!r}); turns rbcheck's plugin on",
    )
    group.addoption(
        "--rbcheck-profile",
        dest="rbcheck_profile",
        default=None,
        help=f"Hypothesis profile, one of {', '.join(PROFILES)} "
        f"(env RBCHECK_PROFILE, default {DEFAULT_PROFILE!r})",
    )
    group.addoption(
        "--rbcheck-device",
        dest="rbcheck_device",
        default=None,
        help="device of the buffers under test, e.g. cpu or cuda (env RBCHECK_DEVICE, default 'cpu')",
    )
    group.addoption(
        "--rbcheck-results",
        dest="rbcheck_results",
        default=None,
        help="write every test outcome to this JSON file (read by the report)",
    )
    group.addoption(
        "--rbcheck-known-failures",
        dest="rbcheck_known_failures",
        default=None,
        help="known-failures file to use instead of the adapter's own",
    )
    group.addoption(
        "--rbcheck-shrink-seconds",
        dest="rbcheck_shrink_seconds",
        default=None,
        help="time Hypothesis may spend shrinking one failing property (env "
        "RBCHECK_SHRINK_SECONDS; default: unbounded for rbcheck's own implementations, "
        "1 s for others, so a broken buffer is reported quickly); 0 skips shrinking",
    )
    group.addoption(
        "--rbcheck-progress",
        dest="rbcheck_progress",
        action="store_true",
        default=False,
        help="print one line to stderr per property as it finishes (rbcheck validate)",
    )


def wanted(config) -> bool:
    """Whether this session turned rbcheck on (module doc)."""
    plugins = config.getoption("plugins", default=None) or []
    return bool(
        "rbcheck" in plugins
        or config.getoption("rbcheck_impl", default=None)
        or os.environ.get("RBCHECK_IMPL")
    )


def pytest_configure(config) -> None:
    manager = config.pluginmanager
    if not wanted(config) or manager.has_plugin(REAL_PLUGIN):
        return
    import importlib

    # registered while pytest_configure runs: pluggy replays the historic
    # pytest_configure for it, so the real plugin configures itself now
    manager.register(importlib.import_module(REAL_PLUGIN), REAL_PLUGIN)
