"""Executed repro of the tensordict 0.14.3 bug in docs/bugs.toml (T41, a
strict xfail stating the spec's behaviour; see test_cpprb_bugs.py for the
pattern). Found by test_compressed_storage.py on rbcheck's own reference,
whose in-memory model lost the sign of -0.0; the reference's ``contents()``
now copies leaf by leaf."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
tensordict = pytest.importorskip("tensordict", reason="tensordict is not installed")

VERSION = f"tensordict {tensordict.__version__}"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: TensorDict.clone() of a TensorDict with a device copies its leaves with "
    "torch._foreach_add(vals, 0) (tensordict/base.py:13187), and -0.0 + 0 is +0.0"))
def test_clone_keeps_the_sign_of_negative_zero():
    td = tensordict.TensorDict({"x": torch.tensor([-0.0, 1.0])}, batch_size=[2], device="cpu")
    copy = td.clone()
    signs = torch.signbit(copy["x"]).tolist()
    assert signs == [True, False], f"signbit(td.clone()['x'])={signs}, but should be [True, False] [TensorDict.clone()]"
