"""RLlib's new-API-stack episode buffers (written against ray[rllib] 2.60.0)
for invariant 10: ``EpisodeReplayBuffer`` and ``PrioritizedEpisodeReplayBuffer``,
whose rows are episodes (``SingleAgentEpisode``) and whose ``sample`` builds
n-step transitions. Line numbers are of ray 2.60.0's
``rllib/utils/replay_buffers/episode_replay_buffer.py`` (``erb.py``),
``prioritized_episode_buffer.py`` (``perb.py``),
``rllib/env/single_agent_episode.py`` (``sae.py``) and
``rllib/algorithms/dqn/torch/dqn_torch_learner.py`` (``dqn_learner.py``).

Built-in names (group ``rllib``):

* ``rllib-episodes``: ``EpisodeReplayBuffer(capacity)`` (erb.py:120);
* ``rllib-episodes-per``: ``PrioritizedEpisodeReplayBuffer(capacity,
  alpha=spec.alpha)`` (perb.py:118), every row at the default priority (the
  prioritized properties are not wired: see below).

How the suite's rows reach RLlib, as RLlib's DQN hands them over
(``dqn.py:668``, ``:688-706``):

* each ``extend`` (one step of the ``num_envs`` envs) is one
  ``add(episodes)``: a list of one 1-step ``SingleAgentEpisode`` chunk per
  env, ``observations=[obs, next_obs]``, ``actions=[action]``,
  ``rewards=[reward]``, ``terminated``/``truncated`` of the step, the env's
  current episode id and ``t_started`` its step count: the chunks an
  ``EnvRunner`` returns. A chunk of an episode the buffer holds is
  concatenated to it (``concat_episode``, sae.py:597, which checks that its
  first observation is the held episode's last one); a step that ends an
  episode makes the env's next step start a new episode id. The ids are the
  adapter's (an ``EnvRunner``'s), never read from the harness's columns.
* ``sample(b)``: ``sample(num_items=b, n_step=spec.nstep, gamma=spec.gamma,
  beta=spec.beta, batch_length_T=0, lookback=0, min_batch_length_T=0,
  sample_episodes=True)``, DQN's call. Each returned 1-step episode gives
  ``obs`` (its first observation; the row ``id`` is read from it, the stream
  writes the id there), ``action``, ``nstep_return`` (its reward: RLlib's
  discounted sum, erb.py:952-956, perb.py:502-507), ``nstep_obs`` (its last
  observation, the bootstrap one) and ``nstep_discount = gamma ** n_step *
  (1 - terminated)``, what DQN's learner bootstraps with (dqn_learner.py:
  203-213; ``n_step`` from ``extra_model_outputs``, erb.py:1006,
  perb.py:546). ``info["weight"]`` of the prioritized buffer is its
  ``"weights"`` output (perb.py:545).
* randomness: the buffer's own ``rng`` attribute (``np.random.
  default_rng(seed=None)``, erb.py:173) is replaced by
  ``default_rng(spec.seed)`` before the first call: seedable.
* ``len``: ``len(buffer)`` (timesteps held, erb.py:180); ``contents()``:
  the observations of every held step, read from ``buffer.episodes``
  (erb.py:144), with their ids; ``cursor``/``write_count``: the steps
  written (RLlib has no slots; ``info["index"]`` is the id modulo capacity).

Conventions (each cited in ``Conventions.notes``):

* ``eviction="whole_episodes"``: ``capacity`` counts timesteps; the oldest
  episodes are dropped whole (erb.py:241-304; perb.py:229-289, before the new
  chunks are added, and a new chunk of a dropped episode is dropped with
  it, perb.py:256-262, :295-296), and a single episode may exceed capacity;
* ``transition_fields=("obs", "action")``: the reward, flags and next
  observation returned are the n-step ones;
* ``incomplete_windows``: the uniform buffer shortens a window at the end
  of what it holds (``episode.slice`` clips, erb.py:942-947), the
  prioritized one resamples every row whose n steps do not fit in its
  episode (perb.py:495-497): ``"exclude"``. A sample where no held row has
  n steps left would loop forever; the adapter raises instead after
  ``200 * b + 1000`` draws (counting the buffer's own ``rng`` calls), so
  the property's "nothing may be sampled" branch sees an error. The uniform
  buffer draws exactly ``b`` times unless it counts a shortened window as a
  negative number of items (erb.py:1022, docs/findings.md), a random walk
  to ``b`` that may not end: the adapter raises after ``4 * b + 100`` draws.
* ``terminal_flag="terminated"``: the learner masks ``TERMINATEDS`` only
  (dqn_learner.py:203-206); a truncated window bootstraps.

Not declared: ``prioritized`` (``update_priorities(priorities)`` takes no
indices: it updates the rows of the last sample, in order, perb.py:661-687;
the suite's rows of arbitrary layout are not episodes either), ``random`` and
the ring properties (rows are env steps; the ``rllib`` columns answer those
for RLlib's other buffers), ``save_load`` and ``shared_rng``.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rbcheck.harness.adapters.counted import CountedWrites
from rbcheck.harness.adapters.numpy_rows import OwnRandomness, check_batch_size
from rbcheck.harness.adapters.sb3_transitions import not_applicable
from rbcheck.harness.protocol import Adapter, BufferSpec, Conventions

SRC = "ray 2.60.0 rllib/utils/replay_buffers"


class DrawLimit(RuntimeError):
    """RLlib's sample drew ``limit`` candidates without completing its batch."""


