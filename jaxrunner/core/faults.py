"""Sub-env faults inside the compiled chunk: detection and per-sub-env recreation.

A sub-env fails at a step when its env sets `info[FAILURE_INFO_KEY]` (see
`mark_step_failed`) or, with `check_finite`, returns a non-finite observation or reward.
Observation leaves that the env builds finite by construction (read from its step's
jaxpr, `core.finiteness`) are not tested. With restarts on, only the failed sub-envs are
recreated (fresh reset, fresh key) under one scalar `cond`, which costs nothing while no
sub-env fails; the layout discards the failed episode (for every agent) and the chunk
counts it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

FAILURE_INFO_KEY = "env_step_failed"  # set by an env in its step info to report a failure


def mark_step_failed(info: dict, failed: Any = True) -> dict:
    """Returns `info` with the sub-env failure flag set (use inside a jitted env `step`)."""
    return {**info, FAILURE_INFO_KEY: jnp.asarray(failed, jnp.bool_)}


# Floating leaves holding at most this many bytes a sub-env together are checked as one
# `(B, N)` array per dtype (one reduction over their concatenation) instead of one
# reduction per leaf. At 4096 sub-envs on the 2-core CPU (same process, alternating
# rounds; `benchmarks/finite_check.py`) Pendulum's runner read 0.87 of the bare scan
# checked this way against 0.77 per leaf and 0.92 with no check; CartPole 0.98 / 0.97 /
# 0.98. Joined, Breakout-MinAtar's 1,600-byte observation lost (0.78 against 0.95 in a
# one-off run): the concatenation copies it every step.
CONCATENATED_CHECK_MAX_BYTES = 256
# How the small leaves (above) are checked: "joined" concatenates them and reduces once;
# "columns" tests each of their `N` columns elementwise and ands the `(B,)` results (no
# concatenation, no reduction: it fuses into the env step's own elementwise kernel);
# "auto" (read when a chunk is traced) takes "joined" when JAX's default backend is the
# CPU and "columns" on any other (the default backend, not the runner's device: a runner
# placed on the CPU of a GPU host gets the column check, with the same flags). On an H200 (CartPole, random actions, 1M sub-envs,
# same process; `benchmarks/results/gpu/ablations.json`) the runner read 0.82 of the
# bare scan by columns against 0.54 joined: there the joined check made the env step's
# kernel a reduction 2.5x as slow (`benchmarks/results/gpu/profile_before.json`). On the
# 2-core CPU at 4096 sub-envs (`benchmarks/results/finite_check_columns.json`) joined read
# 1.23 / 0.96 / 0.93 (CartPole / Pendulum / multi-agent CartPole) against 1.10 / 0.90 /
# 0.90 by columns.
SMALL_LEAVES_CHECK = "auto"


def small_leaves_check() -> str:
    """The small leaves' check this process traces: `SMALL_LEAVES_CHECK` with "auto"
    resolved ("joined" or "columns")."""
    if SMALL_LEAVES_CHECK != "auto":
        return SMALL_LEAVES_CHECK
    return "joined" if jax.default_backend() == "cpu" else "columns"


def all_finite(tree: Any) -> jax.Array | None:
    """(B,) bool: every floating leaf of each sub-env's entry is finite; None if `tree` has
    no floating leaf. Leaves are `(B, ...)` arrays."""
    rows = [leaf.reshape(leaf.shape[0], -1) for leaf in map(jnp.asarray, jax.tree.leaves(tree))
            if jnp.issubdtype(leaf.dtype, jnp.floating)]
    if not rows:
        return None
    if sum(r.shape[1] * r.dtype.itemsize for r in rows) <= CONCATENATED_CHECK_MAX_BYTES:
        if small_leaves_check() == "columns":
            return functools.reduce(jnp.logical_and, [jnp.isfinite(r[:, j]) for r in rows
                                                      for j in range(r.shape[1])])
        by_dtype: dict[Any, list[jax.Array]] = {}
        for r in rows:  # one array per dtype: no cast can turn a finite value infinite
            by_dtype.setdefault(r.dtype, []).append(r)
        rows = [jnp.concatenate(group, axis=1) if len(group) > 1 else group[0]
                for group in by_dtype.values()]
    ok = None
    for r in rows:
        row_ok = jnp.all(jnp.isfinite(r), axis=-1)
        ok = row_ok if ok is None else ok & row_ok
    return ok


def has_large_float_leaf(tree: Any) -> bool:
    """Whether a floating leaf of `tree` (`(B, ...)` leaves) holds more than
    `CONCATENATED_CHECK_MAX_BYTES` a sub-env: one the check tests apart, with a reduction
    over it every step (the leaves worth proving finite, `core.finiteness`)."""
    return any(jnp.issubdtype(leaf.dtype, jnp.floating)
               and int(np.prod(leaf.shape[1:])) * leaf.dtype.itemsize
               > CONCATENATED_CHECK_MAX_BYTES for leaf in jax.tree.leaves(tree))


def step_failed(info: dict, rewards: Any, final_obs: Any, num_envs: int,
                check_finite: bool, obs_known_finite: Any = None) -> jax.Array:
    """(B,) bool: the sub-envs that failed at this step (flag, or non-finite rewards or
    final observations when `check_finite`). `obs_known_finite`: a pytree of bools like
    `final_obs` (or None): its True leaves are finite by construction
    (`core.finiteness.provably_finite`) and are not tested."""
    failed = jnp.broadcast_to(jnp.asarray(info.get(FAILURE_INFO_KEY, False), jnp.bool_),
                              (num_envs,))
    if check_finite:
        if obs_known_finite is not None:
            final_obs = [leaf for leaf, known in zip(jax.tree.leaves(final_obs),
                                                     jax.tree.leaves(obs_known_finite))
                         if not known]
        finite = all_finite((rewards, final_obs))
        if finite is not None:
            failed = failed | ~finite
    return failed


def select_rows(mask: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `mask` (B,) else `old`, leaf by leaf over a leading `B` axis."""
    return jax.tree.map(
        lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (o.ndim - 1)), n, o), new, old)


def recreate_failed(failed: jax.Array, env_state: Any, obs: Any, key: jax.Array,
                    reset: Callable[[jax.Array], tuple[Any, Any]]) -> tuple[Any, Any, jax.Array]:
    """`(env_state, obs, key)` with the failed sub-envs replaced by fresh resets.

    `reset(key) -> (obs, env_state)` resets all `B` sub-envs; it only runs when a sub-env
    failed."""
    def recreate(args):
        state, observation, k = args
        k, reset_key = jax.random.split(k)
        new_obs, new_state = reset(reset_key)
        return select_rows(failed, new_state, state), select_rows(failed, new_obs,
                                                                  observation), k

    return jax.lax.cond(jnp.any(failed), recreate, lambda args: args, (env_state, obs, key))


__all__ = ["CONCATENATED_CHECK_MAX_BYTES", "FAILURE_INFO_KEY", "SMALL_LEAVES_CHECK", "all_finite",
           "has_large_float_leaf", "mark_step_failed", "recreate_failed", "select_rows",
           "small_leaves_check", "step_failed"]
