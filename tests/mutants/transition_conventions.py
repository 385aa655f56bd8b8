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
from tensordict import TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions
from rbcheck.harness.transition_streams import LAYOUT
from tests.mutants.registry import control, mutant

T = "test_transitions"
MATCH = f"{T}::test_sampled_transitions_match_the_oracle"
WINDOW = f"{T}::test_no_window_contains_another_episodes_or_a_newer_row"
D3RLPY_LIKE = {"capacity_counts": "complete_transitions", "terminal_next_obs": "zeros"}


class FifoTransitions(CountedWrites):
    """A FIFO of complete transitions (see the module docstring)."""

    def __init__(self, spec: BufferSpec, bugs: frozenset[str]):
        self.spec, self.bugs = spec, bugs
        self.fifo: deque[int] = deque()  # the ids of the held steps, in the order they completed
        self.batches: list[TensorDictBase] = []  # every row written, in write order
        self.where: dict[int, int] = {}  # row id -> position in the rows written
        self.episode: dict[int, int] = {}  # row id -> its episode
        self.terminated: set[int] = set()
        self.pending: dict[int, int] = {}  # env -> the id of its running episode's newest step
        self.written = 0
        self.gen = torch.Generator().manual_seed(spec.seed)

    def _complete(self, i: int) -> None:
        self.fifo.append(i)
        if "counts_episodes" in self.bugs:  # the limit counts episodes: whole episodes are kept
            while len({self.episode[j] for j in self.fifo}) > self.spec.capacity:
                oldest = self.episode[self.fifo[0]]
                while self.fifo and self.episode[self.fifo[0]] == oldest:
                    self.fifo.popleft()
        elif len(self.fifo) > self.spec.capacity:
            self.fifo.popleft()

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        self.batches.append(data.select(*LAYOUT).to_tensordict())
        ids, envs, episodes = data["id"].tolist(), data["env"].tolist(), data["episode"].tolist()
        terminated, truncated = data["terminated"].tolist(), data["truncated"].tolist()
        for k, i in enumerate(ids):
            self.where[i], self.episode[i] = self.written + k, episodes[k]
            if envs[k] in self.pending:  # its predecessor's next observation is known now
                self._complete(self.pending.pop(envs[k]))
            if terminated[k]:
                self.terminated.add(i)
                self._complete(i)
            elif not truncated[k]:
                self.pending[envs[k]] = i
        self.written += len(data)
        return data["id"].reshape(-1).long() % self.spec.capacity

    def _held(self) -> list[int]:
        held = list(self.fifo)
        if "samples_pending" in self.bugs:  # the running episodes' newest steps, next obs not known yet
            held += list(self.pending.values())
        return held

    def __len__(self) -> int:
        return len(self._held())

    def _next(self, i: int) -> int | None:
        """The position of the row whose obs is ``i``'s next observation; None for zeros."""
        following = i + self.spec.num_envs  # the env's next row
        if i in self.terminated:
            if "terminal_next_is_next_episode" in self.bugs:  # another episode's first obs, or its own for the newest
                return self.where.get(following, self.where[i])
            return None
        return None if i in self.pending.values() else self.where[following]  # pending: not known yet

    def _gather(self, ids: list[int]) -> TensorDictBase:
        every = torch.cat(self.batches)
        rows = every[torch.tensor([self.where[i] for i in ids], dtype=torch.long)]
        following = [self._next(i) for i in ids]
        known = torch.tensor([f is not None for f in following])
        nxt = every["obs"][torch.tensor([f if f is not None else 0 for f in following], dtype=torch.long)]
        rows["next_obs"] = torch.where(known[:, None], nxt, torch.zeros_like(nxt))
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


@mutant(bug="terminal_next_obs='zeros' declared, but a terminated step's next_obs is the next episode's first obs "
            "(its own obs while it is the newest row)",
        catches=(MATCH, WINDOW), control=fifo_transitions, kind="convention", in_process=True)
def fifo_terminal_next_obs_from_the_next_episode():
    return _adapter("fifo_terminal_next_obs_from_the_next_episode", ("terminal_next_is_next_episode",))