class CountingRng:
    """The buffer's own generator, passed through, counting the draws that
    pick a row (``random()``, perb.py:468; ``integers()``, erb.py:915): past
    ``limit`` it raises :class:`DrawLimit` instead of letting a sample loop
    forever (perb.py:464-497 resamples every row without n steps left;
    erb.py:1022 can count items negatively, a random walk to ``num_items``)."""

    WHY = {True: f"every candidate was resampled: no held row has n steps left in its episode ({SRC}/"
                 "prioritized_episode_buffer.py:495-497)",
           False: f"shortened windows counted as negative items ({SRC}/episode_replay_buffer.py:1022)"}

    def __init__(self, rng: np.random.Generator, prioritized: bool):
        self.rng, self.calls, self.limit, self.prioritized = rng, 0, None, prioritized

    def _count(self) -> None:
        self.calls += 1
        if self.limit is not None and self.calls > self.limit:
            raise DrawLimit(f"RLlib's {'Prioritized' if self.prioritized else ''}EpisodeReplayBuffer.sample drew "
                            f"{self.limit} candidates without completing its batch ({self.WHY[self.prioritized]})")

    def random(self, *args, **kwargs):
        self._count()
        return self.rng.random(*args, **kwargs)

    def integers(self, *args, **kwargs):
        self._count()
        return self.rng.integers(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.rng, name)


class RLlibEpisodes(CountedWrites, OwnRandomness):
    """A transitions :class:`BufferUnderTest` over an RLlib episode buffer."""

    LIBRARY = "RLlib"

    def __init__(self, spec: BufferSpec, prioritized: bool):
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        self.spec, self.prioritized = spec, prioritized
        self._episode = SingleAgentEpisode
        if prioritized:
            mod = importlib.import_module("ray.rllib.utils.replay_buffers.prioritized_episode_buffer")
            self.rb = mod.PrioritizedEpisodeReplayBuffer(capacity=spec.capacity, alpha=spec.alpha)
        else:
            mod = importlib.import_module("ray.rllib.utils.replay_buffers.episode_replay_buffer")
            self.rb = mod.EpisodeReplayBuffer(capacity=spec.capacity)
        self.rng = CountingRng(np.random.default_rng(spec.seed), prioritized)
        self.rb.rng = self.rng
        e = spec.num_envs
        self.episode_id = [f"env{k}-0" for k in range(e)]  # what an EnvRunner keeps per env
        self.episodes_started = [1] * e
        self.t = [0] * e
        self.written = 0

    def __repr__(self) -> str:
        return f"RLlibEpisodes({type(self.rb).__name__}, {self.spec})"

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        not_applicable(data)
        e = self.spec.num_envs
        if len(data) % e:
            raise ValueError(f"len(data)={len(data)}, but should be a multiple of num_envs={e} (one row per env)")
        start = self.written
        obs, nxt, act = data["obs"].numpy(), data["next_obs"].numpy(), data["action"].numpy()
        rew = data["reward"].double().numpy()
        term, trunc = data["terminated"].numpy().astype(bool), data["truncated"].numpy().astype(bool)
        for s in range(0, len(data), e):
            chunks = []
            for k in range(e):
                r = s + k
                chunks.append(self._episode(
                    id_=self.episode_id[k], observations=[obs[r].copy(), nxt[r].copy()], actions=[act[r].copy()],
                    rewards=[float(rew[r])], terminated=bool(term[r]), truncated=bool(trunc[r]) and not term[r],
                    t_started=self.t[k], len_lookback_buffer=0))
                self.t[k] += 1
                if term[r] or trunc[r]:  # the env resets: its next step starts a new episode
                    self.episode_id[k] = f"env{k}-{self.episodes_started[k]}"
                    self.episodes_started[k] += 1
                    self.t[k] = 0
            self.rb.add(chunks)
            self.written += e
        return self.slots(start, len(data))

    def sample(self, batch_size: int | None = None):
        batch_size = check_batch_size(batch_size, self.spec.batch_size)
        gamma = self.spec.gamma
        b = max(int(batch_size or 0), 0)
        # every draw of the uniform buffer counts one item unless it counts one negatively (erb.py:1022); the
        # prioritized one resamples rows without n steps left, which may be all but one of the held rows
        self.rng.calls, self.rng.limit = 0, (200 * b + 1000) if self.prioritized else (4 * b + 100)
        try:
            out = self.rb.sample(num_items=batch_size, n_step=self.spec.nstep or 1, gamma=gamma, beta=self.spec.beta,
                                 batch_length_T=0, lookback=0, min_batch_length_T=0, sample_episodes=True)
        finally:
            self.rng.limit = None
        n = len(out)
        obs = torch.as_tensor(np.stack([np.asarray(ep.get_observations(0)) for ep in out])) if n else None
        boot = torch.as_tensor(np.stack([np.asarray(ep.get_observations(-1)) for ep in out])) if n else None
        steps = torch.tensor([float(ep.get_extra_model_outputs("n_step")[0]) for ep in out], dtype=torch.float64)
        terminated = torch.tensor([bool(ep.is_terminated) for ep in out], dtype=torch.bool)
        if n == 0:
            obs = boot = torch.zeros((0, 3), dtype=torch.float32)
        rows = {
            "id": obs[:, 0].round().long(), "obs": obs,
            "action": torch.as_tensor(np.stack([np.asarray(ep.get_actions(0)) for ep in out])) if n
            else torch.zeros((0, 1)),
            "nstep_return": torch.tensor([float(ep.get_rewards(0)) for ep in out], dtype=torch.float64),
            "nstep_obs": boot,
            "nstep_discount": gamma ** steps * (~terminated).double(),  # dqn_torch_learner.py:203-213
        }
        info = {"index": rows["id"] % self.spec.capacity}
        if self.prioritized:
            info["weight"] = torch.tensor([float(ep.get_extra_model_outputs("weights")[0]) for ep in out],
                                          dtype=torch.float64)
        return TensorDict(rows, batch_size=[n]), info

    def contents(self) -> TensorDictBase:
        obs = [np.asarray(o) for ep in self.rb.episodes for o in ep.get_observations()[:-1]]
        stacked = torch.as_tensor(np.stack(obs)) if obs else torch.zeros((0, 3), dtype=torch.float32)
        return TensorDict({"obs": stacked, "id": stacked[:, 0].round().long()}, batch_size=[len(stacked)])

    def update_priority(self, index, priority, generation=None) -> None:
        raise NotImplementedError("update_priorities(priorities) takes no indices: it updates the last sample's "
                                  "rows (capability 'prioritized' is not declared)")

    def stored_priority(self, index) -> torch.Tensor:
        raise NotImplementedError("capability 'priority_readback' is not declared")

    @property
    def max_priority(self) -> float:
        raise NotImplementedError("capability 'priority_readback' is not declared")


