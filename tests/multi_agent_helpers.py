"""Helpers for the multi-agent tests: a turn-order test env, RLlib's multi-agent episode
semantics as a plain-Python loop, and small utilities."""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv


@struct.dataclass
class RelayState:
    t: jax.Array  # () int32
    last: jax.Array  # (3,) int32: last action of each agent
    c_done: jax.Array  # () bool


@struct.dataclass
class RelayParams:
    horizon: int = 7


class Relay(MultiAgentEnv):
    """Three agents, turn order by phase `t % 3`: {a, b} move together, then {c} (or {b}
    once c is done), then {a}. Every agent gets a distinct reward at every step (it
    depends on the time and on earlier actions), so rewards received while waiting must
    accumulate. `c` terminates alone when it plays 0 at
    `t >= 4`; `"__all__"` is truncated at `t == horizon`. Deterministic given actions."""

    agents = ("a", "b", "c")

    @property
    def default_params(self):
        return RelayParams()

    def observation_space(self, agent_id, params=None):
        return spaces.Box(-10.0, 1000.0, (3,), jnp.float32)

    def action_space(self, agent_id, params=None):
        return spaces.Discrete(3)

    def _obs(self, state: RelayState) -> dict:
        t = state.t.astype(jnp.float32) / 10.0
        return {agent: jnp.stack([t, state.last[i].astype(jnp.float32), jnp.float32(i)])
                for i, agent in enumerate(self.agents)}

    def reset_env(self, key, params):
        state = RelayState(t=jnp.zeros((), jnp.int32), last=jnp.zeros((3,), jnp.int32),
                           c_done=jnp.zeros((), jnp.bool_))
        return self._obs(state), state

    def agents_to_act(self, state, params):
        phase = state.t % 3
        return {"a": (phase == 0) | (phase == 2),
                "b": (phase == 0) | ((phase == 1) & state.c_done),
                "c": (phase == 1) & ~state.c_done}

    def step_env(self, key, state, actions, params):
        acting = self.agents_to_act(state, params)
        action = jnp.stack([actions[a] for a in self.agents]).astype(jnp.int32)
        moved = jnp.stack([acting[a] for a in self.agents])
        last = jnp.where(moved, action, state.last)
        t = state.t.astype(jnp.float32)
        bonus = jnp.sum(state.last).astype(jnp.float32)  # actions taken before this step
        rewards = {agent: 0.1 * (i + 1) + 0.01 * t + 0.001 * bonus
                   for i, agent in enumerate(self.agents)}
        c_ends = acting["c"] & (action[2] == 0) & (state.t >= 4)
        new = RelayState(t=state.t + 1, last=last, c_done=state.c_done | c_ends)
        truncated = new.t >= params.horizon
        no = jnp.zeros((), jnp.bool_)
        terminateds = {"a": no, "b": no, "c": c_ends, ALL: no}
        truncateds = {"a": truncated, "b": truncated, "c": truncated, ALL: truncated}
        return self._obs(new), new, rewards, terminateds, truncateds, {}


def relay_creator(context):
    env = Relay()
    return env, RelayParams(horizon=int(context.get("horizon", 7)))


