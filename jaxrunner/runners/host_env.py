"""Host envs: any gymnasium env behind the same `SingleAgentEnvRunner` API.

A `HostEnvEngine` steps a `gymnasium.vector` env in Python while the policy stays
compiled: one jitted function per vector step runs the env-to-module connectors, the
module, the action distribution and the module-to-env connectors (the rollout's own
`make_act_fn`), with one round trip to the device per vector step (observations in as
arguments, actions and model outputs back in one `device_get`). Connector, module and RNG
state stay on the device between steps.

What comes out is what the compiled path returns: host numpy `Trajectory` chunks of
`chunk_len` rows with a `valid` mask and the same fields (per-step episode lengths and
returns are not recorded, as in the compiled rollout), the same chunk-start counters,
episode ids, lookback and cuts, so `EpisodeBatch`, host views, `trajectory()` and
`concat_episode` work unchanged. Finished episodes go into the same `MetricRegisters`
ring with the compiled rollout's own `write_ring`, and the lookback rolls with its
`roll_lookback`, run on the host-sized chunk buffers (one program per chunk shape: no
numpy twins of device code).

Episodes: the runner builds its vector envs with gymnasium's `SAME_STEP` autoreset (a
finished sub-env is reset inside the step; its final observation comes in
`infos["final_obs"]`), so no step is wasted. A user `VectorEnv` in `NEXT_STEP` or
`DISABLED` mode has its finished sub-envs reset right after the step with
`reset(options={"reset_mask": done})` (gymnasium >= 1.1), so the reset step RLlib skips
never happens.

Faults follow RLlib's `_try_env_step` / `_try_env_reset`: any exception from the env (or a
non-finite observation or reward with `check_finite`) counts in `num_env_step_failures`;
with `restart_failed_sub_environments` the whole vector env is rebuilt, the episodes in
progress are discarded (never returned, never in metrics; their steps in this call count
in `num_env_steps_discarded`) and sampling goes on until the asked size is reached;
`StepFailedRecreateEnvError` is silent, other errors are logged once. Without it,
`sample()` raises `RuntimeError` naming the setting and the next `sample()` starts on a
fresh env. `num_consecutive_sub_env_failures_tolerance` failures in a row stop the call.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrunner.core.carry import Lookback, MetricRegisters, RolloutCarry, Trajectory
from jaxrunner.core.lookback import roll_lookback
from jaxrunner.core.ring import RingInput, write_ring
from jaxrunner.core.rollout import RolloutSpec, make_act_fn, sample_action_space
from jaxrunner.envs.gymnasium_env import RESTART_HINT, HostEnvSource, create_with_retries
from jaxrunner.envs.spaces import action_dtype
from jaxrunner.episodes.batch import EpisodeBatch
from jaxrunner.errors import StepFailedRecreateEnvError

logger = logging.getLogger(__name__)

_SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


class NonFiniteStepError(RuntimeError):
    """A host env step returned a non-finite observation or reward (`check_finite`)."""


@struct.dataclass
class _ActInputs:
    """The carry fields `make_act_fn`'s `act` reads, for one host vector step."""

    obs: Any
    is_first: Any
    prev_action: Any
    prev_reward: Any
    connector_state: Any
    module_state: Any


@struct.dataclass
class _PolicyState:
    """Device-resident between vector steps."""

    key: jax.Array
    prev_action: jax.Array
    connector_state: Any
    module_state: Any


def _canonical(tree: Any) -> Any:
    """Host arrays in the dtypes JAX uses (float64 -> float32, int64 -> int32 with x64
    off), so host and compiled trajectories have the same dtypes."""
    def leaf(x):
        x = np.asarray(x)
        dtype = jax.dtypes.canonicalize_dtype(x.dtype)
        return x if x.dtype == dtype else x.astype(dtype)
    return jax.tree.map(leaf, tree)


def _all_finite(tree: Any) -> np.ndarray | None:
    ok = None
    for leaf in jax.tree.leaves(tree):
        if np.issubdtype(leaf.dtype, np.floating):
            leaf_ok = np.isfinite(leaf).reshape(leaf.shape[0], -1).all(axis=-1)
            ok = leaf_ok if ok is None else ok & leaf_ok
    return ok


@jax.jit
def _write_ring(registers, ring, start_step, episodes_limit):
    return write_ring(registers, ring, start_step, episodes_limit)


