"""`EpisodeBatch`: what `sample()` returns.

Two faces of the same data:

* device arrays, time-major, for a JAX learner (no host transfer): `batch.chunks` is a
  tuple of `Trajectory` chunks, each `(T, B, ...)` with a `valid` `(T,)` mask, and
  `batch.trajectory()` joins them into one `Trajectory` (one chunk: returned as is);
* a `Sequence` of host `SingleAgentEpisode` chunks: `len(batch)`, iteration and indexing
  build them lazily from one device-to-host transfer of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.core.carry import Lookback, Trajectory
from jaxrunner.core.final_obs import host_rows, join_stores
from jaxrunner.episodes.single_agent_episode import SingleAgentEpisode


class EpisodeBatch(Sequence):
    """Episodes sampled by one `sample()` call.

    Attributes:
        chunks: tuple of device `Trajectory` chunks `(T, B, ...)`.
        num_envs: `B`.
        env_steps: number of env steps in the returned episodes.
        mode: "timesteps" (cut episodes included) or "episodes" (only the first
            `num_episodes` finished episodes).
    """

    def __init__(self, *, chunks: tuple[Trajectory, ...], start_episode_count: jax.Array,
                 start_episode_len: jax.Array, lookback: Lookback, num_steps: int,
                 num_envs: int, mode: str, num_episodes: int | None, id_prefix: str,
                 observation_space=None, action_space=None, weights_seq_no: int = 0,
                 discarded_env_steps: int = 0):
        self.chunks = tuple(chunks)
        self.num_envs = num_envs
        self.mode = mode
        self.weights_seq_no = weights_seq_no
        self.observation_space = observation_space
        self.action_space = action_space
        if num_steps == 0:
            # Nothing ran: keep no reference to the runner's carry (the next call donates
            # its buffers, which would leave this batch holding deleted arrays).
            start_episode_count = start_episode_len = None
        self._start_episode_count = start_episode_count
        self._start_episode_len = start_episode_len
        self._lookback = lookback
        self._num_steps = num_steps  # vector steps taken in the call
        self._num_episodes = num_episodes
        self._id_prefix = id_prefix
        self._discarded_env_steps = discarded_env_steps
        self._episodes: list[SingleAgentEpisode] | None = None

    # ------------------------------------------------------------------ device face
    def trajectory(self) -> Trajectory:
        """All chunks as one device `Trajectory` `(T_total, B, ...)` with a `valid` mask.

        With a single chunk (the default `sample()`), the chunk itself: no copy, no compile.
        """
        if not self.chunks:
            raise ValueError(
                "This batch holds no steps (no vector step was taken in its sample() "
                "call), so it has no trajectory; check batch.env_steps before calling "
                "trajectory().")
        if len(self.chunks) == 1:
            return self.chunks[0]
        return join_trajectories(self.chunks, self.num_envs)

    @property
    def num_vector_steps(self) -> int:
        """Vector steps (steps of all `B` sub-envs at once) taken in the call."""
        return self._num_steps

    @property
    def env_steps(self) -> int:
        """Env steps in the returned episodes (timestep mode: vector steps x B)."""
        if self.mode == "timesteps":
            return self._num_steps * self.num_envs - self._discarded_env_steps
        return sum(len(e) for e in self._host_episodes())

    # ------------------------------------------------------------------ host face
    def _host_episodes(self) -> list[SingleAgentEpisode]:
        if self._episodes is None:
            self._episodes = self._build_host_episodes()
        return self._episodes

    def __len__(self) -> int:
        return len(self._host_episodes())

    def __getitem__(self, index):
        return self._host_episodes()[index]

    def __iter__(self):
        return iter(self._host_episodes())

    def to_rllib(self) -> list:
        """The episodes as `ray.rllib.env.single_agent_episode.SingleAgentEpisode`s, their
        steps marked with this batch's `weights_seq_no` (see `SingleAgentEpisode.to_rllib`)."""
        return [episode.to_rllib(weights_seq_no=self.weights_seq_no)
                for episode in self._host_episodes()]

    def _build_host_episodes(self) -> list[SingleAgentEpisode]:
        if self._num_steps == 0:
            return []  # num_timesteps=0 or num_episodes=0: no chunk ran
        # One device-to-host transfer of everything the views need.
        chunks, start_count, start_len, lookback = jax.device_get(
            (self.chunks, self._start_episode_count, self._start_episode_len, self._lookback))
        num_steps = self._num_steps
        joined = join_trajectories(chunks, self.num_envs)
        store = joined.final_obs_store
        final_row = host_rows(store)  # flat (t, b) position in `joined` -> store row
        # Chunks may end early (a partial chunk, then a top-up chunk): keep taken steps.
        taken = np.flatnonzero(joined.valid)
        traj = jax.tree.map(lambda x: x[joined.valid], joined.replace(final_obs_store=None))
        obs = traj.obs  # widened once (a trajectory may store it narrower)

        def final_obs_at(t: int, b: int):
            """The final observation of taken step `t` (of `traj`) on sub-env `b`."""
            row = final_row.get(int(taken[t]) * self.num_envs + b)
            if row is not None:
                # A store may keep the rows in a narrower dtype holding them exactly.
                return jax.tree.map(lambda x, o: x[row].astype(o.dtype), store.obs, obs)
            return jax.tree.map(lambda x: x[t + 1, b], obs)  # the episode goes on
        done = traj.terminated | traj.truncated  # (T, B)
        failed = traj.failed  # (T, B): the episode ending here is discarded
        ends_at = done | failed
        lookback_len = lookback.rewards.shape[0]
        episodes: list[tuple[int, int, SingleAgentEpisode]] = []
        for b in range(self.num_envs):
            ends = np.flatnonzero(ends_at[:, b])
            starts = np.concatenate([[0], ends + 1])
            stops = np.concatenate([ends + 1, [num_steps]])
            for k, (s, e) in enumerate(zip(starts, stops)):
                if e <= s:
                    continue  # an episode that starts at the very end has no steps yet
                if k < len(ends) and failed[e - 1, b]:
                    continue  # its sub-env failed: the episode is discarded
                finished = k < len(ends)
                if self.mode == "episodes" and not finished:
                    continue
                steps = slice(s, e)
                pick = lambda tree: jax.tree.map(lambda x: x[steps, b], tree)  # noqa: E731
                observations = jax.tree.map(
                    lambda o, f: np.concatenate([o[steps, b], f[None]], axis=0),
                    obs, final_obs_at(e - 1, b))
                if k == 0:
                    t_started = int(start_len[b])
                    n_lb = min(lookback_len, t_started)
                else:
                    t_started, n_lb = 0, 0
                lb = slice(lookback_len - n_lb, lookback_len)
                episode = SingleAgentEpisode(
                    f"{self._id_prefix}{b:05x}{int(start_count[b]) + k:08x}",
                    observations=observations,
                    actions=pick(traj.actions),
                    rewards=pick(traj.rewards),
                    extra_model_outputs={n: pick(v) for n, v in
                                         traj.extra_model_outputs.items()},
                    terminated=finished and bool(traj.terminated[e - 1, b]),
                    truncated=finished and bool(traj.truncated[e - 1, b]),
                    t_started=t_started,
                    lookback_observations=jax.tree.map(lambda x: x[lb, b], lookback.obs),
                    lookback_actions=lookback.actions[lb, b],
                    lookback_rewards=lookback.rewards[lb, b],
                    lookback_extra_model_outputs={
                        n: jax.tree.map(lambda x: x[lb, b], v)
                        for n, v in lookback.extra_model_outputs.items()},
                    observation_space=self.observation_space,
                    action_space=self.action_space,
                )
                episodes.append((int(e - 1), b, episode))
        if self.mode == "episodes":
            # RLlib returns the first k episodes to finish, in (step, sub-env) order.
            episodes.sort(key=lambda item: (item[0], item[1]))
            episodes = episodes[: self._num_episodes]
        return [episode for _, _, episode in episodes]

    def __repr__(self) -> str:
        return (f"EpisodeBatch(num_envs={self.num_envs}, vector_steps={self._num_steps}, "
                f"chunks={len(self.chunks)}, mode={self.mode!r})")

    # ------------------------------------------------------------------ host copy, pickling
    def _fields(self) -> dict[str, Any]:
        """Every attribute except the lazily built host episode views."""
        return {name: value for name, value in self.__dict__.items() if name != "_episodes"}

    @property
    def is_on_host(self) -> bool:
        """Whether no array of the batch lives on a device (all are host numpy)."""
        return not any(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(self._fields()))

    def to_numpy(self) -> "EpisodeBatch":
        """The same batch with every array on the host, from one device-to-host transfer.

        Returns `self` when the batch is already on the host. Host episode views already
        built are shared, not copied. `chunks` then hold numpy arrays;
        `jax.device_put(batch.chunks)` moves them back to a device.
        """
        if self.is_on_host:
            return self
        host = EpisodeBatch.__new__(EpisodeBatch)
        host.__dict__.update(jax.device_get(self._fields()))
        host._episodes = self._episodes
        return host

    def __reduce__(self):
        # A batch pickles (and so crosses Ray) as host numpy. The host episode views are
        # left out: they would carry the same data a second time; the receiver rebuilds
        # them from the arrays on first use.
        return (_episode_batch_from_state, (self.to_numpy()._fields(),))


def _episode_batch_from_state(state: dict) -> EpisodeBatch:
    batch = EpisodeBatch.__new__(EpisodeBatch)
    batch.__dict__.update(state)
    batch._episodes = None
    return batch


def join_trajectories(chunks, num_envs: int) -> Trajectory:
    """`Trajectory` chunks (device or host) joined along time, one `Trajectory`
    `(sum T, B, ...)` whose final-observation store holds all the chunks' rows."""
    xp = np if isinstance(chunks[0].rewards, np.ndarray) else jnp
    stores = [chunk.final_obs_store for chunk in chunks]
    joined = jax.tree.map(lambda *xs: xp.concatenate(xs, axis=0),
                          *[chunk.replace(final_obs_store=None) for chunk in chunks])
    return joined.replace(final_obs_store=join_stores(
        stores, [chunk.rewards.shape[0] for chunk in chunks], num_envs))
