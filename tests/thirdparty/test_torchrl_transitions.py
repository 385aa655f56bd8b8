"""torchrl 0.14.1 ``MultiStep`` (invariant 10, docs/bugs.toml RM1, formerly R1): a
strict xfail stating the spec's behaviour. Skipped where torchrl is not
installed: ``nox -s thirdparty``."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data.postprocs import MultiStep  # noqa: E402

VERSION = "torchrl 0.14.1"


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: MultiStep gathers the bootstrap observation from the window's last step but not its "
    "done flags (done keys excluded from the gather, data/postprocs/postprocs.py:272-276), and "
    "'nonterminal' is time_to_obs != 0 (:285): a step whose window ends on a termination keeps "
    "('next', 'terminated') False, nonterminal True and gamma**m, so it bootstraps from the terminal observation"))
def test_window_ending_on_a_termination_does_not_bootstrap():
    t = 4  # one episode terminated at step 2, then a new one
    term = torch.tensor([False, False, True, False])[:, None]
    td = TensorDict({
        "observation": torch.arange(t).float()[:, None], "action": torch.zeros(t, 1),
        "next": TensorDict({"observation": torch.tensor([1.0, 2.0, 102.0, 4.0])[:, None],
                            "reward": torch.ones(t, 1), "terminated": term, "truncated": torch.zeros(t, 1, dtype=torch.bool),
                            "done": term.clone()}, [t]),
    }, [t])
    out = MultiStep(gamma=0.5, n_steps=3)(td.unsqueeze(0))[0]
    assert out["next", "reward"][:3, 0].tolist() == [1.75, 1.5, 1.0]  # returns stop at the termination
    # steps 0 and 1: their windows end on the termination at step 2, so no bootstrap
    assert out["next", "terminated"][:2, 0].tolist() == [True, True] or out["nonterminal"][:2].tolist() == [False, False]
