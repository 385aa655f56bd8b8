"""torchrl 0.14.1's ``HERReplayBuffer`` (docs/findings.md, issue 42): a strict
xfail stating the spec's behaviour. Skipped where torchrl is not installed
(``nox -s thirdparty`` installs it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not installed (nox -s thirdparty installs it)")
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import HERReplayBuffer, LazyTensorStorage  # noqa: E402

VERSION = "torchrl 0.14.1"


def episode(length: int) -> TensorDict:
    """One episode whose step t starts in state t and reaches state t + 1 (goals [t] and [t + 1])."""
    t = torch.arange(length, dtype=torch.float32)[:, None]
    done = (torch.arange(length) == length - 1)[:, None]
    return TensorDict({"achieved_goal": t, "desired_goal": torch.full((length, 1), -1.0),
                       "next": TensorDict({"achieved_goal": t + 1, "desired_goal": torch.full((length, 1), -1.0),
                                           "reward": torch.zeros(length, 1), "done": done, "terminated": done},
                                          [length])}, [length])


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    f"{VERSION}: HERReplayBuffer._sample takes the new goal from the chosen step's own achieved goal, "
    "goal_src_tds.get(self.achieved_goal_key) (data/replay_buffers/her.py:389-390), the state the step "
    "starts in, not ('next', achieved_goal), the state reached after it: 'final' gives the state before the "
    "last step (its docstring: 'the final achieved state of the episode'), and 'future' may give the "
    "sampled step's own starting state"))
def test_final_relabels_with_the_state_reached_at_the_episodes_end():
    torch.manual_seed(0)
    rb = HERReplayBuffer(lambda td: torch.zeros(td.shape[0], 1), her_ratio=1.0, strategy="final",
                         storage=LazyTensorStorage(8))
    rb.extend(episode(3))  # states 0 -> 1 -> 2 -> 3: the final achieved state is 3
    goals = rb.sample(16)["desired_goal"].reshape(-1).tolist()
    assert goals == [3.0] * 16, f"relabelled goals {sorted(set(goals))}, but should all be 3.0 (the final state)"
