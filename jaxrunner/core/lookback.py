"""Lookback buffers: the last `L` steps of every sub-env (or of every agent of it), rolled
forward after each chunk so a cut episode's next chunk can show its lookback.

Shapes: `L` lookback length, `T` chunk length, `B` sub-envs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def roll_lookback(old: jax.Array, new: jax.Array, num_new: jax.Array) -> jax.Array:
    """Last `L` rows of `concat(old (L, ...), first num_new rows of new (T, ...))`: every
    sub-env took a step at each of the chunk's `num_new` steps (single-agent)."""
    length = old.shape[0]
    if length == 0:
        return old
    # Row i of the result is row `num_new - L + i` of concat(old, new), gathered without
    # materialising the concatenation (which would copy the whole chunk).
    index = num_new - length + jnp.arange(length, dtype=jnp.int32)
    from_new = jnp.take(new, jnp.clip(index, 0, new.shape[0] - 1), axis=0)
    from_old = jnp.take(old, jnp.clip(index + length, 0, length - 1), axis=0)
    pick_new = (index >= 0).reshape((length,) + (1,) * (old.ndim - 1))
    return jnp.where(pick_new, from_new, from_old)


def last_positions(mask: jax.Array, lookback_len: int) -> jax.Array:
    """`(L, B)` int32 positions in `concat(old (L), new (T))` of the last `L` entries per
    sub-env, where every old entry counts and new entry `t` counts if `mask[t]` (`(T, B)`
    bool): the steps an agent completed (multi-agent)."""
    num_envs = mask.shape[1]
    flags = jnp.concatenate([jnp.ones((lookback_len, num_envs), jnp.int32),
                             mask.astype(jnp.int32)], axis=0)
    cumulative = jnp.cumsum(flags, axis=0)  # (L + T, B)
    total = cumulative[-1]
    rank = total[None, :] - lookback_len + 1 + jnp.arange(lookback_len)[:, None]
    return jax.vmap(lambda c, r: jnp.searchsorted(c, r, side="left"), in_axes=(1, 1),
                    out_axes=1)(cumulative, rank).astype(jnp.int32)


def gather_last(old: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """`old` (L, B, ...) / `new` (T, B, ...) entries at `positions` (L, B) of
    `last_positions`."""
    lookback_len, chunk_len = old.shape[0], new.shape[0]
    rest = old.shape[2:]
    expand = lambda idx: jnp.broadcast_to(  # noqa: E731
        idx.reshape(idx.shape + (1,) * len(rest)), idx.shape + rest)
    from_old = jnp.take_along_axis(old, expand(jnp.clip(positions, 0, lookback_len - 1)),
                                   axis=0)
    from_new = jnp.take_along_axis(new, expand(jnp.clip(positions - lookback_len, 0,
                                                        chunk_len - 1)), axis=0)
    return jnp.where(expand(positions < lookback_len), from_old, from_new)


def zeros_like_steps(record_shape, lookback_len: int):
    """`(L, ...)` zero buffers for a pytree of per-step `ShapeDtypeStruct`s."""
    return jax.tree.map(lambda s: jnp.zeros((lookback_len,) + tuple(s.shape), s.dtype),
                        record_shape)


__all__ = ["gather_last", "last_positions", "roll_lookback", "zeros_like_steps"]
