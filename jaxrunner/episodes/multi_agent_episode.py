"""`MultiAgentEpisode` host views and the `MultiAgentEpisodeBatch` that `sample()` returns.

A `MultiAgentEpisode` is one chunk of one sub-env's episode: `len()` env steps
(`env_t_started` to `env_t`) and one `SingleAgentEpisode` chunk per agent that completed
at least one agent step in it (zero-length agent chunks are dropped, as RLlib does).
Agent chunks follow the single-agent contract: same `id_` across cuts
(`"<episode id>/<agent id>"`), `t_started` = agent steps before the chunk, the
predecessor's last observation is the successor's first, and `episode_lookback_horizon`
earlier agent steps as lookback.

`MultiAgentEpisodeBatch` is both the device arrays (`chunks`, `trajectory()`,
`module_batches()` for a JAX learner) and a `Sequence` of `MultiAgentEpisode`s built
lazily with one device-to-host transfer. `to_rllib()` (batch or episode) gives real
`ray.rllib.env.multi_agent_episode.MultiAgentEpisode`s (see
`jaxrunner.episodes.rllib_conversion`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.core.multi_agent_rollout import (ModuleBatch, MultiAgentLookback,
                                                MultiAgentTrajectory)
from jaxrunner.episodes.single_agent_episode import SingleAgentEpisode


class MultiAgentEpisode:
    """One multi-agent episode chunk on the host (RLlib's `MultiAgentEpisode` surface).

    Attributes:
        id_: episode id (str), equal across the chunks of one episode.
        env_t_started: env steps of the episode before this chunk.
        agent_episodes: `{agent_id: SingleAgentEpisode}` for agents with steps here.
        is_terminated, is_truncated: `"__all__"` flags (both False for a cut chunk).
        env_rewards: `{agent_id: (len,) float32}` the rewards the env gave each agent at
            each env step of the chunk (before any accumulation to agent steps).
        acted: `{agent_id: (len,) bool}` which agents acted at each env step.
        completed: `{agent_id: (len,) bool}` at which env steps an agent step of the
            agent completed (it got its next observation, or its final one).
        agent_t_started: `{agent_id: int}` agent steps each agent completed in the
            episode before this chunk (also for agents without steps here).
        observation_spaces, action_spaces: `{agent_id: gymnasium space}`.
        acts_at_end: `{agent_id: bool}` for a cut chunk, the agents that act at the env
            step right after it, if the batch knows (else empty).
        env_index, episode_index: the sub-env and the episode's index on it (the values
            the `policy_mapping_fn` saw in `MappingEpisode`).
    """

    def __init__(self, id_: str, *, agent_episodes: dict[str, SingleAgentEpisode],
                 env_t_started: int, length: int, terminated: bool, truncated: bool,
                 agent_to_module: dict[str, str], env_rewards: dict[str, np.ndarray],
                 acted: dict[str, np.ndarray], env_index: int, episode_index: int,
                 agent_ids: tuple[str, ...], completed: dict[str, np.ndarray],
                 agent_t_started: dict[str, int], observation_spaces: dict | None = None,
                 action_spaces: dict | None = None, acts_at_end: dict | None = None):
        self.id_ = id_
        self.agent_episodes = agent_episodes
        self.env_t_started = int(env_t_started)
        self._len = int(length)
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self._agent_to_module = dict(agent_to_module)
        self.env_rewards = env_rewards
        self.acted = acted
        self.completed = completed
        self.agent_t_started = {a: int(t) for a, t in agent_t_started.items()}
        self.observation_spaces = dict(observation_spaces or {})
        self.action_spaces = dict(action_spaces or {})
        self.acts_at_end = {a: bool(v) for a, v in (acts_at_end or {}).items()}
        self.env_index = int(env_index)
        self.episode_index = int(episode_index)
        self.possible_agents = tuple(agent_ids)

    # ------------------------------------------------------------------ RLlib surface
    def __len__(self) -> int:
        """Env steps in this chunk."""
        return self._len

    @property
    def env_t(self) -> int:
        return self.env_t_started + self._len

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def agent_ids(self) -> set[str]:
        return set(self.agent_episodes)

    def env_steps(self) -> int:
        return self._len

    def agent_steps(self) -> int:
        """Agent steps in this chunk: the sum of the agent chunks' lengths."""
        return sum(len(e) for e in self.agent_episodes.values())

    def module_for(self, agent_id: str) -> str:
        """The module the agent was mapped to in this episode."""
        return self._agent_to_module[agent_id]

    @property
    def agent_to_module(self) -> dict[str, str]:
        """`{agent_id: module_id}` for every agent of the env, as mapped in this episode."""
        return dict(self._agent_to_module)

    def get_return(self) -> float:
        """Sum of the agent chunks' returns (rewards received before an agent's first
        action are not part of it, as in RLlib)."""
        return float(sum(e.get_return() for e in self.agent_episodes.values()))

    def validate(self) -> None:
        for episode in self.agent_episodes.values():
            episode.validate()
        if self.agent_steps() > self._len * max(1, len(self.possible_agents)):
            raise AssertionError(f"Episode {self.id_}: more agent steps than agents x env "
                                 "steps.")

    def concat_episode(self, other: "MultiAgentEpisode") -> None:
        """Appends the next chunk `other` of the same episode (per agent, RLlib's rules)."""
        if other.id_ != self.id_:
            raise AssertionError(f"Cannot concat episode {other.id_} to episode {self.id_}.")
        if self.is_done:
            raise AssertionError(f"Episode {self.id_} is done; nothing can follow it.")
        if self.env_t != other.env_t_started:
            raise AssertionError(f"Episode {self.id_}: chunk starts at env_t="
                                 f"{other.env_t_started}, expected {self.env_t}.")
        for agent_id, episode in other.agent_episodes.items():
            if agent_id in self.agent_episodes:
                self.agent_episodes[agent_id].concat_episode(episode)
            else:
                self.agent_episodes[agent_id] = episode
        self.env_rewards = {a: np.concatenate([self.env_rewards[a], other.env_rewards[a]])
                            for a in self.env_rewards}
        self.acted = {a: np.concatenate([self.acted[a], other.acted[a]]) for a in self.acted}
        self.completed = {a: np.concatenate([self.completed[a], other.completed[a]])
                          for a in self.completed}
        self._len += len(other)
        self.acts_at_end = dict(other.acts_at_end)
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated

    def to_rllib(self, *, weights_seq_no: int = 0):
        """This chunk as a `ray.rllib.env.multi_agent_episode.MultiAgentEpisode` (numpy
        data, agents' lookback kept, `env_t_to_agent_t` built; see
        `jaxrunner.episodes.rllib_conversion`). Imports Ray."""
        from jaxrunner.episodes.rllib_conversion import multi_agent_to_rllib

        return multi_agent_to_rllib(self, weights_seq_no=weights_seq_no)

    def __repr__(self) -> str:
        state = ("terminated" if self.is_terminated else "truncated" if self.is_truncated
                 else "ongoing")
        return (f"MultiAgentEpisode(id_={self.id_!r}, env_t_started={self.env_t_started}, "
                f"len={len(self)}, agent_steps={self.agent_steps()}, "
                f"return={self.get_return():.3f}, {state})")


