"""Final observations stored only where they are not the next step's observation.

A sub-env's final observation at step `t` (the next observation before any auto-reset) is
the observation its next action is taken on, `obs[t + 1]`, unless its episode ended at `t`
(then the env auto-reset and `obs[t + 1]` is the new episode's first observation) or `t`
is the chunk's last taken step (then `obs[t + 1]` is not in the chunk). A chunk therefore
stores the final observations of exactly those steps, in a fixed-size `FinalObsStore` of
`(flat position, observation)` rows, instead of a second `(T, B, *obs_shape)` array:

* `slots` rows for the episode ends, written inside the scan. The chunk stops before a
  step whose ends might not fit (`count + B > slots`); the runner then runs another chunk
  from where it stopped, so no final observation is ever dropped, only the chunk is
  shorter (`ChunkInfo.num_steps`). `slots = B * per_env` with `per_env` from
  `final_obs_slots_per_env` (config; "auto": `ceil(T / 8) + 1`, so a chunk stops early
  only after more than one episode end per 8 steps of every sub-env on average; chunks
  of at most 16 steps get `T`, never stop early and cost as little as a dense record);
* `B` tail rows: the chunk's last taken step for the sub-envs whose episode did not end
  there.

`dense_final_obs` rebuilds the `(T, B, *obs_shape)` array bit for bit (taken steps:
`obs[t + 1]` or the stored row; steps not taken: zeros), as `Trajectory.final_obs` does.
This relies on the env protocol of same-step auto-reset: at a step that ends no episode,
`info["final_observation"]` is the returned observation (gymnax, the partial auto-reset,
every adapter here).

Everything here is pure JAX (plus a numpy twin of `dense_final_obs` for host batches).
Shapes: `T` chunk length, `B` sub-envs, `S` stored rows.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

UNUSED = -1  # `FinalObsStore.index` of an empty row
AUTO_STEPS_PER_SLOT = 8  # "auto": one slot per sub-env for every 8 chunk steps (+ 1)
AUTO_DENSE_UP_TO = 16  # "auto": chunks this short store every step's row


@struct.dataclass
class FinalObsStore:
    """The final observations a chunk stores (see the module docstring).

    `index`: `(S,)` int32, flat position `t * B + b` of each row in its `(T, B)`
    trajectory, `UNUSED` (-1) for an empty row; `obs`: pytree like the observations,
    leaves `(S, *obs_shape)`, in the observation's dtype or a narrower integer dtype that
    holds every row exactly (`core.value_range.storage_dtypes`: MinAtar's float32 grids
    in uint8); `dense_final_obs` and the host episodes widen them back. Positions are
    unique."""

    index: jax.Array
    obs: Any


def slots_for(num_envs: int, chunk_len: int, per_env: int | str = "auto") -> int:
    """Episode-end rows of a chunk's store: `num_envs * per_env` ("auto": `ceil(chunk_len /
    8) + 1`, or `chunk_len` for chunks of at most 16 steps), at most `num_envs *
    chunk_len` (every sub-env ending at every step: the chunk never stops early) and at
    least `num_envs` (so a chunk always takes a step)."""
    if per_env == "auto":
        per_env = (chunk_len if chunk_len <= AUTO_DENSE_UP_TO
                   else math.ceil(chunk_len / AUTO_STEPS_PER_SLOT) + 1)
    return num_envs * max(1, min(int(per_env), chunk_len))


class StoreState(NamedTuple):
    """The store while the scan writes it."""

    t: jax.Array  # () int32: steps taken so far
    count: jax.Array  # () int32: episode-end rows written
    index: jax.Array  # (slots + B,) int32
    obs: Any  # leaves (slots + B, *obs_shape)
    # Optional values kept beside each episode-end row (e.g. device callbacks' metric
    # values of the episode ending there), leaves (slots, ...); None without.
    extra: Any = None


class EndRows(NamedTuple):
    """The episode-end rows of a chunk's store with their `extra` values: `index` `(S,)`
    int32 flat positions `t * B + b`, ascending over the used rows, `UNUSED` after them;
    `values` leaves `(S, ...)`."""

    index: jax.Array
    values: Any


class FinalObsWriter:
    """Writes a chunk's `FinalObsStore` inside the scan (used by `core.chunk`)."""

    def __init__(self, num_envs: int, slots: int):
        if slots < num_envs:
            raise ValueError(f"A final-observation store needs at least num_envs={num_envs} "
                             f"slots, got {slots}.")
        self.num_envs, self.slots = num_envs, slots

    def init(self, obs_shape: Any, extra_shape: Any = None) -> StoreState:
        """An empty store for observations shaped like `obs_shape` (`(B, ...)`
        `ShapeDtypeStruct`s) and, beside the episode-end rows, values shaped like
        `extra_shape` (`(B, ...)`, or None)."""
        rows = self.slots + self.num_envs
        zeros = lambda n: lambda s: jnp.zeros((n,) + tuple(s.shape[1:]), s.dtype)  # noqa: E731
        return StoreState(
            t=jnp.zeros((), jnp.int32), count=jnp.zeros((), jnp.int32),
            index=jnp.full((rows,), UNUSED, jnp.int32),
            obs=jax.tree.map(zeros(rows), obs_shape),
            extra=None if extra_shape is None else jax.tree.map(zeros(self.slots),
                                                                extra_shape))

    def room(self, state: StoreState, steps: int = 1) -> jax.Array:
        """() bool: the next `steps` steps' episode ends fit whatever they are."""
        return state.count <= self.slots - steps * self.num_envs

    def write(self, state: StoreState, ended: jax.Array, final_obs: Any,
              extra: Any = None) -> StoreState:
        """Appends the rows of the sub-envs whose episode `ended` (`(B,)` bool) at this
        step, with their `extra` values (`(B, ...)`) when the store keeps them."""
        ended = ended.astype(jnp.bool_)
        ends = ended.astype(jnp.int32)
        target = jnp.where(ended, state.count + jnp.cumsum(ends) - 1, self.slots)
        target = jnp.where(target < self.slots, target, self.slots + self.num_envs)  # drop
        position = state.t * self.num_envs + jnp.arange(self.num_envs, dtype=jnp.int32)
        index = state.index.at[target].set(position, mode="drop")
        put = lambda buf, x: buf.at[target].set(x.astype(buf.dtype), mode="drop")  # noqa: E731
        obs = jax.tree.map(put, state.obs, final_obs)
        kept = None if state.extra is None else jax.tree.map(put, state.extra, extra)
        return StoreState(t=state.t + 1, count=state.count + jnp.sum(ends), index=index,
                          obs=obs, extra=kept)

    def end_rows(self, state: StoreState) -> EndRows:
        """The episode-end rows written so far with their `extra` values."""
        return EndRows(index=state.index[:self.slots], values=state.extra)

    def finish(self, state: StoreState, last_ended: jax.Array, next_obs: Any
               ) -> FinalObsStore:
        """The store with its tail rows: the last taken step's final observation
        (`next_obs`, `(B, ...)`: the carry's observation after the chunk) for the sub-envs
        whose episode did not end there (`last_ended` `(B,)` bool)."""
        last = state.t - 1
        envs = jnp.arange(self.num_envs, dtype=jnp.int32)
        tail = jnp.where((last >= 0) & ~last_ended.astype(jnp.bool_),
                         last * self.num_envs + envs, UNUSED)
        index = jax.lax.dynamic_update_slice(state.index, tail.astype(jnp.int32),
                                             (self.slots,))
        obs = jax.tree.map(
            lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype),
                                                               self.slots, 0),
            state.obs, next_obs)
        return FinalObsStore(index=index, obs=obs)


def _is_host(tree: Any) -> bool:
    return any(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(tree))


def _dense_leaf(obs: Any, rows: Any, index: Any, valid: Any, xp) -> Any:
    num_steps, num_envs = obs.shape[:2]
    rest = obs.shape[2:]
    shifted = xp.concatenate([obs[1:], xp.zeros_like(obs[:1])], axis=0)
    shifted = xp.where(valid.reshape((num_steps,) + (1,) * (obs.ndim - 1)), shifted,
                       xp.zeros_like(shifted))
    flat = shifted.reshape((num_steps * num_envs,) + rest)
    if xp is np:
        used = index >= 0
        flat = flat.copy()
        flat[index[used]] = rows[used]
    else:
        target = jnp.where(index >= 0, index, num_steps * num_envs)
        flat = flat.at[target].set(rows.astype(flat.dtype), mode="drop")
    return flat.reshape(obs.shape)


def _dense(obs: Any, store: FinalObsStore, valid: Any, xp) -> Any:
    return jax.tree.map(lambda o, r: _dense_leaf(o, r, store.index, valid, xp), obs,
                        store.obs)


_dense_jit = jax.jit(lambda obs, store, valid: _dense(obs, store, valid, jnp))


def dense_final_obs(obs: Any, store: FinalObsStore, valid: Any) -> Any:
    """The `(T, B, *obs_shape)` final observations of a trajectory with observations `obs`
    (`(T, B, ...)`), `store` and `valid` (`(T,)` bool): numpy for host arrays, else jax
    (jitted once per shape; traced inline inside a jit)."""
    if _is_host((obs, store, valid)):
        return _dense(jax.tree.map(np.asarray, obs),
                      jax.tree.map(np.asarray, store), np.asarray(valid), np)
    if isinstance(valid, jax.core.Tracer):
        return _dense(obs, store, valid, jnp)
    return _dense_jit(obs, store, valid)


def store_from_dense(final_obs: Any, valid: Any) -> FinalObsStore:
    """A store holding every taken step's final observation (`final_obs` `(T, B, ...)`,
    `valid` `(T,)`): for host-stepped envs, whose rows are on the host anyway, and for
    trajectories joined along the sub-env axis. Fixed size `T * B`; numpy for host
    arrays, else jax."""
    xp = np if _is_host((final_obs, valid)) else jnp
    leaves = jax.tree.leaves(final_obs)
    num_steps, num_envs = leaves[0].shape[:2]
    flat = xp.arange(num_steps * num_envs, dtype=np.int32).reshape(num_steps, num_envs)
    index = xp.where(xp.asarray(valid)[:, None], flat, UNUSED).reshape(-1)
    return FinalObsStore(index=index, obs=jax.tree.map(
        lambda x: xp.asarray(x).reshape((num_steps * num_envs,) + x.shape[2:]), final_obs))


def join_stores(stores: list[FinalObsStore], chunk_lens: list[int], num_envs: int
                ) -> FinalObsStore:
    """The store of chunks joined along time (their positions shifted by the rows of the
    chunks before)."""
    xp = np if _is_host(stores) else jnp
    offsets = np.cumsum([0] + list(chunk_lens[:-1])) * num_envs
    index = xp.concatenate([
        xp.where(s.index >= 0, s.index + int(off), UNUSED) for s, off in zip(stores, offsets)])
    obs = jax.tree.map(lambda *xs: xp.concatenate(xs, axis=0), *[s.obs for s in stores])
    return FinalObsStore(index=index, obs=obs)


def join_stores_across_envs(stores: list[FinalObsStore], num_envs: list[int], valid: Any
                            ) -> FinalObsStore:
    """The store of trajectories of one length `T` joined along the sub-env axis (store
    `i`'s `num_envs[i]` sub-envs after those of the stores before it): each position
    `t * B_i + b` becomes `t * sum(B) + offset_i + b`. Rows at steps that `valid` (`(T,)`
    bool, the joined trajectory's) does not mark as taken are dropped, so the dense final
    observations are those of the trajectories side by side, zeros at steps not taken by
    all of them. numpy for host stores, else jax."""
    xp = np if _is_host(stores) else jnp
    valid = xp.asarray(valid)
    total = int(sum(num_envs))
    offsets = np.cumsum([0] + list(num_envs[:-1]))
    index = []
    for store, envs, offset in zip(stores, num_envs, offsets):
        used = store.index >= 0
        step = xp.where(used, store.index // envs, 0)
        keep = used & valid[step]
        index.append(xp.where(keep, step * total + int(offset) + store.index % envs, UNUSED
                              ).astype(np.int32))
    obs = jax.tree.map(lambda *xs: xp.concatenate(xs, axis=0), *[s.obs for s in stores])
    return FinalObsStore(index=xp.concatenate(index), obs=obs)


def host_rows(store: FinalObsStore) -> dict[int, int]:
    """`{flat position: row}` of a host store's used rows."""
    index = np.asarray(store.index)
    used = np.flatnonzero(index >= 0)
    return dict(zip(index[used].tolist(), used.tolist()))


__all__ = ["AUTO_DENSE_UP_TO", "AUTO_STEPS_PER_SLOT", "EndRows", "FinalObsStore", "FinalObsWriter",
           "StoreState", "UNUSED", "dense_final_obs", "host_rows", "join_stores",
           "join_stores_across_envs", "slots_for", "store_from_dense"]
