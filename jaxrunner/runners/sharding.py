"""Sub-env sharding over the local devices of one runner (`jax.sharding`, not `pmap`).

The carry's per-sub-env leaves (leading axis `B`) and the lookback (axis 1) are placed
with `NamedSharding(Mesh(devices, ("env",)), P("env"))`; everything else (RNG key, metric
registers, connector statistics) is replicated. The jitted rollout then runs SPMD over
the devices: with JAX's partitionable threefry RNG the samples equal the single-device
run's for the same seed.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

logger = logging.getLogger(__name__)

# Carry fields with a leading sub-env axis, of both layouts' carries (`RolloutCarry`,
# `MultiAgentCarry`); every other field (keys, metric rings, counters) is replicated.
_PER_ENV_FIELDS = ("env_state", "obs", "episode_count", "episode_len", "episode_return",
                   "is_first", "prev_action", "prev_reward", "module_state",
                   "consecutive_failures", "acting", "agent_done", "pending", "pending_obs",
                   "pending_action", "pending_extras", "pending_reward", "module_index",
                   "agent_len", "agent_len_in_call", "agent_return")


def make_env_mesh(num_envs: int, enabled: bool = True) -> Mesh | None:
    """A 1-D mesh over the local devices, or None for a single device (or when disabled
    or `num_envs` does not divide evenly, which is logged)."""
    devices = jax.local_devices()
    if not enabled or len(devices) < 2:
        return None
    if num_envs % len(devices):
        logger.warning("num_envs_per_env_runner=%d does not divide over %d local devices; "
                       "sampling on one device.", num_envs, len(devices))
        return None
    return Mesh(np.asarray(devices), ("env",))


def shard_carry(carry, lookback, mesh: Mesh):
    """`(carry, lookback)` placed on `mesh`: per-sub-env leaves split over "env"."""
    replicated = NamedSharding(mesh, PartitionSpec())
    per_env = NamedSharding(mesh, PartitionSpec("env"))
    lookback_spec = NamedSharding(mesh, PartitionSpec(None, "env"))
    fields = {}
    for name in type(carry).__dataclass_fields__:
        value = getattr(carry, name)
        sharding = per_env if name in _PER_ENV_FIELDS else replicated
        fields[name] = jax.tree.map(lambda x, s=sharding: jax.device_put(x, s), value)
    carry = type(carry)(**fields)
    lookback = jax.tree.map(lambda x: jax.device_put(x, lookback_spec), lookback)
    return carry, lookback


def replicate(tree, mesh: Mesh):
    """`tree` replicated on every device of `mesh`."""
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)
