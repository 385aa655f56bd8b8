"""Mutants of invariant 10 (transitions and n-step returns), each modelled on
a real bug, and their controls.

:class:`SlotTransitions` is a transitions buffer written the way libraries
write them: rows in a ring of slots, the next row of an env found by slot
arithmetic (``slot + num_envs``), the n-step window walked slot by slot and
stopped at an episode's end and at the write cursor. With no bug it is a
correct buffer (the controls); each mutant turns one bug on. These mutants
run in-process with small example budgets (``in_process=True``):
tests/meta/test_mutants_caught.py calls the targeted properties directly.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions
from rbcheck.harness.transition_streams import LAYOUT
from tests.mutants.registry import control
from tests.mutants.registry import mutant as _mutant

T = "test_transitions"
MATCH = f"{T}::test_sampled_transitions_match_the_oracle"
TRUNC = f"{T}::test_truncated_step_bootstraps_from_its_own_final_obs"
WINDOW = f"{T}::test_no_window_contains_another_episodes_or_a_newer_row"
INCOMPLETE = f"{T}::test_incomplete_windows_are_handled_as_declared"
GARBAGE = 48879.0


def mutant(**kw):
    """:func:`tests.mutants.registry.mutant`, run in-process (cheap)."""
    return _mutant(in_process=True, **kw)  # what uninitialised memory reads as here (deterministic)


class SlotTransitions(CountedWrites):
    """A ring of ``capacity`` rows with transitions and n-step by slot arithmetic."""

    def __init__(self, spec: BufferSpec, bugs: frozenset[str], conventions: Conventions):
        self.spec, self.bugs, self.conv = spec, bugs, conventions
        self.cap, self.e = spec.capacity, spec.num_envs
        self.store = TensorDict({k: torch.zeros(spec.capacity, *shape, dtype=dtype)
                                 for k, (shape, dtype) in LAYOUT.items()}, batch_size=[spec.capacity])
        self.written = 0
        self.gen = torch.Generator().manual_seed(spec.seed)
        if spec.nstep and conventions.incomplete_windows == "exclude_until_n_steps":
            ring = self.cap // self.e  # the steps one env holds
            if spec.nstep > ring or ("refuses_fitting" in bugs and spec.nstep == ring):
                raise ValueError(f"spec.nstep={spec.nstep}, but should be <= {ring} (capacity // num_envs)")

    # writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        slots = (self.written + torch.arange(len(data))) % self.cap
        self.store[slots] = data.select(*LAYOUT).to_tensordict()
        self.written += len(data)
        return slots

    def __len__(self) -> int:
        return min(self.written, self.cap)

    @property
    def cursor(self) -> int:
        return self.written % self.cap

    def contents(self) -> TensorDictBase:
        return self.store[: len(self)].clone()

    # transitions
    def age(self, s: int) -> int:
        """Write number of the row in slot ``s``."""
        return s if self.written <= self.cap else self.written - self.cap + (s - self.cursor) % self.cap

    def succ(self, s: int) -> int | None:
        """The slot of the next row of the same env, None past the write cursor."""
        step = 1 if "no_env_id" in self.bugs else self.e
        nxt = (s + step) % self.cap
        if "wrap_before_full" in self.bugs and self.written < self.cap:
            return nxt  # tianshou #135: modulo capacity, into unwritten slots
        if "cross_cursor" in self.bugs:
            return nxt
        return nxt if self.age(s) + step < self.written else None

    def ends(self, s: int) -> bool:
        return self._term[s] or self._trunc[s]

    def window(self, s: int, n: int) -> list[int]:
        out = [s]
        crossing = "cross_episode_when_full" in self.bugs and self.written >= self.cap
        while len(out) < n and (crossing or not self.ends(out[-1])):
            nxt = self.succ(out[-1])
            if nxt is None:
                break
            out.append(nxt)
        return out

    def complete(self, s: int, n: int) -> bool:
        w = self.window(s, n)
        return len(w) == n or self.ends(w[-1])

    def next_obs(self, s: int) -> torch.Tensor:
        st = self.store
        nxt = (s + self.e) % self.cap
        if "memopt" in self.bugs and not self.ends(s):  # next obs from the next slot's obs
            if self.age(s) + self.e >= self.written:  # the newest row: its slot was never written
                return torch.full_like(st["obs"][s], GARBAGE) if "uninitialised" in self.bugs else st["obs"][nxt]
            return st["obs"][nxt]
        if "final_obs_overwritten" in self.bugs and self.ends(s) and self.age(s) + self.e < self.written:
            return st["obs"][nxt]  # the next episode's first obs
        if "truncated_final_obs_lost" in self.bugs and self._trunc[s] and self.age(s) + self.e < self.written:
            return st["obs"][nxt]
        return st["next_obs"][s]

    def sample(self, batch_size: int | None = None):
        batch_size = batch_size or self.spec.batch_size
        n = self.spec.nstep
        self._term = self.store["terminated"].tolist()
        self._trunc = self.store["truncated"].tolist()
        reward = self.store["reward"].tolist()
        held = len(self)
        if "samples_unwritten" in self.bugs and self.written < self.cap:
            held = min(held + self.e, self.cap)  # SB3 #1503: the upper bound includes pos
        eligible = torch.arange(held)
        rule = self.conv.incomplete_windows
        if n and rule == "exclude_until_n_steps" and "ends_early" not in self.bugs:
            eligible = torch.tensor([s for s in range(held) if self.age(s) + (n - 1) * self.e < self.written],
                                    dtype=torch.long)  # n steps of its env held from it on
        elif n and rule != "shorten" and "samples_incomplete" not in self.bugs:  # ends_early: as "exclude"
            eligible = torch.tensor([s for s in range(held) if self.complete(s, n)], dtype=torch.long)
        if len(eligible) == 0:
            raise RuntimeError("no slot with a complete window, but should be one to sample")
        index = eligible[torch.randint(len(eligible), (batch_size,), generator=self.gen)]
        st = self.store
        rows = st[index].clone()
        if "index_shifted" in self.bugs:  # tianshou #82: gathers after obs_next shifted the index in place
            moved = st[torch.tensor([self.succ(s) if self.succ(s) is not None else s for s in index.tolist()])]
            for key in ("action", "reward", "terminated", "truncated"):
                rows[key] = moved[key]
        rows["next_obs"] = torch.stack([self.next_obs(s) for s in index.tolist()])
        if "extra_terminal" in self.bugs:  # dopamine #228: the step before a termination flagged too
            rows["terminated"] = rows["terminated"] | torch.tensor(
                [self.succ(s) is not None and self._term[self.succ(s)] for s in index.tolist()])
        if n and self.conv.nstep_form == "window":
            ids = st["id"].tolist()
            rows["window_id"] = torch.tensor([[ids[p] for p in self.window(s, n)] + [-1] * (n - len(self.window(s, n)))
                                              for s in index.tolist()], dtype=torch.long).reshape(-1, n)
        elif n:
            ret, disc, boot = [], [], []
            for s in index.tolist():
                w = self.window(s, n)
                gamma = self.spec.gamma
                ret.append(sum(gamma**k * reward[p] for k, p in enumerate(w)))
                terminal = self._term[w[-1]]
                if "done_mask_ignored" in self.bugs:
                    terminal = False
                power = 1 if "gamma_not_gamma_n" in self.bugs else len(w)
                disc.append(0.0 if terminal else gamma**power)
                boot.append(self.next_obs(w[-1]))
            rows["nstep_return"] = torch.tensor(ret, dtype=torch.float64)
            rows["nstep_discount"] = torch.tensor(disc, dtype=torch.float64)
            rows["nstep_obs"] = torch.stack(boot)
            if "obs_shifted_by_nstep" in self.bugs:  # ray PR #18358: OBS shared with NEXT_OBS
                rows["obs"] = rows["nstep_obs"].clone()
        if "empty_sample" in self.bugs:  # answers with no row while rows are held
            return rows[:0], {"index": index[:0]}
        return rows, {"index": index}


def _adapter(name: str, bugs: tuple[str, ...] = (), capabilities=("transitions", "nstep", "env_id"),
             **conventions) -> Adapter:
    conv = Conventions(**conventions)
    return Adapter(name=name, version="mutant", make=lambda spec: SlotTransitions(spec, frozenset(bugs), conv),
                   capabilities=frozenset(capabilities), conventions=conv)


# controls: the same buffer without a bug, with and without the conventions the mutants declare


@control
def slot_transitions():
    return _adapter("slot_transitions")


@control
def slot_transitions_windows():
    return _adapter("slot_transitions_windows", nstep_form="window")


@control
def slot_transitions_excluding():
    return _adapter("slot_transitions_excluding", incomplete_windows="exclude")


@control
def slot_transitions_sequences():
    return _adapter("slot_transitions_sequences", nstep_form="window", incomplete_windows="exclude_until_n_steps")


# mutants, one per real bug


@mutant(bug="sample() answers with an empty batch while rows are held (no error, no row)",
        catches=(MATCH, TRUNC, WINDOW), control=slot_transitions)
def empty_sample_while_rows_are_held():
    return _adapter("empty_sample", ("empty_sample",))


@mutant(bug="optimize_memory_usage with timeouts: a truncated step's next obs is the next episode's first obs",
        catches=(MATCH, TRUNC, WINDOW), control=slot_transitions, reproduces="DLR-RM/stable-baselines3 #934")
def sb3_934_timeout_bootstraps_from_next_episode():
    return _adapter("sb3_934", ("final_obs_overwritten",))


@mutant(bug="next obs derived from the next slot: a full buffer's newest row's next is the oldest row",
        catches=(MATCH, WINDOW), control=slot_transitions, reproduces="DLR-RM/stable-baselines3 #1853")
def sb3_1853_newest_row_next_is_an_old_row():
    return _adapter("sb3_1853", ("memopt",))


@mutant(bug="a buffer that is not full samples the unwritten slot at pos",
        catches=(MATCH,), control=slot_transitions, reproduces="DLR-RM/stable-baselines3 #1503 (PR #1504)")
def sb3_1503_samples_the_unwritten_slot():
    return _adapter("sb3_1503", ("samples_unwritten",))


@mutant(bug="the final observation of a truncated episode is lost (the next episode's first obs instead)",
        catches=(TRUNC, MATCH), control=slot_transitions, reproduces="vwxyzjn/cleanrl #460")
def cleanrl_460_truncated_final_obs_lost():
    return _adapter("cleanrl_460", ("truncated_final_obs_lost",))


@mutant(bug="n-step windows cross episode ends once the buffer is full",
        catches=(MATCH, WINDOW), control=slot_transitions, reproduces="younggyoseo/FastTD3 #6")
def fasttd3_6_windows_cross_episodes_when_full():
    return _adapter("fasttd3_6_cross", ("cross_episode_when_full",))


@mutant(bug="n-step done mask ignored: a window ending on a termination still bootstraps",
        catches=(MATCH,), control=slot_transitions, reproduces="younggyoseo/FastTD3 PR #7 (done mask)")
def fasttd3_7_done_mask_ignored():
    return _adapter("fasttd3_7_done", ("done_mask_ignored",))


@mutant(bug="the bootstrap is discounted by gamma where gamma**n belongs",
        catches=(MATCH, WINDOW), control=slot_transitions, reproduces="younggyoseo/FastTD3 PR #7 (gamma**n)")
def fasttd3_7_gamma_not_gamma_n():
    return _adapter("fasttd3_7_gamma", ("gamma_not_gamma_n",))


@mutant(bug="before the buffer is full the n-step window wraps modulo capacity into unwritten slots",
        catches=(MATCH, WINDOW, INCOMPLETE), control=slot_transitions, reproduces="thu-ml/tianshou #135")
def tianshou_135_nstep_wraps_before_full():
    return _adapter("tianshou_135", ("wrap_before_full",))


@mutant(bug="deriving obs_next shifts the index in place: reward, action and flags of the next row",
        catches=(MATCH,), control=slot_transitions, reproduces="thu-ml/tianshou #82")
def tianshou_82_index_shifted_by_obs_next():
    return _adapter("tianshou_82", ("index_shifted",))


@mutant(bug="a window cut short by the write cursor is sampled as if it were valid",
        catches=(INCOMPLETE,), control=slot_transitions_excluding, reproduces="google/dopamine #213")
def dopamine_213_truncated_trajectory_taken_as_valid():
    return _adapter("dopamine_213", ("samples_incomplete",), incomplete_windows="exclude")


@mutant(bug="extra terminal elements: the step before a termination is flagged terminal too",
        catches=(MATCH,), control=slot_transitions, reproduces="google/dopamine #228")
def dopamine_228_extra_terminal_elements():
    return _adapter("dopamine_228", ("extra_terminal",))


@mutant(bug="n-step over several envs without an env id: the window follows write order",
        catches=(MATCH, WINDOW), control=slot_transitions, reproduces="chainer/chainerrl PR #442")
def chainerrl_442_nstep_without_env_id():
    return _adapter("chainerrl_442", ("no_env_id",))


@mutant(bug="optimize_memory: the newest row's next obs is read from uninitialised memory",
        catches=(MATCH,), control=slot_transitions, reproduces="huggingface/lerobot PR #918")
def lerobot_918_reads_uninitialised_memory():
    return _adapter("lerobot_918", ("memopt", "uninitialised"))


@mutant(bug="obs shared with next_obs: n-step postprocessing shifts the observations by n",
        catches=(MATCH,), control=slot_transitions, reproduces="ray-project/ray PR #18358")
def ray_18358_obs_shifted_by_nstep():
    return _adapter("ray_18358", ("obs_shifted_by_nstep",))


@mutant(bug="the n-step window runs past the write cursor into the oldest (overwritten) rows",
        catches=(MATCH, WINDOW, INCOMPLETE), control=slot_transitions_windows,
        reproduces="younggyoseo/FastTD3 #6 (past the cursor)")
def fasttd3_6_window_crosses_the_write_cursor():
    """Returns the window itself (``nstep_form="window"``), so that form is checked too."""
    return _adapter("fasttd3_6_cursor", ("cross_cursor",), nstep_form="window")


class StagedNstep(CountedWrites):
    """An n-step buffer of cpprb's design (``Nstep``): each env's steps wait
    in a staging list until their window is complete (``n`` steps, or the
    episode's end, which flushes them all); only then does a step enter a
    ring of ``capacity`` rows, with its return, bootstrap observation and
    discount computed from the staged steps. It declares
    ``nstep_ring="completed_windows"``. With no bug it is correct (the
    control); ``"enter_early"`` enters each step as it is written, its
    window cut at the newest step and never revised (the declaration does
    not hold); ``"stale_flush"`` bootstraps the windows an episode's end
    cuts short from the last full window's observation (cpprb's C7)."""

    def __init__(self, spec: BufferSpec, bugs: frozenset[str]):
        self.spec, self.bugs = spec, bugs
        self.staged: dict[int, list[TensorDictBase]] = {e: [] for e in range(spec.num_envs)}
        self.last_boot = {e: torch.ones(3) for e in range(spec.num_envs)}
        self.ring: list[TensorDictBase] = []
        self.written = self.entered = 0
        self.gen = torch.Generator().manual_seed(spec.seed)

    def _enter(self, window: list[TensorDictBase], env: int, flushed: bool) -> None:
        gamma, row, last = self.spec.gamma, window[0], window[-1]
        entry = row.select(*LAYOUT).to_tensordict()
        entry["nstep_return"] = torch.tensor(sum(gamma**k * float(r["reward"]) for k, r in enumerate(window)),
                                             dtype=torch.float64)
        entry["nstep_discount"] = torch.tensor(0.0 if bool(last["terminated"]) else gamma ** len(window),
                                               dtype=torch.float64)
        boot = last["next_obs"].clone()
        if "stale_flush" in self.bugs and flushed and len(window) < self.spec.nstep:
            boot = self.last_boot[env].clone()
        elif len(window) == self.spec.nstep:
            self.last_boot[env] = boot.clone()
        entry["nstep_obs"] = boot
        slot = self.entered % self.spec.capacity
        if slot == len(self.ring):
            self.ring.append(entry)
        else:
            self.ring[slot] = entry
        self.entered += 1

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        n = self.spec.nstep
        for row in data.unbind(0):
            env = int(row["env"])
            q = self.staged[env]
            q.append(row)
            ends = bool(row["terminated"]) or bool(row["truncated"])
            if "enter_early" in self.bugs:
                self._enter([row], env, flushed=False)
                if ends:
                    q.clear()
            elif ends:
                for i in range(len(q)):
                    self._enter(q[i:i + n], env, flushed=True)
                q.clear()
            elif len(q) == n:
                self._enter(q[:n], env, flushed=False)
                q.pop(0)
            self.written += 1
        return torch.arange(len(data), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.ring)

    @property
    def cursor(self) -> int:
        return self.entered % self.spec.capacity

    def contents(self) -> TensorDictBase:
        return torch.stack(self.ring) if self.ring else TensorDict({}, batch_size=[0])

    def sample(self, batch_size: int | None = None):
        batch_size = batch_size or self.spec.batch_size
        if not self.ring:
            raise RuntimeError("no step with a complete window yet, but should be one to sample")
        index = torch.randint(len(self.ring), (batch_size,), generator=self.gen)
        return torch.stack([self.ring[i] for i in index.tolist()]).clone(), {"index": index}


def _staged(name: str, bugs: tuple[str, ...] = ()) -> Adapter:
    conv = Conventions(incomplete_windows="exclude", nstep_ring="completed_windows")
    return Adapter(name=name, version="mutant", make=lambda spec: StagedNstep(spec, frozenset(bugs)),
                   capabilities=frozenset({"transitions", "nstep", "env_id"}), conventions=conv)


@control
def staged_nstep():
    return _staged("staged_nstep")


@mutant(bug="declares a ring of completed windows, but each step enters as it is written, its window cut "
            "at the newest step and never revised", catches=(MATCH, TRUNC, WINDOW, INCOMPLETE), control=staged_nstep)
def staged_nstep_enters_before_its_window_is_complete():
    return _staged("staged_nstep_enter_early", ("enter_early",))


@mutant(bug="a ring of completed windows whose flush at an episode's end bootstraps the windows it cuts short "
            "from the last full window's observation", catches=(MATCH, TRUNC, WINDOW), control=staged_nstep)
def staged_nstep_flush_bootstraps_from_a_stale_observation():
    return _staged("staged_nstep_stale_flush", ("stale_flush",))


SLICE_ENDS = f"{T}::test_slice_ends_are_marked_and_episode_ends_keep_their_flags"


class _SliceEndsUnmarked:
    """The reference buffer whose slice samples return every row's stored
    flags: a slice's end is not marked as the trajectory's break."""

    def __init__(self, buf, bugs: frozenset[str], spec: BufferSpec):
        self.buf, self.bugs, self.spec = buf, bugs, spec

    def __getattr__(self, name):
        return getattr(self.buf, name)

    def __len__(self) -> int:
        return len(self.buf)

    def sample(self, batch_size: int | None = None):
        rows, info = self.buf.sample(batch_size)
        stored = self.buf.contents()[info["index"].cpu()]
        rows = rows.clone()
        if "unmarked" in self.bugs:
            rows["truncated"] = stored["truncated"]
        if "terminated_cleared" in self.bugs and self.spec.slice_len:  # the end marker over the done flags
            end = torch.zeros(len(rows), dtype=torch.bool)
            end[self.spec.slice_len - 1::self.spec.slice_len] = True
            rows["truncated"] = rows["truncated"] | end
            rows["terminated"] = rows["terminated"] & ~end
        return rows, info


def _slice_mutant(name: str, bugs: tuple[str, ...]) -> Adapter:
    from rbcheck.harness.adapters.reference import reference_adapter

    ref = reference_adapter()
    return Adapter(name=name, version="mutant", make=lambda spec: _SliceEndsUnmarked(ref.make(spec), frozenset(bugs), spec),
                   capabilities=frozenset({"transitions", "slice"}), conventions=Conventions())


@mutant(bug="a slice sample returns the stored truncated flags: a slice that ends before its episode's end "
            "is not marked, so a value estimator runs on into the next slice", catches=(SLICE_ENDS,),
        control="reference")
def slice_ends_not_marked_truncated():
    return _slice_mutant("slice_ends_unmarked", ("unmarked",))


@mutant(bug="a slice sample marks each slice's end truncated over the episode's own flags: a termination at "
            "a slice's end loses terminated", catches=(SLICE_ENDS,), control="reference")
def slice_end_marker_clears_terminated():
    return _slice_mutant("slice_end_clears_terminated", ("terminated_cleared",))


# --- eviction="whole_episodes": an episode buffer (RLlib's EpisodeReplayBuffer) ---------------


class EpisodeTransitions(CountedWrites):
    """Rows kept whole-episode by whole-episode: capacity counts rows, the
    oldest episode (by its first row) is dropped whole while more than
    capacity rows and more than one episode are held; n-step windows over
    the held rows of each env. With no bug it is a correct buffer (the
    control); each mutant turns one bug on."""

    def __init__(self, spec: BufferSpec, bugs: frozenset[str]):
        self.spec, self.bugs = spec, bugs
        self.rows: list[TensorDict] = []  # held, in write order
        self.dropped: list[TensorDict] = []
        self.episode_of_env: dict[int, int] = {}
        self.next_episode = 0
        self.written = 0
        self.gen = torch.Generator().manual_seed(spec.seed)

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        for r in range(len(data)):
            row = data[r].select(*LAYOUT).to_tensordict()
            env = int(row["env"])
            if env not in self.episode_of_env:
                self.episode_of_env[env] = self.next_episode
                self.next_episode += 1
            row.set("uid", torch.tensor(self.episode_of_env[env]))
            if bool(row["terminated"]) or bool(row["truncated"]):
                del self.episode_of_env[env]
            self.written += 1
            if "drops_new_steps" in self.bugs and len(self.rows) >= self.spec.capacity:
                continue  # full: the new step is dropped, the episode's older steps kept
            if ("drops_new_episodes" in self.bugs and len(self.rows) >= self.spec.capacity
                    and int(row["uid"]) not in {int(r["uid"]) for r in self.rows}):
                continue  # full: a new episode's steps are dropped, the held (older) episodes kept
            self.rows.append(row)
            self._evict()
        return torch.arange(self.written - len(data), self.written) % self.spec.capacity

    def _evict(self) -> None:
        if "never_evicts" in self.bugs:
            return
        while len(self.rows) > self.spec.capacity and len({int(r["uid"]) for r in self.rows}) > 1:
            oldest = int(self.rows[0]["uid"])
            self.dropped += [r for r in self.rows if int(r["uid"]) == oldest]
            self.rows = [r for r in self.rows if int(r["uid"]) != oldest]

    def __len__(self) -> int:
        return len(self.rows)

    def contents(self) -> TensorDictBase:
        return torch.stack(self.rows).exclude("uid") if self.rows else TensorDict({}, [0])

    def sample(self, batch_size: int | None = None):
        from rbcheck.reference.transitions import Transitions

        held = torch.stack(self.rows).exclude("uid")
        pool = torch.stack(self.rows + self.dropped).exclude("uid") if "samples_dropped" in self.bugs else held
        tr = Transitions(held)
        pick = torch.randint(len(pool), (batch_size,), generator=self.gen).tolist()
        rows = pool[pick]
        where = {int(i): t for t, i in enumerate(held["id"].tolist())}
        n, gamma = self.spec.nstep or 1, self.spec.gamma
        out = []
        for i in rows["id"].tolist():
            t = where.get(int(i), 0)  # a dropped row: the window of the oldest held row
            out.append(tr.nstep(t, n, gamma))
        rows["nstep_return"] = torch.tensor([o.ret for o in out], dtype=torch.float64)
        rows["nstep_discount"] = torch.tensor([o.discount for o in out], dtype=torch.float64)
        rows["nstep_obs"] = torch.stack([o.obs for o in out])
        return rows, {"index": rows["id"] % self.spec.capacity}


def _episodes_adapter(name: str, bugs: tuple[str, ...] = ()) -> Adapter:
    conv = Conventions(eviction="whole_episodes")
    return Adapter(name=name, version="mutant", make=lambda spec: EpisodeTransitions(spec, frozenset(bugs)),
                   capabilities=frozenset({"transitions", "nstep", "env_id"}), conventions=conv)


@control
def episode_transitions():
    return _episodes_adapter("episode_transitions")


@mutant(bug="eviction='whole_episodes' but the capacity is never enforced: several episodes beyond it",
        catches=(MATCH,), control=episode_transitions)
def episodes_never_evicted():
    return _episodes_adapter("episodes_never_evicted", ("never_evicts",))


@mutant(bug="eviction='whole_episodes' but a full buffer drops each new step and keeps the episode's older ones",
        catches=(MATCH,), control=episode_transitions)
def episodes_new_steps_dropped():
    return _episodes_adapter("episodes_new_steps_dropped", ("drops_new_steps",))


@mutant(bug="eviction='whole_episodes' but sample still draws rows of the episodes it dropped",
        catches=(MATCH,), control=episode_transitions)
def episodes_dropped_rows_sampled():
    return _episodes_adapter("episodes_dropped_rows_sampled", ("samples_dropped",))


@mutant(bug="eviction='whole_episodes' but a full buffer drops new episodes whole and keeps the oldest ones",
        catches=(MATCH,), control=episode_transitions)
def episodes_new_episodes_dropped():
    return _episodes_adapter("episodes_new_episodes_dropped", ("drops_new_episodes",))


# mutants of the fixed-length sequence declaration (flashbax's trajectory buffer)


@mutant(bug="declares exclude_until_n_steps, but samples a window its episode's end completed before n steps "
            "of its env were written", catches=(INCOMPLETE,), control=slot_transitions_sequences)
def sequence_sampled_before_n_steps():
    return _adapter("sequence_ends_early", ("ends_early",), nstep_form="window",
                    incomplete_windows="exclude_until_n_steps")


@mutant(bug="declares exclude_until_n_steps, but refuses to be built for n equal to the steps one env holds "
            "(a window that fits)", catches=(MATCH,), control=slot_transitions_sequences)
def sequence_that_fits_refused():
    return _adapter("sequence_refuses_fitting", ("refuses_fitting",), nstep_form="window",
                    incomplete_windows="exclude_until_n_steps")
