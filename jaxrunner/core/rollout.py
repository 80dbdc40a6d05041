"""The single-agent layout of the one rollout chunk (`jaxrunner.core.chunk`).

A single-agent rollout is the chunk with one agent: every sub-env's agent acts at every
vector step, through the env-to-module connectors, the module (or uniform random actions)
and the module-to-env connectors. What this layout adds to the chunk's carry: the running
episode return, the connector and recurrent-module states and the previous action and
reward; its per-step record is the public `Trajectory` itself.

Everything here is pure JAX: no Ray, no host I/O, no Python randomness.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.connectors.base import ConnectorContext
from jaxrunner.core.autoreset import (AUTORESET_MODES, check_partial_autoreset_env,
                                      gymnax_step_fns)
from jaxrunner.core.callbacks import StepView
from jaxrunner.core.carry import (ChunkInfo, Lookback, RolloutCarry, Trajectory,
                                  narrow_obs, pack_step_flags)
from jaxrunner.core.chunk import (POLICY_MODES, ChunkFns, check_policy_mode, make_chunk_fns,
                                  scan_while)
from jaxrunner.core.faults import FAILURE_INFO_KEY, mark_step_failed
from jaxrunner.core.final_obs import FinalObsWriter, slots_for
from jaxrunner.core.lookback import roll_lookback, zeros_like_steps
from jaxrunner.core.ring import NO_EPISODE_LIMIT, RingInput, rank_positions, write_ring
from jaxrunner.modules.distributions import masked_logits, sample_legal

RolloutFns = ChunkFns


def zero_actions(action_space: Any, num_envs: int) -> jax.Array:
    """A `(B, ...)` batch of zero actions in the dtype `action_space`'s actions have."""
    action = jax.eval_shape(lambda k: sample_action_space(action_space, k, num_envs),
                            jax.random.key(0))
    return jnp.zeros(action.shape, action.dtype)


def episode_start_fields(num_envs: int, prev_action: jax.Array) -> dict[str, jax.Array]:
    """The single-agent carry's per-episode fields at the start of every sub-env's episode:
    `(B,)` float32 zero running return and previous reward, `(B,)` bool `is_first` (all
    True) and zero previous actions shaped and typed as `prev_action`. The compiled chunk
    and the host-env engine start (and restart) their carries from these."""
    return dict(episode_return=jnp.zeros((num_envs,), jnp.float32),
                is_first=jnp.ones((num_envs,), jnp.bool_),
                prev_action=jnp.zeros(prev_action.shape, prev_action.dtype),
                prev_reward=jnp.zeros((num_envs,), jnp.float32))


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Static description of a single-agent rollout (everything that keys the compile
    cache)."""

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
    callbacks: Any = None  # core.callbacks.DeviceCallbacks, or None (none traced)
    # Episode-end rows of the chunk's final-observation store per sub-env ("auto":
    # ceil(chunk_len / 8) + 1); see `jaxrunner.core.final_obs.slots_for`.
    final_obs_slots_per_env: int | str = "auto"
    # Record the module's `action_dist_inputs` (B, D) float32 per step (an extra model
    # output RLlib learners read; jaxrunner's PPO does not).
    record_action_dist_inputs: bool = True
    # Vector steps a chunk takes between two tests of its loop condition (1 on CPU; on
    # GPU each test waits for the device); see `jaxrunner.core.chunk.scan_while`.
    steps_per_loop_check: int = 1


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


def random_legal_actions(key: jax.Array, action_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(actions (B,) int32, logp (B,) float32)`: uniform over each row's legal actions
    (`action_mask` `(B, n)` bool; a row with no legal action allows all)."""
    actions = sample_legal(key, action_mask)
    legal = jnp.sum(jnp.asarray(action_mask, jnp.int32), axis=-1)
    legal = jnp.where(legal > 0, legal, action_mask.shape[-1])
    return actions, -jnp.log(legal.astype(jnp.float32))


