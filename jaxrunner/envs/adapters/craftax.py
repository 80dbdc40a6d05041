"""Craftax (`pip install craftax`): `"craftax/<id>"`, or a Craftax env object.

Craftax envs are gymnax-style but on Craftax's own base class, with gymnax's **pre-1.0**
step API (`(obs, state, reward, done, info)`; `done` includes the time limit) and its own
`spaces.Box/Discrete`. `CraftaxEnv` is `LegacyGymnaxEnv` with Craftax's time fields:
`truncated` = `state.timestep >= params.max_timesteps`, `terminated` = the agent died (or
won) before that. Each episode starts from a fresh random world (`reset_env` with a new key)
and keeps its final observation.

Observations: Symbolic ids a flat float32 vector (`(1345,)` for
Craftax-Classic-Symbolic-v1); Pixels ids float32 images `(H, W, 3)`. Actions: Discrete(43)
(Craftax) or Discrete(17) (Classic). `env_config` keys are fields of the env's `EnvParams`
(e.g. `{"max_timesteps": 1000}`).
"""

from __future__ import annotations

from typing import Any

from jaxrunner.envs.adapters.base import replace_fields
from jaxrunner.envs.adapters.gymnax_legacy import LegacyGymnaxEnv

CRAFTAX_IDS = ("Craftax-Symbolic-v1", "Craftax-Pixels-v1", "Craftax-Classic-Symbolic-v1",
               "Craftax-Classic-Pixels-v1")


class CraftaxEnv(LegacyGymnaxEnv):
    """A Craftax env object (from `craftax.craftax_env.make_craftax_env_from_name`).

    Args:
        env: the Craftax env (auto-reset or not: its `step_env` is used either way).
        params: its `EnvParams` (default: `env.default_params`).
        env_id: the name to report.
    """

    suite = "craftax"

    def __init__(self, env: Any, params: Any = None, env_id: str | None = None):
        super().__init__(env, params, time_field="timestep", limit_field="max_timesteps",
                         env_id=env_id or type(env).__name__)


def make(env_id: str, env_config: dict) -> tuple[CraftaxEnv, Any]:
    """`"craftax/<env_id>"`: the adapted env and its params (`env_config` set on them)."""
    from craftax.craftax_env import make_craftax_env_from_name

    if env_id not in CRAFTAX_IDS:
        raise ValueError(f"Unknown Craftax id {env_id!r}; Craftax has {list(CRAFTAX_IDS)}.")
    inner = make_craftax_env_from_name(env_id, auto_reset=False)
    params = replace_fields(inner.default_params, dict(env_config),
                            f"{env_id}'s EnvParams")
    env = CraftaxEnv(inner, params, env_id=env_id)
    return env, params


def env_ids() -> list[str]:
    """Every Craftax id `make` accepts."""
    return list(CRAFTAX_IDS)
