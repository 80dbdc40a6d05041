"""The JAX multi-agent env protocol, and resolution of multi-agent env names.

A multi-agent env is a stateless object with a **fixed** tuple of agent ids
(`env.agents`, RLlib's `possible_agents`) and pure functions over dicts keyed by agent id:

* `reset(key, params) -> (obs, state)`: `obs[aid]` for every agent.
* `step(key, state, actions, params) -> (obs, state, rewards, terminateds, truncateds,
  infos)`: `actions[aid]` for the agents that act now; `obs`, `rewards`, `terminateds`
  and `truncateds` have an entry for every agent, and the last two also `"__all__"`.
* `agents_to_act(state, params) -> {aid: bool array}`: which agents have an observation
  in `state` and must act at the next `step` (RLlib's "agents with an observation").
  Simultaneous-move envs return True for every agent still in the episode; a turn-based
  game returns True for the player to move only.

Every step returns an observation for every agent (fixed shapes, so the step can be
compiled); the `agents_to_act` mask of the next state says which of them are real, i.e.
which agents act on them. An agent's observation in the step where it is done (its own
`terminateds[aid]`/`truncateds[aid]`, or `"__all__"`) is its final observation.
Rewards may go to any agent at any step; the runner adds the rewards an agent receives
while it waits for its next observation to its last action, as RLlib does.

`step` auto-resets: when `terminateds["__all__"] | truncateds["__all__"]`, the returned
`obs`/`state` are those of a fresh episode and `infos["final_observation"]` holds the
observations of the step before the reset (the gymnax 1.0 convention). `__all__` must be
True once every agent is done. Actions of agents that are not to act are ignored (replaced
by zeros before `step_env` sees them). Called eagerly (concrete arrays, e.g. a Python
loop), `step` also checks that actions were given exactly for the agents that must act
and raises `ValueError` otherwise; inside `jit`/`vmap` it cannot raise, and ignores them.

Subclasses write `reset_env`, `step_env` and `agents_to_act` (and the spaces); the base
class adds the dict checks, the action masking and the auto-reset.

`config.env` for `MultiAgentEnvRunner` resolves like the single-agent one (a name given
to `jaxrunner.register_env`, a callable creator, an env instance) plus
`"jaxmarl/<id>"` for a JaxMARL env through `JaxMARLEnv` (needs `pip install jaxmarl`).
Built-in names: `"MultiAgentCartPole-v1"` (simultaneous moves) and `"TicTacToe-v0"`
(turn-based).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.core.autoreset import gated_reset, select_where
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.registry import make_jax_env, register_env

ALL = "__all__"


def _is_concrete(tree: Any) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


class MultiAgentEnv(abc.ABC):
    """Base class of JAX multi-agent envs (see the module docstring for the contract).

    Subclasses set `self.agents` (a tuple of str agent ids) in `__init__` and implement
    `default_params`, `observation_space(agent_id, params)`,
    `action_space(agent_id, params)` (gymnax spaces), `reset_env`, `step_env` and
    `agents_to_act`.
    """

    agents: tuple[str, ...] = ()

    @property
    def default_params(self) -> Any:
        return None

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def observation_space(self, agent_id: str, params: Any = None) -> Any:
        """The gymnax observation space of `agent_id`."""

    @abc.abstractmethod
    def action_space(self, agent_id: str, params: Any = None) -> Any:
        """The gymnax action space of `agent_id`."""

    @abc.abstractmethod
    def reset_env(self, key: jax.Array, params: Any) -> tuple[dict, Any]:
        """Starts an episode: `(obs dict, state)`."""

    @abc.abstractmethod
    def step_env(self, key: jax.Array, state: Any, actions: dict, params: Any
                 ) -> tuple[dict, Any, dict, dict, dict, dict]:
        """One transition, without auto-reset: `(obs, state, rewards, terminateds,
        truncateds, infos)`; `actions` has every agent (zeros for agents not to act)."""

    @abc.abstractmethod
    def agents_to_act(self, state: Any, params: Any) -> dict[str, jax.Array]:
        """`{aid: () bool}`: the agents that have an observation and act next."""

    # ------------------------------------------------------------------ the protocol
    def reset(self, key: jax.Array, params: Any = None) -> tuple[dict, Any]:
        """Starts an episode; returns `(obs, state)` with `obs[aid]` for every agent."""
        if params is None:
            params = self.default_params
        obs, state = self.reset_env(key, params)
        self._check_keys("reset() observations", obs, with_all=False)
        return obs, state

    def step(self, key: jax.Array, state: Any, actions: dict, params: Any = None
             ) -> tuple[dict, Any, dict, dict, dict, dict]:
        """One env step with auto-reset on `"__all__"` (see the module docstring)."""
        key_step, key_reset = jax.random.split(key)
        return self.step_with_keys(key_step, key_reset, state, actions, params)

    def step_with_keys(self, key_step: jax.Array, key_reset: jax.Array, state: Any,
                       actions: dict, params: Any = None, reset_gate: jax.Array | None = None,
                       separate_reset_draws: bool = False
                       ) -> tuple[dict, Any, dict, dict, dict, dict]:
        """`step` with the step and reset keys it splits from its key given (the
        compiled runner draws both in its one key split per vector step). With
        `reset_gate` (`jaxrunner.core.autoreset.always_true`), the reset is computed in a
        kernel of its own on CPU, and with `separate_reset_draws` so are its random draws
        (`jaxrunner.core.autoreset.gated_reset`); same values."""
        if params is None:
            params = self.default_params
        acting = self.agents_to_act(state, params)
        actions = self._full_actions(actions, acting, params)
        obs_st, state_st, rewards, terminateds, truncateds, infos = self.step_env(
            key_step, state, actions, params)
        self._check_keys("step() observations", obs_st, with_all=False)
        self._check_keys("step() rewards", rewards, with_all=False)
        self._check_keys("step() terminateds", terminateds, with_all=True)
        self._check_keys("step() truncateds", truncateds, with_all=True)
        done = jnp.logical_or(terminateds[ALL], truncateds[ALL])
        obs_re, state_re = gated_reset(self.reset_env, key_reset, params, reset_gate,
                                       separate_reset_draws)
        state = select_where(done, state_re, state_st)
        obs = select_where(done, obs_re, obs_st)
        infos = {**dict(infos), "final_observation": obs_st}
        return obs, state, rewards, terminateds, truncateds, infos

    # ------------------------------------------------------------------ helpers
    def _check_keys(self, what: str, values: Any, *, with_all: bool) -> None:
        expected = set(self.agents) | ({ALL} if with_all else set())
        if not isinstance(values, dict) or set(values) != expected:
            got = sorted(values) if isinstance(values, dict) else type(values).__name__
            raise ValueError(
                f"{self.name}: {what} must be a dict keyed by exactly the env's fixed agent "
                f"ids {sorted(expected)}, got {got}. jaxrunner's multi-agent envs have a "
                "fixed set of agents: give every agent an entry at every step (use "
                "agents_to_act() to say which of them act) instead of adding or removing "
                "agents."
            )

    def _full_actions(self, actions: dict, acting: dict, params: Any) -> dict:
        """Every agent's action, zeros for agents not to act; eager calls are checked."""
        if not isinstance(actions, dict):
            raise TypeError(f"{self.name}: actions must be a dict keyed by agent id, got "
                            f"{type(actions).__name__}.")
        unknown = set(actions) - set(self.agents)
        if unknown:
            raise ValueError(f"{self.name}: actions for unknown agents {sorted(unknown)}; "
                             f"the env's agents are {list(self.agents)}.")
        if _is_concrete((acting, actions)):
            must = {a for a in self.agents if bool(np.asarray(acting[a]))}
            given = set(actions)
            if given != must:
                raise ValueError(
                    f"{self.name}: actions were given for {sorted(given)}, but the agents "
                    f"that must act now are {sorted(must)}"
                    + (f"; {sorted(given - must)} must not act" if given - must else "")
                    + (f"; {sorted(must - given)} are missing" if must - given else "")
                    + ". Pass actions only for the agents env.agents_to_act(state) marks."
                )
        full = {}
        for agent in self.agents:
            space = self.action_space(agent, params)
            zero = jnp.zeros(tuple(space.shape), space.dtype)
            if agent in actions:
                value = jnp.asarray(actions[agent]).astype(space.dtype)
                full[agent] = jnp.where(acting[agent], value, zero)
            else:
                full[agent] = jnp.broadcast_to(zero, zero.shape)
        return full


