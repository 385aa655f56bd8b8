"""The README's list of built-in names, generated from the records (harness/records.py).

    python -m tools.records            # print the list
    python -m tools.records --check    # exit status 1 when README.md's list differs from it
    python -m tools.records --write    # rewrite README.md's list (between its markers)

A test (tests/test_records.py) fails when README.md's list is not the records' list.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rbcheck.harness import records
from tools.generated import check_or_write

README = Path(__file__).resolve().parents[1] / "README.md"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="exit 1 when README.md's list differs")
    action.add_argument("--write", action="store_true", help="rewrite README.md's list")
    parser.add_argument("--readme", type=Path, default=README, help="the README (default: the repository's)")
    args = parser.parse_args(argv)
    if not (args.check or args.write):
        print(records.readme_block())
        return 0
    text = args.readme.read_text()
    wanted = records.readme_with_block(text)
    return check_or_write(args.readme, text, wanted, args.check, "the list of built-in names is the records'",
                          "the list of built-in names differs from the records' (python -m tools.records --write)")


if __name__ == "__main__":
    sys.exit(main())
