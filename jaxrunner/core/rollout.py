"""The compiled rollout: `lax.scan` over time of a `vmap` over sub-envs.

Everything here is pure JAX: no Ray, no host I/O, no Python randomness. The runner jits
`chunk` once per policy mode and calls it with traced step and episode limits, so any
`sample()` size reuses the same compiled program.

One chunk runs up to `T = chunk_len` vector steps in a `while_loop` (`scan_while`): it
stops after `num_steps` steps or once `episodes_limit` episodes finished; the steps not
taken hold zeros and are marked invalid in `Trajectory.valid`. Finished episodes'
returns and lengths go into the metric ring after the scan, from the done flags, so the
scan body stays lean.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.connectors.base import ConnectorContext
from jaxrunner.core.carry import ChunkInfo, Lookback, MetricRegisters, RolloutCarry, Trajectory

POLICY_MODES = ("explore", "inference", "random")
FAILURE_INFO_KEY = "env_step_failed"  # set by an env in its step info to report a failure


def mark_step_failed(info: dict, failed: Any = True) -> dict:
    """Returns `info` with the sub-env failure flag set (use inside a jitted env `step`)."""
    return {**info, FAILURE_INFO_KEY: jnp.asarray(failed, jnp.bool_)}


def _all_finite(tree: Any) -> jax.Array:
    """(B,) bool: every floating leaf of each sub-env's entry is finite."""
    leaves = [leaf for leaf in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)]
    ok = None
    for leaf in leaves:
        leaf_ok = jnp.all(jnp.isfinite(leaf).reshape(leaf.shape[0], -1), axis=-1)
        ok = leaf_ok if ok is None else ok & leaf_ok
    return ok
NO_EPISODE_LIMIT = np.int32(2**31 - 1)


