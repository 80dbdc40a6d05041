"""gymnax <-> gymnasium spaces, duck-typed spaces, and the few space facts the rollout needs.

The env protocol speaks gymnax spaces (`Discrete`, `Box`, `Dict`, `Tuple`) plus this
module's `MultiDiscrete` (gymnax has none; Jumanji and others act in one). Other suites'
space objects are converted by `to_gymnax`, which reads them by their attributes rather than
their class ("duck typing"), so any object with gymnax's, gymnasium's or dm_env's space
attributes works:

| the object has | becomes |
|---|---|
| `spaces` (a dict, or a tuple/list) | `Dict` / `Tuple` of the converted parts |
| `num_values` (dm_env / Jumanji `DiscreteArray`, `MultiDiscreteArray`) | `Discrete(num_values)` for shape `()`; `MultiDiscrete(num_values)` otherwise |
| `nvec` (gymnasium `MultiDiscrete`) | `MultiDiscrete(nvec)` |
| `n` with shape `()` (gymnax, gymnasium, Craftax, Navix `Discrete`) | `Discrete(n)` |
| `n` with a non-empty shape (Navix's categorical observations) | `Box(0, n - 1, shape, dtype)` |
| `low`/`high` (gymnax, gymnasium, Craftax `Box`) | `Box(low, high, shape, dtype)` |
| `minimum`/`maximum` (dm_env / Jumanji `BoundedArray`, Navix `Continuous`) | `Box(minimum, maximum, shape, dtype)` |
| only `shape`/`dtype` (dm_env `Array`) | `Box` over the dtype's whole range |
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gx


class MultiDiscrete(gx.Space):
    """A vector of independent discrete choices: action `i` lies in `[0, nvec[i])`.

    Args:
        nvec: `(K,)` ints, the number of values of each component.
        dtype: the action dtype (int32).

    Samples and actions have shape `(K,)` and dtype int32.
    """

    def __init__(self, nvec: Any, dtype: Any = jnp.int32):
        nvec = np.asarray(nvec, np.int64).reshape(-1)
        if nvec.size == 0 or np.any(nvec < 1):
            raise ValueError(f"MultiDiscrete needs at least one component and every count "
                             f">= 1, got nvec={nvec.tolist()}.")
        self.nvec = nvec
        self.shape = (int(nvec.size),)
        self.dtype = jnp.dtype(dtype)

    def __repr__(self) -> str:
        return f"MultiDiscrete({self.nvec.tolist()})"

    def sample(self, key: jax.Array) -> jax.Array:
        """`(K,)` int32, each component uniform over its values."""
        return jax.random.randint(key, self.shape, 0, jnp.asarray(self.nvec, jnp.int32),
                                  dtype=self.dtype)

    def contains(self, x: jax.Array) -> jax.Array:
        """`()` bool: whether every component of `x` is in range."""
        x = jnp.asarray(x)
        return jnp.all((x >= 0) & (x < jnp.asarray(self.nvec, jnp.int32)))


def _bound(value: Any, shape: tuple, dtype) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()


def _shape_of(space: Any) -> tuple:
    shape = getattr(space, "shape", ())
    return () if shape is None else tuple(int(d) for d in shape)


def _dtype_range(dtype) -> tuple[Any, Any]:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return False, True
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.min, info.max
    return -np.inf, np.inf


def to_gymnax(space: Any, *, what: str = "space") -> Any:
    """Converts a space of any suite (see the module docstring) to a gymnax space.

    Args:
        space: a gymnax, gymnasium, dm_env/Jumanji spec, Craftax, Navix or other
            duck-typed space; a dict or tuple of them.
        what: how error messages name the space (e.g. "Jumanji Snake-v1 observation_spec").

    Returns:
        a gymnax `Discrete`, `Box`, `Dict` or `Tuple`, or this module's `MultiDiscrete`.

    Raises:
        TypeError: the object has none of the attributes that identify a space.
    """
    if isinstance(space, (gx.Discrete, gx.Box, gx.Dict, gx.Tuple, MultiDiscrete)):
        return space
    if isinstance(space, dict):
        return gx.Dict({str(k): to_gymnax(s, what=f"{what}[{k!r}]") for k, s in space.items()})
    if isinstance(space, (tuple, list)):
        return gx.Tuple([to_gymnax(s, what=f"{what}[{i}]") for i, s in enumerate(space)])
    parts = getattr(space, "spaces", None)
    if isinstance(parts, dict) or isinstance(parts, (tuple, list)):
        return to_gymnax(dict(parts) if isinstance(parts, dict) else list(parts), what=what)
    shape = _shape_of(space)
    num_values = getattr(space, "num_values", None)
    if num_values is not None:
        values = np.asarray(num_values)
        if shape == () and values.ndim == 0:
            return gx.Discrete(int(values))
        if len(shape) == 1:
            return MultiDiscrete(np.broadcast_to(values, shape))
        low = getattr(space, "minimum", 0)
        return gx.Box(_bound(low, shape, np.int32), _bound(values - 1, shape, np.int32),
                      shape, jnp.int32)
    nvec = getattr(space, "nvec", None)
    if nvec is not None:
        return MultiDiscrete(nvec)
    n = getattr(space, "n", None)
    if n is not None and not callable(n):
        if shape == ():
            return gx.Discrete(int(n))
        dtype = np.dtype(getattr(space, "dtype", np.int32))
        return gx.Box(_bound(0, shape, dtype), _bound(int(n) - 1, shape, dtype), shape, dtype)
    for low_name, high_name in (("low", "high"), ("minimum", "maximum")):
        if hasattr(space, low_name) and hasattr(space, high_name):
            dtype = np.dtype(getattr(space, "dtype", np.float32))
            return gx.Box(_bound(getattr(space, low_name), shape, dtype),
                          _bound(getattr(space, high_name), shape, dtype), shape, dtype)
    if hasattr(space, "shape") and hasattr(space, "dtype"):
        dtype = np.dtype(space.dtype)
        low, high = _dtype_range(dtype)
        return gx.Box(_bound(low, shape, dtype), _bound(high, shape, dtype), shape, dtype)
    raise TypeError(
        f"Unsupported {what} {space!r} ({type(space).__name__}): jaxrunner reads a space by "
        "its attributes and found none it knows. Give it `n` (discrete), `low`/`high`/"
        "`shape`/`dtype` (box), `nvec` or `num_values` (multi-discrete) or `spaces` (a dict "
        "or tuple of spaces), or return a gymnax space from the env's observation_space/"
        "action_space."
    )


def to_gymnasium(space: Any) -> gym.spaces.Space:
    """Converts a gymnax space (Discrete, Box, Dict, Tuple, `MultiDiscrete`) or any
    duck-typed space `to_gymnax` reads to the gymnasium one."""
    if isinstance(space, gym.spaces.Space):
        return space
    space = to_gymnax(space)
    if isinstance(space, gx.Discrete):
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, MultiDiscrete):
        return gym.spaces.MultiDiscrete(space.nvec.astype(np.int64))
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
        "Tuple spaces and jaxrunner.envs.spaces.MultiDiscrete."
    )


def batched_space(space: gym.spaces.Space, num_envs: int) -> gym.spaces.Space:
    """The vector-env space of `num_envs` copies (gymnasium's batching rules)."""
    from gymnasium.vector.utils import batch_space

    return batch_space(space, num_envs)


def action_dtype(space: Any):
    """The dtype actions of `space` (gymnax, gymnasium or duck-typed) are sent to the env in."""
    if isinstance(space, (gx.Discrete, gx.Box, MultiDiscrete)):
        return jnp.dtype(space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return jnp.dtype(jnp.int32)
    if isinstance(space, gym.spaces.Box):
        return jnp.dtype(jnp.float32) if np.issubdtype(space.dtype, np.floating) else jnp.dtype(
            jnp.int32)
    if not isinstance(space, gym.spaces.Space):
        try:
            converted = to_gymnax(space, what="action space")
        except TypeError:
            converted = None
        if isinstance(converted, (gx.Discrete, gx.Box, MultiDiscrete)):
            return action_dtype(converted)
    raise TypeError(
        f"Unsupported action space {space!r}: jaxrunner acts in Discrete, MultiDiscrete and "
        "Box spaces."
    )
