"""Brax (`pip install brax`): `"brax/<name>"`, or a Brax env object.

Brax envs have `reset(rng) -> State` and `step(state, action) -> State` with
`State(pipeline_state, obs, reward, done, metrics, info)`, `observation_size`,
`action_size` and actions in [-1, 1]. A bare Brax env has no time limit and no auto-reset;
Brax's training wrappers add both (`EpisodeWrapper`: `info["truncation"]` when
`steps >= episode_length`; `AutoResetWrapper`: every episode restarts from the **first
state cached** at the start of training, and the final observation is lost).
`BraxEnv` does neither of those: it counts steps itself, and

* `terminated` = the env's `done` (the robot fell), `truncated` = `episode_length` steps
  reached without it — what `EpisodeWrapper`'s `info["truncation"]` says;
* every episode starts from a fresh `reset(rng)` with its own key (gymnax's base `step()`,
  or the runner's cheaper `autoreset_mode="partial"`), and keeps its final observation in
  `info["final_observation"]`;
* spaces: `Box(-inf, inf, (observation_size,), float32)` (a `Dict` of such boxes when
  `observation_size` is a dict of shapes, as in MuJoCo Playground),
  `Box(-1, 1, (action_size,), float32)`;
* `info["metrics"]` holds the State's `metrics`.

`env_config` goes to `brax.envs.get_environment(name, **env_config)` (e.g. `{"backend":
"positional"}`), except `episode_length` (default 1000), which is the adapter's time limit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gx

from jaxrunner.envs.adapters.base import (SuiteAdapter, SuiteState, first_state, next_state,
                                          split_done)

DEFAULT_EPISODE_LENGTH = 1000


def _box(shape: Any, low: float, high: float) -> gx.Box:
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
    return gx.Box(np.full(shape, low, np.float32), np.full(shape, high, np.float32), shape,
                  jnp.float32)


def observation_space_of(size: Any) -> Any:
    """gymnax space of an `observation_size`: an int or shape -> Box; a dict -> Dict."""
    if isinstance(size, dict) or hasattr(size, "items"):
        return gx.Dict({str(k): _box(v, -np.inf, np.inf) for k, v in size.items()})
    return _box(size, -np.inf, np.inf)


class BraxEnv(SuiteAdapter):
    """A Brax (or Brax-style MJX) env object.

    Args:
        env: the env (`reset(rng) -> State`, `step(state, action) -> State`,
            `observation_size`, `action_size`). Give the bare env, not one wrapped in Brax's
            `EpisodeWrapper`/`AutoResetWrapper`: the adapter does their job.
        episode_length: steps after which an episode is truncated.
        env_id: the name to report (default: the class name).

    The state's `inner` is the env's `State`.
    """

    suite = "brax"

    def __init__(self, env: Any, episode_length: int = DEFAULT_EPISODE_LENGTH,
                 env_id: str | None = None):
        if type(env).__name__ in ("AutoResetWrapper", "BraxAutoResetWrapper",
                                  "EpisodeWrapper", "VmapWrapper"):
            raise ValueError(
                f"{type(env).__name__} wraps the env given to the {self.suite} adapter: give "
                "the bare env (e.g. brax.envs.get_environment(name), not envs.create(...) or "
                "a training wrapper). The adapter counts steps and resets itself, with a "
                "fresh random reset per episode."
            )
        if int(episode_length) < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}.")
        super().__init__(env, env_id)
        self.episode_length = int(episode_length)
        self.set_spaces(observation_space_of(env.observation_size),
                        _box(env.action_size, -1.0, 1.0))

    def reset_env(self, key: jax.Array, params: Any):
        del params
        inner = self.inner.reset(key)
        return inner.obs, first_state(inner)

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        del key, params
        inner = self.inner.step(state.inner, action)
        time_up = state.time + 1 >= self.episode_length
        terminated, truncated = split_done(inner.done > 0.5, time_up)
        info = {"metrics": dict(inner.metrics)}
        return (inner.obs, next_state(state, inner, truncated),
                jnp.asarray(inner.reward, jnp.float32).reshape(()), terminated, info)


def make(env_id: str, env_config: dict) -> tuple[BraxEnv, Any]:
    """`"brax/<env_id>"`: `BraxEnv(brax.envs.get_environment(env_id, **env_config))`."""
    from brax import envs

    config = dict(env_config)
    episode_length = config.pop("episode_length", DEFAULT_EPISODE_LENGTH)
    try:
        inner = envs.get_environment(env_id, **config)
    except TypeError as error:
        raise ValueError(f"brax.envs.get_environment({env_id!r}) rejected env_config "
                         f"{config!r}: {error}. Pass only keyword arguments its constructor "
                         "takes (and episode_length).") from error
    env = BraxEnv(inner, episode_length=episode_length, env_id=env_id)
    return env, env.default_params


def env_ids() -> list[str]:
    """Every name in Brax's env registry."""
    from brax import envs

    return sorted(envs._envs)  # noqa: SLF001 - Brax lists its registry nowhere else