def scan_while(step: Callable, state: Any, record_shape: Any, length: int,
               keep_going: Callable[[jax.Array, Any], jax.Array]) -> tuple:
    """A `lax.scan` of `step: state -> (state, record)` over at most `length` steps that
    stops before the first step where `keep_going(t, state)` is False.

    A `while_loop` writing each record into preallocated `(length, ...)` buffers: no
    per-step `cond` (whose branch copies and extra kernels cost more than the step itself
    for small batches) and no work for the steps not taken, whose records stay zeros.
    `record_shape` is the record pytree of `jax.ShapeDtypeStruct`s. Returns
    `(steps_taken, state, records)`."""
    buffers = jax.tree.map(lambda s: jnp.zeros((length,) + tuple(s.shape), s.dtype),
                           record_shape)

    def cond(loop):
        t, state, _ = loop
        return (t < length) & keep_going(t, state)

    def body(loop):
        t, state, out = loop
        state, record = step(state)
        out = jax.tree.map(lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, t, 0),
                           out, record)
        return t + 1, state, out

    return jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state, buffers))


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Static description of a rollout (everything that keys the compile cache)."""

    env: Any  # gymnax-style env object
    module: Any  # jaxrunner RLModule
    action_space: gym.spaces.Space  # gymnasium action space
    env_action_dtype: Any  # dtype the env takes actions in
    num_envs: int
    chunk_len: int
    lookback_len: int
    metrics_window: int
    env_to_module: Any  # ConnectorPipeline: observations -> module inputs
    module_to_env: Any  # ConnectorPipeline: module actions -> env actions
    check_finite: bool = True  # a non-finite observation or reward is a sub-env failure
    autoreset_mode: str = "gymnax"  # "gymnax" (reset every step, select) or "partial"
    partial_reset_ratio: int = 16  # "partial": ceil(B / ratio) resets computed per step
    restart_failed_sub_environments: bool = False  # recreate failed sub-envs in the scan


class RolloutFns(NamedTuple):
    """The pure functions of a rollout (see `make_rollout_fns`)."""

    init_carry: Callable[..., RolloutCarry]
    reset_carry: Callable[..., RolloutCarry]
    init_lookback: Callable[..., Lookback]
    chunk: Callable[..., tuple[RolloutCarry, Lookback, Trajectory, ChunkInfo]]


def sample_action_space(space: gym.spaces.Space, key: jax.Array, batch: int) -> jax.Array:
    """`batch` uniform samples of a Discrete, MultiDiscrete or Box space (jittable).

    Unbounded Box dimensions are drawn from a standard normal."""
    if isinstance(space, gym.spaces.Discrete):
        return (jax.random.randint(key, (batch,), 0, int(space.n), jnp.int32)
                + jnp.int32(space.start))
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = jnp.asarray(space.nvec, jnp.int32)
        return jax.random.randint(key, (batch,) + nvec.shape, 0, nvec, jnp.int32)
    if isinstance(space, gym.spaces.Box):
        low = np.asarray(space.low, np.float32)
        high = np.asarray(space.high, np.float32)
        finite = np.isfinite(low) & np.isfinite(high)
        uniform_key, normal_key = jax.random.split(key)
        shape = (batch,) + tuple(space.shape)
        uniform = jax.random.uniform(uniform_key, shape, jnp.float32,
                                     jnp.where(finite, low, 0.0), jnp.where(finite, high, 1.0))
        if finite.all():
            return uniform
        return jnp.where(finite, uniform, jax.random.normal(normal_key, shape, jnp.float32))
    raise ValueError(f"Cannot sample random actions from {space}.")


def _uniform_logp(action_space: gym.spaces.Space, batch: int) -> jax.Array:
    if isinstance(action_space, gym.spaces.Discrete):
        value = -math.log(action_space.n)
    elif isinstance(action_space, gym.spaces.MultiDiscrete):
        value = -float(np.sum(np.log(np.asarray(action_space.nvec, np.float64))))
    else:
        width = np.asarray(action_space.high, np.float64) - np.asarray(action_space.low,
                                                                         np.float64)
        value = -float(np.sum(np.log(width))) if np.all(np.isfinite(width)) else 0.0
    return jnp.full((batch,), value, jnp.float32)


def _roll_lookback(old: jax.Array, new: jax.Array, num_new: jax.Array) -> jax.Array:
    """Last `L` rows of `old` (L, ...) followed by the first `num_new` rows of `new`."""
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


def _episode_stats_at(traj: Trajectory, flat_positions: jax.Array,
                      start_episode_len: jax.Array, start_episode_return: jax.Array):
    """Length and return of the episodes ending at `flat_positions` (into `(T, B)`).

    For each position, the steps of its episode in this chunk are those after the last
    end (done or failure) before it in the same sub-env column; earlier steps come from
    the carry at chunk start. Only `(T, len(flat_positions))` work: no per-step outputs."""
    chunk_len, num_envs = traj.rewards.shape
    t_end = flat_positions // num_envs
    column = flat_positions % num_envs
    ended_cols = ((traj.terminated[:, column] | traj.truncated[:, column]
                   | traj.failed[:, column]) & traj.valid[:, None])  # (T, W)
    steps = jnp.arange(chunk_len, dtype=jnp.int32)[:, None]
    before = ended_cols & (steps < t_end[None, :])
    prev_end = jnp.max(jnp.where(before, steps, -1), axis=0)  # (W,)
    in_episode = (steps > prev_end[None, :]) & (steps <= t_end[None, :])
    rewards = jnp.sum(jnp.where(in_episode, traj.rewards[:, column], 0.0), axis=0)
    from_start = prev_end < 0
    length = t_end - prev_end + jnp.where(from_start, start_episode_len[column], 0)
    ret = rewards + jnp.where(from_start, start_episode_return[column], 0.0)
    return length.astype(jnp.int32), ret.astype(jnp.float32)


def _block_size(num_items: int, num_queries: int) -> int:
    """Power-of-two block for `rank_positions`: balances the per-block pass (N / S) against
    the per-query block scans (W * S)."""
    best = math.sqrt(max(1, num_items) / max(1, num_queries))
    return int(min(4096, max(8, 2 ** round(math.log2(max(best, 1.0))))))


def rank_positions(flags: jax.Array, ranks: jax.Array) -> jax.Array:
    """Flat index of the `rank`-th (1-based) True of `flags` (any shape, row-major order)
    for each entry of `ranks` (W,) int32; ranks outside `[1, count]` give a clamped index.

    Two-level search instead of a cumulative sum over all `N` flags: one pass counts the
    flags per block of `S`, a cumulative sum over the `N / S` block counts locates each
    rank's block, then a scan inside `W` blocks of `S` finds it. Work `O(N + W * S)`,
    temporaries `O(N / S + W * S)`, no `N`-sized scan (which costs as much as the rollout's
    post-processing itself at 4096 sub-envs)."""
    flat = flags.reshape(-1).astype(jnp.bool_)  # bool: no 4-byte copy of all N flags
    num_items = flat.shape[0]
    block = _block_size(num_items, ranks.shape[0])
    num_blocks = -(-num_items // block)
    if num_blocks * block != num_items:
        flat = jnp.pad(flat, (0, num_blocks * block - num_items))
    blocks = flat.reshape(num_blocks, block)
    block_cum = jnp.cumsum(jnp.sum(blocks, axis=1, dtype=jnp.int32))  # (N / S,)
    ranks = jnp.maximum(ranks, 1)
    index = jnp.minimum(jnp.searchsorted(block_cum, ranks, side="left"), num_blocks - 1)
    within = ranks - jnp.where(index > 0, block_cum[jnp.maximum(index - 1, 0)], 0)
    in_block = jnp.cumsum(blocks[index].astype(jnp.int32), axis=1)  # (W, S)
    offset = jnp.sum((in_block < within[:, None]).astype(jnp.int32), axis=1)
    return jnp.minimum(index * block + offset, num_items - 1).astype(jnp.int32)


def _ended_lengths_slow(traj: Trajectory, start_episode_len: jax.Array, last_counted: jax.Array,
                        steps_in_call: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact `(counted_len, discarded)` by one scan over the `T` rows (no `(T, B)`
    temporaries): summed length of the counted episode ends (flat index `<= last_counted`)
    and of the failed steps' episodes, each capped by `steps_in_call[t]`."""
    chunk_len, num_envs = traj.rewards.shape
    flat_row = jnp.arange(num_envs, dtype=jnp.int32)

    def row(loop, xs):
        running, counted_len, discarded = loop
        t, terminated, truncated, failed, valid, cap = xs
        length = running + 1
        done = (terminated | truncated) & valid
        failed = failed & valid
        counted = done & (t * num_envs + flat_row <= last_counted)
        counted_len = counted_len + jnp.sum(jnp.where(counted, length, 0))
        discarded = discarded + jnp.sum(jnp.where(failed, jnp.minimum(length, cap), 0))
        running = jnp.where(valid, jnp.where(done | failed, 0, length), running)
        return (running, counted_len, discarded), None

    zero = jnp.zeros((), jnp.int32)
    (_, counted_len, discarded), _ = jax.lax.scan(
        row, (start_episode_len.astype(jnp.int32), zero, zero),
        (jnp.arange(chunk_len, dtype=jnp.int32), traj.terminated, traj.truncated,
         traj.failed, traj.valid, steps_in_call))
    return counted_len, discarded


