"""Hypothesis strategies for streams of env steps (the transitions properties).

A :class:`Stream` is what a collector hands a buffer: ``T`` steps of
``num_envs`` envs, each step one write of ``num_envs`` rows (env order), so
rows are interleaved by env. Each env runs episodes of drawn lengths that end
``terminated``, ``truncated`` or are still running when the stream stops.

Rows are self-describing, so a sample can be checked without the buffer's
help and a row of another episode is visible at once:

* ``id``: write order (0, 1, ...); ``env``; ``episode`` (a uid over all envs);
  ``step`` (within its episode);
* ``obs = [id, episode, step]`` (float32, exact);
* ``next_obs``: the next row of the same env's ``obs`` inside an episode (for
  the newest row, the obs its successor will have), and at an episode's end
  its own final observation ``[-(id + 1), episode, step + 1]``, which no
  row holds as ``obs``;
* ``reward``: a distinct dyadic value per row (exact in float32);
  ``action``: ``[id % 3 / 2]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from tensordict import TensorDict

from rbcheck.harness.protocol import BufferSpec

NONE, TERMINATED, TRUNCATED = 0, 1, 2


@dataclass(frozen=True)
class Stream:
    num_envs: int
    ends: tuple[tuple[int, ...], ...]  # ends[step][env] in {NONE, TERMINATED, TRUNCATED}

    @property
    def steps(self) -> int:
        return len(self.ends)

    @property
    def total(self) -> int:
        return self.steps * self.num_envs

    def rows(self) -> TensorDict:
        """Every row in write order (see the module docstring)."""
        e, t = self.num_envs, self.steps
        ids = torch.arange(t * e, dtype=torch.long)
        env = ids % e
        episode = torch.empty_like(ids)
        step = torch.empty_like(ids)
        end = torch.tensor([x for row in self.ends for x in row], dtype=torch.long).reshape(-1)
        uid, current, count = 0, [None] * e, [0] * e
        for r in range(t * e):
            k = r % e
            if current[k] is None:
                current[k], count[k], uid = uid, 0, uid + 1
            episode[r], step[r] = current[k], count[k]
            count[k] += 1
            if end[r] != NONE:
                current[k] = None
        obs = torch.stack([ids, episode, step], 1).float()
        ending = end != NONE
        nxt = torch.stack([ids + e, episode, step + 1], 1).float()
        final = torch.stack([-(ids + 1), episode, step + 1], 1).float()
        next_obs = torch.where(ending[:, None], final, nxt)
        reward = ((ids * 7) % 23 - 11).float() / 4
        return TensorDict(
            {
                "id": ids, "env": env, "episode": episode, "step": step, "obs": obs,
                "action": (ids % 3).float()[:, None] / 2, "reward": reward,
                "terminated": end == TERMINATED, "truncated": end == TRUNCATED, "next_obs": next_obs,
            },
            batch_size=[t * e],
        )

    def held(self, capacity: int, counts: str = "rows") -> TensorDict:
        """The rows a buffer of ``capacity`` holds at the end, in write order.

        ``counts="rows"`` (the spec): the last ``capacity`` rows written.
        ``counts="complete_transitions"`` (``Conventions.capacity_counts``): a
        row is held once its transition is complete, at the write of the next
        row of its env in the same episode, or at its own write when it
        terminated (after that next row's predecessor, as written); the last
        row of a truncated episode and the newest row of a running one never
        complete. The last ``capacity`` rows in completion order are held."""
        rows = self.rows()
        if counts == "rows":
            return rows[max(0, len(rows) - capacity):]
        if counts != "complete_transitions":
            raise ValueError(f"counts={counts!r}, but should be 'rows' or 'complete_transitions'")
        e, total = self.num_envs, len(rows)
        terminated = rows["terminated"].tolist()
        ending = (rows["terminated"] | rows["truncated"]).tolist()
        done = []  # (the id of the write that completes the row, the row's id)
        for r in range(total):
            if terminated[r]:
                done.append((r, r))
            elif not ending[r] and r + e < total:
                done.append((r + e, r))
        kept = sorted(r for _, r in sorted(done)[max(0, len(done) - capacity):])
        return rows[torch.tensor(kept, dtype=torch.long)]

    def describe(self) -> str:
        names = {NONE: ".", TERMINATED: "T", TRUNCATED: "t"}
        per_env = ["".join(names[s[k]] for s in self.ends) for k in range(self.num_envs)]
        return f"steps per env {per_env} ('.' running, T terminated, t truncated)"

    def write(self, buf) -> None:
        """Write the stream into ``buf``: one ``extend`` per step (``num_envs`` rows)."""
        rows = self.rows()
        for s in range(self.steps):
            buf.extend(rows[s * self.num_envs:(s + 1) * self.num_envs])

    #: the same as a line of a repro snippet
    WRITE = "stream.write(buf)"


LAYOUT = {
    "id": ((), torch.long), "env": ((), torch.long), "episode": ((), torch.long), "step": ((), torch.long),
    "obs": ((3,), torch.float32), "action": ((1,), torch.float32), "reward": ((), torch.float32),
    "terminated": ((), torch.bool), "truncated": ((), torch.bool), "next_obs": ((3,), torch.float32),
}


@st.composite
def streams(draw, num_envs: int, capacity: int, truncations: bool = False) -> Stream:
    """A stream for a ring of ``capacity`` rows: before, at, just after or
    long after its first wrap; episodes of drawn lengths (``truncations``:
    more of them end truncated)."""
    per_env = max(1, capacity // num_envs)
    when = draw(st.sampled_from(["before", "at", "after", "long after"]), label="first wrap")
    t = {"before": draw(st.integers(1, max(1, per_env - 1))), "at": per_env, "after": per_env + 1,
         "long after": draw(st.integers(per_env + 2, 4 * per_env + 3))}[when]
    p_end = draw(st.sampled_from([1, 3, 6]), label="chance in 10 an episode ends at a step")
    weights = [TRUNCATED, TRUNCATED, TERMINATED] if truncations else [TERMINATED, TRUNCATED]
    ends = []
    for _ in range(t):
        row = []
        for _ in range(num_envs):
            ended = draw(st.integers(0, 9)) < p_end
            row.append(draw(st.sampled_from(weights)) if ended else NONE)
        ends.append(tuple(row))
    return Stream(num_envs, tuple(ends))


@st.composite
def transition_setups(draw, impl, nstep: bool, truncations: bool = False, one_env: bool = False):
    """``(spec, stream)``: several envs only where the adapter has ``env_id``
    (and not ``one_env``: slices need each episode's rows adjacent)."""
    num_envs = draw(st.integers(1, 3), label="num_envs") if impl.has("env_id") and not one_env else 1
    capacity = num_envs * draw(st.integers(2, 8), label="rows per env")
    spec = BufferSpec(
        capacity=capacity, seed=draw(st.integers(0, 2**16), label="seed"), layout=LAYOUT, num_envs=num_envs,
        nstep=draw(st.integers(1, 4), label="n") if nstep else None,
        gamma=draw(st.sampled_from([0.5, 0.75, 0.99]), label="gamma"),
    )
    return spec, draw(streams(num_envs, capacity, truncations), label="stream")


__all__ = ["LAYOUT", "Stream", "streams", "transition_setups"]
