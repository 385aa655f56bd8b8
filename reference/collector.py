"""SyncCollector: roll a policy in an env and write the trajectories into a buffer.

Contract
--------
``SyncCollector(env, policy, buffer, frames_per_batch, device="cpu",
total_frames=None, allow_in_place=True)``

* The policy is placed once, at construction, with
  :func:`rbcheck.reference.policy.place_policy` (never a raw ``deepcopy``): used in
  place when it already lives on ``device``, copied otherwise; a policy that
  needs a copy but cannot be copied raises ``NotCopyableError`` here, before
  anything is written. ``collector.policy`` is what actually runs.
* The policy is called as ``policy(observation)`` under ``torch.no_grad()``
  with the observation (float32 ``[obs_dim]``) on ``device``; it returns one
  action (a scalar or a one-element tensor), brought back to the CPU.
* ``collect()`` takes ``frames_per_batch`` env steps, calls
  ``buffer.extend(batch)`` once, and returns the batch: a TensorDict of batch
  size ``[frames_per_batch]`` with keys ``observation``, ``action`` (``[n]``),
  ``reward`` (``[n, 1]``), ``episode`` (int64 ``[n]``; 0, 1, 2, ... in the
  order episodes start, never reused), ``steps`` (int64 ``[n]``, 0 at the
  first step of an episode, +1 per step), ``done`` (bool ``[n, 1]``: True on
  the last row of an episode, equal to ``("next", "done")``; at the root so
  a sampler can find episode ends by a flat key), ``("next", "observation")``
  and ``("next", "done")``. An episode cut by the end of a batch goes on in
  the next batch with the same id and the following step numbers.
* Iterating yields ``collect()`` results until ``total_frames`` frames
  (a multiple of ``frames_per_batch``) have been collected; forever if None.

Cost: one policy call and one env step per frame (plain Python loop); one
``extend`` per batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict

from rbcheck.reference.policy import place_policy


class SyncCollector:
    def __init__(
        self,
        env: Any,
        policy: Any,
        buffer: Any,
        frames_per_batch: int,
        device: Any = "cpu",
        total_frames: int | None = None,
        allow_in_place: bool = True,
    ) -> None:
        if not (hasattr(env, "reset") and hasattr(env, "step")):
            raise TypeError(f"env={type(env).__name__}, but should have reset() and step(td)")
        if not callable(getattr(buffer, "extend", None)):
            raise TypeError(f"buffer={type(buffer).__name__}, but should have an extend(td) method")
        if (
            not isinstance(frames_per_batch, int)
            or isinstance(frames_per_batch, bool)
            or frames_per_batch < 1
        ):
            raise ValueError(f"frames_per_batch={frames_per_batch!r}, but should be an int >= 1")
        if total_frames is not None and (
            not isinstance(total_frames, int) or total_frames < 1 or total_frames % frames_per_batch
        ):
            raise ValueError(
                f"total_frames={total_frames!r}, but should be None or a positive multiple "
                f"of frames_per_batch={frames_per_batch}"
            )
        self.device = torch.device(device)
        self.policy = place_policy(policy, self.device, allow_in_place=allow_in_place)
        self.env = env
        self.buffer = buffer
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.frames = 0  # frames collected so far
        self.episode = -1  # id of the current episode (-1: none started yet)
        self.step_in_episode = 0
        self._state: TensorDict | None = None  # None: the next frame starts an episode

    def _act(self, observation: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            action = self.policy(observation.to(self.device))
        action = torch.as_tensor(action)
        if action.numel() != 1:
            raise ValueError(
                f"policy(observation).shape={tuple(action.shape)}, but should hold one action"
            )
        return action.detach().to("cpu").reshape(())

    def collect(self) -> TensorDict:
        """Take ``frames_per_batch`` steps, write them with ``buffer.extend``, return them."""
        columns: dict[str, list[torch.Tensor]] = {
            k: []
            for k in (
                "observation",
                "action",
                "reward",
                "episode",
                "steps",
                "done",
                "next_observation",
            )
        }
        for _ in range(self.frames_per_batch):
            if self._state is None:
                self._state = self.env.reset()
                self.episode += 1
                self.step_in_episode = 0
            observation = self._state["observation"]
            action = self._act(observation)
            nxt = self.env.step(self._state.copy().set("action", action))["next"]
            done = nxt["done"].reshape(1).to(torch.bool)
            columns["observation"].append(observation)
            columns["action"].append(action)
            columns["reward"].append(nxt["reward"].reshape(1))
            columns["episode"].append(torch.tensor(self.episode, dtype=torch.int64))
            columns["steps"].append(torch.tensor(self.step_in_episode, dtype=torch.int64))
            columns["done"].append(done)
            columns["next_observation"].append(nxt["observation"])
            self.step_in_episode += 1
            if bool(done):
                self._state = None
            else:
                self._state = TensorDict(
                    {"observation": nxt["observation"], "done": done}, batch_size=[]
                )
        stacked = {k: torch.stack(v) for k, v in columns.items()}
        next_observation = stacked.pop("next_observation")
        batch = TensorDict(stacked, batch_size=[self.frames_per_batch])
        batch["next"] = TensorDict(
            {"observation": next_observation, "done": stacked["done"].clone()},
            batch_size=[self.frames_per_batch],
        )
        self.buffer.extend(batch)
        self.frames += self.frames_per_batch
        return batch

    def __iter__(self) -> Iterator[TensorDict]:
        while self.total_frames is None or self.frames < self.total_frames:
            yield self.collect()