class MultiAgentEpisodeBatch(Sequence):
    """What `MultiAgentEnvRunner.sample()` returns.

    Attributes:
        chunks: tuple of device `MultiAgentTrajectory` chunks `(T, B, ...)`.
        num_envs: `B`; agent_ids: the env's agents; module_ids: the modules.
        mode: "timesteps" (cut episodes included) or "episodes".
    """

    def __init__(self, *, chunks: tuple[MultiAgentTrajectory, ...], start_info: Any,
                 lookback: MultiAgentLookback, num_steps: int, num_envs: int, mode: str,
                 num_episodes: int | None, id_prefix: str, agent_ids: tuple[str, ...],
                 module_ids: tuple[str, ...], observation_spaces: dict,
                 action_spaces: dict, module_batch_fn: Callable | None = None,
                 weights_seq_no: int = 0, end_acting: Any = None,
                 discarded_env_steps: int = 0):
        self.chunks = tuple(chunks)
        self.num_envs = num_envs
        self.mode = mode
        self.agent_ids = tuple(agent_ids)
        self.module_ids = tuple(module_ids)
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces
        self.weights_seq_no = weights_seq_no
        self._start_info = start_info  # (episode_count (B,), episode_len (B,), agent_len (B, A))
        self._lookback = lookback
        self._num_steps = num_steps
        self._num_episodes = num_episodes
        self._id_prefix = id_prefix
        self._module_batch_fn = module_batch_fn
        # (B, A) bool or None: the agents acting at the env step after the batch's last
        # one (a copy of the carry's mask, never the carry's own buffer, which the next
        # sample() donates); it completes the RLlib env-step map of cut chunks.
        self._end_acting = end_acting
        self._episodes: list[MultiAgentEpisode] | None = None
        # Env steps of failed sub-envs' episodes (discarded: not in the episodes).
        self.discarded_env_steps = int(discarded_env_steps)

    # ------------------------------------------------------------------ device face
    def trajectory(self) -> MultiAgentTrajectory:
        """All chunks as one device `MultiAgentTrajectory` (one chunk: returned as is)."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *self.chunks)

    def module_batch_chunks(self) -> tuple[dict[str, ModuleBatch], ...]:
        """`{module_id: ModuleBatch}` device arrays per module for each chunk (see
        `ModuleBatch`), from one compiled program per runner: no call compiles again."""
        if self._module_batch_fn is None:
            raise ValueError("This batch was built without a module batch function.")
        return tuple(self._module_batch_fn(chunk) for chunk in self.chunks)

    def module_batches(self) -> dict[str, ModuleBatch]:
        """`{module_id: ModuleBatch}` over all chunks. A default `sample()` is one chunk,
        returned as is; several chunks are concatenated along time, which compiles once
        per distinct number of chunks (use `module_batch_chunks()` to avoid that)."""
        per_chunk = self.module_batch_chunks()
        if not per_chunk:
            return {}
        if len(per_chunk) == 1:
            return per_chunk[0]
        return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *per_chunk)

    @property
    def num_vector_steps(self) -> int:
        return self._num_steps

    @property
    def env_steps(self) -> int:
        """Env steps in the returned episodes."""
        if self.mode == "timesteps":
            return self._num_steps * self.num_envs - self.discarded_env_steps
        return sum(len(e) for e in self._host_episodes())

    def agent_steps(self) -> int:
        """Agent steps in the returned episodes."""
        return sum(e.agent_steps() for e in self._host_episodes())

    # ------------------------------------------------------------------ host face
    def _host_episodes(self) -> list[MultiAgentEpisode]:
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
        """The episode chunks as `ray.rllib.env.multi_agent_episode.MultiAgentEpisode`s
        (in this batch's order, same ids across cuts; see `MultiAgentEpisode.to_rllib`),
        their steps marked with this batch's `weights_seq_no`."""
        return [episode.to_rllib(weights_seq_no=self.weights_seq_no)
                for episode in self._host_episodes()]

    def _build_host_episodes(self) -> list[MultiAgentEpisode]:
        chunks, (start_count, start_len, start_agent_len), lookback, end_acting = (
            jax.device_get((self.chunks, self._start_info, self._lookback,
                            self._end_acting)))
        num_steps = self._num_steps
        if not chunks:
            return []
        # Only the taken steps: a chunk that stopped early (e.g. before a top-up after a
        # sub-env failure) has invalid rows in the middle of the concatenation.
        taken = np.concatenate([chunk.valid for chunk in chunks])
        traj = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0)[taken], *chunks)
        # A failed sub-env's episode ends at the failure and is discarded.
        done = traj.all_terminated | traj.all_truncated | traj.failed  # (T, B)
        lookback_len = lookback.rewards.shape[0]
        episodes: list[tuple[int, int, MultiAgentEpisode]] = []
        for b in range(self.num_envs):
            ends = np.flatnonzero(done[:, b])
            starts = np.concatenate([[0], ends + 1])
            stops = np.concatenate([ends + 1, [num_steps]])
            for k, (s, e) in enumerate(zip(starts, stops)):
                if e <= s:
                    continue  # an episode that starts at the very end has no steps yet
                finished = k < len(ends)
                if finished and traj.failed[e - 1, b]:
                    continue  # its sub-env failed: the episode is discarded for every agent
                if self.mode == "episodes" and not finished:
                    continue
                episode_index = int(start_count[b]) + k
                episode_id = f"{self._id_prefix}{b:05x}{episode_index:08x}"
                agent_episodes = {}
                for i, agent in enumerate(self.agent_ids):
                    steps = s + np.flatnonzero(traj.completed[s:e, b, i])
                    if len(steps) == 0:
                        continue  # zero-length agent chunks are dropped
                    t_started = int(start_agent_len[b, i]) if k == 0 else 0
                    n_lb = min(lookback_len, t_started)
                    lb = slice(lookback_len - n_lb, lookback_len)
                    last = steps[-1]
                    observations = jax.tree.map(
                        lambda o, n: np.concatenate([o[steps, b], n[last, b][None]], axis=0),
                        traj.obs[agent], traj.next_obs[agent])
                    agent_episodes[agent] = SingleAgentEpisode(
                        f"{episode_id}/{agent}",
                        observations=observations,
                        actions=jax.tree.map(lambda x: x[steps, b], traj.actions[agent]),
                        rewards=traj.rewards[steps, b, i],
                        extra_model_outputs={
                            n: jax.tree.map(lambda x: x[steps, b], v)
                            for n, v in traj.extra_model_outputs[agent].items()},
                        terminated=bool(traj.terminated[last, b, i]),
                        truncated=bool(traj.truncated[last, b, i]),
                        t_started=t_started,
                        lookback_observations=jax.tree.map(lambda x: x[lb, b],
                                                           lookback.obs[agent]),
                        lookback_actions=jax.tree.map(lambda x: x[lb, b],
                                                      lookback.actions[agent]),
                        lookback_rewards=lookback.rewards[lb, b, i],
                        lookback_extra_model_outputs={
                            n: jax.tree.map(lambda x: x[lb, b], v)
                            for n, v in lookback.extra_model_outputs[agent].items()},
                        observation_space=self.observation_spaces.get(agent),
                        action_space=self.action_spaces.get(agent),
                        agent_id=agent,
                        module_id=self.module_ids[int(traj.module_index[s, b, i])],
                    )
                episode = MultiAgentEpisode(
                    episode_id,
                    agent_episodes=agent_episodes,
                    env_t_started=int(start_len[b]) if k == 0 else 0,
                    length=int(e - s),
                    terminated=finished and bool(traj.all_terminated[e - 1, b]),
                    truncated=finished and bool(traj.all_truncated[e - 1, b]),
                    agent_to_module={a: self.module_ids[int(traj.module_index[s, b, i])]
                                     for i, a in enumerate(self.agent_ids)},
                    env_rewards={a: traj.env_rewards[s:e, b, i]
                                 for i, a in enumerate(self.agent_ids)},
                    acted={a: traj.acted[s:e, b, i] for i, a in enumerate(self.agent_ids)},
                    completed={a: traj.completed[s:e, b, i]
                               for i, a in enumerate(self.agent_ids)},
                    agent_t_started={a: int(start_agent_len[b, i]) if k == 0 else 0
                                     for i, a in enumerate(self.agent_ids)},
                    observation_spaces=self.observation_spaces,
                    action_spaces=self.action_spaces,
                    acts_at_end=({a: end_acting[b, i] for i, a in enumerate(self.agent_ids)}
                                 if end_acting is not None and not finished else None),
                    env_index=b, episode_index=episode_index, agent_ids=self.agent_ids,
                )
                episodes.append((int(e - 1), b, episode))
        if self.mode == "episodes":
            # The first k episodes to finish, in (step, sub-env) order.
            episodes.sort(key=lambda item: (item[0], item[1]))
            episodes = episodes[: self._num_episodes]
        return [episode for _, _, episode in episodes]

    def __repr__(self) -> str:
        return (f"MultiAgentEpisodeBatch(num_envs={self.num_envs}, vector_steps="
                f"{self._num_steps}, chunks={len(self.chunks)}, mode={self.mode!r}, "
                f"agents={list(self.agent_ids)})")


__all__ = ["ModuleBatch", "MultiAgentEpisode", "MultiAgentEpisodeBatch"]
