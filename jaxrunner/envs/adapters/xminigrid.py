"""XLand-MiniGrid (`pip install xminigrid`): `"xminigrid/<id>"`, or an xminigrid env object.

xminigrid envs are `(env, params)` pairs with dm_env-style TimeSteps:
`reset(params, key) -> TimeStep`, `step(params, timestep, action) -> TimeStep`
(`step_type`, `reward`, `discount`, `observation`, `state`). `XMiniGridEnv` maps them to the
env protocol: at `step_type == LAST`, `discount == 0` is a termination (the goal reached),
`discount > 0` a truncation (`params.max_steps`). Observations are the agent's view,
`(view_size, view_size, 2)` uint8 (tile id, colour id), as a `Box` bounded by xminigrid's
tile and colour counts; actions `Discrete(env.num_actions(params))`.

`env_config` keys are fields of the env's `EnvParams` (`xminigrid.make(id, **env_config)`,
e.g. `{"max_steps": 50, "view_size": 5}`). The `XLand-MiniGrid-R*` ids need a ruleset in
their params (`params.replace(ruleset=...)` from `xminigrid.load_benchmark`, which
downloads the benchmark): pass such params with the env object through a creator.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gx

from jaxrunner.envs.adapters.base import (SuiteAdapter, SuiteState, first_state, next_state,
                                          split_done)

_LAST = 2  # xminigrid.types.StepType.LAST


class XMiniGridEnv(SuiteAdapter):
    """An xminigrid env object with its params (`env, params = xminigrid.make(id)`).

    Args:
        env: the xminigrid `Environment`.
        params: its `EnvParams` (default: `env.default_params()`).
        env_id: the id to report (default: the class name).

    The state's `inner` is the xminigrid `TimeStep`.
    """

    suite = "xminigrid"

    def __init__(self, env: Any, params: Any = None, env_id: str | None = None):
        super().__init__(env, env_id)
        self._params = params if params is not None else env.default_params()

    @property
    def default_params(self) -> Any:
        return self._params

    def observation_space(self, params: Any):
        from xminigrid.core.constants import NUM_COLORS, NUM_TILES

        shape = tuple(int(d) for d in self.inner.observation_shape(params))
        high = np.broadcast_to(np.array([NUM_TILES - 1, NUM_COLORS - 1], np.uint8),
                               shape).copy()
        return gx.Box(np.zeros(shape, np.uint8), high, shape, jnp.uint8)

    def action_space(self, params: Any):
        return gx.Discrete(int(self.inner.num_actions(params)))

    def reset_env(self, key: jax.Array, params: Any):
        timestep = self.inner.reset(params, key)
        return timestep.observation, first_state(timestep)

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        del key
        timestep = self.inner.step(params, state.inner, action)
        last = timestep.step_type == _LAST
        terminated, truncated = split_done(last & (timestep.discount == 0),
                                           last & (timestep.discount > 0))
        return (timestep.observation, next_state(state, timestep, truncated),
                jnp.asarray(timestep.reward, jnp.float32).reshape(()), terminated, {})


def make(env_id: str, env_config: dict) -> tuple[XMiniGridEnv, Any]:
    """`"xminigrid/<env_id>"`: the adapted env and its params (`env_config` set on them)."""
    import xminigrid

    try:
        inner, params = xminigrid.make(env_id, **env_config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"xminigrid.make({env_id!r}) rejected env_config {env_config!r}: "
                         f"{error}. Pass only fields of the env's EnvParams.") from error
    return XMiniGridEnv(inner, params, env_id), params


def env_ids() -> list[str]:
    """Every id in xminigrid's registry."""
    import xminigrid

    return list(xminigrid.registered_environments())
