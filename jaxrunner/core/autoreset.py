"""Auto-reset inside the vector step: a finished sub-env starts its next episode in the same
step (its final observation goes to `info["final_observation"]`), in one of two modes.

* "gymnax": the env's own auto-resetting `step()`: every sub-env computes a reset every
  step and the reset is selected where the episode ended.
* "partial": the step is taken without resets; then only `R = ceil(B / ratio)` resets are
  computed and written into the sub-envs that finished (found with a fixed-size
  `nonzero`). When more than `R` sub-envs finish in the same step, that step falls back to
  resetting all `B` and selecting, so every episode still starts from its own fresh reset
  drawn with a fresh key: no two episodes share a start state, and the start-state
  distribution is the env's `reset_env` distribution, as in "gymnax". Only the keys
  differ, so the two modes give different (equally distributed) draws.

The layout says how its env steps (`EnvStepFns`); this module is the same for a gymnax env
and a multi-agent env.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrunner.core.faults import select_rows

AUTORESET_MODES = ("gymnax", "partial")


class EnvStepFns(NamedTuple):
    """One sub-env's step functions (unbatched; `autoreset.make_env_step` vmaps them).

    `auto_step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
    info)` resets in the step an episode ends. `step_no_reset` is the same transition
    without the reset (None: the env has no such split, "partial" is refused), `reset(key,
    params) -> (obs, state)`, and `episode_done(terminated, truncated) -> bool` says when
    the whole episode ended."""

    auto_step: Callable
    reset: Callable
    step_no_reset: Callable | None
    episode_done: Callable[[Any, Any], jax.Array]


def check_partial_autoreset_env(env: Any) -> None:
    """Raises ValueError unless `env` is a gymnax Environment using the base `step()`."""
    from gymnax.environments.environment import Environment

    if not isinstance(env, Environment) or type(env).step is not Environment.step:
        raise ValueError(
            f"autoreset_mode='partial' needs a gymnax Environment subclass that keeps the base "
            f"class's step() (it calls step_env/reset_env/is_truncated itself); "
            f"{type(env).__name__} does not. Use autoreset_mode='gymnax' for this env."
        )


def make_env_step(fns: EnvStepFns, num_envs: int, mode: str, partial_reset_ratio: int
                  ) -> Callable:
    """`env_step(key, states, actions, env_params) -> (obs, states, reward, terminated,
    truncated, info)` over the `B` sub-envs, with auto-reset in the same step (see the
    module docstring for the two modes)."""
    if mode not in AUTORESET_MODES:
        raise ValueError(f"autoreset_mode must be one of {AUTORESET_MODES}, got {mode!r}.")
    if mode == "gymnax":
        vmapped_step = jax.vmap(fns.auto_step, in_axes=(0, 0, 0, None))

        def env_step(key, states, actions, env_params):
            return vmapped_step(jax.random.split(key, num_envs), states, actions, env_params)

        return env_step
    if fns.step_no_reset is None:
        raise ValueError("autoreset_mode='partial' needs an env with a step without reset "
                         "(step_env) and reset_env; use autoreset_mode='gymnax' for this env.")
    resets_per_step = max(1, math.ceil(num_envs / partial_reset_ratio))
    step_no_reset = jax.vmap(fns.step_no_reset, in_axes=(0, 0, 0, None))
    reset = jax.vmap(fns.reset, in_axes=(0, None))
    episode_done = jax.vmap(fns.episode_done)

    def env_step(key, states, actions, env_params):
        step_key, reset_key = jax.random.split(key)
        obs, states, reward, terminated, truncated, info = step_no_reset(
            jax.random.split(step_key, num_envs), states, actions, env_params)
        done = episode_done(terminated, truncated)

        def few(args):
            step_obs, step_states = args
            index = jnp.nonzero(done, size=resets_per_step, fill_value=num_envs)[0]
            new_obs, new_states = reset(jax.random.split(reset_key, resets_per_step),
                                        env_params)
            put = lambda cur, new: cur.at[index].set(new, mode="drop")  # noqa: E731
            return (jax.tree.map(put, step_obs, new_obs),
                    jax.tree.map(put, step_states, new_states))

        def every(args):
            step_obs, step_states = args
            new_obs, new_states = reset(jax.random.split(reset_key, num_envs), env_params)
            return select_rows(done, new_obs, step_obs), select_rows(done, new_states,
                                                                     step_states)

        next_obs, next_states = jax.lax.cond(
            jnp.sum(done.astype(jnp.int32)) <= resets_per_step, few, every, (obs, states))
        info = {**info, "final_observation": obs}
        return next_obs, next_states, reward, terminated, truncated, info

    return env_step


def gymnax_step_fns(env: Any) -> EnvStepFns:
    """`EnvStepFns` of a gymnax-style env (`step`, `reset`; `step_env`, `reset_env` and
    `is_truncated` of a gymnax `Environment` for "partial")."""
    def step_without_reset(key, state, action, params):
        obs, state, reward, terminated, info = env.step_env(key, state, action, params)
        return obs, state, reward, terminated, env.is_truncated(state, params), info

    has_split = hasattr(env, "step_env") and hasattr(env, "is_truncated")
    return EnvStepFns(auto_step=env.step, reset=getattr(env, "reset_env", env.reset),
                      step_no_reset=step_without_reset if has_split else None,
                      episode_done=lambda terminated, truncated: jnp.logical_or(terminated,
                                                                                truncated))


__all__ = ["AUTORESET_MODES", "EnvStepFns", "check_partial_autoreset_env",
           "gymnax_step_fns", "make_env_step"]
