"""Example adapters for people wiring their own buffer into rbcheck."""