# ---------------------------------------------------------------------- reference loop
def reference_rollout(env: MultiAgentEnv, params: Any, choose_action: Callable,
                      *, num_episodes: int | None = None, num_env_steps: int | None = None
                      ) -> list[dict]:
    """Steps `env` eagerly, one sub-env, and builds episodes as RLlib's MultiAgentEpisode
    does: an agent's step is (obs it acted on, action, rewards summed until it gets its
    next observation or is done, that observation); rewards before its first action are
    not its own; agents with no step are left out.

    `choose_action(episode_index, agent, agent_step, obs)` gives the actions. Stops after
    `num_episodes` finished episodes or `num_env_steps` env steps; an unfinished last
    episode is returned with what it completed so far.
    """
    key = jax.random.key(0)
    episodes: list[dict] = []

    def new_episode(obs, state):
        mask = env.agents_to_act(state, params)
        agents = {a: {"obs": [], "actions": [], "rewards": [], "terminated": False,
                      "truncated": False} for a in env.agents}
        for a in env.agents:
            if bool(mask[a]):
                agents[a]["obs"].append(np.asarray(obs[a]))
        return {"agents": agents, "len": 0, "terminated": False, "truncated": False,
                "env_rewards": {a: [] for a in env.agents},
                "hanging": {}, "hanging_reward": {}, "done": set()}

    obs, state = env.reset(key, params)
    episode = new_episode(obs, state)
    steps = 0
    while True:
        if num_episodes is not None and len(episodes) >= num_episodes:
            break
        if num_env_steps is not None and steps >= num_env_steps:
            break
        mask = env.agents_to_act(state, params)
        to_act = [a for a in env.agents if bool(mask[a]) and a not in episode["done"]]
        actions = {}
        for a in to_act:
            agent = episode["agents"][a]
            actions[a] = choose_action(len(episodes), a, len(agent["actions"]),
                                       agent["obs"][-1])
            episode["hanging"][a] = actions[a]
            episode["hanging_reward"][a] = 0.0
        obs, state, rewards, terminateds, truncateds, infos = env.step(key, state, actions,
                                                                       params)
        steps += 1
        episode["len"] += 1
        final = infos["final_observation"]
        all_terminated = bool(terminateds[ALL])
        all_truncated = bool(truncateds[ALL]) and not all_terminated
        all_done = all_terminated or all_truncated
        next_mask = env.agents_to_act(state, params)
        for a in env.agents:
            reward = float(rewards[a])
            episode["env_rewards"][a].append(reward)
            if a in episode["done"]:
                continue
            agent = episode["agents"][a]
            ends = bool(terminateds[a]) or bool(truncateds[a]) or all_done
            gets_obs = not all_done and bool(next_mask[a]) and not ends
            if a in episode["hanging"]:
                episode["hanging_reward"][a] += reward
                if gets_obs or ends:
                    agent["actions"].append(episode["hanging"].pop(a))
                    agent["rewards"].append(episode["hanging_reward"].pop(a))
                    agent["obs"].append(np.asarray(final[a]))
                    if ends:
                        agent["terminated"] = bool(terminateds[a]) or all_terminated
                        agent["truncated"] = not agent["terminated"]
            elif gets_obs and not agent["obs"]:
                agent["obs"].append(np.asarray(final[a]))
            if ends:
                episode["done"].add(a)
        if all_done:
            episode["terminated"], episode["truncated"] = all_terminated, all_truncated
            episodes.append(episode)
            episode = new_episode(obs, state)
    if episode["len"] > 0 and (num_episodes is None or len(episodes) < num_episodes):
        episodes.append(episode)
    for item in episodes:
        item["agents"] = {a: v for a, v in item["agents"].items() if v["actions"]}
    return episodes


def assert_same_episode(runner_episode, reference: dict, *, check_done: bool = True) -> None:
    """The runner's whole `MultiAgentEpisode` equals a reference episode."""
    assert len(runner_episode) == reference["len"], (len(runner_episode), reference["len"])
    assert set(runner_episode.agent_episodes) == set(reference["agents"])
    for agent, expected in reference["agents"].items():
        got = runner_episode.agent_episodes[agent]
        np.testing.assert_allclose(got.observations, np.stack(expected["obs"]), rtol=1e-6,
                                   err_msg=f"{agent} observations")
        np.testing.assert_array_equal(got.actions, np.asarray(expected["actions"]),
                                      err_msg=f"{agent} actions")
        np.testing.assert_allclose(got.rewards, np.asarray(expected["rewards"]), rtol=1e-5,
                                   atol=1e-6, err_msg=f"{agent} rewards")
        if check_done:
            assert got.is_terminated == expected["terminated"], agent
            assert got.is_truncated == expected["truncated"], agent
    if check_done:
        assert runner_episode.is_terminated == reference["terminated"]
        assert runner_episode.is_truncated == reference["truncated"]
    for agent, values in reference["env_rewards"].items():
        np.testing.assert_allclose(runner_episode.env_rewards[agent], np.asarray(values),
                                   rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- utilities
def whole_episodes(batches) -> tuple[dict, list]:
    """Joins the chunks of successive batches per episode id (copies) with
    `concat_episode`; returns `({id: episode}, [ids of finished episodes])`. Episodes
    whose first chunk is not in `batches` are skipped."""
    by_id: dict = {}
    finished: list = []
    for batch in batches:
        for chunk in batch:
            if chunk.id_ in by_id:
                by_id[chunk.id_].concat_episode(copy.deepcopy(chunk))
            elif chunk.env_t_started == 0:
                by_id[chunk.id_] = copy.deepcopy(chunk)
            else:
                continue
            if by_id[chunk.id_].is_done:
                finished.append(chunk.id_)
    return by_id, finished


class _CompileLog(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        if record.getMessage().startswith("Compiling"):
            self.messages.append(record.getMessage())


@contextlib.contextmanager
def count_compiles():
    """Yields a list that collects the XLA compilations made inside the block."""
    handler = _CompileLog()
    logger = logging.getLogger("jax")
    previous, previous_level = jax.config.jax_log_compiles, logger.level
    jax.config.update("jax_log_compiles", True)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        jax.config.update("jax_log_compiles", previous)