# ---------------------------------------------------------------------- resolution
JAXMARL_PREFIX = "jaxmarl/"


def make_multi_agent_env(env_spec: Any, env_context: EnvContext) -> tuple[Any, Any, str]:
    """Builds `(env, env_params, name)` for `MultiAgentEnvRunner` from `config.env`."""
    if isinstance(env_spec, str) and env_spec.startswith(JAXMARL_PREFIX):
        from jaxrunner.envs.jaxmarl_adapter import JaxMARLEnv

        env = JaxMARLEnv.from_id(env_spec[len(JAXMARL_PREFIX):], **dict(env_context))
        return env, env.default_params, env_spec
    env, params, name = make_jax_env(env_spec, env_context)
    if not isinstance(env, MultiAgentEnv):
        raise TypeError(
            f"The env {name!r} ({type(env).__name__}) is not a jaxrunner multi-agent env. "
            "MultiAgentEnvRunner needs a jaxrunner.envs.multi_agent.MultiAgentEnv (dicts "
            "keyed by agent id, a fixed agent set, agents_to_act()); use "
            "SingleAgentEnvRunner for gymnax envs, 'jaxmarl/<id>' for JaxMARL envs, or "
            "wrap your env in a MultiAgentEnv subclass."
        )
    return env, params, name


def _cartpole_creator(context: EnvContext):
    from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole

    env = MultiAgentCartPole(num_agents=int(context.get("num_agents", 2)))
    params = env.default_params
    if "max_steps_in_episode" in context:
        params = params.replace(max_steps_in_episode=int(context["max_steps_in_episode"]))
    return env, params


def _tic_tac_toe_creator(context: EnvContext):
    from jaxrunner.envs.tic_tac_toe import TicTacToe

    env = TicTacToe()
    return env, env.default_params


BUILTIN_MULTI_AGENT_ENVS = {
    "MultiAgentCartPole-v1": _cartpole_creator,
    "TicTacToe-v0": _tic_tac_toe_creator,
}
for _name, _creator in BUILTIN_MULTI_AGENT_ENVS.items():
    register_env(_name, _creator)

__all__ = ["ALL", "BUILTIN_MULTI_AGENT_ENVS", "JAXMARL_PREFIX", "MultiAgentEnv",
           "make_multi_agent_env"]
