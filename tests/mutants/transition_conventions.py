"""Convention mutants of invariant 10: a buffer that declares
``capacity_counts="complete_transitions"`` and ``terminal_next_obs="zeros"``
(d3rlpy's online path) is still checked in those terms, so a bug under
either declaration is caught, and the same buffer without a bug passes (the
control).

:class:`FifoTransitions` is modelled on d3rlpy 2.8.1 (``FIFOBuffer``,
``ExperienceWriter``, ``BasicTransitionPicker``): a FIFO of at most
``capacity`` transitions; a step enters it once its transition is complete
(the next step of its episode is written, or it terminated; a truncated
episode's last step never does); a terminated step's next observation is
zeros. Each mutant turns one bug on. They run in-process
(``in_process=True``, tests/meta/test_in_process_mutants.py).
"""

from __future__ import annotations

from collections import deque

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions
from tests.mutants.registry import control, mutant

T = "test_transitions"
MATCH = f"{T}::test_sampled_transitions_match_the_oracle"
WINDOW = f"{T}::test_no_window_contains_another_episodes_or_a_newer_row"
D3RLPY_LIKE = {"capacity_counts": "complete_transitions", "terminal_next_obs": "zeros"}


class FifoTransitions:
    """A FIFO of complete transitions (see the module docstring)."""

    def __init__(self, spec: BufferSpec, bugs: frozenset[str]):
        self.spec, self.bugs = spec, bugs
        self.fifo: deque[int] = deque()  # the ids of the held steps, in the order they completed
        self.rows: dict[int, TensorDictBase] = {}
        self.pending: dict[int, int] = {}  # env -> the id of its running episode's newest step
        self.written = 0
        self.gen = torch.Generator().manual_seed(spec.seed)

    def _complete(self, i: int) -> None:
        self.fifo.append(i)
        if "counts_episodes" in self.bugs:  # the limit counts episodes: whole episodes are kept
            episodes = list(dict.fromkeys(int(self.rows[j]["episode"]) for j in self.fifo))
            while len(episodes) > self.spec.capacity:
                oldest = episodes.pop(0)
                while self.fifo and int(self.rows[self.fifo[0]]["episode"]) == oldest:
                    self.fifo.popleft()
        elif len(self.fifo) > self.spec.capacity:
            self.fifo.popleft()

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        for k in range(len(data)):
            row = data[k].clone()
            i, env = int(row["id"]), int(row["env"])
            self.rows[i] = row
            if env in self.pending:  # its predecessor's next observation is known now
                self._complete(self.pending.pop(env))
            if row["terminated"]:
                self._complete(i)
            elif not row["truncated"]:
                self.pending[env] = i
        self.written += len(data)
        return data["id"].reshape(-1).long() % self.spec.capacity

    def add(self, row: TensorDictBase) -> int:
        return int(self.extend(row.unsqueeze(0))[0])

    def _held(self) -> list[int]:
        held = list(self.fifo)
        if "samples_pending" in self.bugs:  # the running episodes' newest steps, next obs not known yet
            held += list(self.pending.values())
        return held

    def __len__(self) -> int:
        return len(self._held())

    @property
    def cursor(self) -> int:
        return self.written % self.spec.capacity

    @property
    def write_count(self) -> int:
        return self.written

    def _next_obs(self, i: int) -> torch.Tensor:
        row = self.rows[i]
        if row["terminated"]:
            if "terminal_next_is_next_episode" in self.bugs and i + self.spec.num_envs in self.rows:
                return self.rows[i + self.spec.num_envs]["obs"]  # the env's next row: another episode's first obs
            return torch.zeros_like(row["obs"])
        if i in self.pending.values():
            return torch.zeros_like(row["obs"])  # not known yet
        return self.rows[i + self.spec.num_envs]["obs"]

    def _gather(self, ids: list[int]) -> TensorDict:
        if not ids:
            return TensorDict({}, batch_size=[0])
        rows = torch.stack([self.rows[i] for i in ids]).to_tensordict()
        rows["next_obs"] = torch.stack([self._next_obs(i) for i in ids])
        return rows

    def contents(self) -> TensorDictBase:
        return self._gather(sorted(self._held()))

    def sample(self, batch_size: int | None = None):
        batch_size = batch_size or self.spec.batch_size
        held = self._held()
        if not held:
            raise RuntimeError("no complete transition is held, but should be one to sample")
        index = torch.randint(len(held), (batch_size,), generator=self.gen)
        rows = self._gather([held[j] for j in index.tolist()])
        return rows, {"index": rows["id"].reshape(-1).long() % self.spec.capacity}


def _adapter(name: str, bugs: tuple[str, ...] = ()) -> Adapter:
    conv = Conventions(**D3RLPY_LIKE)
    return Adapter(name=name, version="mutant", make=lambda spec: FifoTransitions(spec, frozenset(bugs)),
                   capabilities=frozenset({"transitions", "env_id"}), conventions=conv)


@control
def fifo_transitions():
    """The FIFO of complete transitions without a bug, declaring both conventions."""
    return _adapter("fifo_transitions")


@mutant(bug="capacity_counts='complete_transitions' declared, but the limit counts episodes: whole episodes "
            "are kept, more steps than the capacity",
        catches=(MATCH, WINDOW), control=fifo_transitions, kind="convention", in_process=True)
def fifo_limit_counts_episodes():
    return _adapter("fifo_limit_counts_episodes", ("counts_episodes",))


@mutant(bug="capacity_counts='complete_transitions' declared, but the newest step of a running episode is "
            "sampled before its next observation is known (with a zero next_obs)",
        catches=(MATCH, WINDOW), control=fifo_transitions, kind="convention", in_process=True)
def fifo_samples_the_pending_step():
    return _adapter("fifo_samples_the_pending_step", ("samples_pending",))


@mutant(bug="terminal_next_obs='zeros' declared, but a terminated step's next_obs is the next episode's first obs",
        catches=(MATCH, WINDOW), control=fifo_transitions, kind="convention", in_process=True)
def fifo_terminal_next_obs_from_the_next_episode():
    return _adapter("fifo_terminal_next_obs_from_the_next_episode", ("terminal_next_is_next_episode",))
