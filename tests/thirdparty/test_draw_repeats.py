"""The adapters of cpprb's uniform buffer and stable-baselines3 repeat the
library's own draw (the libraries return no indices): under the same NumPy
state, the repeat must pick exactly the rows the library's own ``sample``
returns, and leave NumPy's generator where the library's call leaves it.

Skipped (with the reason) where the library is not installed: run them with
``nox -s thirdparty``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rbcheck.harness.protocol import BufferSpec
from rbcheck.harness.strategies import Field, Layout

LAYOUT = Layout((Field(("obs",), (2,), "float32"), Field(("next", "done"), (), "bool")))


def _fill(buf, rows: int) -> None:
    buf.extend(LAYOUT.batch(0, rows))


@pytest.mark.parametrize("rows", [3, 11])  # not full, and wrapped round the ring
def test_cpprb_uniform_repeat_is_cpprb_own_draw(rows):
    pytest.importorskip("cpprb", reason="cpprb is not installed (nox -s thirdparty installs it)")
    from rbcheck.harness.adapters.cpprb import CpprbBuffer

    spec = BufferSpec(capacity=7, sampler="random", seed=11, layout=LAYOUT.spec_layout())
    buf = CpprbBuffer(spec)
    _fill(buf, rows)
    np.random.seed(11)  # the library's own draw, from NumPy's global generator
    own = buf.rb.sample(64)
    after_own = np.random.get_state()[1].copy()
    rows_, info = buf.sample(64)  # the adapter's repeat, on the buffer's stream seeded with 11
    assert torch.equal(rows_["id"], torch.as_tensor(own["id"]).reshape(-1))
    assert torch.equal(rows_["id"] % 7, info["index"])
    assert np.array_equal(buf.stream.state[1], after_own)


@pytest.mark.parametrize("rows", [3, 11])
def test_sb3_repeat_is_sb3_own_draw(rows):
    pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (nox -s thirdparty installs it)")
    from rbcheck.harness.adapters.numpy_rows import unpack_rows
    from rbcheck.harness.adapters.sb3 import SB3Buffer

    spec = BufferSpec(capacity=7, sampler="random", seed=5, layout=LAYOUT.spec_layout())
    buf = SB3Buffer(spec)
    _fill(buf, rows)
    np.random.seed(5)
    own = buf.rb.sample(64)  # SB3's ReplayBuffer.sample: indices are not returned
    after_own = np.random.get_state()[1].copy()
    rows_, info = buf.sample(64)
    own_rows = unpack_rows(buf.layout, own.observations.numpy())
    assert torch.equal(rows_["id"], own_rows["id"])
    assert torch.equal(rows_["id"] % 7, info["index"])
    assert np.array_equal(buf.stream.state[1], after_own)
