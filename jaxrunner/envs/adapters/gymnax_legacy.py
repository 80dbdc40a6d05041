"""`LegacyGymnaxEnv`: envs written against gymnax's pre-1.0 step API.

Before 1.0, a gymnax env's `step(key, state, action, params)` returned
`(obs, state, reward, done, info)`, where `done` also covered the time limit, and auto-reset
without keeping the final observation. Many third-party gymnax-style envs (and Craftax) still
do. This adapter calls the env's `step_env` / `reset_env` (no auto-reset) and splits `done`:

* `truncated` = the episode reached its time limit: `state.<time_field> >=
  params.<limit_field>` (gymnax's `state.time` and `params.max_steps_in_episode` by
  default; the adapter's own step count when the state has no such field; never when no
  limit is known);
* `terminated` = `done` and not `truncated`.

So an episode that runs out of time is truncated, not terminated, even though the env says
`done`. Spaces may be any duck-typed objects (`jaxrunner.envs.spaces.to_gymnax`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner.envs.adapters.base import SuiteAdapter, SuiteState, first_state, next_state
from jaxrunner.envs.spaces import to_gymnax

_NEEDED = ("reset_env", "step_env", "observation_space", "action_space")


def is_legacy_gymnax_env(env: Any) -> bool:
    """Whether `env` is a gymnax-style env whose public `step` returns the pre-1.0 5-tuple.

    An instance of the installed gymnax `Environment` keeps gymnax 1.0's `step()` and is not
    legacy. Other objects with `reset_env`/`step_env` are traced once (`jax.eval_shape`, no
    computation) to count what `step` returns.
    """
    from gymnax.environments.environment import Environment

    if isinstance(env, Environment) or isinstance(env, type):
        return False
    if not all(hasattr(env, name) for name in ("reset", "step", *_NEEDED)):
        return False
    try:
        params = getattr(env, "default_params", None)
        key = jax.random.key(0)
        _, state = jax.eval_shape(env.reset, key, params)
        space = to_gymnax(env.action_space(params), what="action space")
        action = jax.ShapeDtypeStruct(tuple(space.shape), space.dtype)
        out = jax.eval_shape(env.step, key, state, action, params)
    except Exception:  # noqa: BLE001 - not traceable as a gymnax-style env: not legacy
        return False
    return isinstance(out, tuple) and len(out) == 5


class LegacyGymnaxEnv(SuiteAdapter):
    """Adapts a pre-1.0 gymnax-style env to gymnax 1.0's protocol.

    Args:
        env: the env object (`reset_env`, `step_env`, `observation_space(params)`,
            `action_space(params)`, optionally `default_params`).
        params: its params pytree (default: `env.default_params`).
        time_field: the state field counting steps in the episode ("time").
        limit_field: the params field with the episode's step limit
            ("max_steps_in_episode").
        time_limit: a step limit to use when the params have no `limit_field`.
        env_id: the name to report (default: `env.name` or the class name).

    Observations, rewards and `done` are the env's own; `reward` is cast to float32.
    """

    suite = "gymnax-legacy"

    def __init__(self, env: Any, params: Any = None, *, time_field: str = "time",
                 limit_field: str = "max_steps_in_episode", time_limit: int | None = None,
                 env_id: str | None = None):
        missing = [name for name in _NEEDED if not hasattr(env, name)]
        if missing:
            raise TypeError(
                f"{type(env).__name__} has a pre-1.0 gymnax step API but no {missing}: the "
                "adapter needs step_env(key, state, action, params) without auto-reset and "
                "reset_env(key, params), so that every episode keeps its final observation "
                "and starts from a fresh reset. Add them (a gymnax 0.x base class has them)."
            )
        name = env_id or getattr(env, "name", None) or type(env).__name__
        super().__init__(env, str(name))
        self._params = params if params is not None else getattr(env, "default_params", None)
        self.time_field = time_field
        self.limit_field = limit_field
        self.time_limit = time_limit

    @property
    def default_params(self) -> Any:
        return self._params

    def observation_space(self, params: Any):
        return to_gymnax(self.inner.observation_space(params),
                         what=f"{self.env_id} observation space")

    def action_space(self, params: Any):
        return to_gymnax(self.inner.action_space(params), what=f"{self.env_id} action space")

    def _limit(self, params: Any) -> Any:
        limit = getattr(params, self.limit_field, None)
        return self.time_limit if limit is None else limit

    def _time(self, state: SuiteState, inner: Any) -> jax.Array:
        value = getattr(inner, self.time_field, None)
        return state.time + 1 if value is None else jnp.asarray(value)

    def reset_env(self, key: jax.Array, params: Any):
        obs, inner = self.inner.reset_env(key, params)
        return obs, first_state(inner)

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        obs, inner, reward, done, info = self.inner.step_env(key, state.inner, action, params)
        limit = self._limit(params)
        if limit is None:
            truncated = jnp.zeros((), jnp.bool_)
        else:
            truncated = self._time(state, inner) >= limit
        done = jnp.asarray(done).astype(jnp.bool_).reshape(())
        terminated = done & ~truncated
        return (obs, next_state(state, inner, truncated),
                jnp.asarray(reward, jnp.float32).reshape(()), terminated, dict(info))