@jax.jit
def _roll_chunk(lookback: Lookback, chunk: Lookback, rows) -> Lookback:
    """`lookback` rolled over the first `rows` rows of one chunk buffer (the compiled
    rollout's `roll_lookback`, on host-sized arrays: one program per chunk shape)."""
    roll = lambda old, new: roll_lookback(old, new, rows)  # noqa: E731
    return Lookback(
        obs=jax.tree.map(roll, lookback.obs, chunk.obs),
        actions=roll(lookback.actions, chunk.actions),
        rewards=roll(lookback.rewards, chunk.rewards),
        extra_model_outputs={name: jax.tree.map(roll, old, chunk.extra_model_outputs[name])
                             for name, old in lookback.extra_model_outputs.items()})


class _ChunkBuffer:
    """`chunk_len` preallocated host rows of a `Trajectory`."""

    def __init__(self, chunk_len: int, obs: Any, actions: np.ndarray, extras: dict):
        zeros = lambda x: np.zeros((chunk_len,) + x.shape, x.dtype)  # noqa: E731
        num_envs = actions.shape[0]
        self.rows = 0
        self.obs = jax.tree.map(zeros, obs)
        self.final_obs = jax.tree.map(zeros, obs)
        self.actions = zeros(actions)
        self.extras = jax.tree.map(zeros, extras)
        self.rewards = np.zeros((chunk_len, num_envs), np.float32)
        self.terminated = np.zeros((chunk_len, num_envs), np.bool_)
        self.truncated = np.zeros((chunk_len, num_envs), np.bool_)
        self.episode_return = np.zeros((chunk_len, num_envs), np.float32)
        self.episode_len = np.zeros((chunk_len, num_envs), np.int32)
        self.failed = np.zeros((chunk_len, num_envs), np.bool_)
        self._obs_leaves = jax.tree.leaves(self.obs)
        self._final_leaves = jax.tree.leaves(self.final_obs)
        self._extra_leaves = jax.tree.leaves(self.extras)

    def write(self, obs, actions, extras, rewards, terminated, truncated, final_obs,
              episode_return, episode_len) -> None:
        t = self.rows
        for buf, value in zip(self._obs_leaves, jax.tree.leaves(obs)):
            buf[t] = value
        for buf, value in zip(self._final_leaves, jax.tree.leaves(final_obs)):
            buf[t] = value
        for buf, value in zip(self._extra_leaves, jax.tree.leaves(extras)):
            buf[t] = value
        self.actions[t] = actions
        self.rewards[t] = rewards
        self.terminated[t] = terminated
        self.truncated[t] = truncated
        self.episode_return[t] = episode_return
        self.episode_len[t] = episode_len
        self.rows = t + 1

    @property
    def valid(self) -> np.ndarray:
        return np.arange(self.rewards.shape[0]) < self.rows

    def trajectory(self) -> Trajectory:
        # Per-step episode lengths/returns stay here (for the metrics), as the compiled
        # rollout does not return them either.
        return Trajectory(obs=self.obs, actions=self.actions, rewards=self.rewards,
                          terminated=self.terminated, truncated=self.truncated,
                          final_obs=self.final_obs, extra_model_outputs=self.extras,
                          episode_return=None, episode_len=None, failed=self.failed,
                          valid=self.valid)


class _Call:
    """Host bookkeeping of one `sample()` call."""

    def __init__(self, carry: RolloutCarry):
        self.obs = carry.obs
        self.episode_count = np.array(carry.episode_count, np.int32)
        self.episode_len = np.array(carry.episode_len, np.int32)
        self.episode_return = np.array(carry.episode_return, np.float32)
        self.is_first = np.array(carry.is_first, np.bool_)
        self.prev_reward = np.array(carry.prev_reward, np.float32)
        self.vector_step = int(carry.vector_step)
        self.policy = _PolicyState(key=carry.key, prev_action=carry.prev_action,
                                   connector_state=carry.connector_state,
                                   module_state=carry.module_state)
        self.buffers: list[_ChunkBuffer] = []
        self.rows = 0  # vector steps recorded in this call
        self.discarded = 0  # env steps of this call's discarded episodes
        self.snapshot_start()

    def snapshot_start(self) -> None:
        """Episode counters the call's first row starts from (the batch's ids, t_started)."""
        self.start_count = self.episode_count.copy()
        self.start_len = self.episode_len.copy()

    def to_carry(self, carry: RolloutCarry, vector_step: int, metrics: Any) -> RolloutCarry:
        return carry.replace(
            obs=self.obs, key=self.policy.key, episode_count=self.episode_count,
            episode_len=self.episode_len, episode_return=self.episode_return,
            is_first=self.is_first, prev_action=self.policy.prev_action,
            prev_reward=self.prev_reward, connector_state=self.policy.connector_state,
            module_state=self.policy.module_state,
            vector_step=np.uint32(vector_step % 2**32), metrics=metrics)


