"""Host envs: any gymnasium env (or EnvPool pool) behind the same `SingleAgentEnvRunner` API.

The engine interface (it reads and writes nothing of the runner; the runner shell passes
everything explicitly):

* `HostEnvEngine(source, settings)`: `settings` is a `HostEngineSettings` (the runner's
  seed, worker index, chunk length and the config values the engine reads, from
  `HostEngineSettings.from_config`); the engine exposes `env`, `name`,
  `observation_space`, `action_space`, `env_action_dtype`, `obs_zeros()`, `close()`.
* `make_host_policy(...)` -> `HostPolicy`: the runner's compiled policy step for one mode
  (built by the runner from its module and connector pipelines, cached with its other
  compiled functions, so a new module or pipeline rebuilds it).
* `init_carry(key, policy, params) -> (carry, lookback)`.
* `sample(request, policy, result)`: a `HostSampleRequest` in (mode, sizes, whether to
  reset, params, the runner's carry and lookback, episode-id prefix, weights seq no); the
  `HostSampleResult` the runner passes is filled in, also when `sample()` raises (new
  carry and lookback, whether the next call must reset, env failures to count, and on
  success the batch and step counts).

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
ring with the compiled rollout's own `write_ring` (returns and lengths derived from the
rewards and each chunk's start counters, as in the compiled chunk), and the lookback
rolls with the single-agent layout's `roll_lookback`, run on the host-sized chunk buffers
(one program per chunk shape, one transfer per call). The per-step episode counters
(length, return, `is_first`, previous reward) and the `check_finite` test of each step's
rewards and final observations are numpy on the host, where the env's arrays are.

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

import dataclasses
import logging
from typing import Any, Callable

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrunner import lowering
from jaxrunner.core.carry import Lookback, RolloutCarry, Trajectory, pack_step_flags
from jaxrunner.core.final_obs import store_from_dense
from jaxrunner.core.ring import NO_EPISODE_LIMIT, RingInput, write_ring
from jaxrunner.core.chunk import initial_counters
from jaxrunner.core.rollout import (RolloutSpec, SingleAgentLayout, episode_start_fields,
                                    make_act_fn, zero_actions)
from jaxrunner.envs.gymnasium_env import RESTART_HINT, HostEnvSource, create_with_retries
from jaxrunner.envs.spaces import action_dtype
from jaxrunner.episodes.batch import EpisodeBatch
from jaxrunner.errors import StepFailedRecreateEnvError

logger = logging.getLogger(__name__)

_SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


class HostEnvConfigError(ValueError):
    """A host vector env that cannot give RLlib's episode semantics (not a sub-env
    failure: never retried, never counted)."""


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


def _finite_rows(rewards: np.ndarray, final_obs: Any) -> np.ndarray:
    """(B,) bool: the rewards and final observations of each sub-env are finite (what
    the compiled rollout's `all_finite` checks, on one host step's numpy arrays: a jitted
    call here would be a second device round trip per vector step)."""
    ok = np.ones(rewards.shape, np.bool_)
    for leaf in jax.tree.leaves((rewards, final_obs)):
        if np.issubdtype(leaf.dtype, np.floating):
            ok &= np.isfinite(leaf).reshape(leaf.shape[0], -1).all(axis=-1)
    return ok


@jax.jit
def _write_ring(registers, ring, start_step, episodes_limit, counted_len, start_len,
                start_return, end_len):
    """The compiled rollout's `write_ring` for one chunk buffer; returns the registers,
    the episode limit left and the summed length of the counted episodes so far (both
    () int32, kept on the device from chunk to chunk)."""
    update = write_ring(registers, ring, start_step, episodes_limit,
                        start_episode_len=start_len, start_episode_return=start_return,
                        end_episode_len=end_len)
    return (update.registers, episodes_limit - update.num_counted,
            counted_len + update.counted_len)


# `lookback` rolled over the first `rows` rows of one chunk buffer: the compiled
# single-agent layout's own `roll_lookback`, on host-sized arrays (one program per chunk
# shape).
_roll_chunk = jax.jit(SingleAgentLayout.roll_lookback)


@dataclasses.dataclass(frozen=True)
class HostEngineSettings:
    """What a `HostEnvEngine` needs from its runner, given explicitly.

    Attributes:
        num_envs: sub-envs (`num_envs_per_env_runner`).
        seed: the runner's seed (None: unseeded); the first reset after the env is built
            uses it, a recreated env a fresh seed derived from it.
        worker_index: the runner's index, for messages.
        chunk_len: rows per returned chunk (the runner's chunk length).
        lookback_len: `episode_lookback_horizon`.
        metrics_window: the metric ring's size.
        check_finite, restart_failed_sub_environments,
        num_consecutive_sub_env_failures_tolerance: the config values of those names.
    """

    num_envs: int
    seed: int | None
    worker_index: int | None
    chunk_len: int
    lookback_len: int
    metrics_window: int
    check_finite: bool = True
    restart_failed_sub_environments: bool = False
    num_consecutive_sub_env_failures_tolerance: int = 100

    @classmethod
    def from_config(cls, config: Any, *, seed: int | None, worker_index: int | None,
                    chunk_len: int) -> "HostEngineSettings":
        return cls(num_envs=config.num_envs_per_env_runner, seed=seed,
                   worker_index=worker_index, chunk_len=chunk_len,
                   lookback_len=config.episode_lookback_horizon,
                   metrics_window=config.metrics_window, check_finite=config.check_finite,
                   restart_failed_sub_environments=config.restart_failed_sub_environments,
                   num_consecutive_sub_env_failures_tolerance=(
                       config.num_consecutive_sub_env_failures_tolerance))


@dataclasses.dataclass(frozen=True)
class HostPolicy:
    """The runner's compiled policy for one mode (`make_host_policy`).

    Attributes:
        step: jitted `(params, policy_state, obs [B, ...], is_first (B,) bool,
            prev_reward (B,) float32) -> (policy_state, (actions [B, ...], env_actions
            [B, ...], extra_model_outputs {name: [B, ...]}))`; `policy_state` holds the
            RNG key, previous actions, connector and module states (device-resident).
        initial_module_state: `[B, ...]` recurrent module state of fresh episodes.
        initial_connector_state: `(env_to_module, module_to_env)` pipeline states.
    """

    step: Callable
    initial_module_state: Any
    initial_connector_state: Any


def make_host_policy(*, module: Any, env_to_module: Any, module_to_env: Any,
                     action_space: Any, env_action_dtype: Any, num_envs: int,
                     mode: str) -> HostPolicy:
    """The compiled policy step of one host vector step: the compiled rollout's own
    `make_act_fn` (env-to-module connectors, module, action distribution, module-to-env
    connectors), jitted once."""
    spec = RolloutSpec(
        env=None, module=module, action_space=action_space,
        env_action_dtype=env_action_dtype, num_envs=num_envs, chunk_len=1, lookback_len=0,
        metrics_window=1, env_to_module=env_to_module, module_to_env=module_to_env)
    act = make_act_fn(spec, mode)

    def policy_step(params, state: _PolicyState, obs, is_first, prev_reward):
        key, act_key = jax.random.split(state.key)
        inputs = _ActInputs(obs=obs, is_first=is_first, prev_action=state.prev_action,
                            prev_reward=prev_reward, connector_state=state.connector_state,
                            module_state=state.module_state)
        actions, env_actions, extras, connector_state, module_state = act(
            params, inputs, act_key)
        new_state = _PolicyState(
            key=key, prev_action=actions.astype(state.prev_action.dtype),
            connector_state=connector_state, module_state=module_state)
        return new_state, (actions, env_actions, extras)

    module_state = jax.tree.map(
        lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x)),
        module.get_initial_state())
    step = lowering.jit(policy_step, unrolled=lowering.unroll_for(num_envs))
    return HostPolicy(step=step, initial_module_state=module_state,
                      initial_connector_state=(env_to_module.init_state(num_envs),
                                               module_to_env.init_state(num_envs)))


@dataclasses.dataclass(frozen=True)
class HostSampleRequest:
    """One `sample()` call as the runner shell asks it.

    Attributes:
        mode: "explore", "inference" or "random".
        num_timesteps / num_episodes: the size (exactly one is not None).
        reset: start new episodes first (force_reset, episode mode, or a call after an
            error).
        params: the module's params.
        carry / lookback: the runner's `RolloutCarry` and `Lookback` (from `init_carry`
            or the previous call's result).
        id_prefix / weights_seq_no: what the returned `EpisodeBatch` carries.
    """

    mode: str
    num_timesteps: int | None
    num_episodes: int | None
    reset: bool
    params: Any
    carry: RolloutCarry
    lookback: Lookback
    id_prefix: str
    weights_seq_no: int


@dataclasses.dataclass
class HostSampleResult:
    """What `HostEnvEngine.sample()` hands back; filled in also when it raises.

    Attributes:
        carry / lookback: the runner's new carry and lookback.
        needs_reset: the next call must start new episodes.
        env_step_failures: env failures (steps, resets) seen in the call, for
            `num_env_step_failures`.
        batch, vector_steps, env_steps, discarded: on success, like the compiled
            `_sample_chunks`.
    """

    carry: Any = None
    lookback: Any = None
    needs_reset: bool = True
    env_step_failures: int = 0
    batch: EpisodeBatch | None = None
    vector_steps: int = 0
    env_steps: int = 0
    discarded: int = 0


class _ChunkBuffer:
    """`chunk_len` preallocated host rows of a `Trajectory`, and the episode counters
    `(B,)` at its start (for the metric ring, as the compiled chunk's start carry)."""

    def __init__(self, chunk_len: int, obs: Any, actions: np.ndarray, extras: dict,
                 start_len: np.ndarray, start_return: np.ndarray):
        zeros = lambda x: np.zeros((chunk_len,) + x.shape, x.dtype)  # noqa: E731
        num_envs = actions.shape[0]
        self.rows = 0
        self.start_len, self.start_return = start_len.copy(), start_return.copy()
        self.obs = jax.tree.map(zeros, obs)
        self.final_obs = jax.tree.map(zeros, obs)
        self.actions = zeros(actions)
        self.extras = jax.tree.map(zeros, extras)
        self.rewards = np.zeros((chunk_len, num_envs), np.float32)
        self.terminated = np.zeros((chunk_len, num_envs), np.bool_)
        self.truncated = np.zeros((chunk_len, num_envs), np.bool_)
        self.failed = np.zeros((chunk_len, num_envs), np.bool_)
        self._obs_leaves = jax.tree.leaves(self.obs)
        self._final_leaves = jax.tree.leaves(self.final_obs)
        self._extra_leaves = jax.tree.leaves(self.extras)

    def write(self, obs, actions, extras, rewards, terminated, truncated, final_obs) -> None:
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
        self.rows = t + 1

    @property
    def valid(self) -> np.ndarray:
        return np.arange(self.rewards.shape[0]) < self.rows

    def trajectory(self) -> Trajectory:
        return Trajectory(stored_obs=self.obs, actions=self.actions, rewards=self.rewards,
                          flags=pack_step_flags(self.terminated, self.truncated, self.failed),
                          final_obs_store=store_from_dense(self.final_obs, self.valid),
                          extra_model_outputs=self.extras,
                          episode_return=None, episode_len=None, valid=self.valid)


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
    """Steps a gymnasium vector env for a runner shell (see the module docstring for the
    interface). The runner keeps owning the params, connectors, metrics and its carry
    (`RolloutCarry` with host numpy episode counters and device connector/module/RNG
    state; `env_state` is empty: the gymnasium env holds it)."""

    def __init__(self, source: HostEnvSource, settings: HostEngineSettings):
        self.settings = settings
        self.source = source
        self.name = source.name
        self.env: gym.vector.VectorEnv = self._create()
        if self.env.num_envs != settings.num_envs:
            raise ValueError(
                f"The gymnasium vector env {self.name!r} has {self.env.num_envs} sub-envs, "
                f"but num_envs_per_env_runner={settings.num_envs}.")
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
        self._failures = 0  # env failures of the current call

    # ------------------------------------------------------------------ env lifecycle
    def _create(self) -> gym.vector.VectorEnv:
        s = self.settings
        env = create_with_retries(
            self.source.build, restart=s.restart_failed_sub_environments,
            tolerance=s.num_consecutive_sub_env_failures_tolerance,
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
        seed = self.settings.seed
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
        self.recreations += 1
        self._needs_recreate = False

    # ------------------------------------------------------------------ carry
    def obs_zeros(self) -> Any:
        """A zero `[B, ...]` observation batch in the dtypes JAX uses."""
        from gymnasium.vector.utils import create_empty_array

        return _canonical(create_empty_array(self.observation_space,
                                             n=self.settings.num_envs, fn=np.zeros))

    def init_carry(self, key: jax.Array, policy: HostPolicy, params: Any
                   ) -> tuple[RolloutCarry, Lookback]:
        """A fresh carry (the env is reset by the next `sample()`) and zero lookback.

        Args:
            key: the typed RNG key of the policy (the runner derives it from its seed).
            policy: any mode's `HostPolicy` (for the initial states and output shapes).
            params: the module's params.
        """
        num_envs = self.settings.num_envs
        prev_action = zero_actions(self.action_space, num_envs)  # stays on the device
        # The compiled chunk's initial values; the counters the engine updates in numpy
        # come to the host.
        start = jax.device_get({**initial_counters(num_envs, self.settings.metrics_window),
                                **episode_start_fields(num_envs, prev_action)})
        carry = RolloutCarry(
            env_state=(), obs=self.obs_zeros(), key=key,
            **{**start, "prev_action": prev_action},
            connector_state=policy.initial_connector_state,
            module_state=policy.initial_module_state,
        )
        _, (actions, _, extras) = jax.eval_shape(
            policy.step, params, self._policy_state(carry), carry.obs, carry.is_first,
            carry.prev_reward)
        length = self.settings.lookback_len
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

    # ------------------------------------------------------------------ faults
    def _on_failure(self, error: BaseException, during: str = "step") -> None:
        """Books one env failure; raises when recovery is off or the env fails forever.
        Call inside the `except` block (the traceback is logged from there)."""
        cfg = self.settings
        worker = cfg.worker_index
        self._failures += 1
        self._consecutive_failures += 1
        call = self._call
        where = (f"vector step {call.rows} of this sample() call"
                 if during == "step" and call is not None else "a reset")
        if not cfg.restart_failed_sub_environments:
            self._needs_recreate = True
            raise RuntimeError(
                f"The gymnasium env {self.name!r} of runner {worker} failed at "
                f"{where} ({type(error).__name__}: {error}). Set {RESTART_HINT} to recreate "
                "the env and continue (its episodes in progress are discarded); the next "
                "sample() starts on a fresh env."
            ) from error
        tolerance = cfg.num_consecutive_sub_env_failures_tolerance
        if self._consecutive_failures > tolerance:
            self._needs_recreate = True
            raise RuntimeError(
                f"The gymnasium env {self.name!r} of runner {worker} failed "
                f"{self._consecutive_failures} times in a row even after being recreated: "
                f"it fails forever (last error {type(error).__name__}: {error}). Fix the "
                "env, or raise config.fault_tolerance("
                "num_consecutive_sub_env_failures_tolerance=...)."
            ) from error
        if not isinstance(error, StepFailedRecreateEnvError):
            logger.error(
                "The gymnasium env %r of runner %s failed at %s (%s: %s); recreating it and "
                "discarding its episodes in progress.", self.name, worker, where,
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
            stepped = next_obs
            next_obs, _ = self.env.reset(options={"reset_mask": done.copy()})
            next_obs = _canonical(next_obs)
            self._check_reset_mask_honoured(stepped, next_obs, done)
        rewards = np.asarray(rewards, np.float32)
        if self.settings.check_finite:
            ok = _finite_rows(rewards, final_obs)
            if not ok.all():
                raise NonFiniteStepError(
                    f"sub-env {int(np.flatnonzero(~ok)[0])} returned a non-finite "
                    "observation or reward (check_finite)")
        return next_obs, rewards, terminated, truncated, final_obs

    def _check_reset_mask_honoured(self, stepped: Any, reset: Any, done: np.ndarray) -> None:
        """A vector env that ignores `reset(options={"reset_mask": ...})` resets every
        sub-env, which would cut the episodes still running: a configuration error."""
        keep = ~done
        for before, after in zip(jax.tree.leaves(stepped), jax.tree.leaves(reset)):
            if not np.array_equal(before[keep], after[keep], equal_nan=True):
                raise HostEnvConfigError(
                    f"The gymnasium vector env {self.name!r} ({type(self.env).__name__}) "
                    f"auto-resets in {self.autoreset_mode.name} mode, and its reset() "
                    "ignored options['reset_mask'] (sub-envs that had not finished changed "
                    "their observation). The runner resets finished sub-envs right after "
                    "their last step (RLlib's episodes spend no step on a reset), which "
                    "needs the vector env to honour reset_mask (as gymnasium's Sync- and "
                    "AsyncVectorEnv do). Vectorize single envs instead "
                    "(config.env_runners(gym_env_vectorize_mode='sync' or 'async')), or "
                    "give the vector env SAME_STEP autoreset.")

    def _vector_step(self, policy: Callable, params) -> np.ndarray | None:
        """One vector step; returns the done flags, or None if the env failed (and was
        recreated)."""
        call = self._call
        call.policy, out = policy(params, call.policy, call.obs, call.is_first,
                                  call.prev_reward)
        actions, env_actions, extras = jax.device_get(out)
        try:
            next_obs, rewards, terminated, truncated, final_obs = self._env_step(env_actions)
        except HostEnvConfigError:
            self._needs_recreate = True
            raise
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
            call.buffers.append(_ChunkBuffer(self._chunk_len, call.obs, actions, extras,
                                             call.episode_len, call.episode_return))
        call.buffers[-1].write(call.obs, actions, extras, rewards, terminated, truncated,
                               final_obs)
        call.rows += 1
        call.episode_count += done.astype(np.int32)
        call.episode_len = np.where(done, 0, episode_len).astype(np.int32)
        call.episode_return = np.where(done, np.float32(0.0), episode_return)
        call.is_first = done.copy()
        call.prev_reward = np.where(done, np.float32(0.0), rewards)
        call.obs = next_obs
        return done

    # ------------------------------------------------------------------ sample
    def sample(self, request: HostSampleRequest, policy: HostPolicy,
               result: HostSampleResult) -> None:
        """Steps until `num_timesteps` env steps are returned (or `num_episodes`
        finished); fills `result` (see `HostSampleResult`), also when it raises."""
        carry, lookback_at_start = request.carry, request.lookback
        num_timesteps, num_episodes = request.num_timesteps, request.num_episodes
        start_step = int(carry.vector_step)
        num_envs = self.settings.num_envs
        self._chunk_len = self.settings.chunk_len
        step, params = policy.step, request.params
        call = self._call = _Call(carry)
        self._failures = 0
        try:
            if self._needs_recreate:
                self._discard_in_progress()
                self._restart_env()
            elif num_episodes is not None or request.reset:
                self._discard_in_progress()  # as the compiled reset_carry: new episodes
                self._reset_env()
            if num_episodes is not None:
                counted = 0
                while counted < num_episodes:
                    done = self._vector_step(step, params)
                    if done is not None:
                        counted += int(done.sum())
            else:
                while call.rows * num_envs - call.discarded < num_timesteps:
                    self._vector_step(step, params)
        except BaseException:
            # The call's episodes are lost; the runner stays usable and the next sample()
            # starts on fresh episodes (and a fresh env after a failure).
            result.carry = call.to_carry(carry, start_step, carry.metrics)
            result.lookback = lookback_at_start
            result.needs_reset = True
            result.env_step_failures = self._failures
            self._call = None
            raise
        self._call = None
        chunks = [buffer.trajectory() for buffer in call.buffers]
        metrics, returned_episode_steps = self._update_metrics(
            carry.metrics, call.buffers, call.episode_len, start_step, num_episodes)
        result.carry = call.to_carry(carry, start_step + call.rows, metrics)
        result.lookback = self._roll_lookback(lookback_at_start, call.buffers)
        result.env_step_failures = self._failures
        env_steps = call.rows * num_envs
        if num_episodes is not None:
            result.needs_reset = True  # episodes in flight are dropped, as in RLlib
            discarded = env_steps - returned_episode_steps
            batch_mode = "episodes"
        else:
            result.needs_reset = False
            discarded = call.discarded
            batch_mode = "timesteps"
        result.batch = EpisodeBatch(
            chunks=tuple(chunks), start_episode_count=call.start_count,
            start_episode_len=call.start_len, lookback=lookback_at_start,
            num_steps=call.rows, num_envs=num_envs, mode=batch_mode,
            num_episodes=num_episodes, id_prefix=request.id_prefix,
            observation_space=self.observation_space, action_space=self.action_space,
            weights_seq_no=request.weights_seq_no,
            discarded_env_steps=discarded if batch_mode == "timesteps" else 0)
        result.vector_steps, result.env_steps, result.discarded = call.rows, env_steps, discarded

    @staticmethod
    def _update_metrics(registers, buffers: list[_ChunkBuffer], end_len: np.ndarray,
                        start_step: int, num_episodes: int | None):
        """Writes the finished episodes of the call's chunks into the ring with the
        compiled rollout's `write_ring`, from the rewards and each chunk's start and end
        episode counters as the compiled chunk does (a discarded episode ends at its
        `failed` row and is not counted); returns the registers and the summed length of
        the counted episodes. `end_len`: the episode lengths `(B,)` after the call."""
        # The limit left and the counted length stay on the device from chunk to chunk:
        # one transfer for the call, not one per chunk.
        limit = np.int32(NO_EPISODE_LIMIT if num_episodes is None else num_episodes)
        step, counted_len = start_step, np.int32(0)
        ends = [buffer.start_len for buffer in buffers[1:]] + [end_len]
        for buffer, chunk_end_len in zip(buffers, ends):
            ring = RingInput(done=buffer.terminated | buffer.truncated, failed=buffer.failed,
                             valid=buffer.valid, rewards=buffer.rewards)
            registers, limit, counted_len = _write_ring(
                registers, ring, np.uint32(step % 2**32), limit, counted_len,
                buffer.start_len, buffer.start_return, chunk_end_len)
            step += buffer.rows
        return registers, int(jax.device_get(counted_len))

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


__all__ = ["HostEngineSettings", "HostEnvConfigError", "HostEnvEngine", "HostPolicy", "HostSampleRequest",
           "HostSampleResult", "NonFiniteStepError", "make_host_policy"]
