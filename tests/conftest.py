"""Loads rbcheck's pytest plugin (``--impl``, ``requires``, the fixtures).

An installed rbcheck already registers the plugin through its ``pytest11``
entry point; registering the same module twice is an error in pytest, so it
is only listed here when that did not happen (a source checkout, or
``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).
"""

import sys

pytest_plugins = [] if "rbcheck.harness.pytest_plugin" in sys.modules else ["rbcheck.harness.pytest_plugin"]
