"""The single-agent layout of the one rollout chunk (`jaxrunner.core.chunk`).

A single-agent rollout is the chunk with one agent: every sub-env's agent acts at every
vector step, through the env-to-module connectors, the module (or uniform random actions)
and the module-to-env connectors. What this layout adds to the chunk's carry: the running
episode return, the connector and recurrent-module states and the previous action and
reward; its per-step record is a compact `StepRecord` (flags packed, no output derived
after the scan), decoded into the public `Trajectory` after the scan, which also derives
the episode counters and the running return (`fields_after_scan`).

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
from flax import struct

from jaxrunner.connectors.base import ConnectorContext
from jaxrunner.core.autoreset import (AUTORESET_MODES, check_partial_autoreset_env,
                                      gymnax_step_fns)
from jaxrunner.core.callbacks import StepView
from jaxrunner.core.carry import ChunkInfo, Lookback, RolloutCarry, Trajectory
from jaxrunner.core.chunk import (POLICY_MODES, ChunkFns, check_policy_mode,
                                  counters_after_scan, make_chunk_fns, scan_while)
from jaxrunner.core.faults import FAILURE_INFO_KEY, mark_step_failed
from jaxrunner.core.final_obs import FinalObsWriter, StoreState, dense_write, slots_for
from jaxrunner.core.lookback import roll_lookback, zeros_like_steps
from jaxrunner.core.ring import NO_EPISODE_LIMIT, RingInput, rank_positions, write_ring
from jaxrunner.modules.distributions import masked_logits, sample_legal

RolloutFns = ChunkFns


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


def make_act_fn(spec: RolloutSpec, mode: str, *, logp_later: bool = False
                ) -> Callable[..., tuple]:
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

    `logp_later`: leave `action_logp` out of `extras` where it is the log-probability of
    the action under the recorded float32 `action_dist_inputs` (module policy modes with
    `spec.record_action_dist_inputs`), for a caller that derives it from them after the
    rollout (`SingleAgentLayout.decode`): no per-step kernel for it.
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
            extras = {"action_dist_inputs": dist_inputs.astype(jnp.float32)}
            if not (logp_later and spec.record_action_dist_inputs
                    and dist_inputs.dtype == jnp.float32):
                extras["action_logp"] = dist.logp(actions).astype(jnp.float32)
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


# Bits of `StepRecord.flags`.
TERMINATED_BIT, TRUNCATED_BIT, FAILED_BIT = 1, 2, 4


@struct.dataclass
class StepRecord:
    """The single-agent layout's per-step record inside the scan (`(B, ...)`; `(T, B, ...)`
    in the chunk's buffers), decoded into the public `Trajectory` after the scan
    (`SingleAgentLayout.decode`): the episode's terminated / truncated flags and the
    failure flag packed into one uint8 (`TERMINATED_BIT`, `TRUNCATED_BIT`, `FAILED_BIT`),
    and no extra model output that the decode derives or fills in."""

    obs: Any
    actions: jax.Array
    rewards: jax.Array  # float32
    flags: jax.Array  # uint8
    final_obs_store: Any  # the final observations (B, ...) until the row store takes them
    extra_model_outputs: dict
    valid: jax.Array | None

    @property
    def done(self) -> jax.Array:
        """bool: the episode terminated or was truncated."""
        return (self.flags & (TERMINATED_BIT | TRUNCATED_BIT)) != 0

    @property
    def ended(self) -> jax.Array:
        """bool: the episode ended (done or failed)."""
        return self.flags != 0


def pack_flags(terminated: jax.Array, truncated: jax.Array, failed: jax.Array) -> jax.Array:
    """The three `(B,)` bool flags as one `(B,)` uint8 (`StepRecord.flags`)."""
    bit = lambda x, b: x.astype(jnp.uint8) * jnp.uint8(b)  # noqa: E731
    return bit(terminated, TERMINATED_BIT) | bit(truncated, TRUNCATED_BIT) | bit(failed,
                                                                                FAILED_BIT)


class _FinalObsRows:
    """The single-agent layout's `row_store`: the per-step record carries the final
    observation in `final_obs_store`, which goes into the chunk's `FinalObsStore` (only the
    steps that ended an episode, plus the last step) instead of a `(T, B)` output.

    Small vector steps' final observations (`core.final_obs.dense_write`) stay in the
    record, so the scan writes them into a `(T, B)` buffer like the observations, and
    `finish` compacts the buffer into the store; larger ones are scattered into the
    store's rows inside the scan."""

    def __init__(self, num_envs: int, slots: int, chunk_len: int):
        self.writer = FinalObsWriter(num_envs, slots, chunk_len)

    def init(self, record_shape: StepRecord):
        if dense_write(record_shape.final_obs_store):
            return self.writer.init_count()
        return self.writer.init(record_shape.final_obs_store)

    @staticmethod
    def strip(record: StepRecord) -> StepRecord:
        if dense_write(record.final_obs_store):
            return record
        return record.replace(final_obs_store=None)

    def write(self, state, record: StepRecord):
        if dense_write(record.final_obs_store):
            return self.writer.count(state, record.ended), record
        return (self.writer.write(state, record.ended, record.final_obs_store),
                self.strip(record))

    def room(self, state):
        return self.writer.room(state)

    def finish(self, state, traj: Trajectory, carry: RolloutCarry) -> Trajectory:
        if not isinstance(state, StoreState):  # written densely
            ended = traj.terminated | traj.truncated | traj.failed
            steps_taken = jnp.sum(traj.valid.astype(jnp.int32))
            return traj.replace(final_obs_store=self.writer.compact(
                ended, traj.final_obs_store, steps_taken, carry.obs))
        last = jnp.maximum(state.t - 1, 0)
        ended = traj.terminated[last] | traj.truncated[last] | traj.failed[last]
        return traj.replace(final_obs_store=self.writer.finish(state, ended, carry.obs))


