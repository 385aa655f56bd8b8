"""Every executed repro named in docs/bugs.toml is collected where its library
is installed (``nox -s thirdparty`` and its environments of their own), so a
renamed or deleted repro cannot drop out of the run that executes it. Where a
repro's module was not collected (its library is not installed here: the
tests session), tests/test_bugs.py's static check stands in (the function
exists and is marked ``xfail(strict=True)``)."""

from __future__ import annotations

import pytest

from tests.thirdparty import conftest
from tools import bugs


def test_every_registered_repro_was_collected():
    wanted = sorted({(e["id"], test) for e in bugs.load() for test in bugs.repros(e)})
    here = [(ident, test) for ident, test in wanted if test.split("::", 1)[0] in conftest.COLLECTED_FILES]
    if not here:
        pytest.skip("no module of a registered repro was collected in this session (their libraries are not "
                    "installed here): tests/test_bugs.py checks the repros statically")
    missing = [f"{ident}: {test}" for ident, test in here if test.split("[", 1)[0] not in conftest.COLLECTED]
    assert not missing, (f"registered repros not collected={missing}, but should each be a test of its module "
                         f"(docs/bugs.toml names them; rename the entry's repro with the test)")
