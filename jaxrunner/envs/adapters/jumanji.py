"""Jumanji (`pip install jumanji`): `"jumanji/<id>"`, or a Jumanji env object.

Jumanji envs have `reset(key) -> (state, TimeStep)` and `step(state, action) -> (state,
TimeStep)` with dm_env-style `TimeStep(step_type, reward, discount, observation, extras)`
and structured specs. `JumanjiEnv` maps them to the env protocol:

* episode ends: `step_type == LAST`; `discount == 0` there is a termination, `discount > 0`
  a truncation (Jumanji's `termination()` / `truncation()` constructors);
* observations: a NamedTuple observation becomes a dict of its fields (nested NamedTuples
  nested dicts), with a gymnax `Dict` space from `observation_spec`; an array observation
  stays an array with a `Box` space;
* actions: `DiscreteArray` -> `Discrete`, `MultiDiscreteArray` ->
  `jaxrunner.envs.spaces.MultiDiscrete`, `BoundedArray` -> `Box`;
* `info["extras"]` holds the TimeStep's `extras`;
* action mask: when the observation has an `action_mask` field shaped like the (discrete)
  action space, the adapted env has `action_mask(state, params) -> bool[n]`.

`env_config` goes to `jumanji.make(id, **env_config)`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner.envs.adapters.base import (SuiteAdapter, SuiteState, construct, first_state,
                                          next_state, split_done)
from jaxrunner.envs.spaces import to_gymnax

_LAST = 2  # jumanji.types.StepType.LAST
_AUTO_RESET_WRAPPERS = ("AutoResetWrapper", "VmapAutoResetWrapper", "VmapWrapper",
                        "JumanjiToGymWrapper", "JumanjiToDMEnvWrapper")


def _spec_to_gymnax(spec: Any, what: str) -> Any:
    parts = getattr(spec, "_specs", None)
    if isinstance(parts, dict) and not hasattr(spec, "shape"):
        from gymnax.environments import spaces as gx

        return gx.Dict({k: _spec_to_gymnax(s, f"{what}.{k}") for k, s in parts.items()})
    return to_gymnax(spec, what=what)


def _obs_to_tree(obs: Any) -> Any:
    if hasattr(obs, "_asdict"):
        return {k: _obs_to_tree(v) for k, v in obs._asdict().items()}
    return obs


def _mask_of(obs: Any) -> Any:
    return getattr(obs, "action_mask", None)


class JumanjiEnv(SuiteAdapter):
    """A Jumanji env object (`jumanji.make(id)`).

    Args:
        env: the Jumanji `Environment`.
        env_id: the id to report (default: the class name).

    The state's `inner` is `(jumanji state, the observation's action_mask or None)`.
    """

    suite = "jumanji"

    def __init__(self, env: Any, env_id: str | None = None):
        if type(env).__name__ in _AUTO_RESET_WRAPPERS:
            raise ValueError(
                f"{type(env).__name__} wraps the env given to the jumanji adapter: give the "
                "bare env (jumanji.make(id)). Its auto-reset would drop each episode's "
                "final observation; the adapter resets itself, with a fresh key per episode."
            )
        super().__init__(env, env_id)
        obs_space = _spec_to_gymnax(env.observation_spec, f"{self.name} observation_spec")
        act_space = _spec_to_gymnax(env.action_spec, f"{self.name} action_spec")
        self.set_spaces(obs_space, act_space)
        mask_space = obs_space.spaces.get("action_mask") if hasattr(obs_space, "spaces") else None
        n = getattr(act_space, "n", None)
        if mask_space is not None and n is not None and tuple(mask_space.shape) == (int(n),):
            self.action_mask = self._action_mask

    def _action_mask(self, state: SuiteState, params: Any = None) -> jax.Array:
        """`(n,)` bool: the legal actions in `state` (the observation's `action_mask`)."""
        del params
        return jnp.asarray(state.inner[1], jnp.bool_)

    def reset_env(self, key: jax.Array, params: Any):
        del params
        inner_state, timestep = self.inner.reset(key)
        return (_obs_to_tree(timestep.observation),
                first_state((inner_state, _mask_of(timestep.observation))))

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        del key, params
        inner_state, timestep = self.inner.step(state.inner[0], action)
        last = timestep.step_type == _LAST
        terminated, truncated = split_done(last & (timestep.discount == 0),
                                           last & (timestep.discount > 0))
        info = {"extras": timestep.extras}
        return (_obs_to_tree(timestep.observation),
                next_state(state, (inner_state, _mask_of(timestep.observation)), truncated),
                jnp.asarray(timestep.reward, jnp.float32).reshape(()), terminated, info)


def make(env_id: str, env_config: dict) -> tuple[JumanjiEnv, Any]:
    """`"jumanji/<env_id>"`: `JumanjiEnv(jumanji.make(env_id, **env_config))`."""
    import jumanji

    inner = construct(jumanji.make, "jumanji.make", env_id, env_config)
    env = JumanjiEnv(inner, env_id)
    return env, env.default_params


def env_ids() -> list[str]:
    """Every id in Jumanji's registry."""
    import jumanji

    return sorted(jumanji.registered_environments())
