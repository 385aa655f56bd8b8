"""rbcheck's plugin is opt-in (``rbcheck.plugin``); this repository turns it
on for its own test runs with ``-p rbcheck`` in pyproject.toml's addopts."""
