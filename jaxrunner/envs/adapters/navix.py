"""Navix (`pip install navix`): `"navix/<id>"`, or a Navix env object.

Navix envs have `reset(key) -> Timestep` and `step(timestep, action) -> Timestep`; the
Timestep says how the step ended (`is_termination()`: the goal or lava; `is_truncation()`:
`t >= max_steps`). Their spaces are attributes (`env.observation_space`), not methods, and
Navix's own `Discrete` with a shape describes categorical observation grids; both become
gymnax spaces (`Box(0, n - 1, shape, uint8)` for the grid, `Discrete(n)` for actions).

Navix's `step` resets an episode itself when it is given a finished Timestep, from the key
stored in its state; the adapter never gives it one (gymnax's base `step()` resets first,
with a fresh key), so every episode starts from its own random reset and keeps its final
observation. The adapter therefore steps with Navix's transition, `Environment._step`,
where the env has it: `step` wraps it in a `lax.cond` on the step type, and under `vmap`
that cond computes both branches, so every vector step would pay for a second reset (one
more besides gymnax's) that is never taken.

Navix's `reset(key)` also rebuilds its `RenderingCache` (the rendered background of the
base map) at every reset unless it is given one, and under gymnax's auto-reset a reset is
computed at every vector step: that doubled the cost of a step of a small grid. When the
cache does not depend on the reset key (a fixed base map, as in Empty-5x5; checked on the
traced program), the adapter computes it once (`NavixEnv.rendering_cache`) and passes it to
every reset, so each reset returns exactly what it would have built. Envs whose base map is
random (DoorKey's wall, ...) keep rebuilding it, so their pixels always show the new map.

A fixed cache is also kept out of the state the runner carries: it is most of a Navix
state's bytes (Empty-5x5: 4,992 of the cache's bytes against 75 of the observation's), and
a carried copy is read and written at every vector step (the auto-reset's select between
the stepped and the reset state, the scan's carry) though it never changes. The state's
`inner.state.cache` is None then; the adapter puts the constant back before each Navix
transition, so the transition and its observation are exactly Navix's own.

The Timestep's `info` accumulators (Navix's running return) are dropped from the state:
they would change the state's structure between reset and step.

`env_config` goes to `navix.make(id, **env_config)` (e.g. `{"max_steps": 50}`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner.core.dependence import outputs_depend_on
from jaxrunner.envs.adapters.base import (SuiteAdapter, SuiteState, construct, first_state,
                                          next_state, split_done)
from jaxrunner.envs.spaces import to_gymnax


class NavixEnv(SuiteAdapter):
    """A Navix env object (`navix.make(id)`).

    Args:
        env: the Navix `Environment`.
        env_id: the id to report (default: the class name).

    The state's `inner` is the Navix `Timestep` (with an empty `info`, and without its
    rendering cache when that is fixed: `rendering_cache` holds it then, else None).
    """

    suite = "navix"

    def __init__(self, env: Any, env_id: str | None = None):
        super().__init__(env, env_id)
        self.set_spaces(
            to_gymnax(env.observation_space, what=f"{self.name} observation_space"),
            to_gymnax(env.action_space, what=f"{self.name} action_space"))
        # Navix's step without its own auto-reset (see the module docstring); an env
        # without `_step` is stepped through `step`, which never resets here either.
        self._transition = getattr(env, "_step", None) or env.step
        self.rendering_cache = fixed_rendering_cache(env)

    def reset_env(self, key: jax.Array, params: Any):
        del params
        cache = () if self.rendering_cache is None else (self.rendering_cache,)
        timestep = self.inner.reset(key, *cache).replace(info={})
        return timestep.observation, first_state(self._carried(timestep))

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        del key, params
        timestep = self._transition(self._with_cache(state.inner), jnp.asarray(action))
        timestep = timestep.replace(info={})
        terminated, truncated = split_done(timestep.is_termination(), timestep.is_truncation())
        return (timestep.observation, next_state(state, self._carried(timestep), truncated),
                jnp.asarray(timestep.reward, jnp.float32).reshape(()), terminated, {})

    def _carried(self, timestep: Any) -> Any:
        """`timestep` as the state carries it: without a fixed rendering cache."""
        return self._set_cache(timestep, None)

    def _with_cache(self, timestep: Any) -> Any:
        """A carried `timestep` as Navix steps it: with its fixed rendering cache."""
        return self._set_cache(timestep, self.rendering_cache)

    def _set_cache(self, timestep: Any, cache: Any) -> Any:
        if self.rendering_cache is None:  # a random base map: its cache stays in the state
            return timestep
        return timestep.replace(state=timestep.state.replace(cache=cache))


def fixed_rendering_cache(env: Any) -> Any:
    """The `RenderingCache` a reset of Navix `env` builds, when it does not depend on the
    reset key (computed once, as concrete arrays); None when it does, or when the env's
    state has no cache."""
    def cache_of(key):
        return env.reset(key).state.cache

    key = jax.random.key(0)
    try:
        traced = jax.make_jaxpr(cache_of)(key)
    except AttributeError:  # a Navix version whose state has no rendering cache
        return None
    if outputs_depend_on(traced.jaxpr, traced.jaxpr.invars):
        return None
    return jax.jit(cache_of)(key)


def make(env_id: str, env_config: dict) -> tuple[NavixEnv, Any]:
    """`"navix/<env_id>"`: `NavixEnv(navix.make(env_id, **env_config))`."""
    import navix

    inner = construct(navix.make, "navix.make", env_id, env_config)
    env = NavixEnv(inner, env_id)
    return env, env.default_params


def env_ids() -> list[str]:
    """Every id in Navix's registry."""
    import navix

    return sorted(navix.registry())
