"""docs/benchmarks.md is a short method page: every number lives in a generated
page of docs/results/, which it links (issue 45 item 4)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"


def test_the_page_is_short():
    lines = PAGE.read_text().count("\n")
    assert lines <= 250, f"docs/benchmarks.md lines={lines}, but should be <= 250: link docs/results/ pages instead"


def test_every_link_to_a_results_page_resolves():
    targets = re.findall(r"\]\((results/[^)#]+)", PAGE.read_text())
    assert targets, "docs/benchmarks.md links no docs/results/ page, but should link where its numbers live"
    missing = sorted({t for t in targets if not (PAGE.parent / t).exists()})
    assert not missing, f"links to missing pages={missing}, but should each name a generated page"


def test_the_sections_the_benchmarks_cite_exist():
    headings = {line.lstrip("#").strip() for line in PAGE.read_text().splitlines() if line.startswith("#")}
    cited = set()
    for path in (ROOT / "bench").glob("*.py"):
        cited |= set(re.findall(r'docs/benchmarks\.md, \\?"([^"\\]+)\\?"', path.read_text()))
    missing = sorted(c for c in cited if not any(c.removeprefix("Ray: ").lower() in h.lower() for h in headings))
    assert not missing, f"sections cited by bench/*.py but missing from docs/benchmarks.md={missing}"
