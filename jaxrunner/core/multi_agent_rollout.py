"""The compiled multi-agent rollout: `scan_while` over time of a batched step over sub-envs.

Pure JAX (no Ray, no host I/O). Shapes: `T` chunk length, `B` sub-envs, `A` agents (the
env's fixed `agents`, in that order), `M` modules (sorted ids), `W` metrics window, `L`
lookback horizon. Per-agent arrays whose shapes differ between agents (observations,
actions, model outputs) are dicts keyed by agent id; per-agent scalars are stacked on a
last `A` axis.

RLlib's multi-agent semantics, per sub-env and agent:

* Only agents in `acting` (the env's `agents_to_act`, minus agents already done) act.
* An *agent step* `(o_k, a_k, r_k, o_{k+1})` starts when the agent acts on `o_k` and is
  *completed* at the env step that gives the agent its next observation (it is in
  `agents_to_act` again) or ends it (its own terminated/truncated flag or `"__all__"`).
  `r_k` is the sum of the rewards the agent received from the step it acted in up to and
  including the completing step, so rewards received while not acting accumulate to its
  last action. Rewards an agent receives before its first action of an episode (RLlib's
  "hanging rewards at the beginning") are not part of its return.
* The trajectory records every agent step at the env step it completes, with both of
  its observations, so a step whose action was taken in an earlier `sample()` call (a
  "hanging" action across a cut) is recorded whole in the call that completes it.

The scan body stays lean: it writes a compact `_StepRecord` (flags packed in bytes, no
per-step episode counters, no module index for a static mapping); the public
`MultiAgentTrajectory`, the counters and the metric rings (an overall ring, one per agent
and one per module) are derived after the scan, vectorised over `(T, B)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.mapping import AgentMapping
from jaxrunner.core.rollout import (NO_EPISODE_LIMIT, POLICY_MODES, _uniform_logp,
                                   _update_registers, scan_while)
from jaxrunner.envs.multi_agent import ALL


@struct.dataclass
class MultiAgentCarry:
    """Everything the multi-agent rollout carries from one vector step to the next."""

    env_state: Any  # pytree, leaves (B, ...)
    obs: dict  # aid -> (B, *obs_shape): the env's latest observation (after auto-reset)
    acting: jax.Array  # (B, A) bool: agents that act at the next step
    agent_done: jax.Array  # (B, A) bool: agents done in the current episode
    pending: jax.Array  # (B, A) bool: the agent acted and its agent step is not completed
    pending_obs: dict  # aid -> (B, *obs_shape): observation the pending action was taken on
    pending_action: dict  # aid -> (B, *act_shape)
    pending_extras: dict  # aid -> {name: (B, ...)}
    pending_reward: jax.Array  # (B, A) float32: rewards since the pending action
    module_index: jax.Array  # (B, A) int32: module of each agent in the current episode
    key: jax.Array  # () typed PRNG key
    mapping_key: jax.Array  # () typed PRNG key the mapping episodes' keys derive from
    episode_count: jax.Array  # (B,) int32: index of the current episode on each sub-env
    episode_len: jax.Array  # (B,) int32: env steps of the current episode (all calls)
    agent_len: jax.Array  # (B, A) int32: completed agent steps of the current episode
    agent_return: jax.Array  # (B, A) float32: return of each agent in the current episode
    vector_step: jax.Array  # () uint32: vector steps taken (mod 2**32)
    agent_steps: jax.Array  # (A,) uint32: completed agent steps per agent (mod 2**32)
    module_steps: jax.Array  # (M,) uint32: completed agent steps per module (mod 2**32)
    metrics: MetricRegisters  # whole episodes: return = sum of agent returns
    agent_metrics: MetricRegisters  # leaves (A, ...): per agent, episodes it stepped in
    module_metrics: MetricRegisters  # leaves (M, ...): per module, episodes it stepped in


@struct.dataclass
class MultiAgentTrajectory:
    """One compiled chunk of `T` vector steps, time-major; see the module docstring.

    Agent-step fields (`obs`, `actions`, `rewards`, `next_obs`, `terminated`,
    `truncated`, `extra_model_outputs`) hold the agent step completed at env step `t`
    where `completed[t, b, a]`, and zeros elsewhere. Steps with `valid[t] == False` were
    not taken.
    """

    acted: jax.Array  # (T, B, A) bool: the agent acted at env step t
    completed: jax.Array  # (T, B, A) bool: an agent step completed at env step t
    obs: dict  # aid -> (T, B, *obs_shape): observation the action was taken on
    actions: dict  # aid -> (T, B, *act_shape): the module's action (before clipping)
    rewards: jax.Array  # (T, B, A) float32: the agent step's (accumulated) reward
    next_obs: dict  # aid -> (T, B, *obs_shape): next observation (final one at the end)
    terminated: jax.Array  # (T, B, A) bool: the agent step ended the agent (terminated)
    truncated: jax.Array  # (T, B, A) bool: ... (truncated)
    extra_model_outputs: dict  # aid -> {"action_logp": (T, B), "action_dist_inputs": (T, B, D)}
    env_rewards: jax.Array  # (T, B, A) float32: rewards the env gave at env step t
    all_terminated: jax.Array  # (T, B) bool: `terminateds["__all__"]`
    all_truncated: jax.Array  # (T, B) bool: `truncateds["__all__"]` (and not terminated)
    module_index: jax.Array  # (T, B, A) int32: module of the agent in step t's episode
    episode_len: jax.Array  # (T, B) int32: env steps of the episode up to and incl. t
    agent_len: jax.Array  # (T, B, A) int32: completed agent steps up to and incl. t
    agent_return: jax.Array  # (T, B, A) float32: agent return up to and incl. t
    valid: jax.Array  # (T,) bool


@struct.dataclass
class _StepRecord:
    """What the scan body writes per env step (compact; `MultiAgentTrajectory` is derived
    from it after the scan)."""

    flags: jax.Array  # (B, A) uint8: acted | completed << 1 | terminated << 2 | truncated << 3
    all_flags: jax.Array  # (B,) uint8: all_terminated | all_truncated << 1
    obs: dict
    actions: dict
    rewards: jax.Array  # (B, A) float32
    next_obs: dict
    extra_model_outputs: dict
    env_rewards: jax.Array  # (B, A) float32
    module_index: Any  # (B, A) int32, or None for a static mapping
    valid: jax.Array  # () bool


_ACTED, _COMPLETED, _TERMINATED, _TRUNCATED = 1, 2, 4, 8


@struct.dataclass
class MultiAgentLookback:
    """The last `L` completed agent steps of every (sub-env, agent)."""

    obs: dict  # aid -> (L, B, *obs_shape)
    actions: dict  # aid -> (L, B, *act_shape)
    rewards: jax.Array  # (L, B, A) float32
    extra_model_outputs: dict  # aid -> {name: (L, B, ...)}


@struct.dataclass
class MultiAgentChunkInfo:
    """Per-chunk scalars and start-of-chunk counters the host reads."""

    num_steps: jax.Array  # () int32: vector steps taken in this chunk
    num_episodes: jax.Array  # () int32: episodes finished and counted in this chunk
    episode_env_steps: jax.Array  # () int32: summed length of those episodes (all chunks)
    agent_steps: jax.Array  # () int32: agent steps completed in this chunk
    start_episode_count: jax.Array  # (B,) int32
    start_episode_len: jax.Array  # (B,) int32
    start_agent_len: jax.Array  # (B, A) int32


@struct.dataclass
class ModuleBatch:
    """The agent steps of one module, for a JAX learner (device arrays).

    Time-major over env steps, with an axis `K` over the agents that can map to the
    module (`agent_ids`). `mask[t, b, k]` marks an agent step of agent `agent_ids[k]`
    that completed at env step `t` and was taken by this module; steps of one agent are
    in time order along `t`. Each entry is a whole transition, so a learner needs no
    other array: `obs -> actions -> rewards, next_obs, terminated/truncated`.
    """

    obs: Any  # (T, B, K, *obs_shape)
    actions: jax.Array  # (T, B, K, *act_shape)
    rewards: jax.Array  # (T, B, K) float32
    next_obs: Any  # (T, B, K, *obs_shape)
    terminated: jax.Array  # (T, B, K) bool
    truncated: jax.Array  # (T, B, K) bool
    extra_model_outputs: dict  # name -> (T, B, K, ...)
    mask: jax.Array  # (T, B, K) bool
    agent_ids: tuple[str, ...] = struct.field(pytree_node=False, default=())


@dataclasses.dataclass(frozen=True)
class MultiAgentRolloutSpec:
    """Static description of a multi-agent rollout."""

    env: Any  # jaxrunner MultiAgentEnv
    module: Any  # MultiRLModule
    mapping: AgentMapping
    gymnax_action_spaces: dict  # aid -> gymnax space (random actions)
    action_spaces: dict  # aid -> gymnasium space
    num_envs: int
    chunk_len: int
    lookback_len: int
    metrics_window: int
    actions_for_env: dict  # aid -> Callable[(B, *act) -> (B, *act)]

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self.mapping.agent_ids

    @property
    def module_ids(self) -> tuple[str, ...]:
        return self.mapping.module_ids

    def agents_of_module(self) -> dict[str, tuple[str, ...]]:
        """module id -> the agents that can map to it (env order); only used modules."""
        out = {}
        for module_id in self.module_ids:
            agents = tuple(a for a in self.agent_ids if module_id in self.mapping.candidates[a])
            if agents:
                out[module_id] = agents
        return out


class MultiAgentRolloutFns(NamedTuple):
    init_carry: Callable[..., MultiAgentCarry]
    reset_carry: Callable[..., MultiAgentCarry]
    init_lookback: Callable[..., MultiAgentLookback]
    chunk: Callable[..., tuple]


class _RingInput(NamedTuple):
    """What `_update_registers` reads from a trajectory."""

    rewards: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array
    episode_return: jax.Array
    episode_len: jax.Array


def _ring(registers: MetricRegisters, done: jax.Array, ret: jax.Array, length: jax.Array,
          start_step: jax.Array) -> MetricRegisters:
    """Writes the episodes marked in `done` (T, B) into a ring (no episode limit)."""
    ring_input = _RingInput(rewards=ret, terminated=done, truncated=jnp.zeros_like(done),
                            valid=jnp.ones(done.shape[:1], jnp.bool_), episode_return=ret,
                            episode_len=length)
    return _update_registers(registers, ring_input, start_step, NO_EPISODE_LIMIT).registers


def _stack_registers(window: int, count: int) -> MetricRegisters:
    one = MetricRegisters.create(window)
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (count,) + x.shape), one)


def _last_positions(mask: jax.Array, lookback_len: int) -> jax.Array:
    """Positions in `concat(old (L), new (T))` of the last `L` entries per sub-env, where
    every old entry counts and new entry `t` counts if `mask[t]`; `(L, B)` int32."""
    num_envs = mask.shape[1]
    flags = jnp.concatenate([jnp.ones((lookback_len, num_envs), jnp.int32),
                             mask.astype(jnp.int32)], axis=0)
    cumulative = jnp.cumsum(flags, axis=0)  # (L + T, B)
    total = cumulative[-1]
    rank = total[None, :] - lookback_len + 1 + jnp.arange(lookback_len)[:, None]
    return jax.vmap(lambda c, r: jnp.searchsorted(c, r, side="left"), in_axes=(1, 1),
                    out_axes=1)(cumulative, rank).astype(jnp.int32)


def _gather_last(old: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """`old` (L, B, ...) / `new` (T, B, ...) entries at `positions` (L, B)."""
    lookback_len, chunk_len = old.shape[0], new.shape[0]
    rest = old.shape[2:]
    expand = lambda idx: jnp.broadcast_to(  # noqa: E731
        idx.reshape(idx.shape + (1,) * len(rest)), idx.shape + rest)
    from_old = jnp.take_along_axis(old, expand(jnp.clip(positions, 0, lookback_len - 1)),
                                   axis=0)
    from_new = jnp.take_along_axis(new, expand(jnp.clip(positions - lookback_len, 0,
                                                        chunk_len - 1)), axis=0)
    return jnp.where(expand(positions < lookback_len), from_old, from_new)


def make_multi_agent_rollout_fns(spec: MultiAgentRolloutSpec, mode: str
                                 ) -> MultiAgentRolloutFns:
    """Builds the pure rollout functions for one policy `mode` ("explore",
    "inference" or "random")."""
    if mode not in POLICY_MODES:
        raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}.")
    env, module, mapping = spec.env, spec.module, spec.mapping
    agents, module_ids = spec.agent_ids, spec.module_ids
    num_envs, num_agents, num_modules = spec.num_envs, len(agents), len(module_ids)
    groups = spec.agents_of_module()
    vmapped_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmapped_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    vmapped_to_act = jax.vmap(env.agents_to_act, in_axes=(0, None))
    vmapped_indices = jax.vmap(mapping.indices, in_axes=(None, 0, 0))
    env_index = jnp.arange(num_envs, dtype=jnp.int32)

    def acting_mask(env_state: Any, env_params: Any) -> jax.Array:
        to_act = vmapped_to_act(env_state, env_params)
        return jnp.stack([jnp.asarray(to_act[a], jnp.bool_) for a in agents], axis=-1)

    def module_indices(mapping_key: jax.Array, episode_count: jax.Array) -> jax.Array:
        if mapping.is_static:
            return jnp.broadcast_to(jnp.asarray(mapping.static_indices()),
                                    (num_envs, num_agents))
        return vmapped_indices(mapping_key, env_index, episode_count)

    def dist_dim(agent: str) -> int:
        first = module[mapping.candidates[agent][0]]
        return first.action_dist_cls.required_input_dim(spec.action_spaces[agent])

    def act(params: Any, obs: dict, module_index: jax.Array, key: jax.Array
            ) -> tuple[dict, dict]:
        if mode == "random":
            actions, extras = {}, {}
            for agent, agent_key in zip(agents, jax.random.split(key, num_agents)):
                sample = jax.vmap(spec.gymnax_action_spaces[agent].sample)
                actions[agent] = sample(jax.random.split(agent_key, num_envs))
                extras[agent] = {
                    "action_logp": _uniform_logp(spec.action_spaces[agent], num_envs),
                    "action_dist_inputs": jnp.zeros((num_envs, dist_dim(agent)), jnp.float32),
                }
            return actions, extras
        per_module: dict[tuple[str, str], tuple] = {}
        group_keys = jax.random.split(key, max(1, len(groups)))
        for (module_id, members), group_key in zip(groups.items(), group_keys):
            rl_module = module[module_id]
            x = (obs[members[0]] if len(members) == 1
                 else jnp.concatenate([obs[a] for a in members], axis=0))
            forward = (rl_module.forward_exploration if mode == "explore"
                       else rl_module.forward_inference)
            dist_inputs = forward(params[module_id], {"obs": x})["action_dist_inputs"]
            dist = rl_module.action_dist_cls.from_inputs(dist_inputs)
            actions = dist.sample(group_key) if mode == "explore" else dist.deterministic_sample()
            logp = dist.logp(actions)
            for k, agent in enumerate(members):
                part = slice(k * num_envs, (k + 1) * num_envs)
                per_module[(agent, module_id)] = (actions[part], logp[part],
                                                  dist_inputs[part].astype(jnp.float32))
        actions, extras = {}, {}
        for i, agent in enumerate(agents):
            candidates = mapping.candidates[agent]
            action, logp, inputs = per_module[(agent, candidates[-1])]
            for candidate in reversed(candidates[:-1]):
                chosen = module_index[:, i] == module_ids.index(candidate)
                c_action, c_logp, c_inputs = per_module[(agent, candidate)]
                action = jnp.where(chosen.reshape((-1,) + (1,) * (action.ndim - 1)),
                                   c_action, action)
                logp = jnp.where(chosen, c_logp, logp)
                inputs = jnp.where(chosen[:, None], c_inputs, inputs)
            actions[agent] = action
            extras[agent] = {"action_logp": logp, "action_dist_inputs": inputs}
        return actions, extras

    def select(flag: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
        return jnp.where(flag.reshape(flag.shape + (1,) * (new.ndim - 1)), new, old)

    def vector_step(carry: MultiAgentCarry, params: Any, env_params: Any
                    ) -> tuple[MultiAgentCarry, MultiAgentTrajectory]:
        key, act_key, step_key = jax.random.split(carry.key, 3)
        acting = carry.acting
        actions, extras = act(params, carry.obs, carry.module_index, act_key)
        # Acting agents start a new agent step (they have no pending one: getting the
        # observation they act on completed it).
        def start_step(new: dict, old: dict) -> dict:
            return {a: jax.tree.map(lambda n, o, i=i: select(acting[:, i], n, o), new[a],
                                    old[a]) for i, a in enumerate(agents)}

        pending_obs = start_step(carry.obs, carry.pending_obs)
        pending_action = start_step(actions, carry.pending_action)
        pending_extras = start_step(extras, carry.pending_extras)
        pending = carry.pending | acting
        env_actions = {a: spec.actions_for_env[a](actions[a]) for a in agents}
        next_obs, env_state, rewards, terminateds, truncateds, info = vmapped_step(
            jax.random.split(step_key, num_envs), carry.env_state, env_actions, env_params)
        final_obs = info["final_observation"]
        reward = jnp.stack([jnp.asarray(rewards[a], jnp.float32) for a in agents], axis=-1)
        all_terminated = jnp.asarray(terminateds[ALL], jnp.bool_)
        all_truncated = jnp.asarray(truncateds[ALL], jnp.bool_) & ~all_terminated
        all_done = all_terminated | all_truncated
        agent_terminated = jnp.stack([jnp.asarray(terminateds[a], jnp.bool_) for a in agents],
                                     axis=-1) | all_terminated[:, None]
        agent_truncated = jnp.stack([jnp.asarray(truncateds[a], jnp.bool_) for a in agents],
                                    axis=-1) | all_truncated[:, None]
        ends = (agent_terminated | agent_truncated) & ~carry.agent_done
        to_act = acting_mask(env_state, env_params)  # of the next state (reset if done)
        gets_obs = to_act & ~all_done[:, None] & ~carry.agent_done & ~ends
        pending_reward = jnp.where(acting, 0.0, carry.pending_reward)
        pending_reward = pending_reward + jnp.where(pending, reward, 0.0)
        completed = pending & (gets_obs | ends)
        terminated = completed & ends & agent_terminated
        truncated = completed & ends & agent_truncated & ~agent_terminated
        agent_len = carry.agent_len + completed.astype(jnp.int32)
        agent_return = carry.agent_return + jnp.where(completed, pending_reward, 0.0)
        episode_len = carry.episode_len + 1
        episode_count = carry.episode_count + all_done.astype(jnp.int32)
        agent_done = jnp.where(all_done[:, None], False, carry.agent_done | ends)
        module_index = carry.module_index
        if not mapping.is_static:
            module_index = jnp.where(all_done[:, None],
                                     module_indices(carry.mapping_key, episode_count),
                                     module_index)
        new_carry = carry.replace(
            env_state=env_state,
            obs=next_obs,
            acting=to_act & ~agent_done,
            agent_done=agent_done,
            pending=pending & ~completed,
            pending_obs=pending_obs,
            pending_action=pending_action,
            pending_extras=pending_extras,
            pending_reward=jnp.where(completed, 0.0, pending_reward),
            module_index=module_index,
            key=key,
            episode_count=episode_count,
            episode_len=jnp.where(all_done, 0, episode_len),
            agent_len=jnp.where(all_done[:, None], 0, agent_len),
            agent_return=jnp.where(all_done[:, None], 0.0, agent_return),
            vector_step=carry.vector_step + jnp.uint32(1),
        )
        flags = (acting.astype(jnp.uint8) | (completed.astype(jnp.uint8) << 1)
                 | (terminated.astype(jnp.uint8) << 2) | (truncated.astype(jnp.uint8) << 3))
        record = _StepRecord(
            flags=flags,
            all_flags=all_terminated.astype(jnp.uint8) | (all_truncated.astype(jnp.uint8) << 1),
            obs=pending_obs, actions=pending_action,
            rewards=jnp.where(completed, pending_reward, 0.0), next_obs=final_obs,
            extra_model_outputs=pending_extras, env_rewards=reward,
            module_index=None if mapping.is_static else carry.module_index,
            valid=jnp.ones((), jnp.bool_))
        return new_carry, record

    def pending_zeros(params: Any, obs: dict, module_index: jax.Array, key: jax.Array):
        actions, extras = jax.eval_shape(act, params, obs, module_index, key)
        zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
        return jax.tree.map(zeros, actions), jax.tree.map(zeros, extras)

    def init_carry(key: jax.Array, mapping_key: jax.Array, params: Any, env_params: Any
                   ) -> MultiAgentCarry:
        key, reset_key = jax.random.split(key)
        obs, env_state = vmapped_reset(jax.random.split(reset_key, num_envs), env_params)
        episode_count = jnp.zeros((num_envs,), jnp.int32)
        module_index = module_indices(mapping_key, episode_count)
        zero_actions, zero_extras = pending_zeros(params, obs, module_index, key)
        return MultiAgentCarry(
            env_state=env_state, obs=obs, acting=acting_mask(env_state, env_params),
            agent_done=jnp.zeros((num_envs, num_agents), jnp.bool_),
            pending=jnp.zeros((num_envs, num_agents), jnp.bool_),
            pending_obs=jax.tree.map(jnp.zeros_like, obs), pending_action=zero_actions,
            pending_extras=zero_extras,
            pending_reward=jnp.zeros((num_envs, num_agents), jnp.float32),
            module_index=module_index, key=key, mapping_key=mapping_key,
            episode_count=episode_count,
            episode_len=jnp.zeros((num_envs,), jnp.int32),
            agent_len=jnp.zeros((num_envs, num_agents), jnp.int32),
            agent_return=jnp.zeros((num_envs, num_agents), jnp.float32),
            vector_step=jnp.zeros((), jnp.uint32),
            agent_steps=jnp.zeros((num_agents,), jnp.uint32),
            module_steps=jnp.zeros((num_modules,), jnp.uint32),
            metrics=MetricRegisters.create(spec.metrics_window),
            agent_metrics=_stack_registers(spec.metrics_window, num_agents),
            module_metrics=_stack_registers(spec.metrics_window, num_modules),
        )

    def reset_carry(carry: MultiAgentCarry, env_params: Any) -> MultiAgentCarry:
        """Restarts every sub-env; episodes in progress are abandoned (new ids)."""
        key, reset_key = jax.random.split(carry.key)
        obs, env_state = vmapped_reset(jax.random.split(reset_key, num_envs), env_params)
        episode_count = carry.episode_count + 1
        return carry.replace(
            env_state=env_state, obs=obs, acting=acting_mask(env_state, env_params),
            agent_done=jnp.zeros_like(carry.agent_done),
            pending=jnp.zeros_like(carry.pending),
            pending_reward=jnp.zeros_like(carry.pending_reward),
            module_index=module_indices(carry.mapping_key, episode_count),
            key=key, episode_count=episode_count,
            episode_len=jnp.zeros_like(carry.episode_len),
            agent_len=jnp.zeros_like(carry.agent_len),
            agent_return=jnp.zeros_like(carry.agent_return),
        )

    def init_lookback(carry: MultiAgentCarry, params: Any, env_params: Any
                      ) -> MultiAgentLookback:
        _, record = jax.eval_shape(vector_step, carry, params, env_params)
        zeros = lambda s: jnp.zeros((spec.lookback_len,) + s.shape, s.dtype)  # noqa: E731
        return MultiAgentLookback(
            obs=jax.tree.map(zeros, record.obs), actions=jax.tree.map(zeros, record.actions),
            rewards=zeros(record.rewards),
            extra_model_outputs=jax.tree.map(zeros, record.extra_model_outputs))

    def update_lookback(lookback: MultiAgentLookback, traj: MultiAgentTrajectory
                        ) -> MultiAgentLookback:
        if spec.lookback_len == 0:
            return lookback
        obs, actions, extras, rewards = {}, {}, {}, []
        for i, agent in enumerate(agents):
            positions = _last_positions(traj.completed[:, :, i], spec.lookback_len)
            gather = lambda old, new, p=positions: _gather_last(old, new, p)  # noqa: E731
            obs[agent] = jax.tree.map(gather, lookback.obs[agent], traj.obs[agent])
            actions[agent] = jax.tree.map(gather, lookback.actions[agent],
                                          traj.actions[agent])
            extras[agent] = jax.tree.map(gather, lookback.extra_model_outputs[agent],
                                         traj.extra_model_outputs[agent])
            rewards.append(gather(lookback.rewards[:, :, i], traj.rewards[:, :, i]))
        return MultiAgentLookback(obs=obs, actions=actions,
                                  rewards=jnp.stack(rewards, axis=-1),
                                  extra_model_outputs=extras)

    def to_trajectory(records: _StepRecord, start: MultiAgentCarry) -> MultiAgentTrajectory:
        """Decodes the flags and derives the per-step episode counters from the end flags
        and the chunk-start counters (vectorised over `(T, B)`)."""
        chunk_len = records.valid.shape[0]
        has = lambda bit: (records.flags & bit) != 0  # noqa: E731
        completed = has(_COMPLETED)
        all_terminated = (records.all_flags & 1) != 0
        all_truncated = (records.all_flags & 2) != 0
        ended = (all_terminated | all_truncated) & records.valid[:, None]  # (T, B)
        steps = jnp.arange(chunk_len, dtype=jnp.int32)[:, None]
        last_end = jax.lax.cummax(jnp.where(ended, steps, -1), axis=0)
        prev_end = jnp.concatenate([jnp.full((1, num_envs), -1, jnp.int32), last_end[:-1]])
        from_start = prev_end < 0  # (T, B): the step's episode began before the chunk
        episode_len = steps - prev_end + jnp.where(from_start, start.episode_len[None, :], 0)

        def since_episode_start(per_step: jax.Array, at_start: jax.Array) -> jax.Array:
            total = jnp.cumsum(per_step, axis=0)  # (T, B, A)
            index = jnp.maximum(prev_end, 0)[:, :, None]
            before = jnp.take_along_axis(total, jnp.broadcast_to(index, total.shape), axis=0)
            return jnp.where(from_start[:, :, None], total + at_start[None], total - before)

        if mapping.is_static:
            module_index = jnp.broadcast_to(jnp.asarray(mapping.static_indices()),
                                            (chunk_len, num_envs, num_agents))
        else:
            module_index = records.module_index
        return MultiAgentTrajectory(
            acted=has(_ACTED), completed=completed, obs=records.obs, actions=records.actions,
            rewards=records.rewards, next_obs=records.next_obs, terminated=has(_TERMINATED),
            truncated=has(_TRUNCATED), extra_model_outputs=records.extra_model_outputs,
            env_rewards=records.env_rewards, all_terminated=all_terminated,
            all_truncated=all_truncated, module_index=module_index, episode_len=episode_len,
            agent_len=since_episode_start(completed.astype(jnp.int32), start.agent_len),
            agent_return=since_episode_start(records.rewards, start.agent_return),
            valid=records.valid)

    def update_metrics(carry: MultiAgentCarry, traj: MultiAgentTrajectory,
                       start_step: jax.Array, episodes_limit: jax.Array):
        chunk_len = traj.episode_len.shape[0]
        valid = traj.valid[:, None]
        episode_done = (traj.all_terminated | traj.all_truncated) & valid  # (T, B)
        episode_return = jnp.sum(traj.agent_return, axis=-1)
        metrics, num_counted, counted_len, _, last_counted = _update_registers(
            carry.metrics,
            _RingInput(rewards=episode_return, terminated=episode_done,
                       truncated=jnp.zeros_like(episode_done), valid=traj.valid,
                       episode_return=episode_return, episode_len=traj.episode_len),
            start_step, episodes_limit)
        flat_index = jnp.arange(chunk_len * num_envs, dtype=jnp.int32).reshape(chunk_len,
                                                                               num_envs)
        counted = episode_done & (flat_index <= last_counted)
        present = traj.agent_len > 0  # (T, B, A)
        to_agent_first = lambda x: jnp.moveaxis(x, -1, 0)  # noqa: E731
        agent_metrics = jax.vmap(_ring, in_axes=(0, 0, 0, 0, None))(
            carry.agent_metrics, to_agent_first(counted[..., None] & present),
            to_agent_first(traj.agent_return), to_agent_first(traj.agent_len), start_step)
        one_hot = traj.module_index[..., None] == jnp.arange(num_modules)  # (T, B, A, M)
        in_module = one_hot & present[..., None]
        module_return = jnp.sum(jnp.where(in_module, traj.agent_return[..., None], 0.0),
                                axis=2)
        module_len = jnp.sum(jnp.where(in_module, traj.agent_len[..., None], 0), axis=2)
        module_present = jnp.any(in_module, axis=2)
        module_metrics = jax.vmap(_ring, in_axes=(0, 0, 0, 0, None))(
            carry.module_metrics, to_agent_first(counted[..., None] & module_present),
            to_agent_first(module_return), to_agent_first(module_len), start_step)
        completed = traj.completed  # False on invalid steps
        agent_steps = jnp.sum(completed, axis=(0, 1)).astype(jnp.uint32)
        module_steps = jnp.sum(completed[..., None] & one_hot, axis=(0, 1, 2)).astype(
            jnp.uint32)
        carry = carry.replace(metrics=metrics, agent_metrics=agent_metrics,
                              module_metrics=module_metrics,
                              agent_steps=carry.agent_steps + agent_steps,
                              module_steps=carry.module_steps + module_steps)
        return carry, num_counted, counted_len

    def chunk(carry: MultiAgentCarry, lookback: MultiAgentLookback, params: Any,
              env_params: Any, num_steps: jax.Array, episodes_limit: jax.Array,
              agent_steps_limit: jax.Array):
        """Runs up to `chunk_len` vector steps: a step is taken while fewer than
        `num_steps` steps were taken, fewer than `episodes_limit` episodes finished and
        fewer than `agent_steps_limit` agent steps completed in this chunk."""
        start = carry
        _, record_shape = jax.eval_shape(vector_step, carry, params, env_params)

        def step(loop):
            c, episodes_done, agent_steps_done = loop
            c, record = vector_step(c, params, env_params)
            episodes_done = episodes_done + jnp.sum((record.all_flags != 0).astype(jnp.int32))
            agent_steps_done = agent_steps_done + jnp.sum(
                ((record.flags & _COMPLETED) != 0).astype(jnp.int32))
            return (c, episodes_done, agent_steps_done), record.replace(valid=None)

        def keep_going(t, loop):
            _, episodes_done, agent_steps_done = loop
            return ((t < num_steps) & (episodes_done < episodes_limit)
                    & (agent_steps_done < agent_steps_limit))

        zero = jnp.zeros((), jnp.int32)
        steps_taken, (carry, _, agent_steps_done), records = scan_while(
            step, (carry, zero, zero), record_shape.replace(valid=None), spec.chunk_len,
            keep_going)
        records = records.replace(
            valid=jnp.arange(spec.chunk_len, dtype=jnp.int32) < steps_taken)
        traj = to_trajectory(records, start)
        carry, num_counted, counted_len = update_metrics(carry, traj, start.vector_step,
                                                         episodes_limit)
        lookback = update_lookback(lookback, traj)
        info = MultiAgentChunkInfo(
            num_steps=steps_taken, num_episodes=num_counted,
            episode_env_steps=counted_len, agent_steps=agent_steps_done,
            start_episode_count=start.episode_count, start_episode_len=start.episode_len,
            start_agent_len=start.agent_len)
        return carry, lookback, traj, info

    return MultiAgentRolloutFns(init_carry=init_carry, reset_carry=reset_carry,
                                init_lookback=init_lookback, chunk=chunk)


def make_module_batch_fn(spec: MultiAgentRolloutSpec
                         ) -> Callable[[MultiAgentTrajectory], dict[str, ModuleBatch]]:
    """Returns the pure `traj -> {module_id: ModuleBatch}` (see `ModuleBatch`)."""
    agents, module_ids = spec.agent_ids, spec.module_ids
    groups = spec.agents_of_module()

    def module_batches(traj: MultiAgentTrajectory) -> dict[str, ModuleBatch]:
        out = {}
        for module_id, members in groups.items():
            columns = [agents.index(a) for a in members]
            stack = lambda per_agent: jax.tree.map(  # noqa: E731
                lambda *xs: jnp.stack(xs, axis=2), *[per_agent[a] for a in members])
            pick = lambda x: x[:, :, columns]  # noqa: E731
            mask = (pick(traj.completed) & traj.valid[:, None, None]
                    & (pick(traj.module_index) == module_ids.index(module_id)))
            out[module_id] = ModuleBatch(
                obs=stack(traj.obs), actions=stack(traj.actions), rewards=pick(traj.rewards),
                next_obs=stack(traj.next_obs), terminated=pick(traj.terminated),
                truncated=pick(traj.truncated),
                extra_model_outputs=stack(traj.extra_model_outputs), mask=mask,
                agent_ids=members)
        return out

    return module_batches


__all__ = ["ModuleBatch", "MultiAgentCarry", "MultiAgentChunkInfo", "MultiAgentLookback",
           "MultiAgentRolloutFns", "MultiAgentRolloutSpec", "MultiAgentTrajectory",
           "make_module_batch_fn", "make_multi_agent_rollout_fns"]
