"""Small gymnax-style envs that pin contracts in tests and examples.

* `DictObsEnv`: Dict observations (a Box and a Discrete part), Discrete(2) actions.
* `MultiDiscreteEnv`: MultiDiscrete([3, 2]) actions; reward = sum of the action parts.
* `TargetEnv`: a 1-D Box action must reach a target; reward = -|action - target|.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class _State(environment.EnvState):
    position: jax.Array
    time: int


@struct.dataclass
class _Params(environment.EnvParams):
    max_steps_in_episode: int = 10


class DictObsEnv(environment.Environment):
    """Observation {"position": Box (2,), "phase": Discrete(3)}; action 0/1 moves left/right;
    terminates when |x| > 3, truncates after `max_steps_in_episode`."""

    @property
    def default_params(self):
        return _Params()

    def step_env(self, key, state, action, params):
        move = jnp.where(action == 1, 1.0, -1.0)
        position = state.position + jnp.stack([move, 0.5 * move])
        state = _State(position=position, time=state.time + 1)
        terminated = jnp.abs(position[0]) > 3.0
        return self.get_obs(state), state, jnp.float32(1.0), terminated, {}

    def reset_env(self, key, params):
        state = _State(position=jax.random.uniform(key, (2,), minval=-1, maxval=1), time=0)
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return {"position": state.position, "phase": jnp.int32(state.time % 3)}

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params=None):
        return spaces.Dict({"position": spaces.Box(-10.0, 10.0, (2,), jnp.float32),
                            "phase": spaces.Discrete(3)})


class MultiDiscreteEnv(environment.Environment):
    """MultiDiscrete([3, 2]) actions (a gymnasium space); reward = a[0] + a[1]."""

    @property
    def default_params(self):
        return _Params()

    def step_env(self, key, state, action, params):
        state = _State(position=state.position + 1.0, time=state.time + 1)
        reward = jnp.sum(action).astype(jnp.float32)
        return state.position, state, reward, jnp.bool_(False), {}

    def reset_env(self, key, params):
        state = _State(position=jnp.zeros((2,)), time=0)
        return state.position, state

    def action_space(self, params=None):
        return gym.spaces.MultiDiscrete([3, 2])

    def observation_space(self, params=None):
        return spaces.Box(-100.0, 100.0, (2,), jnp.float32)


class TargetEnv(environment.Environment):
    """Box(-2, 2, (1,)) actions; reward = -|action - target|. The observation is
    `[target, the action the env last received]`, so tests can see what reached the env."""

    @property
    def default_params(self):
        return _Params()

    def step_env(self, key, state, action, params):
        reward = -jnp.abs(action[0] - state.position[0]).astype(jnp.float32)
        target = jax.random.uniform(key, (), minval=-2.0, maxval=2.0)
        state = _State(position=jnp.stack([target, action[0]]), time=state.time + 1)
        return state.position, state, reward, jnp.bool_(False), {}

    def reset_env(self, key, params):
        target = jax.random.uniform(key, (), minval=-2.0, maxval=2.0)
        state = _State(position=jnp.stack([target, jnp.float32(0.0)]), time=0)
        return state.position, state

    def action_space(self, params=None):
        return spaces.Box(-2.0, 2.0, (1,), jnp.float32)

    def observation_space(self, params=None):
        return spaces.Box(-100.0, 100.0, (2,), jnp.float32)


class FlakyEnv(environment.Environment):
    """Wraps a gymnax env; a step fails when the observation it starts from hashes to 0
    mod `period` (about 1 step in `period`), so tests can recount failures from the data.

    `mode="flag"` reports the failure with `mark_step_failed` in the step info;
    `mode="nan"` returns a NaN observation instead (caught by `check_finite`).
    """

    def __init__(self, inner: environment.Environment, period: int = 100, mode: str = "flag"):
        self.inner = inner
        self.period = period
        self.mode = mode

    @staticmethod
    def fails(obs, period: int):
        """The failure predicate (works on jax and numpy arrays of shape (..., F))."""
        import numpy as np

        if isinstance(obs, np.ndarray):
            bits = obs[..., 0].astype(np.float32).view(np.uint32)
            return bits % np.uint32(period) == 0
        bits = jax.lax.bitcast_convert_type(obs[..., 0].astype(jnp.float32), jnp.uint32)
        return bits % jnp.uint32(period) == 0

    @property
    def default_params(self):
        return self.inner.default_params

    def step(self, key, state, action, params=None):
        from jaxrunner.core.rollout import mark_step_failed

        obs_before = self.inner_obs(state)
        obs, state, reward, terminated, truncated, info = self.inner.step(key, state[0], action,
                                                                          params)
        failed = self.fails(obs_before, self.period)
        if self.mode == "nan":
            info = dict(info)
            info["final_observation"] = jnp.where(failed, jnp.nan, info["final_observation"])
            obs = jnp.where(failed, jnp.nan, obs)
        else:
            info = mark_step_failed(info, failed)
        return obs, (state, obs), reward, terminated, truncated, info

    def inner_obs(self, state):
        return state[1]

    def reset(self, key, params=None):
        obs, state = self.inner.reset(key, params)
        return obs, (state, obs)

    def action_space(self, params=None):
        return self.inner.action_space(params)

    def observation_space(self, params=None):
        return self.inner.observation_space(params)


def make_flaky_multi_agent_env(inner: Any, period: int = 100, mode: str = "flag"):
    """Wraps a jaxrunner `MultiAgentEnv`: a step fails when the first agent's observation
    the step starts from hashes to 0 mod `period` (`FlakyEnv.fails`), so tests can recount
    failures from the data. `mode="flag"` reports it with `mark_step_failed`; `mode="nan"`
    returns a NaN observation for the first agent instead (caught by `check_finite`)."""
    from jaxrunner.core.faults import mark_step_failed
    from jaxrunner.envs.multi_agent import MultiAgentEnv

    first = inner.agents[0]

    class _Flaky(MultiAgentEnv):
        agents = inner.agents

        @property
        def name(self) -> str:
            return f"Flaky({inner.name})"

        @property
        def default_params(self):
            return inner.default_params

        def observation_space(self, agent_id, params=None):
            return inner.observation_space(agent_id, params)

        def action_space(self, agent_id, params=None):
            return inner.action_space(agent_id, params)

        def reset_env(self, key, params):
            obs, state = inner.reset_env(key, params)
            return obs, (state, obs[first])

        def step_env(self, key, state, actions, params):
            inner_state, obs_before = state
            obs, inner_state, rewards, terminateds, truncateds, infos = inner.step_env(
                key, inner_state, actions, params)
            failed = FlakyEnv.fails(obs_before, period)
            if mode == "nan":
                obs = {**obs, first: jnp.where(failed, jnp.nan, obs[first])}
            else:
                infos = mark_step_failed(dict(infos), failed)
            return obs, (inner_state, obs[first]), rewards, terminateds, truncateds, infos

        def agents_to_act(self, state, params):
            return inner.agents_to_act(state[0], params)

    return _Flaky()
