"""The HTML report as a person opens it: ``rbcheck validate`` on a buffer
with a planted bug (the README's list buffer, made to never draw its last
slot), its ``conformance.html`` opened in headless Chromium. The page loads
with no console message (its script runs to the end: ``data-ready``), the
failure comes first with its plot and its repro, and the markdown, the page
and the JSON say the same counts and verdict. A screenshot is kept as an
artefact: ``reports/html-report/conformance.png``.

Chromium comes from Debian's packages (``.ci/run`` installs it when it is
missing); without it the browser test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness.planted import SKIPS_LAST, UNIFORM

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = ROOT / "reports" / "html-report"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

MINE = SKIPS_LAST


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``rbcheck validate mine:broken --only <uniform sampling> --out out`` from a user's directory."""
    project = tmp_path_factory.mktemp("html_report")
    (project / "mine.py").write_text(textwrap.dedent(MINE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RBCHECK_", "PYTEST_"))}
    proc = subprocess.run([sys.executable, "-m", "rbcheck.cli", "validate", "mine:broken", "--only", UNIFORM,
                           "--out", "out"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return project / "out", proc.stdout


def test_markdown_and_page_say_the_jsons_counts_and_verdict_and_the_failure_first(run):
    out, printed = run
    data = json.loads((out / "conformance.json").read_text())
    markdown, page = (out / "conformance.md").read_text(), (out / "conformance.html").read_text()
    verdict, counts = data["verdict"], data["implementations"]["mine:broken"]["counts"]
    assert verdict["verdict"] == "failed" and verdict["exit_status"] == 1 and counts.get("fail", 0) >= 1
    for text in (printed, markdown):
        first = "\n".join(text.splitlines()[:40])
        assert "FAILED (exit 1)" in first and f"{counts['fail']} failure" in first, first
        assert "slot frequencies" in first and "but should be" in first, first
        assert "not declared" not in first, first
    said = ", ".join(f"{n} {w}" for k, w in (("fail", "FAIL"), ("pass", "pass"), ("skip", "skip"))
                     if (n := counts.get(k)))
    assert f"| mine:broken (yours) | 0.1 | {said} |" in markdown
    assert '<meta name="rbcheck-verdict" content="failed">' in page
    shown = re.search(r'data-impl="mine:broken" data-status="ran" data-counts="([^"]*)"', page).group(1)
    assert json.loads(shown.replace("&quot;", '"')) == counts


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs "
                    "it), so the page is not opened in a browser")
def test_the_page_opens_in_a_browser_with_no_console_error_failure_first_and_its_plot(run, tmp_path):
    out, _ = run
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "conformance.png"
    shot.unlink(missing_ok=True)
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
                           "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--window-size=1280,1800", f"--screenshot={shot}", "--dump-dom",
                           (out / "conformance.html").as_uri()],
                          capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert console == [], console  # the page logs nothing: no error, no warning
    assert 'data-ready="1"' in dom, dom[:2000]  # its script ran to its last line
    first = re.search(r'<(article|details|tr)[^>]*class="[^"]*\bresult\b[^"]*"[^>]*>', dom).group(0)
    assert 'class="result failure"' in first and 'data-impl="mine:broken"' in first, first
    failure = dom.split('id="failure-1"', 1)[1].split("</article>", 1)[0]
    assert UNIFORM.split("::")[1] in failure
    assert re.search(r'<svg class="freq-plot"[^>]*data-passed="false"', failure), failure[:3000]
    assert 'class="observed outside"' in failure  # the last slot, never drawn, falls out of its band
    assert 'class="copy"' in failure and "load_adapter('mine:broken')" in failure
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