def _context_fields(carry: RolloutCarry, actions: jax.Array, ended: jax.Array,
                    reward: jax.Array) -> dict:
    """The carry's `is_first`, `prev_action`, `prev_reward` after a step (`(B, ...)`)."""
    return dict(is_first=ended, prev_action=actions.astype(carry.prev_action.dtype),
                prev_reward=jnp.where(ended, jnp.float32(0.0), reward))


def _reads_context(act: Callable, params: Any, carry: RolloutCarry, key: jax.Array,
                   mask: Any) -> bool:
    """Whether `act` (`make_act_fn`'s) reads the carry's `is_first`, `prev_action` or
    `prev_reward` (connectors' `ConnectorContext`, a recurrent module's state reset): a
    trace of `act` with those three as its inputs, where any equation or output taking
    one counts as reading it."""
    def with_context(fields):
        is_first, prev_action, prev_reward = fields
        return act(params, carry.replace(is_first=is_first, prev_action=prev_action,
                                         prev_reward=prev_reward), key, mask)

    jaxpr = jax.make_jaxpr(with_context)(
        (carry.is_first, carry.prev_action, carry.prev_reward)).jaxpr
    inputs = {id(var) for var in jaxpr.invars}
    return (any(id(var) in inputs for eqn in jaxpr.eqns for var in eqn.invars)
            or any(id(var) in inputs for var in jaxpr.outvars))