def _conventions(prioritized: bool) -> Conventions:
    notes = {
        "eviction": f"capacity counts timesteps; the oldest episodes are dropped whole ({SRC}/"
                    + ("prioritized_episode_buffer.py:229-289" if prioritized else "episode_replay_buffer.py:241-304")
                    + ")",
        "transition_fields": "each sample is a 1-step episode holding the n-step reward and the bootstrap "
                             f"observation ({SRC}/"
                             + ("prioritized_episode_buffer.py:510-559)" if prioritized
                                else "episode_replay_buffer.py:952-988)"),
    }
    if prioritized:
        notes["incomplete_windows"] = (f"a row whose n steps do not fit in its episode is resampled ({SRC}/"
                                       "prioritized_episode_buffer.py:495-497)")
    return Conventions(transition_fields=("obs", "action"), eviction="whole_episodes",
                       incomplete_windows="exclude" if prioritized else "shorten", notes=notes)


def _adapter(name: str, prioritized: bool) -> Adapter:
    try:
        ray = importlib.import_module("ray")
        importlib.import_module("ray.rllib.utils.replay_buffers.prioritized_episode_buffer")
    except ImportError as err:
        raise ImportError(f"ray[rllib] is not installed ({type(err).__name__}: {err}), but should be: install the "
                          f"'rllib' dependency group") from err

    def make(spec: BufferSpec) -> RLlibEpisodes:
        if spec.sampler != "random":
            raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (a transitions column; "
                             "'prioritized' is not declared)")
        return RLlibEpisodes(spec, prioritized)

    return Adapter(name=name, version=f"{ray.__version__} (numpy {np.__version__})", make=make,
                   capabilities=frozenset({"transitions", "nstep", "env_id"}), conventions=_conventions(prioritized))


def rllib_episodes_adapter() -> Adapter:
    """RLlib's new-stack ``EpisodeReplayBuffer``."""
    return _adapter("rllib-episodes", prioritized=False)


def rllib_episodes_per_adapter() -> Adapter:
    """RLlib's new-stack ``PrioritizedEpisodeReplayBuffer``."""
    return _adapter("rllib-episodes-per", prioritized=True)


__all__ = ["RLlibEpisodes", "rllib_episodes_adapter", "rllib_episodes_per_adapter"]
