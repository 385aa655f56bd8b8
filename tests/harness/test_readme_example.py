"""The README's own-buffer example is the file it names, and it really runs
through the conformance suite: its declared capability passes, the rest is
skipped with the reason."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "harness" / "examples" / "list_buffer.py"


def test_readme_shows_the_example_file_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = "```python\n" + EXAMPLE.read_text().rstrip("\n") + "\n```"
    assert block in readme, "README.md's adapter example differs from harness/examples/list_buffer.py"


def test_example_adapter_passes_what_it_declares(tmp_path):
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "rbcheck/conformance", "-q", "-p", "no:cacheprovider",
         "--impl", "rbcheck.harness.examples.list_buffer:adapter", f"--rbcheck-results={results}",
         "--ignore=rbcheck/conformance/test_bad_input.py",
         "--ignore=rbcheck/conformance/test_checkpoint_faults.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    outcomes = [r["outcome"] for r in json.loads(results.read_text())["tests"]]
    assert "pass" in outcomes and "skip" in outcomes, outcomes
    assert "fail" not in outcomes
