"""Repository tools, not shipped in the wheel: run them from the repository's
root as ``python -m tools.<name>`` (TorchRL's extension build, the TorchRL
release history, the variants' speed check, the README's list of built-in
names from the records)."""
