"""What the tools that keep a generated part of a file (``tools/bugs.py``,
``tools/records.py``) share: compare the file with what it should hold, then
say it is current, or (``--check``) that it differs and how to regenerate
it, or write it."""

from __future__ import annotations

import sys
from pathlib import Path


def check_or_write(path: Path, text: str, wanted: str, check: bool, same: str, differs: str) -> int:
    """0 when ``text`` (the file's) is ``wanted`` or ``wanted`` was written; 1 when ``check`` finds it differs."""
    if wanted == text:
        print(f"{path}: {same}")
        return 0
    if check:
        print(f"{path}: {differs}", file=sys.stderr)
        return 1
    path.write_text(wanted)
    print(f"wrote {path}")
    return 0
