"""The parts of a merged report: one implementation's result as a JSON
file each (``rbcheck validate --parts DIR``), read back and merged by
``rbcheck report --merge DIR`` (``nox -s validate``: one environment per
group of libraries that install together)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from rbcheck.harness.adapters import builtin_names
from rbcheck.harness.outcomes import NOT_RUN, ImplResult

__all__ = ["part_path", "write_part", "read_parts", "merge"]


def part_path(directory: Path, name: str) -> Path:
    """Where :func:`write_part` puts ``name``'s part: a file name that keeps
    the name readable and cannot collide (``pkg.mod:f`` and ``pkg.mod_f`` differ)."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in name)
    return directory / f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:8]}.json"


def write_part(result: ImplResult, directory: Path) -> Path:
    """Write one implementation's result to ``directory`` (a part of a merged
    report); atomic, so a merge never reads half a part."""
    directory.mkdir(parents=True, exist_ok=True)
    path = part_path(directory, result.name)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_part(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_parts(directory: Path) -> dict[str, ImplResult]:
    """Every part under ``directory`` (searched recursively: one folder per
    environment is fine), by implementation name. A part that does not parse,
    or two parts of one name, is a ValueError naming the files."""
    found: dict[str, tuple[Path, ImplResult]] = {}
    for path in sorted(directory.rglob("*.json")):
        try:
            result = ImplResult.from_part(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"part {path}: {err}") from err
        if result.name in found:
            raise ValueError(f"parts {found[result.name][0]} and {path} both hold {result.name!r}, "
                             f"but each implementation should have one part")
        found[result.name] = (path, result)
    return {name: result for name, (_, result) in found.items()}


def merge(directory: Path, names: Iterable[str] | None = None) -> list[ImplResult]:
    """The results of ``names`` (default: every built-in name, then any other
    part found) from the parts under ``directory``. A name without a part is a
    result of status ``"not run"``: never a pass, and it aborts the verdict."""
    parts = read_parts(directory) if directory.is_dir() else {}
    wanted = list(dict.fromkeys(names)) if names is not None else builtin_names() + sorted(
        set(parts) - set(builtin_names()))
    return [parts.get(name) or ImplResult(name=name, status=NOT_RUN,
                                          why=f"no results for it in {directory}: its environment did not run "
                                              f"or did not finish")
            for name in wanted]
