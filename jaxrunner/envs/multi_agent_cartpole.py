"""`MultiAgentCartPole`: N independent CartPole-v1 poles, one per agent, moved
simultaneously (RLlib's `MultiAgentCartPole` example env, in JAX).

* Agents: `"agent_0"`, ..., `"agent_{N-1}"`.
* Observation (per agent): `(4,)` float32 `[x, x_dot, theta, theta_dot]` of its pole.
* Action (per agent): Discrete(2), push left or right.
* Reward: 1.0 per step to every agent whose pole is still up.
* An agent is terminated when its pole falls (gymnax CartPole-v1 rule); it then stops
  acting and its pole freezes. `"__all__"` is terminated once every pole has fallen and
  truncated after `max_steps_in_episode` steps (500).

Physics: gymnax `CartPole` (github.com/RobertTLange/gymnax, classic_control/cartpole.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments.classic_control.cartpole import CartPole

from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv


@struct.dataclass
class MultiAgentCartPoleState:
    poles: Any  # gymnax CartPole EnvState, leaves (N,)
    done: jax.Array  # (N,) bool: the agent's pole has fallen
    time: jax.Array  # () int32: steps taken in the episode


class MultiAgentCartPole(MultiAgentEnv):
    """N CartPole-v1 poles, one per agent, all moving at every step."""

    def __init__(self, num_agents: int = 2):
        if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
            raise ValueError(f"num_agents must be an int >= 1, got {num_agents!r}.")
        self.num_agents = num_agents
        self.agents = tuple(f"agent_{i}" for i in range(num_agents))
        self._cartpole = CartPole()

    @property
    def name(self) -> str:
        return "MultiAgentCartPole-v1"

    @property
    def default_params(self):
        return self._cartpole.default_params

    def observation_space(self, agent_id: str, params: Any = None):
        return self._cartpole.observation_space(
            self.default_params if params is None else params)

    def action_space(self, agent_id: str, params: Any = None):
        return self._cartpole.action_space(params)

    def _obs(self, poles) -> dict:
        stacked = jnp.stack([poles.x, poles.x_dot, poles.theta, poles.theta_dot], axis=-1)
        return {agent: stacked[i].astype(jnp.float32) for i, agent in enumerate(self.agents)}

    def reset_env(self, key, params):
        _, poles = jax.vmap(self._cartpole.reset_env, in_axes=(0, None))(
            jax.random.split(key, self.num_agents), params)
        state = MultiAgentCartPoleState(poles=poles,
                                        done=jnp.zeros((self.num_agents,), jnp.bool_),
                                        time=jnp.zeros((), jnp.int32))
        return self._obs(poles), state

    def step_env(self, key, state, actions, params):
        action = jnp.stack([actions[agent] for agent in self.agents]).astype(jnp.int32)
        _, moved, _, fell, _ = jax.vmap(self._cartpole.step_env, in_axes=(0, 0, 0, None))(
            jax.random.split(key, self.num_agents), state.poles, action, params)
        alive = ~state.done
        poles = jax.tree.map(lambda new, old: jnp.where(alive, new, old), moved, state.poles)
        done = state.done | (alive & fell)
        time = state.time + 1
        reward = alive.astype(jnp.float32)
        all_terminated = jnp.all(done)
        all_truncated = (time >= params.max_steps_in_episode) & ~all_terminated
        fell_now = alive & fell
        terminateds = {agent: fell_now[i] for i, agent in enumerate(self.agents)}
        terminateds[ALL] = all_terminated
        truncateds = {agent: all_truncated for agent in self.agents}
        truncateds[ALL] = all_truncated
        rewards = {agent: reward[i] for i, agent in enumerate(self.agents)}
        new_state = MultiAgentCartPoleState(poles=poles, done=done, time=time)
        return self._obs(poles), new_state, rewards, terminateds, truncateds, {}

    def agents_to_act(self, state, params):
        return {agent: ~state.done[i] for i, agent in enumerate(self.agents)}
