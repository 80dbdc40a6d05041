"""MuJoCo Playground (`pip install playground`): `"playground/<name>"`, or a Playground env.

Playground envs (`mujoco_playground.registry.load(name)`: the DM Control suite, locomotion,
manipulation) are Brax-style MJX envs: `reset(rng) -> State`, `step(state, action) ->
State` with `State(data, obs, reward, done, metrics, info)`, `observation_size` (an int, or
a dict of shapes for dict observations) and `action_size`. Playground's own training
wrapper (`BraxAutoResetWrapper`) restarts every episode from a cached first state and drops
the final observation (Playground #169/#179/#305). `PlaygroundEnv` is `BraxEnv` with
Playground's episode length (`config.episode_length`, 1000 by default): a fresh random
reset per episode, the final observation kept, `truncated` at the time limit apart from
`terminated` (the env's `done`).

`env_config` is Playground's `config_overrides` (e.g. `{"episode_length": 200, "impl":
"jax"}`). The locomotion and manipulation envs load robot models from MuJoCo Menagerie,
which Playground downloads the first time; the DM Control suite ships with the package.
"""

from __future__ import annotations

from typing import Any

from jaxrunner.envs.adapters.brax import DEFAULT_EPISODE_LENGTH, BraxEnv


def _episode_length(env: Any) -> int:
    config = getattr(env, "_config", None)
    value = None if config is None else config.get("episode_length", None)
    return DEFAULT_EPISODE_LENGTH if value is None else int(value)


class PlaygroundEnv(BraxEnv):
    """A MuJoCo Playground env object.

    Args:
        env: the Playground `MjxEnv` (bare, not wrapped for training).
        episode_length: steps after which an episode is truncated (default: the env's
            `config.episode_length`).
        env_id: the name to report (default: the class name).
    """

    suite = "playground"

    def __init__(self, env: Any, episode_length: int | None = None,
                 env_id: str | None = None):
        super().__init__(env, _episode_length(env) if episode_length is None
                         else episode_length, env_id)


def make(env_id: str, env_config: dict) -> tuple[PlaygroundEnv, Any]:
    """`"playground/<env_id>"`: `registry.load(env_id, config_overrides=env_config)`."""
    from mujoco_playground import registry

    try:
        inner = registry.load(env_id, config_overrides=dict(env_config) or None)
    except (KeyError, AttributeError, TypeError) as error:
        raise ValueError(f"mujoco_playground.registry.load({env_id!r}) rejected "
                         f"config_overrides {env_config!r}: {error}. Pass keys of "
                         f"registry.get_default_config({env_id!r}).") from error
    env = PlaygroundEnv(inner, env_id=env_id)
    return env, env.default_params


def env_ids() -> list[str]:
    """Every name in Playground's registry."""
    from mujoco_playground import registry

    return list(registry.ALL_ENVS)
