"""Device-resident rollout state: the scan carry, metric registers and lookback buffers.

Shapes use `B` = number of sub-envs, `W` = metrics window, `L` = lookback horizon.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrunner.core.final_obs import FinalObsStore, dense_final_obs


@struct.dataclass
class MetricRegisters:
    """Fixed-size on-device record of finished episodes (a ring of the last `W`)."""

    window_return: jax.Array  # (W,) float32: return of each finished episode in the ring
    window_len: jax.Array  # (W,) int32: length of each finished episode in the ring
    window_end_step: jax.Array  # (W,) uint32: global vector step the episode ended at (mod 2**32)
    window_next: jax.Array  # () int32: ring slot the next episode is written to
    window_size: jax.Array  # () int32: number of filled slots (<= W)
    episodes: jax.Array  # () uint32: episodes finished so far (mod 2**32; the host takes deltas)

    @classmethod
    def create(cls, window: int) -> "MetricRegisters":
        return cls(
            window_return=jnp.zeros((window,), jnp.float32),
            window_len=jnp.zeros((window,), jnp.int32),
            window_end_step=jnp.zeros((window,), jnp.uint32),
            window_next=jnp.zeros((), jnp.int32),
            window_size=jnp.zeros((), jnp.int32),
            episodes=jnp.zeros((), jnp.uint32),
        )

    def return_mean(self) -> jax.Array:
        """() float32: the mean return of the ring's filled slots, NaN while it is empty
        (on the device; `get_metrics()`'s `episode_return_mean` is the same mean in float64
        on the host)."""
        filled = jnp.arange(self.window_return.shape[-1]) < self.window_size
        total = jnp.sum(jnp.where(filled, self.window_return, 0.0))
        return jnp.where(self.window_size > 0,
                         total / jnp.maximum(self.window_size, 1).astype(jnp.float32),
                         jnp.nan)


@struct.dataclass
class RolloutCarry:
    """Everything the rollout carries from one vector step (and one call) to the next."""

    env_state: Any  # pytree, leaves (B, ...)
    obs: Any  # (B, *obs_shape): the observation the next action is taken on
    key: jax.Array  # () typed PRNG key
    episode_count: jax.Array  # (B,) int32: index of the current episode on each sub-env
    episode_len: jax.Array  # (B,) int32: steps taken in the current episode (all calls)
    episode_return: jax.Array  # (B,) float32: return of the current episode so far
    is_first: jax.Array  # (B,) bool: `obs` is the first observation of its episode
    prev_action: jax.Array  # (B, *act_shape): last action taken (0 at episode start)
    prev_reward: jax.Array  # (B,) float32: reward that came with `obs` (0 at episode start)
    connector_state: Any  # (env-to-module state, module-to-env state) pytrees
    module_state: Any  # recurrent module state, leaves (B, ...); {} if not recurrent
    consecutive_failures: jax.Array  # (B,) int32: failed steps in a row on each sub-env
    vector_step: jax.Array  # () uint32: vector steps taken by this runner (mod 2**32)
    metrics: MetricRegisters
    callbacks: Any = None  # core.callbacks.CallbackCarry with device callbacks, else None


def widen_obs(stored: Any, dtypes: tuple | None) -> Any:
    """The observation pytree `stored` with each leaf cast to its dtype in `dtypes` (one
    per leaf, flattened order; None: `stored` itself). Leaves may be jax or numpy arrays
    or `jax.ShapeDtypeStruct`s; a leaf already in its dtype is returned as it is."""
    if dtypes is None:
        return stored
    leaves, treedef = jax.tree.flatten(stored)
    if len(leaves) != len(dtypes):
        raise ValueError(f"widen_obs: {len(dtypes)} dtypes for an observation of "
                         f"{len(leaves)} leaves; pass one dtype per leaf.")

    def widen(leaf, dtype):
        if leaf.dtype == dtype:
            return leaf
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(leaf.shape, dtype)
        return leaf.astype(dtype)

    return treedef.unflatten([widen(x, d) for x, d in zip(leaves, dtypes)])


def narrow_obs(obs: Any, stored_dtypes: Any) -> tuple[Any, tuple | None]:
    """`(stored, obs_dtypes)`: the observation pytree `obs` with each leaf cast to its
    dtype in `stored_dtypes` (a pytree of dtypes like `obs`, each holding the leaf's
    values exactly; None: no leaf is narrowed), and the leaves' own dtypes for
    `widen_obs` (None when no leaf changes dtype)."""
    if stored_dtypes is None:
        return obs, None
    leaves, treedef = jax.tree.flatten(obs)
    targets = treedef.flatten_up_to(stored_dtypes)
    if all(jnp.dtype(d) == x.dtype for x, d in zip(leaves, targets)):
        return obs, None
    return (treedef.unflatten([x.astype(d) for x, d in zip(leaves, targets)]),
            tuple(jnp.dtype(x.dtype) for x in leaves))


TERMINATED_FLAG, TRUNCATED_FLAG, FAILED_FLAG = 1, 2, 4


def pack_step_flags(terminated, truncated, failed):
    """One uint8 per step from its three bool end flags (any equal shapes; jax arrays
    give a jax array, numpy arrays a numpy array)."""
    xp = jnp if isinstance(terminated, jax.Array) else np
    as_byte = lambda flag, bit: xp.asarray(flag).astype(xp.uint8) * xp.uint8(bit)  # noqa: E731
    return (as_byte(terminated, TERMINATED_FLAG) | as_byte(truncated, TRUNCATED_FLAG)
            | as_byte(failed, FAILED_FLAG))


@struct.dataclass
class Trajectory:
    """One compiled chunk of `T` vector steps, time-major.

    Steps with `valid[t] == False` were not taken (the chunk stopped early) and hold zeros.
    """

    # (T, B, *obs_shape): the observation each action was taken on, as stored: leaves the
    # env only ever fills with small integers may be kept in a narrower integer dtype that
    # holds them exactly (`obs_dtypes`). Read them as the `obs` property.
    stored_obs: Any
    actions: jax.Array  # (T, B, *act_shape): action the module chose (before clipping)
    rewards: jax.Array  # (T, B) float32
    # (T, B) uint8: the step's end flags packed in one byte (`pack_step_flags`); read them
    # as the `terminated`, `truncated` and `failed` properties.
    flags: jax.Array
    # The final observations (next observation before any auto-reset) of the steps that
    # ended an episode and of the chunk's last step; every other taken step's is the next
    # step's `obs`. `final_obs` rebuilds the dense array (`core.final_obs`).
    final_obs_store: FinalObsStore
    extra_model_outputs: dict  # name -> (T, B, ...): "action_logp", "action_dist_inputs"
    # (T, B) return / length of the episode up to and incl. step t, or None: the compiled
    # rollout does not record them per step (the metric ring derives them from the
    # rewards and the chunk-start counters); host-stepped envs may.
    episode_return: jax.Array | None
    episode_len: jax.Array | None
    valid: jax.Array  # (T,) bool
    # The dtype of each `stored_obs` leaf (flattened order) as the env returns it, when
    # some leaf is stored narrower; None: every leaf is stored in its own dtype.
    obs_dtypes: tuple | None = struct.field(pytree_node=False, default=None)

    @property
    def obs(self) -> Any:
        """(T, B, *obs_shape): the observation each action was taken on, in the env's own
        dtypes (`stored_obs` widened where it is kept narrower; the same values). Works on
        device arrays (inline under a trace), numpy arrays and `jax.ShapeDtypeStruct`s."""
        return widen_obs(self.stored_obs, self.obs_dtypes)

    @property
    def terminated(self) -> jax.Array:
        """(T, B) bool: the episode ended at this step in a terminal state."""
        return (self.flags & TERMINATED_FLAG) != 0

    @property
    def truncated(self) -> jax.Array:
        """(T, B) bool: the episode was cut at this step (time limit), not terminal."""
        return (self.flags & TRUNCATED_FLAG) != 0

    @property
    def failed(self) -> jax.Array:
        """(T, B) bool: the sub-env failed at this step (its episode is discarded)."""
        return (self.flags & FAILED_FLAG) != 0

    @property
    def final_obs(self) -> Any:
        """(T, B, *obs_shape): the next observation before any auto-reset of every step
        (zeros where not taken), rebuilt from `obs` and `final_obs_store` (numpy for a
        host trajectory; jitted once per shape, or inline under a trace)."""
        return dense_final_obs(self.obs, self.final_obs_store, self.valid)


@struct.dataclass
class Lookback:
    """The last `L` taken steps of every sub-env (for cut episodes' lookback)."""

    obs: Any  # (L, B, *obs_shape)
    actions: jax.Array  # (L, B, *act_shape)
    rewards: jax.Array  # (L, B) float32
    extra_model_outputs: dict  # name -> (L, B, ...)


@struct.dataclass
class ChunkInfo:
    """Per-chunk scalars and start-of-chunk counters the host reads."""

    num_steps: jax.Array  # () int32: vector steps taken in this chunk
    num_episodes: jax.Array  # () int32: episodes finished and counted in this chunk
    episode_env_steps: jax.Array  # () int32: summed length of those episodes (all chunks)
    start_episode_count: jax.Array  # (B,) int32
    start_episode_len: jax.Array  # (B,) int32
    num_failures: jax.Array  # () int32: sub-env step failures in this chunk
    discarded_env_steps: jax.Array  # () int32: steps of this call's failed episodes
    first_failure_step: jax.Array  # () int32: chunk step of the first failure (-1: none)
    first_failure_env: jax.Array  # () int32: sub-env of the first failure (-1: none)
    max_consecutive_failures: jax.Array  # () int32: longest failure streak of any sub-env
    # Multi-agent layouts only (None for single-agent):
    agent_steps: jax.Array | None = None  # () int32: agent steps completed in this chunk
    discarded_agent_steps: jax.Array | None = None  # () int32: of this call's failed episodes
    start_agent_len: jax.Array | None = None  # (B, A) int32
    # With device callbacks only: (K,) float32 summed custom metrics of the counted episodes.
    custom_metric_sums: jax.Array | None = None