def make_act_fn(spec: RolloutSpec, mode: str) -> Callable[..., tuple]:
    """The policy half of one vector step, as a pure (jittable) function.

    Returns `act(params, carry, key, action_mask=None) -> (actions, env_actions, extras,
    connector_state, module_state)`: env-to-module connectors, module forward, action
    distribution and module-to-env connectors for `spec.num_envs` sub-envs. With an
    `action_mask` (`(B, n)` bool, Discrete actions: True for legal actions) only legal
    actions are taken in every mode: the module's logits are masked (the recorded
    `action_dist_inputs` and `action_logp` are the masked distribution's; the module also
    gets `batch["action_mask"]`) and random actions are uniform over the legal ones. `carry` is anything with the
    `RolloutCarry` fields `obs`, `is_first`, `prev_action`, `prev_reward`,
    `connector_state` and `module_state`: the compiled rollout passes its carry, the
    host-env runner the same fields for a gymnasium vector env. `spec.env` is not used.
    """
    check_policy_mode(mode)
    module = spec.module
    num_envs = spec.num_envs
    dist_dim = module.action_dist_input_dim
    stateful = module.is_stateful()
    batch_leaf = lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x))  # noqa: E731

    def initial_module_state():
        return jax.tree.map(batch_leaf, module.get_initial_state())

    def act(params: Any, carry: RolloutCarry, key: jax.Array,
            action_mask: jax.Array | None = None):
        """Env-to-module connectors, module, action distribution, module-to-env connectors."""
        ctx = ConnectorContext(is_first=carry.is_first, prev_action=carry.prev_action,
                               prev_reward=carry.prev_reward)
        e2m_state, m2e_state = carry.connector_state
        module_state = carry.module_state
        if mode == "random" and action_mask is not None:
            actions, logp = random_legal_actions(key, action_mask)
            extras = {"action_logp": logp,
                      "action_dist_inputs": jnp.zeros((num_envs, dist_dim), jnp.float32)}
        elif mode == "random":
            actions = sample_action_space(spec.action_space, key, num_envs)
            extras = {
                "action_logp": _uniform_logp(spec.action_space, num_envs),
                "action_dist_inputs": jnp.zeros((num_envs, dist_dim), jnp.float32),
            }
        else:
            e2m_state, module_obs = spec.env_to_module(e2m_state, carry.obs, ctx)
            batch = {"obs": module_obs}
            if action_mask is not None:
                batch["action_mask"] = action_mask
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
            if action_mask is not None:
                dist_inputs = masked_logits(dist_inputs, action_mask)
            dist = module.action_dist(dist_inputs)
            actions = dist.sample(key) if mode == "explore" else dist.deterministic_sample()
            extras = {"action_logp": dist.logp(actions).astype(jnp.float32),
                      "action_dist_inputs": dist_inputs.astype(jnp.float32)}
            if stateful:
                module_state = out["state_out"]
                extras["state_out"] = module_state
        if not spec.record_action_dist_inputs:
            extras.pop("action_dist_inputs")
        m2e_state, env_actions = spec.module_to_env(m2e_state, actions, ctx)
        env_actions = jnp.asarray(env_actions).astype(spec.env_action_dtype)
        return actions, env_actions, extras, (e2m_state, m2e_state), module_state

    return act


def action_mask_fn(env: Any, action_space: Any) -> Callable | None:
    """`(states (B, ...), env_params) -> (B, n) bool` legal actions of an env that has
    `action_mask(state, params) -> bool[n]` (e.g. pgx and Jumanji adapters), else None."""
    if not callable(getattr(env, "action_mask", None)):
        return None
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"The env {type(env).__name__} has action_mask(), but its action space is "
            f"{action_space}: action masks are supported for Discrete action spaces only.")
    return jax.vmap(env.action_mask, in_axes=(0, None))


class _FinalObsRows:
    """The single-agent layout's `row_store`: the per-step record carries `(ended,
    final_obs)` in `final_obs_store`, which goes into the chunk's `FinalObsStore` (only the
    steps that ended an episode, plus the last step) instead of the `(T, B)` buffers."""

    def __init__(self, num_envs: int, slots: int):
        self.writer = FinalObsWriter(num_envs, slots)

    def init(self, record_shape: Trajectory, extra_shape=None, obs_dtypes=None):
        """`obs_dtypes`: the dtypes to keep the observation leaves in (each holding every
        value exactly, `core.value_range.storage_dtypes`), or None: their own."""
        _, final_obs = record_shape.final_obs_store
        if obs_dtypes is not None:
            final_obs = jax.tree.map(lambda s, d: jax.ShapeDtypeStruct(s.shape, d),
                                     final_obs, obs_dtypes)
        return self.writer.init(final_obs, extra_shape)

    @staticmethod
    def strip(record: Trajectory) -> Trajectory:
        return record.replace(final_obs_store=None)

    def write(self, state, record: Trajectory, extra=None):
        ended, final_obs = record.final_obs_store
        return self.writer.write(state, ended, final_obs, extra), self.strip(record)

    def end_rows(self, state):
        return self.writer.end_rows(state)

    def room(self, state, steps: int = 1):
        return self.writer.room(state, steps)

    def finish(self, state, traj: Trajectory, carry: RolloutCarry) -> Trajectory:
        last = jnp.maximum(state.t - 1, 0)
        ended = traj.terminated[last] | traj.truncated[last] | traj.failed[last]
        return traj.replace(final_obs_store=self.writer.finish(state, ended, carry.obs))