class HostEnvEngine:
    """Steps a gymnasium vector env for a `SingleAgentEnvRunner` (see the module
    docstring). The runner keeps owning the params, connectors, metrics and its carry
    (`RolloutCarry` with host numpy episode counters and device connector/module/RNG
    state; `env_state` is empty: the gymnasium env holds it)."""

    def __init__(self, runner: Any, source: HostEnvSource):
        self.runner = runner
        self.source = source
        self.name = source.name
        self.env: gym.vector.VectorEnv = self._create()
        if self.env.num_envs != runner.num_envs:
            raise ValueError(
                f"The gymnasium vector env {self.name!r} has {self.env.num_envs} sub-envs, "
                f"but num_envs_per_env_runner={runner.num_envs}.")
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.env_action_dtype = action_dtype(self.action_space)
        self.autoreset_mode = gym.vector.AutoresetMode(
            self.env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP))
        self.recreations = 0
        self._seed_next_reset = True  # the first reset after make_env uses the runner seed
        self._needs_recreate = False
        self._consecutive_failures = 0
        self._call: _Call | None = None

    # ------------------------------------------------------------------ env lifecycle
    def _create(self) -> gym.vector.VectorEnv:
        cfg = self.runner.config
        env = create_with_retries(
            self.source.build, restart=cfg.restart_failed_sub_environments,
            tolerance=cfg.num_consecutive_sub_env_failures_tolerance,
            what=f"the gymnasium env {self.name!r}")
        if not isinstance(env, gym.vector.VectorEnv):
            raise TypeError(f"Building {self.name!r} gave {type(env).__name__}, not a "
                            "gymnasium VectorEnv.")
        return env

    def close(self) -> None:
        if self.env is not None and self.source.owned:
            try:
                self.env.close()
            except Exception as error:  # noqa: BLE001 - closing a broken env may fail
                logger.warning("Closing the gymnasium env %r raised %s: %s", self.name,
                               type(error).__name__, error)

    def _next_seed(self, recreated: bool) -> int | None:
        seed = self.runner._seed
        if self._seed_next_reset:
            self._seed_next_reset = False
            return seed
        if recreated and seed is not None:
            # A fresh, reproducible seed: the failed trajectory is not replayed.
            return int(np.random.SeedSequence([seed, self.recreations]).generate_state(1)[0])
        return None

    def _rebuild(self) -> None:
        """RLlib's recreation: the whole vector env is closed and built again."""
        self._needs_recreate = True  # until a new env exists
        if self.source.owned:
            self.close()
            self.env = None
            self.env = self._create()
            self.runner.env = self.env
        self.recreations += 1
        self._needs_recreate = False

    # ------------------------------------------------------------------ carry
    def _obs_zeros(self) -> Any:
        from gymnasium.vector.utils import create_empty_array

        return _canonical(create_empty_array(self.observation_space, n=self.runner.num_envs,
                                             fn=np.zeros))

    def init_carry(self) -> tuple[RolloutCarry, Lookback]:
        """A fresh carry (the env is reset by the next `sample()`) and zero lookback."""
        r = self.runner
        num_envs = r.num_envs
        action = jax.eval_shape(lambda k: sample_action_space(self.action_space, k, num_envs),
                                jax.random.key(0))
        module_state = jax.tree.map(
            lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x)),
            r.module.get_initial_state())
        carry = RolloutCarry(
            env_state=(), obs=self._obs_zeros(), key=jax.random.fold_in(r._base_key, 2),
            episode_count=np.zeros((num_envs,), np.int32),
            episode_len=np.zeros((num_envs,), np.int32),
            episode_return=np.zeros((num_envs,), np.float32),
            is_first=np.ones((num_envs,), np.bool_),
            prev_action=jax.device_put(np.zeros(action.shape, action.dtype)),
            prev_reward=np.zeros((num_envs,), np.float32),
            connector_state=(r.env_to_module.init_state(num_envs),
                             r.module_to_env.init_state(num_envs)),
            module_state=module_state,
            consecutive_failures=np.zeros((num_envs,), np.int32),
            vector_step=np.uint32(0),
            metrics=jax.device_get(MetricRegisters.create(r.config.metrics_window)),
        )
        _, (actions, _, extras) = jax.eval_shape(
            self._policy_fn("explore"), r._params, self._policy_state(carry), carry.obs,
            carry.is_first, carry.prev_reward)
        length = r.config.episode_lookback_horizon
        zeros = lambda s: np.zeros((length,) + tuple(s.shape), s.dtype)  # noqa: E731
        lookback = Lookback(obs=jax.tree.map(zeros, carry.obs), actions=zeros(actions),
                            rewards=np.zeros((length, num_envs), np.float32),
                            extra_model_outputs=jax.tree.map(zeros, extras))
        return carry, lookback

    @staticmethod
    def _policy_state(carry: RolloutCarry) -> _PolicyState:
        return _PolicyState(key=carry.key, prev_action=carry.prev_action,
                            connector_state=carry.connector_state,
                            module_state=carry.module_state)

    # ------------------------------------------------------------------ jitted pieces
    def _policy_fn(self, mode: str):
        """One jitted policy step per mode, cached with the runner's compiled functions
        (so a new module or connector pipeline rebuilds it)."""
        cache_key = ("host_policy", mode)
        compiled = self.runner._compiled
        if cache_key not in compiled:
            r = self.runner
            spec = RolloutSpec(
                env=None, module=r.module, action_space=self.action_space,
                env_action_dtype=self.env_action_dtype, num_envs=r.num_envs,
                chunk_len=r._chunk_len(), lookback_len=r.config.episode_lookback_horizon,
                metrics_window=r.config.metrics_window, env_to_module=r.env_to_module,
                module_to_env=r.module_to_env)
            act = make_act_fn(spec, mode)

            def policy_step(params, state: _PolicyState, obs, is_first, prev_reward):
                key, act_key = jax.random.split(state.key)
                inputs = _ActInputs(obs=obs, is_first=is_first, prev_action=state.prev_action,
                                    prev_reward=prev_reward,
                                    connector_state=state.connector_state,
                                    module_state=state.module_state)
                actions, env_actions, extras, connector_state, module_state = act(
                    params, inputs, act_key)
                new_state = _PolicyState(
                    key=key, prev_action=actions.astype(state.prev_action.dtype),
                    connector_state=connector_state, module_state=module_state)
                return new_state, (actions, env_actions, extras)

            compiled[cache_key] = jax.jit(policy_step)
        return compiled[cache_key]

    # ------------------------------------------------------------------ faults
    def _on_failure(self, error: BaseException, during: str = "step") -> None:
        """Books one env failure; raises when recovery is off or the env fails forever.
        Call inside the `except` block (the traceback is logged from there)."""
        r = self.runner
        cfg = r.config
        r._metrics.env_step_failures_lifetime += 1
        self._consecutive_failures += 1
        call = self._call
        where = (f"vector step {call.rows} of this sample() call"
                 if during == "step" and call is not None else "a reset")
        if not cfg.restart_failed_sub_environments:
            self._needs_recreate = True
            raise RuntimeError(
                f"The gymnasium env {self.name!r} of runner {r.worker_index} failed at "
                f"{where} ({type(error).__name__}: {error}). Set {RESTART_HINT} to recreate "
                "the env and continue (its episodes in progress are discarded); the next "
                "sample() starts on a fresh env."
            ) from error
        tolerance = cfg.num_consecutive_sub_env_failures_tolerance
        if self._consecutive_failures > tolerance:
            self._needs_recreate = True
            raise RuntimeError(
                f"The gymnasium env {self.name!r} of runner {r.worker_index} failed "
                f"{self._consecutive_failures} times in a row even after being recreated: "
                f"it fails forever (last error {type(error).__name__}: {error}). Fix the "
                "env, or raise config.fault_tolerance("
                "num_consecutive_sub_env_failures_tolerance=...)."
            ) from error
        if not isinstance(error, StepFailedRecreateEnvError):
            logger.error(
                "The gymnasium env %r of runner %s failed at %s (%s: %s); recreating it and "
                "discarding its episodes in progress.", self.name, r.worker_index, where,
                type(error).__name__, error,
                exc_info=not isinstance(error, NonFiniteStepError))

    def _discard_in_progress(self) -> None:
        """Ends every episode in progress as failed: its last row of this call is flagged
        (so it is never returned nor counted) and its steps in this call are discarded."""
        call = self._call
        in_progress = call.episode_len > 0
        if call.rows == 0:
            # Nothing of them in this call: abandon them, like a reset.
            call.episode_count += 1
        else:
            last = call.buffers[-1]
            last.failed[last.rows - 1] |= in_progress
            call.discarded += int(np.minimum(call.episode_len[in_progress], call.rows).sum())
            call.episode_count += in_progress.astype(np.int32)
        call.episode_len[:] = 0
        call.episode_return[:] = 0.0
        call.is_first[:] = True
        call.prev_reward[:] = 0.0
        call.policy = call.policy.replace(prev_action=jax.device_put(
            np.zeros(call.policy.prev_action.shape, call.policy.prev_action.dtype)))
        if call.rows == 0:
            call.snapshot_start()

    def _restart_env(self) -> None:
        """Rebuilds the vector env and resets it, retrying failed resets."""
        while True:
            self._rebuild()
            try:
                obs, _ = self.env.reset(seed=self._next_seed(recreated=True))
            except Exception as error:  # noqa: BLE001 - RLlib's _try_env_reset
                self._on_failure(error, "reset")
                continue
            self._call.obs = _canonical(obs)
            return

    def _reset_env(self) -> None:
        """`_try_env_reset`: resets every sub-env (seeded after make_env)."""
        try:
            obs, _ = self.env.reset(seed=self._next_seed(recreated=False))
        except Exception as error:  # noqa: BLE001 - RLlib's _try_env_reset
            self._on_failure(error, "reset")
            self._discard_in_progress()
            self._restart_env()
            return
        self._call.obs = _canonical(obs)

    # ------------------------------------------------------------------ stepping
    def _env_step(self, env_actions: np.ndarray):
        """`env.step` plus the final observations and auto-resets; may raise."""
        next_obs, rewards, terminated, truncated, infos = self.env.step(env_actions)
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        done = terminated | truncated
        next_obs = _canonical(next_obs)
        final_obs = next_obs
        if self.autoreset_mode == _SAME_STEP:
            mask = infos.get("_final_obs")
            if mask is not None and np.any(mask):
                final_obs = jax.tree.map(np.copy, next_obs)
                leaves = jax.tree.leaves(final_obs)
                for i in np.flatnonzero(mask):
                    single = _canonical(infos["final_obs"][i])
                    for buf, value in zip(leaves, jax.tree.leaves(single)):
                        buf[i] = value
        elif done.any():
            # NEXT_STEP / DISABLED: reset the finished sub-envs now, so no step is spent
            # on the reset (the final observation is what step() returned).
            next_obs, _ = self.env.reset(options={"reset_mask": done.copy()})
            next_obs = _canonical(next_obs)
        rewards = np.asarray(rewards, np.float32)
        if self.runner.config.check_finite:
            ok = np.isfinite(rewards)
            obs_ok = _all_finite(final_obs)
            if obs_ok is not None:
                ok = ok & obs_ok
            if not ok.all():
                raise NonFiniteStepError(
                    f"sub-env {int(np.flatnonzero(~ok)[0])} returned a non-finite "
                    "observation or reward (check_finite)")
        return next_obs, rewards, terminated, truncated, final_obs

    def _vector_step(self, policy, params) -> np.ndarray | None:
        """One vector step; returns the done flags, or None if the env failed (and was
        recreated)."""
        call = self._call
        call.policy, out = policy(params, call.policy, call.obs, call.is_first,
                                  call.prev_reward)
        actions, env_actions, extras = jax.device_get(out)
        try:
            next_obs, rewards, terminated, truncated, final_obs = self._env_step(env_actions)
        except Exception as error:  # noqa: BLE001 - RLlib's _try_env_step
            self._on_failure(error)
            self._discard_in_progress()
            self._restart_env()
            return None
        self._consecutive_failures = 0
        done = terminated | truncated
        episode_len = call.episode_len + 1
        episode_return = call.episode_return + rewards
        if call.rows % self._chunk_len == 0:
            call.buffers.append(_ChunkBuffer(self._chunk_len, call.obs, actions, extras))
        call.buffers[-1].write(call.obs, actions, extras, rewards, terminated, truncated,
                               final_obs, episode_return, episode_len)
        call.rows += 1
        call.episode_count += done.astype(np.int32)
        call.episode_len = np.where(done, 0, episode_len).astype(np.int32)
        call.episode_return = np.where(done, np.float32(0.0), episode_return)
        call.is_first = done.copy()
        call.prev_reward = np.where(done, np.float32(0.0), rewards)
        call.obs = next_obs
        return done

    # ------------------------------------------------------------------ sample
    def sample(self, mode: str, num_timesteps: int | None, num_episodes: int | None,
               force_reset: bool) -> tuple[EpisodeBatch, int, int, int]:
        """Steps until `num_timesteps` env steps are returned (or `num_episodes` finished);
        returns `(batch, vector_steps, env_steps, discarded_env_steps)` like the compiled
        `_sample_chunks`."""
        r = self.runner
        r._ensure_carry()
        carry, lookback_at_start = r._carry, r._lookback
        start_step = int(carry.vector_step)
        num_envs = r.num_envs
        self._chunk_len = r._chunk_len()
        policy = self._policy_fn(mode)
        params = r._params
        call = self._call = _Call(carry)
        try:
            if self._needs_recreate:
                self._discard_in_progress()
                self._restart_env()
            elif num_episodes is not None or force_reset or r._needs_reset:
                self._discard_in_progress()  # as the compiled reset_carry: new episodes
                self._reset_env()
            r._needs_reset = False
            if num_episodes is not None:
                counted = 0
                while counted < num_episodes:
                    done = self._vector_step(policy, params)
                    if done is not None:
                        counted += int(done.sum())
            else:
                while call.rows * num_envs - call.discarded < num_timesteps:
                    self._vector_step(policy, params)
        except BaseException:
            # The call's episodes are lost; the runner stays usable and the next sample()
            # starts on fresh episodes (and a fresh env after a failure).
            r._needs_reset = True
            r._carry = call.to_carry(carry, start_step, carry.metrics)
            self._call = None
            raise
        self._call = None
        chunks = [buffer.trajectory() for buffer in call.buffers]
        metrics, returned_episode_steps = self._update_metrics(
            carry.metrics, call.buffers, start_step, num_episodes)
        r._carry = call.to_carry(carry, start_step + call.rows, metrics)
        r._lookback = self._roll_lookback(lookback_at_start, call.buffers)
        env_steps = call.rows * num_envs
        if num_episodes is not None:
            r._needs_reset = True  # episodes in flight are dropped, as in RLlib
            discarded = env_steps - returned_episode_steps
            batch_mode = "episodes"
        else:
            discarded = call.discarded
            batch_mode = "timesteps"
        batch = EpisodeBatch(
            chunks=tuple(chunks), start_episode_count=call.start_count,
            start_episode_len=call.start_len, lookback=lookback_at_start,
            num_steps=call.rows, num_envs=num_envs, mode=batch_mode,
            num_episodes=num_episodes, id_prefix=r._id_prefix,
            observation_space=self.observation_space, action_space=self.action_space,
            weights_seq_no=r._weights_seq_no,
            discarded_env_steps=discarded if batch_mode == "timesteps" else 0)
        return batch, call.rows, env_steps, discarded

    @staticmethod
    def _update_metrics(registers, buffers: list[_ChunkBuffer], start_step: int,
                        num_episodes: int | None):
        """Writes the finished episodes of the call's chunks into the ring with the
        compiled rollout's `write_ring` (failed episodes are not finished: their rows are
        neither terminated nor truncated); returns the registers and the summed length of
        the counted episodes."""
        limit = 2**31 - 1 if num_episodes is None else int(num_episodes)
        step, counted_len = start_step, 0
        for buffer in buffers:
            ring = RingInput(done=buffer.terminated | buffer.truncated, failed=None,
                             valid=buffer.valid, episode_return=buffer.episode_return,
                             episode_len=buffer.episode_len)
            update = _write_ring(registers, ring, np.uint32(step % 2**32), np.int32(limit))
            registers = update.registers
            num_new, length = (int(x) for x in jax.device_get((update.num_counted,
                                                                update.counted_len)))
            counted_len += length
            if num_episodes is not None:
                limit -= num_new
            step += buffer.rows
        return registers, counted_len

    @staticmethod
    def _roll_lookback(lookback: Lookback, buffers: list[_ChunkBuffer]) -> Lookback:
        if lookback.rewards.shape[0] == 0:
            return lookback
        for buffer in buffers:
            if buffer.rows:
                chunk = Lookback(obs=buffer.obs, actions=buffer.actions, rewards=buffer.rewards,
                                 extra_model_outputs={
                                     name: buffer.extras[name]
                                     for name in lookback.extra_model_outputs})
                lookback = _roll_chunk(lookback, chunk, np.int32(buffer.rows))
        return lookback


__all__ = ["HostEnvEngine", "NonFiniteStepError"]
