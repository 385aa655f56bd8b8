"""rbcheck's pytest plugin is opt-in: an installed rbcheck changes nothing in
an unrelated project's pytest session (no header, no torch import, no
Hypothesis profile, none of rbcheck's modules beyond the light entry point),
and ``-p rbcheck`` or ``--impl`` turns it on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

UNRELATED = '''
import sys

def test_nothing_of_rbcheck_was_loaded():
    heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "rbcheck.harness")))
    assert heavy == [], heavy

def test_hypothesis_profile_untouched():
    from hypothesis import settings

    # Hypothesis itself loads its own "ci" profile when the CI variable is set
    import os
    own = "ci" if os.environ.get("CI") else "default"
    assert settings._current_profile in (None, own), settings._current_profile
    assert "dev" not in settings._profiles and "thorough" not in settings._profiles
'''


def run(tmp_path, *args):
    (tmp_path / "test_unrelated.py").write_text(textwrap.dedent(UNRELATED))
    env = {k: v for k, v in os.environ.items() if k not in ("RBCHECK_IMPL", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_an_unrelated_project_sees_nothing_of_rbcheck(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # pytest's own "plugins:" line names every installed plugin distribution
    mentions = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "rbcheck" in line and not line.startswith("plugins:")]
    assert mentions == [], proc.stdout
    assert "2 passed" in proc.stdout, proc.stdout


def test_dash_p_rbcheck_turns_the_plugin_on(tmp_path):
    proc = run(tmp_path, "-p", "rbcheck", "--impl", "example")
    assert "rbcheck implementation: list-buffer 0.1 (--impl example)" in proc.stdout, proc.stdout
    assert "2 failed" in proc.stdout, proc.stdout
    proc = run(tmp_path, "-p", "rbcheck")
    assert "rbcheck implementation: reference" in proc.stdout, proc.stdout
