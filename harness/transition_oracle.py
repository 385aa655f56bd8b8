"""The oracle of the transitions properties (``rbcheck/conformance/
test_transitions.py``): what every held row of a stream of env steps must
read as, under the buffer's declared conventions (the spec itself is
``reference/transitions.py``; this file applies the declarations to it)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.transition_streams import Stream
from rbcheck.reference.transitions import Transitions


class Oracle:
    """The expected value of every held row, by position (0 = oldest held).

    Windows are walked over every row written (``self.tr``, write order =
    row id); under the spec a ring holds the last ``capacity`` rows, so a
    held row's window only reaches held rows, exactly as over the held rows
    alone. Under ``nstep_ring="completed_windows"`` it holds the last
    ``capacity`` rows whose window is complete, in the order they completed,
    and a window may reach rows written after the ring's newest. Under
    ``capacity_counts="complete_transitions"`` (no ``nstep``) it holds the
    last ``capacity`` steps whose transitions are complete
    (:meth:`Stream.held`)."""

    def __init__(self, stream: Stream, spec, conventions, buf=None, trace: Trace | None = None):
        self.spec, self.conv = spec, conventions
        if spec.nstep and conventions.capacity_counts != "rows":
            raise ValueError(f"Conventions.capacity_counts={conventions.capacity_counts!r} with spec.nstep="
                             f"{spec.nstep}, but should be 'rows': n-step windows over complete transitions "
                             f"are not defined")
        self.rows = stream.rows()
        self.tr = Transitions(self.rows)
        total = len(self.tr)
        self.written = total - 1  # the newest row written (the write cursor is after it)
        n = spec.nstep
        if conventions.eviction == "whole_episodes":
            held_ids = held_whole_episodes(self.rows, spec, buf, trace)
        elif n and conventions.nstep_ring == "completed_windows":
            done = [(self.tr.window(t, n)[-1], t) for t in range(total) if self.tr.complete(t, n)]
            held_ids = sorted(t for _, t in sorted(done)[-spec.capacity:])
        elif conventions.capacity_counts == "complete_transitions":
            held_ids = stream.held(spec.capacity, conventions.capacity_counts)["id"].tolist()
        else:
            held_ids = list(range(max(0, total - spec.capacity), total))
        ids = torch.tensor(held_ids, dtype=torch.long)
        self.held = self.rows[ids]
        self.size = len(held_ids)
        self.position = torch.full((total,), -1, dtype=torch.long)  # row id -> held position, -1 if not held
        self.position[ids] = torch.arange(self.size)
        done_flag = conventions.terminal_flag == "done"
        self.flag = self.held["terminated"] | (self.held["truncated"] if done_flag else False)
        self.next_obs = self.held["next_obs"]
        if conventions.terminal_next_obs == "zeros":
            self.next_obs = torch.where(self.held["terminated"][:, None], torch.zeros_like(self.next_obs),
                                        self.next_obs)
        if n:
            gamma = spec.gamma
            ns = [self.tr.nstep(t, n, gamma, conventions.terminal_flag) for t in held_ids]
            self.ret = torch.tensor([x.ret for x in ns], dtype=torch.float64)
            self.discount = torch.tensor([x.discount for x in ns], dtype=torch.float64)
            self.length = torch.tensor([x.length for x in ns])
            self.boot = torch.stack([x.obs for x in ns]) if ns else self.next_obs[:0]
            self.complete = torch.tensor([self.tr.complete(t, n) for t in held_ids], dtype=torch.bool)
            if conventions.incomplete_windows == "exclude_until_n_steps":  # and n steps of its env written
                self.complete &= torch.tensor([self.steps_from(t) >= n for t in held_ids], dtype=torch.bool)
            self.window = torch.full((self.size, n), -1, dtype=torch.long)  # row ids, -1 after the end
            for p, t in enumerate(held_ids):
                w = self.tr.window(t, n)
                self.window[p, : len(w)] = torch.tensor(w)

    def steps_from(self, t: int) -> int:
        """How many steps of row ``t``'s env are written from ``t`` on, up to
        ``n``, across episode ends."""
        count, p = 1, t
        while count < self.spec.nstep and self.tr.successor[p] is not None:
            p, count = self.tr.successor[p], count + 1
        return count

    def positions(self, rows, trace: Trace) -> torch.Tensor:
        if "id" not in rows.keys():
            fail("keys of a transitions sample", sorted(map(str, rows.keys())), "to include 'id'", trace)
        ids = rows["id"].cpu().reshape(-1).long()
        p = self.position[ids.clamp(0, self.written)]
        bad = (ids < 0) | (ids > self.written) | (p < 0)
        if bad.any():
            held = self.held["id"].tolist()
            ring = "" if self.conv.nstep_ring == "steps" else f" (nstep_ring={self.conv.nstep_ring!r})"
            if self.conv.capacity_counts != "rows":
                ring = (f" (capacity_counts={self.conv.capacity_counts!r}: the last {self.spec.capacity} steps "
                        f"whose transitions are complete)")
            ring += "" if self.conv.eviction == "ring" else f" (eviction={self.conv.eviction!r})"
            want = f"a held row{ring}, one of {held}" if held else f"no row: none is held yet{ring}, so a sample is refused"
            fail("sampled row id", int(ids[bad][0]), want, trace)
        return p


def held_whole_episodes(rows: TensorDict, spec, buf, trace: Trace) -> list[int]:
    """Under ``eviction="whole_episodes"``: the ids of the rows the buffer
    reports holding (``contents()["id"]``), checked in the convention's
    terms: each held episode's rows are its newest steps (dropped from the
    oldest end, never from the middle), every episode with a dropped row
    began before the first held row of every held episode (the oldest are
    dropped), more than ``capacity`` rows only while one episode is held, no
    row twice. A held row's successors in its episode are then held too, so
    its window over every row written is its window over the held rows."""
    trace.op("held = buf.contents()['id']")
    ids = buf.contents()["id"].cpu().reshape(-1).long()
    if len(ids) == 0 or ((ids < 0) | (ids >= len(rows))).any() or len(set(ids.tolist())) != len(ids):
        fail("ids of the rows held (contents()['id'])", ids.tolist(),
             f"distinct written rows in [0, {len(rows)}), at least one", trace)
    ids = ids.sort().values
    held = rows[ids]
    episode = rows["episode"]
    for ep in held["episode"].unique().tolist():
        written = (episode == ep).nonzero().reshape(-1)
        kept = ids[held["episode"] == ep]
        if kept.tolist() != written[len(written) - len(kept):].tolist():
            fail(f"rows of episode {ep} held", kept.tolist(),
                 f"its newest {len(kept)} steps {written[len(written) - len(kept):].tolist()} "
                 "(eviction='whole_episodes': an episode is dropped from its oldest end, whole)", trace)
    dropped = torch.ones(len(rows), dtype=torch.bool)
    dropped[ids] = False
    if dropped.any():  # the oldest episodes are the ones dropped: each began before every held episode's rows
        first_held = {ep: int(ids[held["episode"] == ep][0]) for ep in held["episode"].unique().tolist()}
        newest_dropped = max(episode[dropped].unique().tolist(), key=lambda ep: int((episode == ep).nonzero()[0]))
        began = int((episode == newest_dropped).nonzero()[0])
        younger = sorted(ep for ep, first in first_held.items() if first <= began)
        if younger:
            fail(f"held episodes whose first held row is before episode {newest_dropped}'s first row {began}, "
                 f"which has dropped rows", younger,
                 "none (eviction='whole_episodes': the oldest episodes are the ones dropped)", trace)
    if len(held) > spec.capacity and len(held["episode"].unique()) > 1:
        fail(f"rows held with capacity={spec.capacity}", len(held),
             f"at most {spec.capacity}, or one episode (eviction='whole_episodes'); held episodes "
             f"{held['episode'].unique().tolist()}", trace)
    return ids.tolist()


#: The declarations under which a slot whose window is incomplete is never sampled.
EXCLUDING = ("exclude", "exclude_until_n_steps")


def never_sampleable(conv, spec) -> bool:
    """Whether no slot can ever be sampled: under ``incomplete_windows=
    "exclude_until_n_steps"`` with ``n`` above the steps one env holds."""
    return (bool(spec.nstep) and conv.incomplete_windows == "exclude_until_n_steps"
            and spec.nstep > spec.capacity // spec.num_envs)


__all__ = ["EXCLUDING", "Oracle", "held_whole_episodes", "never_sampleable"]
