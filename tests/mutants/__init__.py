"""Mutants: deliberately broken implementations the suite must catch, by
class of bug (one module each), declared in :mod:`tests.mutants.registry`."""
