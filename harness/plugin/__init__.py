"""What rbcheck's pytest plugin does, one concern a module; the hooks that
call them are in ``rbcheck.harness.pytest_plugin``. Importing these modules
registers nothing with pytest."""