class SingleAgentLayout:
    """The chunk's single-agent layout (see the `jaxrunner.core.chunk` protocol)."""

    carry_cls = RolloutCarry
    counts_agent_steps = False

    def __init__(self, spec: RolloutSpec, mode: str):
        check_policy_mode(mode)
        if spec.autoreset_mode == "partial":
            check_partial_autoreset_env(spec.env)
        self.spec = spec
        self.step_fns = gymnax_step_fns(spec.env)
        self._act = make_act_fn(spec, mode, logp_later=True)
        # Whether the policy step reads is_first / prev_action / prev_reward (traced once;
        # if not, they are set after the scan).
        self._reads_context: bool | None = None
        self._action_mask = action_mask_fn(spec.env, spec.action_space)
        num_envs = spec.num_envs
        self.row_store = _FinalObsRows(num_envs, slots_for(
            num_envs, spec.chunk_len, spec.final_obs_slots_per_env), spec.chunk_len)
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
        action = sample_action_space(self.spec.action_space, jax.random.key(0), num_envs)
        return dict(
            episode_return=jnp.zeros((num_envs,), jnp.float32),
            is_first=jnp.ones((num_envs,), jnp.bool_),
            prev_action=jnp.zeros_like(action),
            prev_reward=jnp.zeros((num_envs,), jnp.float32),
            connector_state=(self.spec.env_to_module.init_state(num_envs),
                             self.spec.module_to_env.init_state(num_envs)),
            module_state=self._initial_module_state())

    def reset_fields(self, carry: RolloutCarry, env_params) -> dict:
        return dict(episode_return=jnp.zeros_like(carry.episode_return),
                    is_first=jnp.ones_like(carry.is_first),
                    prev_action=jnp.zeros_like(carry.prev_action),
                    prev_reward=jnp.zeros_like(carry.prev_reward),
                    module_state=self._initial_module_state())

    def act(self, params, carry: RolloutCarry, key, env_params):
        mask = None
        if self._action_mask is not None:  # the env says which actions are legal
            mask = self._action_mask(carry.env_state, env_params)
        if self._reads_context is None:
            self._reads_context = _reads_context(self._act, params, carry, key, mask)
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
        fields = dict(connector_state=connector_state,  # the rest: fields_after_scan
                      module_state=module_state)
        if self._reads_context:
            fields.update(_context_fields(carry, actions, ended, step.reward))
        record = StepRecord(
            obs=carry.obs, actions=actions, rewards=step.reward,
            flags=pack_flags(step.all_terminated, step.all_truncated, step.failed),
            final_obs_store=step.final_obs, extra_model_outputs=extras,
            valid=jnp.ones((), jnp.bool_))
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
    def record_counts(record: StepRecord):
        return jnp.sum(record.done.astype(jnp.int32)), None

    @staticmethod
    def begin_chunk(carry, call_step_offset):
        return carry

    def _with_constant_extras(self, extras: dict, steps: tuple, valid=None) -> dict:
        """`extras` plus this mode's constant ones, `steps + (B, ...)` float32 (zeros
        where `valid` `steps` is False, as the buffers of steps not taken), and, as a
        shape only (`valid` None), `action_logp` where the decode derives it."""
        extras = dict(extras)
        if valid is None and self._logp_later(extras):
            extras["action_logp"] = jax.ShapeDtypeStruct((*steps, self.spec.num_envs),
                                                         jnp.float32)
        for name, (shape, value) in self._constant_extras.items():
            full = (*steps, self.spec.num_envs, *shape)
            if valid is None:
                extras[name] = jax.ShapeDtypeStruct(full, jnp.float32)
            else:
                extras[name] = jnp.where(valid.reshape(valid.shape + (1,) * (len(full) - 1)),
                                         jnp.float32(value), jnp.zeros(full, jnp.float32))
        return extras

    def _logp_later(self, extras: dict) -> bool:
        """The step left `action_logp` to the decode (`make_act_fn(logp_later=True)`)."""
        return "action_logp" not in extras and "action_logp" not in self._constant_extras

    def _derived_logp(self, records: StepRecord) -> jax.Array:
        """(T, B) float32 `action_logp`: the log-probability of each recorded action under
        its recorded `action_dist_inputs` (zeros at steps not taken)."""
        inputs = records.extra_model_outputs["action_dist_inputs"]
        steps = inputs.shape[:2]
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        logp = self.spec.module.action_dist(flat(inputs)).logp(flat(records.actions))
        logp = logp.astype(jnp.float32).reshape(steps)
        return jnp.where(records.valid[:, None], logp, jnp.float32(0.0))

    def decode(self, records: StepRecord, start) -> Trajectory:
        """The public `Trajectory` of the chunk's `(T, B)` records: flags unpacked,
        derived and constant extra model outputs filled in."""
        extras = dict(records.extra_model_outputs)
        if self._logp_later(extras):
            extras["action_logp"] = self._derived_logp(records)
        if self._constant_extras:
            extras = self._with_constant_extras(extras, records.valid.shape, records.valid)
        flags = records.flags
        return Trajectory(
            obs=records.obs, actions=records.actions, rewards=records.rewards,
            terminated=(flags & TERMINATED_BIT) != 0, truncated=(flags & TRUNCATED_BIT) != 0,
            final_obs_store=records.final_obs_store, extra_model_outputs=extras,
            episode_return=None, episode_len=None, failed=(flags & FAILED_BIT) != 0,
            valid=records.valid)

    def fields_after_scan(self, start: RolloutCarry, traj: Trajectory, steps_taken) -> dict:
        """The counters the step does not update (see `core.chunk`); the running episode
        return: the rewards after each sub-env's last episode end (plus the return at the
        chunk's start where no episode ended); and, where the policy step does not read
        them, the previous action and reward and `is_first`, from the last step taken."""
        ended = traj.terminated | traj.truncated | traj.failed
        fields, last_end = counters_after_scan(start, ended, traj.failed, traj.valid,
                                               steps_taken)
        steps = jnp.arange(traj.valid.shape[0], dtype=jnp.int32)[:, None]
        current = (steps > last_end[None, :]) & traj.valid[:, None]
        fields["episode_return"] = (
            jnp.sum(jnp.where(current, traj.rewards, jnp.float32(0.0)), axis=0)
            + jnp.where(last_end < 0, start.episode_return, jnp.float32(0.0)))
        if not self._reads_context:
            last = jnp.maximum(steps_taken - 1, 0)
            after = _context_fields(start, traj.actions[last], ended[last], traj.rewards[last])
            fields.update(jax.tree.map(lambda new, old: jnp.where(steps_taken > 0, new, old),
                                       after, {k: getattr(start, k) for k in after}))
        return fields

    @staticmethod
    def ring_input(traj: Trajectory) -> RingInput:
        return RingInput(done=traj.terminated | traj.truncated, failed=traj.failed,
                         valid=traj.valid, rewards=traj.rewards)

    @staticmethod
    def after_ring(carry, traj, start, update):
        return carry

    def init_lookback(self, record: StepRecord) -> Lookback:
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
           "POLICY_MODES", "RolloutFns", "RolloutSpec", "SingleAgentLayout", "StepRecord",
           "action_mask_fn", "pack_flags",
           "random_legal_actions",
           "check_partial_autoreset_env", "make_act_fn", "make_rollout_fns",
           "mark_step_failed", "rank_positions", "sample_action_space", "scan_while",
           "write_ring"]
