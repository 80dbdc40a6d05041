"""gymnax <-> gymnasium spaces, and the few space facts the rollout needs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gx


def _bound(value: Any, shape: tuple, dtype) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()


def to_gymnasium(space: Any) -> gym.spaces.Space:
    """Converts a gymnax space (Discrete, Box, Dict, Tuple) to the gymnasium one."""
    if isinstance(space, gym.spaces.Space):
        return space
    if isinstance(space, gx.Discrete):
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, gx.Box):
        dtype = np.dtype(space.dtype)
        shape = tuple(space.shape)
        return gym.spaces.Box(low=_bound(space.low, shape, dtype),
                              high=_bound(space.high, shape, dtype), shape=shape, dtype=dtype)
    if isinstance(space, gx.Dict):
        return gym.spaces.Dict({k: to_gymnasium(s) for k, s in space.spaces.items()})
    if isinstance(space, gx.Tuple):
        return gym.spaces.Tuple(tuple(to_gymnasium(s) for s in space.spaces))
    raise TypeError(
        f"Unsupported space {space!r}: jaxrunner handles gymnax Discrete, Box, Dict and "
        "Tuple spaces."
    )


def batched_space(space: gym.spaces.Space, num_envs: int) -> gym.spaces.Space:
    """The vector-env space of `num_envs` copies (gymnasium's batching rules)."""
    from gymnasium.vector.utils import batch_space

    return batch_space(space, num_envs)


def action_dtype(space: Any):
    """The dtype actions of `space` (gymnax or gymnasium) are sent to the env in."""
    if isinstance(space, (gx.Discrete, gx.Box)):
        return jnp.dtype(space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return jnp.dtype(jnp.int32)
    if isinstance(space, gym.spaces.Box):
        return jnp.dtype(jnp.float32) if np.issubdtype(space.dtype, np.floating) else jnp.dtype(
            jnp.int32)
    raise TypeError(
        f"Unsupported action space {space!r}: jaxrunner acts in Discrete, MultiDiscrete and "
        "Box spaces."
    )
