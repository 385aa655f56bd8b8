"""The documentation runs as written (seed invariant 5 for the tutorial).

Every fenced ```python block of README.md and of each docs/*.md is executed, in
order, in one namespace per file, with the working directory set to a fresh
temporary directory. A block that must not run is fenced ```text. A failure
names the file and the line of the block (tracebacks point at lines of the
Markdown file itself). README.md may have no python block; a docs/ page
without one is a mistake and fails.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
RUNNABLE = {"python", "py"}


def extract_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the first code line, code)`` for each python fence, in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, language, start = opening.group(1), opening.group(2).lower(), i + 1
        i += 1
        while i < len(lines) and not re.match(
            rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]
        ):
            i += 1
        if i == len(lines):
            raise ValueError(f"fence opened at line {start}, but should be closed")
        if language in RUNNABLE:
            blocks.append((start + 1, "\n".join(lines[start:i])))
        i += 1
    return blocks


def run_blocks(path: Path, blocks: list[tuple[int, str]]) -> dict:
    """Run the blocks in one namespace; fail with the file and block line."""
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for line, code in blocks:
        # pad so that line numbers in tracebacks are lines of the Markdown file
        compiled = compile("\n" * (line - 1) + code, str(path), "exec")
        try:
            exec(compiled, namespace)
        except Exception as err:
            trace = "".join(traceback.format_exception(err)[1:])
            pytest.fail(
                f"{path.name}: the python block at line {line} failed\n{trace}", pytrace=False
            )
    return namespace


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def run_page(path: Path) -> dict:
    """Run one page's blocks; a docs/ page must have at least one."""
    blocks = extract_blocks(path.read_text(encoding="utf-8"))
    if path.parent.name == "docs":
        assert blocks, (
            f"{path.name} has no ```python block, but should have one (fence prose as ```text)"
        )
    return run_blocks(path, blocks)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_runs_as_written(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    run_page(path)


def test_the_tutorial_exists():
    assert (ROOT / "docs" / "tutorial.md").is_file()


def test_extract_blocks_finds_python_only_and_keeps_lines():
    text = "\n".join(
        [
            "# Title",  # 1
            "```python",  # 2
            "x = 1",  # 3
            "```",  # 4
            "```text",  # 5
            "not python",  # 6
            "```",  # 7
            "````python",  # 8
            "```",  # 9  (shorter fence: still inside the block)
            "````",  # 10
            "~~~py",  # 11
            "y = x + 1",  # 12
            "~~~",  # 13
        ]
    )
    assert extract_blocks(text) == [(3, "x = 1"), (9, "```"), (12, "y = x + 1")]
    with pytest.raises(ValueError, match="fence opened at line 1, but should be closed"):
        extract_blocks("```python\nx = 1\n")


def test_run_blocks_shares_a_namespace_and_reports_the_failing_line(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\ntext\n\n```python\ny = x + 1\nassert y == 3\n```\n")
    blocks = extract_blocks(page.read_text())
    assert run_blocks(page, blocks[:1])["x"] == 1
    with pytest.raises(pytest.fail.Exception) as info:
        run_blocks(page, blocks)
    message = str(info.value)
    assert "page.md: the python block at line 8 failed" in message
    assert f'File "{page}", line 9' in message
    assert "AssertionError" in message


def test_a_docs_page_without_python_fails_but_a_readme_may_have_none(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    prose = "# Notes\n\n```text\nnot run\n```\n"
    page, readme = tmp_path / "docs" / "notes.md", tmp_path / "README.md"
    page.write_text(prose)
    readme.write_text(prose)
    assert run_page(readme) == {"__name__": "docs_README"}
    with pytest.raises(
        AssertionError, match=r"notes.md has no ```python block, but should have one"
    ):
        run_page(page)
