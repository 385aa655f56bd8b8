"""Invariant 10: what the learner reads. Every sampled transition's next
observation, flags and n-step quantities equal the oracle's
(``reference/transitions.py``) over streams of env steps
(``harness/transition_streams.py``): episodes of drawn lengths, several envs
interleaved where the buffer takes an env id, terminations and truncations in
any mix, before, at and long after the ring's first wrap.

Conventions (``Conventions.transition_fields``, ``nstep_form``,
``incomplete_windows``, ``terminal_flag``, ``nstep_ring``,
``capacity_counts``, ``terminal_next_obs``) are checked in their own terms: a
buffer that takes a timeout for a termination still returns each truncated
step's own final observation; one whose capacity counts complete transitions
samples exactly the steps that are held in those terms; one that returns
zeros as a terminated step's next observation returns exactly zeros there."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rbcheck.harness.assertions import Trace, fail
from rbcheck.harness.transition_oracle import EXCLUDING, Oracle, never_sampleable
from rbcheck.harness.transition_streams import Stream, transition_setups

pytestmark = [pytest.mark.requires("transitions"),
              pytest.mark.conventions("transition_fields", "nstep_form", "incomplete_windows", "terminal_flag",
                                      "nstep_ring", "capacity_counts", "terminal_next_obs")]


def write(impl, spec, stream: Stream):
    """``(buf, trace)`` with the stream written; ``buf`` is None where the
    buffer refused to be built and its declaration allows it (nothing could
    ever be sampled, :func:`never_sampleable`): the answer is checked, there
    is nothing more to ask."""
    trace = Trace(impl, spec)
    trace.need("from rbcheck.harness.transition_streams import Stream")
    trace.let("stream", stream)
    try:
        buf = trace.wrap(impl.make(spec))
    except Exception as err:  # noqa: BLE001 - any refusal will do where nothing could be sampled
        conv = impl.conventions
        if never_sampleable(conv, spec):
            return None, trace
        if spec.nstep and conv.incomplete_windows == "exclude_until_n_steps":
            fail(f"impl.make(spec) with n={spec.nstep}, capacity // num_envs={spec.capacity // spec.num_envs}",
                 f"{type(err).__name__}: {err}", "a buffer: the window fits one env's ring (a refusal is allowed "
                 "only for n > capacity // num_envs, incomplete_windows='exclude_until_n_steps')", trace)
        raise
    trace.op("stream.write(buf)")  # the stream's extends as one line (Stream.WRITE): made on the buffer itself
    stream.write(buf.inner)
    return buf, trace


def draw_sample(buf, oracle: Oracle, trace: Trace, per_row: int):
    if oracle.size == 0:  # nothing held yet: a refusal is the answer
        try:
            rows, _ = buf.sample(1)
        except Exception:  # noqa: BLE001 - any refusal will do: no row is held
            return None, None
        if len(rows) == 0:
            fail("rows in buf.sample(1) from a buffer that holds no row", 0, "a refusal (an exception)", trace)
        return rows, oracle.positions(rows, trace)  # fails: no sampled id is held
    batch = per_row * oracle.size
    if oracle.spec.nstep and oracle.conv.incomplete_windows in EXCLUDING and not oracle.complete.any():
        try:  # nothing may be sampled: an error is the answer
            rows, _ = buf.sample(batch)
        except Exception:  # noqa: BLE001 - any refusal will do: no held row has a complete window
            return None, None
        if len(rows) == 0:  # an empty answer will do too
            return None, None
    else:
        try:
            rows, _ = buf.sample(batch)
        except Exception as err:  # noqa: BLE001 - a refusal while rows are held is the failure to report
            fail(f"buf.sample({batch})", f"{type(err).__name__}: {err}",
                 f"{batch} rows: the buffer holds the rows {oracle.held['id'].tolist()}", trace)
        if len(rows) == 0:
            fail(f"rows in buf.sample({batch})", 0,
                 f"{batch} rows: the buffer holds the rows {oracle.held['id'].tolist()}", trace)
    return rows, oracle.positions(rows, trace)


def first_bad(what, got, want, p, oracle, trace, detail="") -> None:
    """Fail on the first sampled row ``b`` where ``got[b] != want[b]``."""
    got, want = got.cpu(), want.cpu()
    if len(want) == 0:
        return
    if got.dtype == torch.bool or want.dtype == torch.bool:
        same = (got != 0).reshape(want.shape) == want
    elif want.dtype == torch.float64:
        same = torch.isclose(got.double().reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    else:
        same = got.to(want.dtype).reshape(want.shape) == want
    same = same.reshape(len(want), -1).all(1)
    if not same.all():
        b = int((~same).nonzero()[0])
        t = int(p[b])
        row = {k: oracle.held[k][t].tolist() for k in ("id", "env", "episode", "step", "terminated", "truncated")}
        fail(f"{what} of sampled row {b} (held row {row})", got[b], want[b], trace, detail)


def check_transitions(impl, spec, oracle: Oracle, rows, p, trace, *, skip_incomplete: bool) -> None:
    conv = impl.conventions
    if spec.nstep and skip_incomplete and conv.incomplete_windows in EXCLUDING:
        keep = oracle.complete[p]
        rows, p = rows[keep], p[keep]  # test_incomplete_windows_are_handled_as_declared judges the others
    for f in conv.transition_fields:
        if f not in rows.keys():
            fail(f"keys of a transitions sample (declared transition_fields={conv.transition_fields})",
                 sorted(map(str, rows.keys())), f"to include {f!r}", trace)
        want = {"terminated": oracle.flag, "next_obs": oracle.next_obs}.get(f, oracle.held.get(f))
        detail = {"terminated": f"terminal_flag={conv.terminal_flag!r}",
                  "next_obs": f"terminal_next_obs={conv.terminal_next_obs!r}"}.get(f, "")
        first_bad(f"sample[{f!r}]", rows[f], want[p], p, oracle, trace, detail)
    if not spec.nstep:
        return
    if conv.nstep_form == "window":
        first_bad("sample['window_id']", rows["window_id"], oracle.window[p], p, oracle, trace)
        return
    for key in ("nstep_return", "nstep_discount", "nstep_obs"):
        if key not in rows.keys():
            fail("keys of an n-step sample", sorted(map(str, rows.keys())), f"to include {key!r}", trace)
    why = f"n={spec.nstep}, gamma={spec.gamma}: window rows {oracle.window[p].tolist()}"
    first_bad("sample['nstep_return']", rows["nstep_return"], oracle.ret[p], p, oracle, trace, why)
    first_bad("sample['nstep_discount']", rows["nstep_discount"], oracle.discount[p], p, oracle, trace, why)
    boots = oracle.discount[p] > 0  # the bootstrap obs of a terminated window is never read
    first_bad("sample['nstep_obs'] (the bootstrap observation)", rows["nstep_obs"][boots], oracle.boot[p][boots],
              p[boots], oracle, trace, why)


def needs(impl, nstep: bool) -> None:
    if nstep and not impl.has("nstep"):
        pytest.skip("capability 'nstep' not declared")


@given(data=st.data())
def test_sampled_transitions_match_the_oracle(impl, data):
    """exact: every sampled row's declared fields (obs, action, reward, the
    terminal flag as declared, next_obs) and, with ``nstep``, its n-step
    return, discount and bootstrap observation equal the oracle's for that
    row (windows complete or, under ``"shorten"``, shortened at the cursor)."""
    spec, stream = data.draw(transition_setups(impl, nstep=impl.has("nstep")), label="setup")
    buf, trace = write(impl, spec, stream)
    if buf is None:
        return
    oracle = Oracle(stream, spec, impl.conventions, buf, trace)
    rows, p = draw_sample(buf, oracle, trace, per_row=4)
    if rows is None:
        return
    check_transitions(impl, spec, oracle, rows, p, trace, skip_incomplete=True)


@given(data=st.data())
def test_truncated_step_bootstraps_from_its_own_final_obs(impl, data):
    """exact: a truncated step's next_obs is its own final observation (not
    the next episode's first one, not the obs of the step); it is not
    reported terminated unless the buffer declares ``terminal_flag="done"``;
    an n-step window ending on it bootstraps from that final observation with
    discount gamma**m (0 under ``"done"``). Under
    ``capacity_counts="complete_transitions"`` a truncated episode's last step
    is never held: sampling it fails, like any row not held."""
    conv = impl.conventions
    if "next_obs" not in conv.transition_fields and not impl.has("nstep"):
        pytest.skip("the buffer returns neither next_obs nor n-step quantities (transition_fields)")
    spec, stream = data.draw(transition_setups(impl, nstep=impl.has("nstep"), truncations=True), label="setup")
    buf, trace = write(impl, spec, stream)
    if buf is None:
        return
    oracle = Oracle(stream, spec, conv, buf, trace)
    rows, p = draw_sample(buf, oracle, trace, per_row=4)
    if rows is None:
        return
    truncated = oracle.held["truncated"][p]
    if "next_obs" in conv.transition_fields:
        first_bad("sample['next_obs'] of a truncated step (its own final observation)", rows["next_obs"][truncated],
                  oracle.next_obs[p][truncated], p[truncated], oracle, trace)
    if "terminated" in conv.transition_fields:
        first_bad("sample['terminated'] of a truncated step", rows["terminated"][truncated],
                  oracle.flag[p][truncated], p[truncated], oracle, trace, f"terminal_flag={conv.terminal_flag!r}")
    if spec.nstep and conv.nstep_form == "return":
        last = oracle.window[p].max(1).values  # the id of the window's last row
        ends_truncated = oracle.rows["truncated"][last] & ~oracle.rows["terminated"][last]
        if conv.incomplete_windows == "exclude":
            ends_truncated &= oracle.complete[p]
        q = p[ends_truncated]
        first_bad("sample['nstep_discount'] of a window ending on a truncated step", rows["nstep_discount"][ends_truncated],
                  oracle.discount[q], q, oracle, trace, f"terminal_flag={conv.terminal_flag!r}, gamma={spec.gamma}")
        if conv.terminal_flag == "terminated":
            first_bad("sample['nstep_obs'] of a window ending on a truncated step (its final observation)",
                      rows["nstep_obs"][ends_truncated], oracle.boot[q], q, oracle, trace)


@given(data=st.data())
def test_no_window_contains_another_episodes_or_a_newer_row(impl, data):
    """exact: the next observation and the bootstrap observation of every
    sampled row belong to the row's own episode, lie 1..n steps after it, and
    come from a row at or after it and held (not past the write cursor); the
    discount is gamma to the number of steps between the row and its
    bootstrap observation (a window's rows: the same, row by row)."""
    spec, stream = data.draw(transition_setups(impl, nstep=impl.has("nstep")), label="setup")
    conv = impl.conventions
    buf, trace = write(impl, spec, stream)
    if buf is None:
        return
    oracle = Oracle(stream, spec, conv, buf, trace)
    rows, p = draw_sample(buf, oracle, trace, per_row=4)
    if rows is None:
        return
    if spec.nstep and conv.incomplete_windows in EXCLUDING:
        keep = oracle.complete[p]
        rows, p = rows[keep], p[keep]
    episode = oracle.held["episode"][p].double()
    step = oracle.held["step"][p].double()
    ids = oracle.held["id"][p].double()

    def check_obs(what: str, obs: torch.Tensor, most: int, mask: torch.Tensor) -> torch.Tensor:
        obs = obs.cpu().double().reshape(len(p), -1)
        marker, ep, st_ = obs[:, 0], obs[:, 1], obs[:, 2]
        source = torch.where(marker < 0, -marker - 1, marker - spec.num_envs)  # the row whose next_obs it is
        ok = (ep == episode) & (st_ > step) & (st_ <= step + most) & (source >= ids) & (source <= oracle.written)
        bad = mask & ~ok
        if bad.any():
            b = int(bad.nonzero()[0])
            fail(f"{what} of sampled row {b} (row id {int(ids[b])}, episode {int(episode[b])}, step {int(step[b])})",
                 obs[b], f"an observation of episode {int(episode[b])} from step {int(step[b]) + 1} to "
                 f"{int(step[b]) + most}, the next_obs of a row written from id {int(ids[b])} to {oracle.written}", trace)
        return st_ - step

    by_episode = torch.ones(len(p), dtype=torch.bool)
    if "next_obs" in conv.transition_fields:
        if conv.terminal_next_obs == "zeros":  # a terminated step's next_obs is exactly zeros, the others as always
            terminated = oracle.held["terminated"][p]
            nonzero = (rows["next_obs"].cpu().double().reshape(len(p), -1) != 0).any(1)
            if (terminated & nonzero).any():
                b = int((terminated & nonzero).nonzero()[0])
                fail(f"sample['next_obs'] of sampled row {b} (row id {int(ids[b])}, terminated)", rows["next_obs"][b],
                     "zeros (terminal_next_obs='zeros')", trace)
            by_episode = ~terminated
        check_obs("sample['next_obs']", rows["next_obs"], 1, by_episode)
    if not spec.nstep:
        return
    if conv.nstep_form == "window":
        win = rows["window_id"].cpu().long().reshape(len(p), -1)
        for k in range(win.shape[1]):
            used = win[:, k] >= 0
            pos = win[:, k].clamp(0, oracle.written)
            ok = (win[:, k] >= ids.long()) & (win[:, k] <= oracle.written)
            ok &= oracle.rows["episode"][pos] == oracle.held["episode"][p]
            ok &= oracle.rows["step"][pos] == oracle.held["step"][p] + k
            if (used & ~ok).any():
                b = int((used & ~ok).nonzero()[0])
                fail(f"sample['window_id'][{b}, {k}]", int(win[b, k]),
                     f"a written row of episode {int(episode[b])} at step {int(step[b]) + k}", trace)
        return
    discount = rows["nstep_discount"].cpu().double().reshape(-1)
    boots = discount > 0
    gap = check_obs("sample['nstep_obs'] (the bootstrap observation)", rows["nstep_obs"], spec.nstep, boots)
    want = spec.gamma ** gap
    bad = boots & ~torch.isclose(discount, want, rtol=1e-5, atol=1e-7)
    if bad.any():
        b = int(bad.nonzero()[0])
        fail(f"sample['nstep_discount'] of sampled row {b}", float(discount[b]),
             f"gamma**{int(gap[b])} = {float(want[b]):.6g} (gamma={spec.gamma}; its bootstrap observation is "
             f"{int(gap[b])} steps later)", trace)


@given(data=st.data())
def test_incomplete_windows_are_handled_as_declared(impl, data):
    """exact: a row whose n-step window reaches the newest row of its env
    before n steps and before its episode's end is never sampled under
    ``incomplete_windows="exclude"`` (probability zero in 16 draws per held
    row), and under ``"shorten"`` is sampled (16 draws per row) with the
    window stopped at the newest row: return, discount gamma**m and the
    newest row's next_obs."""
    needs(impl, nstep=True)
    conv = impl.conventions
    spec, stream = data.draw(transition_setups(impl, nstep=True), label="setup")
    spec = spec.but(nstep=max(spec.nstep, 2))
    buf, trace = write(impl, spec, stream)
    if buf is None:
        return
    oracle = Oracle(stream, spec, conv, buf, trace)
    rows, p = draw_sample(buf, oracle, trace, per_row=16)
    if rows is None:
        return
    incomplete = ~oracle.complete[p]
    if conv.incomplete_windows in EXCLUDING:
        if incomplete.any():
            b = int(incomplete.nonzero()[0])
            fail(f"share of sampled rows with an incomplete window (row {int(oracle.held['id'][p[b]])}, "
                 f"window {oracle.window[p[b]].tolist()}, n={spec.nstep})",
                 f"{int(incomplete.sum())}/{len(p)}", f"0 (incomplete_windows={conv.incomplete_windows!r})", trace)
        return
    held_incomplete = set((~oracle.complete).nonzero().reshape(-1).tolist())
    missing = held_incomplete - set(p.tolist())
    if missing and conv.sampling == "independent":
        t = min(missing)
        fail(f"times the row id {int(oracle.held['id'][t])} with an incomplete window "
             f"{oracle.window[t].tolist()} was sampled", 0,
             f"> 0 in {len(p)} draws (incomplete_windows='shorten': it is sampled, shortened)", trace)
    sub = rows[incomplete]
    check_transitions(impl, spec, oracle, sub, p[incomplete], trace, skip_incomplete=False)


@given(data=st.data())
def test_slice_ends_are_marked_and_episode_ends_keep_their_flags(impl, data):
    """exact: a slice sample (capability ``slice``, ``strict_length``, one
    env) of env steps: each slice is a run of consecutive held steps of one
    episode; every row keeps its own ``terminated`` and ``next_obs``; a row
    inside a slice keeps its own ``truncated``; a slice's last row is marked
    ``truncated`` (the learner's trajectory breaks there) unless it is
    terminated, where ``terminated`` already turns bootstrapping off and
    ``truncated`` may be either. No eligible episode: the sample is refused."""
    if not impl.has("slice"):
        pytest.skip("capability 'slice' not declared")
    conv = impl.conventions
    if "truncated" not in conv.transition_fields:
        pytest.skip("the buffer does not return truncated (transition_fields)")
    spec, stream = data.draw(transition_setups(impl, nstep=False, truncations=True, one_env=True), label="setup")
    slice_len = data.draw(st.integers(1, 4), label="slice_len")
    num_slices = data.draw(st.integers(1, 3), label="num_slices")
    spec = spec.but(sampler="slice", slice_len=slice_len, num_slices=None, strict_length=True,
                    episode_key="episode")
    buf, trace = write(impl, spec, stream)
    if buf is None:
        return
    oracle = Oracle(stream, spec, conv)
    episodes = oracle.held["episode"].tolist()
    longest = max(sum(1 for e in episodes if e == x) for x in set(episodes))
    batch = slice_len * num_slices
    if longest < slice_len:
        try:
            buf.sample(batch)
        except Exception:  # noqa: BLE001 - any refusal will do: no held episode is slice_len long
            return
        fail(f"sample({batch}) with no held episode of length >= slice_len={slice_len}", "<a batch>",
             "an error (strict_length=True)", trace)
    rows, _ = buf.sample(batch)
    p = oracle.positions(rows, trace)
    if len(p) != batch:
        fail("rows in a slice sample", len(p), f"{batch} = {num_slices} slices x slice_len={slice_len}", trace)
    ids = oracle.held["id"][p].reshape(num_slices, slice_len)
    for k in range(num_slices):
        run = ids[k]
        same = (oracle.held["episode"][p.reshape(num_slices, slice_len)[k]] == episodes[int(p[k * slice_len])]).all()
        if not (bool(same) and bool((run.diff() == 1).all())):
            fail(f"row ids of slice {k}", run.tolist(), "consecutive steps of one episode", trace)
    last = torch.zeros(batch, dtype=torch.bool)
    last[slice_len - 1::slice_len] = True
    if "terminated" in conv.transition_fields:
        first_bad("sample['terminated'] of a slice row", rows["terminated"], oracle.flag[p], p, oracle, trace,
                  f"terminal_flag={conv.terminal_flag!r}")
    if "next_obs" in conv.transition_fields:
        first_bad("sample['next_obs'] of a slice row", rows["next_obs"], oracle.next_obs[p], p, oracle, trace)
    got = rows["truncated"].cpu().reshape(-1) != 0
    inner = ~last
    first_bad("sample['truncated'] inside a slice (its own flag)", got[inner], oracle.held["truncated"][p][inner],
              p[inner], oracle, trace)
    ends = last & ~oracle.held["terminated"][p]
    first_bad(f"sample['truncated'] at a slice's last row (slice_len={slice_len}), not a termination",
              got[ends], torch.ones(int(ends.sum()), dtype=torch.bool), p[ends], oracle, trace,
              "a slice's end breaks the trajectory: truncated unless terminated")