class RingUpdate(NamedTuple):
    """What `_update_registers` returns."""

    registers: MetricRegisters
    num_counted: jax.Array  # () int32: episodes written (at most the limit)
    counted_len: jax.Array  # () int32: their summed lengths
    discarded: jax.Array  # () int32: summed (capped) lengths of failed steps' episodes
    last_counted: jax.Array  # () int32: flat (t, b) index of the last counted end, or -1


def _update_registers(registers: MetricRegisters, traj: Trajectory, start_step: jax.Array,
                      episodes_limit: jax.Array, *, start_episode_len: jax.Array | None = None,
                      start_episode_return: jax.Array | None = None,
                      end_episode_len: jax.Array | None = None,
                      steps_in_call: jax.Array | None = None,
                      ) -> RingUpdate:
    """Writes the episodes finished in `traj` (in (t, b) order, at most
    `episodes_limit`) into the ring; returns a `RingUpdate`: the new registers, the
    number of episodes written, their summed lengths, the summed lengths of the failed
    steps' episodes (each capped by `steps_in_call[t]`, `(T,)`; 0 without it) and where
    the counted episode ends stop (the ends at flat indices `<= last_counted` count).

    Only the last `W` counted episodes can survive in the ring, so they are located with
    `rank_positions` (no scan over all `T * B` flags) and only `W` slots are written.
    Their lengths and returns come from `traj.episode_len` / `traj.episode_return` when
    the trajectory records them per step, else from the rewards and the chunk-start
    counters (`start_episode_len`, `start_episode_return`, `(B,)`). The summed length of
    the counted episodes then comes from the chunk-end counters `end_episode_len` (`(B,)`;
    each sub-env's ended episodes hold `start + steps - end` steps) unless a sub-env
    failed or the limit cut the chunk's episodes, when one exact scan over the rows runs.
    """
    chunk_len, num_envs = traj.rewards.shape
    window = registers.window_return.shape[0]
    valid = traj.valid[:, None]
    done = (traj.terminated | traj.truncated) & valid  # (T, B)
    total = jnp.sum(done.astype(jnp.int32))
    num_new = jnp.minimum(total, episodes_limit)
    # 1-based rank (among this chunk's counted episodes) of each ring write, oldest first.
    rank = num_new - window + 1 + jnp.arange(window, dtype=jnp.int32)
    written = rank >= 1
    # One search for the W ring ranks and the last counted episode's rank.
    found = rank_positions(done, jnp.concatenate([rank, num_new[None]]))
    position = found[:window]
    last_counted = jnp.where(num_new > 0, found[window], -1)
    slot = jnp.where(written, (registers.window_next + rank - 1) % window, window)
    end_step = start_step + (position // num_envs).astype(jnp.uint32) + jnp.uint32(1)
    zero = jnp.zeros((), jnp.int32)
    if traj.episode_return is not None:
        lengths = traj.episode_len.reshape(-1)[position]
        returns = traj.episode_return.reshape(-1)[position]
        flat_index = jnp.arange(chunk_len * num_envs, dtype=jnp.int32).reshape(chunk_len,
                                                                               num_envs)
        counted = done & (flat_index <= last_counted)
        counted_len = jnp.sum(jnp.where(counted, traj.episode_len, 0))
        failed = getattr(traj, "failed", None)
        discarded = zero if steps_in_call is None or failed is None else jnp.sum(jnp.where(
            failed & valid, jnp.minimum(traj.episode_len, steps_in_call[:, None]), 0))
    else:
        lengths, returns = _episode_stats_at(traj, position, start_episode_len,
                                             start_episode_return)
        steps_taken = jnp.sum(traj.valid.astype(jnp.int32))
        if steps_in_call is None:
            steps_in_call = jnp.full((chunk_len,), 2**31 - 1, jnp.int32)

        def identity(_):
            return jnp.sum(start_episode_len + steps_taken - end_episode_len), zero

        exact = jnp.any(traj.failed & valid) | (total > num_new)
        counted_len, discarded = jax.lax.cond(
            exact, lambda _: _ended_lengths_slow(traj, start_episode_len, last_counted,
                                                 steps_in_call),
            identity, None)
    new = registers.replace(
        window_return=registers.window_return.at[slot].set(returns, mode="drop"),
        window_len=registers.window_len.at[slot].set(lengths, mode="drop"),
        window_end_step=registers.window_end_step.at[slot].set(end_step, mode="drop"),
        window_next=(registers.window_next + num_new) % window,
        window_size=jnp.minimum(registers.window_size + num_new, window),
        episodes=registers.episodes + num_new.astype(jnp.uint32),
    )
    return RingUpdate(new, num_new, counted_len, discarded, last_counted)


def make_act_fn(spec: RolloutSpec, mode: str) -> Callable[..., tuple]:
    """The policy half of one vector step, as a pure (jittable) function.

    Returns `act(params, carry, key) -> (actions, env_actions, extras, connector_state,
    module_state)`: env-to-module connectors, module forward, action distribution and
    module-to-env connectors for `spec.num_envs` sub-envs. `carry` is anything with the
    `RolloutCarry` fields `obs`, `is_first`, `prev_action`, `prev_reward`,
    `connector_state` and `module_state`: the compiled rollout passes its carry, the
    host-env runner the same fields for a gymnasium vector env. `spec.env` is not used.
    """
    if mode not in POLICY_MODES:
        raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}.")
    module = spec.module
    num_envs = spec.num_envs
    dist_dim = module.action_dist_input_dim
    stateful = module.is_stateful()
    batch_leaf = lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x))  # noqa: E731

    def initial_module_state():
        return jax.tree.map(batch_leaf, module.get_initial_state())

    def act(params: Any, carry: RolloutCarry, key: jax.Array):
        """Env-to-module connectors, module, action distribution, module-to-env connectors."""
        ctx = ConnectorContext(is_first=carry.is_first, prev_action=carry.prev_action,
                               prev_reward=carry.prev_reward)
        e2m_state, m2e_state = carry.connector_state
        module_state = carry.module_state
        if mode == "random":
            actions = sample_action_space(spec.action_space, key, num_envs)
            extras = {
                "action_logp": _uniform_logp(spec.action_space, num_envs),
                "action_dist_inputs": jnp.zeros((num_envs, dist_dim), jnp.float32),
            }
        else:
            e2m_state, module_obs = spec.env_to_module(e2m_state, carry.obs, ctx)
            batch = {"obs": module_obs}
            if stateful:
                start = carry.is_first
                batch["state_in"] = jax.tree.map(
                    lambda init, cur: jnp.where(
                        start.reshape((-1,) + (1,) * (cur.ndim - 1)), init, cur),
                    initial_module_state(), module_state)
            forward = (module.forward_exploration if mode == "explore"
                       else module.forward_inference)
            out = forward(params, batch)
            dist_inputs = out["action_dist_inputs"]
            dist = module.action_dist(dist_inputs)
            actions = dist.sample(key) if mode == "explore" else dist.deterministic_sample()
            extras = {"action_logp": dist.logp(actions).astype(jnp.float32),
                      "action_dist_inputs": dist_inputs.astype(jnp.float32)}
            if stateful:
                module_state = out["state_out"]
                extras["state_out"] = module_state
        m2e_state, env_actions = spec.module_to_env(m2e_state, actions, ctx)
        env_actions = jnp.asarray(env_actions).astype(spec.env_action_dtype)
        return actions, env_actions, extras, (e2m_state, m2e_state), module_state

    return act


