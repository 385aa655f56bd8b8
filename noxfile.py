"""Sessions for rbcheck. Every session builds its own virtualenv and installs
what it needs; torch is pinned through .ci/constraints.txt so no install ever
pulls an accelerator build on the development machines."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
CONSTRAINTS = ("-c", ".ci/constraints.txt")


def install(session: nox.Session, *groups: str) -> None:
    """Install the project (editable) plus the named dependency groups."""
    requirements = []
    for group in groups:
        requirements += nox.project.dependency_groups(PYPROJECT, group)
    session.install(*CONSTRAINTS, "-e", ".", *requirements)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of reference/, the conformance suite on the reference and
    every variant, the meta tests (mutants must be caught), the docs, and
    the benchmarks in smoke mode."""
    install(session, "test", "bench")
    session.env.setdefault("RBCHECK_PROFILE", "ci")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    install(session, "lint")
    session.run("ruff", "check", ".")