class SingleAgentLayout:
    """The chunk's single-agent layout (see the `jaxrunner.core.chunk` protocol)."""

    carry_cls = RolloutCarry
    counts_agent_steps = False
    # The trajectory keeps observation leaves that only hold small integers narrow
    # (`jaxrunner.core.chunk.NARROW_TRAJECTORY_OBS`).
    narrows_trajectory_obs = True

    def __init__(self, spec: RolloutSpec, mode: str):
        check_policy_mode(mode)
        if spec.autoreset_mode == "partial":
            check_partial_autoreset_env(spec.env)
        self.spec = spec
        self.step_fns = gymnax_step_fns(spec.env)
        self._act = make_act_fn(spec, mode)
        self._action_mask = action_mask_fn(spec.env, spec.action_space)
        num_envs = spec.num_envs
        self.row_store = _FinalObsRows(num_envs, slots_for(
            num_envs, spec.chunk_len, spec.final_obs_slots_per_env))
        # Extra model outputs that are constants in this mode: filled in after the scan
        # instead of written at every step (random actions: zero distribution inputs and,
        # without an action mask, the uniform log-probability).
        self._constant_extras: dict[str, tuple] = {}
        if mode == "random":
            if spec.record_action_dist_inputs:
                self._constant_extras["action_dist_inputs"] = (
                    (spec.module.action_dist_input_dim,), 0.0)
            if self._action_mask is None:
                self._constant_extras["action_logp"] = (
                    (), float(_uniform_logp(spec.action_space, 1)[0]))
        self._initial_module_state = lambda: jax.tree.map(
            lambda x: jnp.broadcast_to(jnp.asarray(x), (num_envs,) + jnp.shape(x)),
            spec.module.get_initial_state())

    def init_fields(self, key, obs, env_state, params, env_params) -> dict:
        num_envs = self.spec.num_envs
        return dict(
            **episode_start_fields(num_envs, zero_actions(self.spec.action_space, num_envs)),
            connector_state=(self.spec.env_to_module.init_state(num_envs),
                             self.spec.module_to_env.init_state(num_envs)),
            module_state=self._initial_module_state())

    def reset_fields(self, carry: RolloutCarry, env_params) -> dict:
        return dict(**episode_start_fields(self.spec.num_envs, carry.prev_action),
                    module_state=self._initial_module_state())

    def act(self, params, carry: RolloutCarry, key, env_params):
        mask = None
        if self._action_mask is not None:  # the env says which actions are legal
            mask = self._action_mask(carry.env_state, env_params)
        actions, env_actions, extras, connector_state, module_state = self._act(
            params, carry, key, mask)
        return env_actions, (actions, extras, connector_state, module_state)

    def outcome(self, reward, terminated, truncated):
        reward = jnp.asarray(reward, jnp.float32)
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.asarray(truncated, jnp.bool_)
        return reward, terminated, truncated, terminated, truncated

    def after_step(self, carry: RolloutCarry, acted, step, env_params):
        actions, extras, connector_state, module_state = acted
        extras = {k: v for k, v in extras.items() if k not in self._constant_extras}
        ended = step.ended
        fields = dict(
            episode_return=jnp.where(ended, 0.0, carry.episode_return + step.reward),
            is_first=ended,
            prev_action=actions.astype(carry.prev_action.dtype),
            prev_reward=jnp.where(ended, 0.0, step.reward),
            connector_state=connector_state,
            module_state=module_state)
        stored_obs, obs_dtypes = narrow_obs(carry.obs, step.obs_record_dtypes)
        record = Trajectory(
            stored_obs=stored_obs, obs_dtypes=obs_dtypes, actions=actions,
            rewards=step.reward,
            flags=pack_step_flags(step.all_terminated, step.all_truncated, step.failed),
            final_obs_store=(step.ended, step.final_obs), extra_model_outputs=extras,
            episode_return=None, episode_len=None, valid=jnp.ones((), jnp.bool_))
        return fields, record

    @staticmethod
    def callback_view(carry: RolloutCarry, acted, step, info) -> StepView:
        actions, extras, _, _ = acted
        return StepView(obs=carry.obs, action=actions, reward=step.reward,
                        terminated=step.all_terminated, truncated=step.all_truncated,
                        next_obs=step.final_obs, info=info,
                        extra_model_outputs={k: v for k, v in extras.items()
                                             if k != "state_out"})

    @staticmethod
    def record_counts(record: Trajectory):
        return jnp.sum((record.terminated | record.truncated).astype(jnp.int32)), None

    @staticmethod
    def begin_chunk(carry, call_step_offset):
        return carry

    def _with_constant_extras(self, extras: dict, steps: tuple, valid=None) -> dict:
        """`extras` plus this mode's constant ones, `steps + (B, ...)` float32 (zeros
        where `valid` `steps` is False, as the buffers of steps not taken)."""
        extras = dict(extras)
        for name, (shape, value) in self._constant_extras.items():
            full = (*steps, self.spec.num_envs, *shape)
            if valid is None:
                extras[name] = jax.ShapeDtypeStruct(full, jnp.float32)
            else:
                extras[name] = jnp.where(valid.reshape(valid.shape + (1,) * (len(full) - 1)),
                                         jnp.float32(value), jnp.zeros(full, jnp.float32))
        return extras

    def decode(self, records: Trajectory, start) -> Trajectory:
        if not self._constant_extras:
            return records
        return records.replace(extra_model_outputs=self._with_constant_extras(
            records.extra_model_outputs, records.valid.shape, records.valid))

    @staticmethod
    def ring_input(traj: Trajectory) -> RingInput:
        return RingInput(done=traj.terminated | traj.truncated, failed=traj.failed,
                         valid=traj.valid, rewards=traj.rewards)

    @staticmethod
    def after_ring(carry, traj, start, update):
        return carry

    def init_lookback(self, record: Trajectory) -> Lookback:
        zeros = lambda tree: zeros_like_steps(tree, self.spec.lookback_len)  # noqa: E731
        return Lookback(obs=zeros(record.obs), actions=zeros(record.actions),
                        rewards=zeros(record.rewards),
                        extra_model_outputs=zeros(self._with_constant_extras(
                            record.extra_model_outputs, ())))

    @staticmethod
    def roll_lookback(lookback: Lookback, traj: Trajectory, steps_taken) -> Lookback:
        roll = lambda old, new: roll_lookback(old, new, steps_taken)  # noqa: E731
        return Lookback(obs=jax.tree.map(roll, lookback.obs, traj.obs),
                        actions=roll(lookback.actions, traj.actions),
                        rewards=roll(lookback.rewards, traj.rewards),
                        extra_model_outputs=jax.tree.map(roll, lookback.extra_model_outputs,
                                                         traj.extra_model_outputs))

    @staticmethod
    def info_extras(start, carry, traj, agent_steps_done) -> dict:
        return {}


def make_rollout_fns(spec: RolloutSpec, mode: str) -> ChunkFns:
    """The pure rollout functions of a single-agent `spec` for one policy `mode`
    ("explore", "inference" or "random"): `init_carry(key, params, env_params)`,
    `reset_carry(carry, env_params)`, `init_lookback(carry, params, env_params)` and
    `chunk(carry, lookback, params, env_params, num_steps, episodes_limit,
    agent_steps_limit, call_step_offset) -> (carry, lookback, Trajectory, ChunkInfo)`."""
    return make_chunk_fns(SingleAgentLayout(spec, mode))


__all__ = ["AUTORESET_MODES", "ChunkInfo", "FAILURE_INFO_KEY", "NO_EPISODE_LIMIT",
           "POLICY_MODES", "RolloutFns", "RolloutSpec", "SingleAgentLayout", "action_mask_fn",
           "random_legal_actions",
           "check_partial_autoreset_env", "make_act_fn", "make_rollout_fns",
           "mark_step_failed", "rank_positions", "sample_action_space", "scan_while",
           "write_ring"]