AUTORESET_MODES = ("gymnax", "partial")


def check_partial_autoreset_env(env: Any) -> None:
    """Raises ValueError unless `env` is a gymnax Environment using the base `step()`."""
    from gymnax.environments.environment import Environment

    if not isinstance(env, Environment) or type(env).step is not Environment.step:
        raise ValueError(
            f"autoreset_mode='partial' needs a gymnax Environment subclass that keeps the base "
            f"class's step() (it calls step_env/reset_env/is_truncated itself); "
            f"{type(env).__name__} does not. Use autoreset_mode='gymnax' for this env."
        )


def make_env_step(spec: RolloutSpec) -> Callable:
    """`env_step(key, states, actions, env_params) -> (obs, states, reward, terminated,
    truncated, info)` over the `B` sub-envs, with auto-reset in the same step.

    * "gymnax": gymnax's own `step()`: every sub-env computes a reset every step and the
      reset is selected where the episode ended.
    * "partial": the step is taken without resets; then only `R = ceil(B / ratio)` resets
      are computed and written into the sub-envs that finished (found with a fixed-size
      `nonzero`). When more than `R` sub-envs finish in the same step, that step falls
      back to resetting all `B` and selecting, so every episode still starts from its own
      fresh reset drawn with a fresh key: no two episodes share a start state, and the
      start-state distribution is the env's `reset_env` distribution, as in "gymnax".
      Only the keys differ, so the two modes give different (equally distributed) draws.
    """
    env = spec.env
    num_envs = spec.num_envs
    if spec.autoreset_mode == "gymnax":
        vmapped_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

        def env_step(key, states, actions, env_params):
            return vmapped_step(jax.random.split(key, num_envs), states, actions, env_params)

        return env_step
    if spec.autoreset_mode != "partial":
        raise ValueError(f"autoreset_mode must be one of {AUTORESET_MODES}, got "
                         f"{spec.autoreset_mode!r}.")
    check_partial_autoreset_env(env)
    resets_per_step = max(1, math.ceil(num_envs / spec.partial_reset_ratio))
    step_env = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))
    reset_env = jax.vmap(env.reset_env, in_axes=(0, None))
    is_truncated = jax.vmap(env.is_truncated, in_axes=(0, None))

    def env_step(key, states, actions, env_params):
        step_key, reset_key = jax.random.split(key)
        obs, states, reward, terminated, info = step_env(
            jax.random.split(step_key, num_envs), states, actions, env_params)
        truncated = is_truncated(states, env_params)
        done = jnp.logical_or(terminated, truncated)

        def few(args):
            step_obs, step_states = args
            index = jnp.nonzero(done, size=resets_per_step, fill_value=num_envs)[0]
            new_obs, new_states = reset_env(jax.random.split(reset_key, resets_per_step),
                                            env_params)
            put = lambda cur, new: cur.at[index].set(new, mode="drop")  # noqa: E731
            return jax.tree.map(put, step_obs, new_obs), jax.tree.map(put, step_states,
                                                                      new_states)

        def every(args):
            step_obs, step_states = args
            new_obs, new_states = reset_env(jax.random.split(reset_key, num_envs), env_params)
            pick = lambda new, cur: jnp.where(  # noqa: E731
                done.reshape((-1,) + (1,) * (cur.ndim - 1)), new, cur)
            return jax.tree.map(pick, new_obs, step_obs), jax.tree.map(pick, new_states,
                                                                       step_states)

        next_obs, next_states = jax.lax.cond(
            jnp.sum(done.astype(jnp.int32)) <= resets_per_step, few, every, (obs, states))
        info = {**info, "final_observation": obs}
        return next_obs, next_states, reward, terminated, truncated, info

    return env_step


