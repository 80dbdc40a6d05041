"""Module-to-env action transforms (pure): RLlib's `NormalizeAndClipActions`.

The episode records the action the module sampled; the env receives the transformed one.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np


def make_actions_for_env(action_space: gym.spaces.Space, *, normalize_actions: bool,
                         clip_actions: bool, env_dtype) -> Callable[[jax.Array], jax.Array]:
    """Returns `f(actions (B, *act_shape)) -> actions for the env (B, *act_shape)`.

    For a bounded Box space: with `normalize_actions`, actions are taken as lying in
    [-1, 1] and mapped to [low, high] (then clipped to the bounds, as RLlib's
    `unsquash_action`); else with `clip_actions`, they are clipped to [low, high]. Discrete
    actions pass through. The result is cast to the env's action dtype.
    """
    if isinstance(action_space, gym.spaces.Box) and np.issubdtype(action_space.dtype,
                                                                  np.floating):
        low = jnp.asarray(action_space.low, jnp.float32)
        high = jnp.asarray(action_space.high, jnp.float32)
        bounded = bool(np.all(np.isfinite(action_space.low))
                       and np.all(np.isfinite(action_space.high)))
        if normalize_actions and bounded:
            def transform(actions):
                scaled = low + (actions + 1.0) * (high - low) / 2.0
                return jnp.clip(scaled, low, high).astype(env_dtype)
            return transform
        if clip_actions:
            return lambda actions: jnp.clip(actions, low, high).astype(env_dtype)
    return lambda actions: actions.astype(env_dtype)