def make_rollout_fns(spec: RolloutSpec, mode: str) -> RolloutFns:
    """Builds the pure rollout functions for one policy `mode` ("explore", "inference" or
    "random")."""
    if mode not in POLICY_MODES:
        raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}.")
    env, module = spec.env, spec.module
    num_envs = spec.num_envs
    vmapped_reset = jax.vmap(env.reset, in_axes=(0, None))
    env_step = make_env_step(spec)
    batch_leaf = lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x))  # noqa: E731

    def initial_module_state():
        return jax.tree.map(batch_leaf, module.get_initial_state())

    def init_carry(key: jax.Array, env_params: Any) -> RolloutCarry:
        key, reset_key = jax.random.split(key)
        obs, env_state = vmapped_reset(jax.random.split(reset_key, num_envs), env_params)
        action = sample_action_space(spec.action_space, jax.random.key(0), num_envs)
        return RolloutCarry(
            env_state=env_state,
            obs=obs,
            key=key,
            episode_count=jnp.zeros((num_envs,), jnp.int32),
            episode_len=jnp.zeros((num_envs,), jnp.int32),
            episode_return=jnp.zeros((num_envs,), jnp.float32),
            is_first=jnp.ones((num_envs,), jnp.bool_),
            prev_action=jnp.zeros_like(action),
            prev_reward=jnp.zeros((num_envs,), jnp.float32),
            connector_state=(spec.env_to_module.init_state(num_envs),
                             spec.module_to_env.init_state(num_envs)),
            module_state=initial_module_state(),
            consecutive_failures=jnp.zeros((num_envs,), jnp.int32),
            vector_step=jnp.zeros((), jnp.uint32),
            metrics=MetricRegisters.create(spec.metrics_window),
        )

    def reset_carry(carry: RolloutCarry, env_params: Any) -> RolloutCarry:
        """Restarts every sub-env; episodes in progress are abandoned (new ids)."""
        key, reset_key = jax.random.split(carry.key)
        obs, env_state = vmapped_reset(jax.random.split(reset_key, num_envs), env_params)
        return carry.replace(
            env_state=env_state, obs=obs, key=key,
            episode_count=carry.episode_count + 1,
            episode_len=jnp.zeros_like(carry.episode_len),
            episode_return=jnp.zeros_like(carry.episode_return),
            is_first=jnp.ones_like(carry.is_first),
            prev_action=jnp.zeros_like(carry.prev_action),
            prev_reward=jnp.zeros_like(carry.prev_reward),
            module_state=initial_module_state(),
        )

    act = make_act_fn(spec, mode)

    def vector_step(carry: RolloutCarry, params: Any, env_params: Any
                    ) -> tuple[RolloutCarry, Trajectory]:
        key, act_key, step_key = jax.random.split(carry.key, 3)
        actions, env_actions, extras, connector_state, module_state = act(
            params, carry, act_key)
        next_obs, env_state, reward, terminated, truncated, info = env_step(
            step_key, carry.env_state, env_actions, env_params)
        reward = jnp.asarray(reward, jnp.float32)
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.asarray(truncated, jnp.bool_)
        final_obs = info.get("final_observation", next_obs)
        failed = jnp.broadcast_to(jnp.asarray(info.get(FAILURE_INFO_KEY, False), jnp.bool_),
                                  (num_envs,))
        if spec.check_finite:
            finite = jnp.isfinite(reward)
            obs_finite = _all_finite(final_obs)
            if obs_finite is not None:
                finite = finite & obs_finite
            failed = failed | ~finite
        if spec.restart_failed_sub_environments:
            # Recreate only the failed sub-envs (fresh reset, fresh key); the scalar cond
            # costs nothing while no sub-env fails.
            def recreate(args):
                state, obs, k = args
                k, reset_key = jax.random.split(k)
                new_obs, new_state = vmapped_reset(jax.random.split(reset_key, num_envs),
                                                   env_params)
                pick = lambda new, old: jnp.where(  # noqa: E731
                    failed.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
                return (jax.tree.map(pick, new_state, state), jax.tree.map(pick, new_obs, obs), k)

            env_state, next_obs, key = jax.lax.cond(
                jnp.any(failed), recreate, lambda args: args, (env_state, next_obs, key))
            terminated = terminated & ~failed
            truncated = truncated & ~failed
        done = terminated | truncated
        ended = done | failed  # a failed episode ends too, but is discarded
        episode_len = carry.episode_len + 1
        episode_return = carry.episode_return + reward
        new_carry = carry.replace(
            env_state=env_state,
            obs=next_obs,
            key=key,
            episode_count=carry.episode_count + ended.astype(jnp.int32),
            episode_len=jnp.where(ended, 0, episode_len),
            episode_return=jnp.where(ended, 0.0, episode_return),
            is_first=ended,
            prev_action=actions.astype(carry.prev_action.dtype),
            prev_reward=jnp.where(ended, 0.0, reward),
            connector_state=connector_state,
            module_state=module_state,
            consecutive_failures=jnp.where(failed, carry.consecutive_failures + 1, 0),
            vector_step=carry.vector_step + jnp.uint32(1),
        )
        record = Trajectory(
            obs=carry.obs, actions=actions, rewards=reward, terminated=terminated,
            truncated=truncated, final_obs=final_obs,
            extra_model_outputs=extras, episode_return=None, episode_len=None,
            failed=failed, valid=jnp.ones((), jnp.bool_))
        return new_carry, record

    def init_lookback(carry: RolloutCarry, params: Any, env_params: Any) -> Lookback:
        _, record = jax.eval_shape(vector_step, carry, params, env_params)
        zeros = lambda s: jnp.zeros((spec.lookback_len,) + s.shape, s.dtype)  # noqa: E731
        return Lookback(obs=jax.tree.map(zeros, record.obs),
                        actions=zeros(record.actions), rewards=zeros(record.rewards),
                        extra_model_outputs=jax.tree.map(zeros, record.extra_model_outputs))

    def chunk(carry: RolloutCarry, lookback: Lookback, params: Any, env_params: Any,
              num_steps: jax.Array, episodes_limit: jax.Array, call_step_offset: jax.Array):
        """Runs up to `chunk_len` vector steps; see the module docstring.

        `call_step_offset`: vector steps the current `sample()` call took before this
        chunk (a failed episode's steps from before the call were already returned, so only
        the steps within the call count as discarded)."""
        start = carry
        _, record_shape = jax.eval_shape(vector_step, carry, params, env_params)

        def step(loop):
            c, episodes_done = loop
            c, record = vector_step(c, params, env_params)
            done = record.terminated | record.truncated
            return (c, episodes_done + jnp.sum(done.astype(jnp.int32))), record.replace(
                valid=None)

        def keep_going(t, loop):
            return (t < num_steps) & (loop[1] < episodes_limit)

        steps_taken, (carry, _), traj = scan_while(
            step, (carry, jnp.zeros((), jnp.int32)), record_shape.replace(valid=None),
            spec.chunk_len, keep_going)
        traj = traj.replace(valid=jnp.arange(spec.chunk_len, dtype=jnp.int32) < steps_taken)
        steps_in_call = call_step_offset + 1 + jnp.arange(spec.chunk_len, dtype=jnp.int32)
        metrics, num_counted, counted_len, discarded, _ = _update_registers(
            carry.metrics, traj, start.vector_step, episodes_limit,
            start_episode_len=start.episode_len, start_episode_return=start.episode_return,
            end_episode_len=carry.episode_len, steps_in_call=steps_in_call)
        carry = carry.replace(metrics=metrics)
        roll = lambda old, new: _roll_lookback(old, new, steps_taken)  # noqa: E731
        lookback = Lookback(
            obs=jax.tree.map(roll, lookback.obs, traj.obs),
            actions=roll(lookback.actions, traj.actions),
            rewards=roll(lookback.rewards, traj.rewards),
            extra_model_outputs=jax.tree.map(roll, lookback.extra_model_outputs,
                                             traj.extra_model_outputs),
        )
        failed = traj.failed & traj.valid[:, None]
        any_failed = jnp.any(failed)
        first = jnp.argmax(failed.reshape(-1))
        info = ChunkInfo(num_steps=steps_taken, num_episodes=num_counted,
                         episode_env_steps=counted_len,
                         start_episode_count=start.episode_count,
                         start_episode_len=start.episode_len,
                         num_failures=jnp.sum(failed.astype(jnp.int32)),
                         discarded_env_steps=discarded.astype(jnp.int32),
                         first_failure_step=jnp.where(any_failed, first // num_envs, -1),
                         first_failure_env=jnp.where(any_failed, first % num_envs, -1),
                         max_consecutive_failures=jnp.max(carry.consecutive_failures))
        return carry, lookback, traj, info

    return RolloutFns(init_carry=init_carry, reset_carry=reset_carry,
                      init_lookback=init_lookback, chunk=chunk)
