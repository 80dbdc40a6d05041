"""The multi-agent layout of the one rollout chunk (`jaxrunner.core.chunk`).

Shapes: `T` chunk length, `B` sub-envs, `A` agents (the env's fixed `agents`, in that
order), `M` modules (sorted ids), `W` metrics window, `L` lookback horizon. Per-agent
arrays whose shapes differ between agents (observations, actions, model outputs) are dicts
keyed by agent id; per-agent scalars are stacked on a last `A` axis.

RLlib's multi-agent semantics, per sub-env and agent:

* Only agents in `acting` (the env's `agents_to_act`, minus agents already done) act.
* Each agent's env-to-module connector pipeline (`spec.env_to_module[agent]`) turns its
  observations into its module's input, and its module-to-env pipeline turns the
  module's actions into the env's; both run with the agent's acting mask as the
  context's `mask` (stateful pieces advance only at the agent's turns), `is_first` = the
  agent's first action of the episode, and the action and reward of the agent's last
  agent step as `prev_action` / `prev_reward` (`jaxrunner.connectors.multi_agent`).
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
* A sub-env that fails (the chunk's fault detection) ends its episode for every agent:
  nothing of that step completes, pending agent steps are dropped, and the episode is
  discarded (`failed`), never counted in the metric rings.

The layout's per-step record is a compact `_StepRecord` (flags packed in bytes, no
per-step episode counters, no module index for a static mapping); the public
`MultiAgentTrajectory`, the counters and the per-agent and per-module metric rings are
derived after the scan, vectorised over `(T, B)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxrunner.connectors.multi_agent import agent_contexts
from jaxrunner.core.autoreset import EnvStepFns
from jaxrunner.core.callbacks import StepView
from jaxrunner.core.carry import (FAILED_FLAG, TERMINATED_FLAG, TRUNCATED_FLAG,
                                  MetricRegisters, pack_step_flags)
from jaxrunner.core.chunk import ChunkFns, check_policy_mode, make_chunk_fns
from jaxrunner.core.lookback import gather_last, last_positions, zeros_like_steps
from jaxrunner.core.mapping import AgentMapping
from jaxrunner.core.ring import RingInput, count_true, stacked_registers, write_episodes
from jaxrunner.core.rollout import _uniform_logp, action_mask_fn, random_legal_actions
from jaxrunner.modules.distributions import masked_logits
from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv


@struct.dataclass
class MultiAgentCarry:
    """Everything the multi-agent rollout carries from one vector step to the next."""

    env_state: Any  # pytree, leaves (B, ...)
    obs: dict  # aid -> (B, *obs_shape): the env's latest observation (after auto-reset)
    key: jax.Array  # () typed PRNG key
    episode_count: jax.Array  # (B,) int32: index of the current episode on each sub-env
    episode_len: jax.Array  # (B,) int32: env steps of the current episode (all calls)
    consecutive_failures: jax.Array  # (B,) int32: failed steps in a row on each sub-env
    vector_step: jax.Array  # () uint32: vector steps taken (mod 2**32)
    metrics: MetricRegisters  # whole episodes: return = sum of agent returns
    acting: jax.Array  # (B, A) bool: agents that act at the next step
    agent_done: jax.Array  # (B, A) bool: agents done in the current episode
    pending: jax.Array  # (B, A) bool: the agent acted and its agent step is not completed
    pending_obs: dict  # aid -> (B, *obs_shape): observation the pending action was taken on
    pending_action: dict  # aid -> (B, *act_shape)
    pending_extras: dict  # aid -> {name: (B, ...)}
    pending_reward: jax.Array  # (B, A) float32: rewards since the pending action
    module_index: jax.Array  # (B, A) int32: module of each agent in the current episode
    mapping_key: jax.Array  # () typed PRNG key the mapping episodes' keys derive from
    agent_len: jax.Array  # (B, A) int32: completed agent steps of the current episode
    agent_len_in_call: jax.Array  # (B, A) int32: ... of them completed in this sample() call
    agent_return: jax.Array  # (B, A) float32: return of each agent in the current episode
    agent_steps: jax.Array  # (A,) uint32: completed agent steps per agent (mod 2**32)
    module_steps: jax.Array  # (M,) uint32: completed agent steps per module (mod 2**32)
    agent_metrics: MetricRegisters  # leaves (A, ...): per agent, episodes it stepped in
    module_metrics: MetricRegisters  # leaves (M, ...): per module, episodes it stepped in
    # Recurrent modules' state: {module_id: leaves (K * B, ...)}, the rows of the K agents
    # that can map to the module stacked agent-major (as the module's input batch).
    module_state: dict
    # (env-to-module, module-to-env) states, each {aid: pipeline state}.
    connector_state: Any
    # (B, A) float32: reward of each agent's last completed agent step (the connectors'
    # `prev_reward`), or None when no connector piece reads the context.
    last_step_reward: Any
    callbacks: Any = None  # core.callbacks.CallbackCarry with device callbacks, else None


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
    failed: jax.Array  # (T, B) bool: the sub-env failed at step t (episode discarded)
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
    all_flags: jax.Array  # (B,) uint8: the episode's end flags (`core.carry.pack_step_flags`)
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
    env_action_dtypes: dict  # aid -> dtype the env takes the agent's actions in
    # connectors.multi_agent.MultiAgentConnectorPipeline: observations -> module inputs
    env_to_module: Any
    # ... : module actions -> env actions (default: NormalizeAndClipActions per agent)
    module_to_env: Any
    check_finite: bool = True  # a non-finite observation or reward is a sub-env failure
    autoreset_mode: str = "gymnax"  # "gymnax" (env.step resets) or "partial"
    partial_reset_ratio: int = 16  # "partial": ceil(B / ratio) resets computed per step
    restart_failed_sub_environments: bool = False  # recreate failed sub-envs in the scan
    callbacks: Any = None  # core.callbacks.DeviceCallbacks, or None (none traced)
    # Vector steps a chunk takes between two tests of its loop condition (1 on CPU; on
    # GPU each test waits for the device); see `jaxrunner.core.chunk.scan_while`.
    steps_per_loop_check: int = 1

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


def multi_agent_step_fns(env: Any) -> EnvStepFns:
    """`EnvStepFns` of a jaxrunner `MultiAgentEnv` (its `step_env` behind the base class's
    action masking, for autoreset_mode="partial")."""
    def step_no_reset(key, state, actions, params):
        acting = env.agents_to_act(state, params)
        return env.step_env(key, state, env._full_actions(actions, acting, params), params)

    own_step = isinstance(env, MultiAgentEnv) and type(env).step is MultiAgentEnv.step
    return EnvStepFns(
        auto_step=env.step, reset=env.reset, step_no_reset=step_no_reset,
        auto_step_with_keys=env.step_with_keys if own_step else None,
        takes_reset_gate=own_step and type(env).step_with_keys is MultiAgentEnv.step_with_keys,
        episode_done=lambda terminateds, truncateds: jnp.logical_or(
            jnp.asarray(terminateds[ALL], jnp.bool_), jnp.asarray(truncateds[ALL], jnp.bool_)))


def _select(flag: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    return jnp.where(flag.reshape(flag.shape + (1,) * (new.ndim - 1)), new, old)


class MultiAgentLayout:
    """The chunk's multi-agent layout (see the `jaxrunner.core.chunk` protocol)."""

    carry_cls = MultiAgentCarry
    counts_agent_steps = True

    def __init__(self, spec: MultiAgentRolloutSpec, mode: str):
        check_policy_mode(mode)
        self.spec, self.mode = spec, mode
        self.step_fns = multi_agent_step_fns(spec.env)
        self.agents, self.module_ids = spec.agent_ids, spec.module_ids
        self.num_agents, self.num_modules = len(self.agents), len(self.module_ids)
        self.groups = spec.agents_of_module()
        self._vmapped_to_act = jax.vmap(spec.env.agents_to_act, in_axes=(0, None))
        # The env-to-module pipelines run (not with random actions, as single-agent).
        self._env_to_module = len(spec.env_to_module) > 0 and mode != "random"
        # Some piece reads the context: the carry tracks the agents' last step rewards
        # (in every mode: one carry serves every mode).
        self._connectors = (spec.env_to_module.reads_context
                            or spec.module_to_env.reads_context)
        self._vmapped_indices = jax.vmap(spec.mapping.indices, in_axes=(None, 0, 0))
        self.stateful = tuple(m for m in self.groups if spec.module[m].is_stateful())
        self._action_mask = None
        if callable(getattr(spec.env, "action_mask", None)):
            for agent, space in spec.action_spaces.items():
                action_mask_fn(spec.env, space)  # Discrete only: a clear error otherwise
            self._action_mask = jax.vmap(spec.env.action_mask, in_axes=(0, None))
        for agent in self.agents:
            candidates = [m for m in spec.mapping.candidates[agent] if m in self.groups]
            states = {repr(jax.tree.structure(spec.module[m].get_initial_state()))
                      if m in self.stateful else None for m in candidates}
            if len(states) > 1:
                raise ValueError(
                    f"Agent {agent!r} can map to modules {candidates} whose recurrent states "
                    "differ (or only some are recurrent); an agent's modules must carry the "
                    "same state structure. Map the agent to modules of one kind.")

    def _initial_module_state(self) -> dict:
        num_envs = self.spec.num_envs
        return {m: jax.tree.map(
            lambda x, rows=len(self.groups[m]) * num_envs: jnp.broadcast_to(
                jnp.asarray(x), (rows,) + jnp.shape(x)),
            self.spec.module[m].get_initial_state()) for m in self.stateful}

    def _rows(self, module_id: str, per_agent: jax.Array) -> jax.Array:
        """`(K * B,)` rows of a `(B, A)` per-agent flag for the module's input batch."""
        columns = [self.agents.index(a) for a in self.groups[module_id]]
        return jnp.concatenate([per_agent[:, i] for i in columns], axis=0)

    # ------------------------------------------------------------------ helpers
    def _acting_mask(self, env_state: Any, env_params: Any) -> jax.Array:
        to_act = self._vmapped_to_act(env_state, env_params)
        return jnp.stack([jnp.asarray(to_act[a], jnp.bool_) for a in self.agents], axis=-1)

    def _module_indices(self, mapping_key: jax.Array, episode_count: jax.Array) -> jax.Array:
        mapping, num_envs = self.spec.mapping, self.spec.num_envs
        if mapping.is_static:
            return jnp.broadcast_to(jnp.asarray(mapping.static_indices()),
                                    (num_envs, self.num_agents))
        return self._vmapped_indices(mapping_key, jnp.arange(num_envs, dtype=jnp.int32),
                                     episode_count)

    def _dist_dim(self, agent: str) -> int:
        spec = self.spec
        first = spec.module[spec.mapping.candidates[agent][0]]
        return first.action_dist_cls.required_input_dim(spec.action_spaces[agent])

    def _policy(self, params: Any, obs: dict, module_index: jax.Array, module_state: dict,
                acting: jax.Array, key: jax.Array, masks: dict | None = None
                ) -> tuple[dict, dict, dict]:
        """Every agent's action and extras (`action_logp`, `action_dist_inputs`, and
        `state_out` for recurrent modules), and the recurrent modules' next state (only
        the rows of agents in `acting` (B, A) advance). `masks` (`{agent: (B, n) bool}`,
        from the env's `action_mask`) restrict every mode to legal actions."""
        spec, agents, num_envs = self.spec, self.agents, self.spec.num_envs
        if self.mode == "random":
            actions, extras = {}, {}
            for agent, agent_key in zip(agents, jax.random.split(key, self.num_agents)):
                if masks is not None:
                    actions[agent], logp = random_legal_actions(agent_key, masks[agent])
                else:
                    sample = jax.vmap(spec.gymnax_action_spaces[agent].sample)
                    actions[agent] = sample(jax.random.split(agent_key, num_envs))
                    logp = _uniform_logp(spec.action_spaces[agent], num_envs)
                extras[agent] = {
                    "action_logp": logp,
                    "action_dist_inputs": jnp.zeros((num_envs, self._dist_dim(agent)),
                                                    jnp.float32),
                }
            for module_id in self.stateful:  # the same record in every mode
                for k, agent in enumerate(self.groups[module_id]):
                    extras[agent]["state_out"] = jax.tree.map(
                        lambda x, k=k: x[k * num_envs:(k + 1) * num_envs],
                        module_state[module_id])
            return actions, extras, module_state
        per_module: dict[tuple[str, str], tuple] = {}
        new_state = dict(module_state)
        group_keys = jax.random.split(key, max(1, len(self.groups)))
        for (module_id, members), group_key in zip(self.groups.items(), group_keys):
            rl_module = spec.module[module_id]
            x = (obs[members[0]] if len(members) == 1
                 else jnp.concatenate([obs[a] for a in members], axis=0))
            forward = (rl_module.forward_exploration if self.mode == "explore"
                       else rl_module.forward_inference)
            batch = {"obs": x}
            mask = None
            if masks is not None:
                mask = (masks[members[0]] if len(members) == 1
                        else jnp.concatenate([masks[a] for a in members], axis=0))
                batch["action_mask"] = mask
            if module_id in self.stateful:
                batch["state_in"] = module_state[module_id]
            out = forward(params[module_id], batch)
            dist_inputs = out["action_dist_inputs"]
            if mask is not None:
                dist_inputs = masked_logits(dist_inputs, mask)
            if module_id in self.stateful:
                advance = self._rows(module_id, acting)
                new_state[module_id] = jax.tree.map(
                    lambda n, o: _select(advance, n, o), out["state_out"],
                    module_state[module_id])
            dist = rl_module.action_dist_cls.from_inputs(dist_inputs)
            actions = (dist.sample(group_key) if self.mode == "explore"
                       else dist.deterministic_sample())
            logp = dist.logp(actions)
            for k, agent in enumerate(members):
                part = slice(k * num_envs, (k + 1) * num_envs)
                state_out = (jax.tree.map(lambda x, p=part: x[p], new_state[module_id])
                             if module_id in self.stateful else None)
                per_module[(agent, module_id)] = (actions[part], logp[part],
                                                  dist_inputs[part].astype(jnp.float32),
                                                  state_out)
        actions, extras = {}, {}
        for i, agent in enumerate(agents):
            candidates = spec.mapping.candidates[agent]
            action, logp, inputs, state_out = per_module[(agent, candidates[-1])]
            for candidate in reversed(candidates[:-1]):
                chosen = module_index[:, i] == self.module_ids.index(candidate)
                c_action, c_logp, c_inputs, c_state = per_module[(agent, candidate)]
                action = _select(chosen, c_action, action)
                logp = jnp.where(chosen, c_logp, logp)
                inputs = jnp.where(chosen[:, None], c_inputs, inputs)
                if state_out is not None:
                    state_out = jax.tree.map(lambda n, o, c=chosen: _select(c, n, o),
                                             c_state, state_out)
            actions[agent] = action
            extras[agent] = {"action_logp": logp, "action_dist_inputs": inputs}
            if state_out is not None:
                extras[agent]["state_out"] = state_out
        return actions, extras, new_state

    # ------------------------------------------------------------------ carry
    def init_fields(self, key, obs, env_state, params, env_params) -> dict:
        num_envs, num_agents = self.spec.num_envs, self.num_agents
        act_key, mapping_key = jax.random.split(key)
        module_index = self._module_indices(mapping_key, jnp.zeros((num_envs,), jnp.int32))
        module_state = self._initial_module_state()
        acting = self._acting_mask(env_state, env_params)
        masks = (None if self._action_mask is None
                 else self._action_mask(env_state, env_params))
        connector_state = (self.spec.env_to_module.init_state(num_envs),
                           self.spec.module_to_env.init_state(num_envs))
        first = jnp.ones((num_envs, num_agents), jnp.bool_)
        module_obs = obs
        if self._env_to_module:
            sampled = {a: jax.eval_shape(jax.vmap(self.spec.gymnax_action_spaces[a].sample),
                                         jax.random.split(act_key, num_envs))
                       for a in self.agents}
            contexts = agent_contexts(self.agents, acting, first, sampled, None)
            module_obs = jax.eval_shape(self.spec.env_to_module.apply, connector_state[0],
                                        obs, contexts)[1]
        actions, extras, _ = jax.eval_shape(self._policy, params, module_obs, module_index,
                                            module_state, acting, act_key, masks)
        zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
        window = self.spec.metrics_window
        return dict(
            connector_state=connector_state,
            last_step_reward=(jnp.zeros((num_envs, num_agents), jnp.float32)
                              if self._connectors else None),
            acting=acting,
            agent_done=jnp.zeros((num_envs, num_agents), jnp.bool_),
            pending=jnp.zeros((num_envs, num_agents), jnp.bool_),
            pending_obs=jax.tree.map(jnp.zeros_like, obs),
            pending_action=jax.tree.map(zeros, actions),
            pending_extras=jax.tree.map(zeros, extras),
            pending_reward=jnp.zeros((num_envs, num_agents), jnp.float32),
            module_index=module_index, mapping_key=mapping_key, module_state=module_state,
            agent_len=jnp.zeros((num_envs, num_agents), jnp.int32),
            agent_len_in_call=jnp.zeros((num_envs, num_agents), jnp.int32),
            agent_return=jnp.zeros((num_envs, num_agents), jnp.float32),
            agent_steps=jnp.zeros((num_agents,), jnp.uint32),
            module_steps=jnp.zeros((self.num_modules,), jnp.uint32),
            agent_metrics=stacked_registers(window, num_agents),
            module_metrics=stacked_registers(window, self.num_modules))

    def reset_fields(self, carry: MultiAgentCarry, env_params) -> dict:
        return dict(
            acting=self._acting_mask(carry.env_state, env_params),
            agent_done=jnp.zeros_like(carry.agent_done),
            pending=jnp.zeros_like(carry.pending),
            pending_reward=jnp.zeros_like(carry.pending_reward),
            module_index=self._module_indices(carry.mapping_key, carry.episode_count),
            agent_len=jnp.zeros_like(carry.agent_len),
            agent_len_in_call=jnp.zeros_like(carry.agent_len_in_call),
            agent_return=jnp.zeros_like(carry.agent_return),
            module_state=self._initial_module_state())

    # ------------------------------------------------------------------ one step
    def act(self, params, carry: MultiAgentCarry, key, env_params):
        masks = None
        if self._action_mask is not None:  # the env says which actions are legal
            masks = self._action_mask(carry.env_state, env_params)
        e2m_state, m2e_state = carry.connector_state
        contexts = dict.fromkeys(self.agents)  # no piece reads it
        if self._connectors:
            # The agent's first action of the episode: no completed and no pending step.
            first = carry.acting & (carry.agent_len == 0) & ~carry.pending
            contexts = agent_contexts(self.agents, carry.acting, first, carry.pending_action,
                                      carry.last_step_reward)
        module_obs = carry.obs
        if self._env_to_module:
            e2m_state, module_obs = self.spec.env_to_module.apply(e2m_state, carry.obs,
                                                                  contexts)
        actions, extras, module_state = self._policy(params, module_obs, carry.module_index,
                                                     carry.module_state, carry.acting, key,
                                                     masks)
        env_actions = actions
        if len(self.spec.module_to_env) > 0:
            m2e_state, env_actions = self.spec.module_to_env.apply(m2e_state, actions,
                                                                   contexts)
        env_actions = {a: jnp.asarray(env_actions[a]).astype(self.spec.env_action_dtypes[a])
                       for a in self.agents}
        return env_actions, (actions, extras, module_state, (e2m_state, m2e_state))

    def outcome(self, rewards, terminateds, truncateds):
        agents = self.agents
        reward = jnp.stack([jnp.asarray(rewards[a], jnp.float32) for a in agents], axis=-1)
        all_terminated = jnp.asarray(terminateds[ALL], jnp.bool_)
        all_truncated = jnp.asarray(truncateds[ALL], jnp.bool_) & ~all_terminated
        agent_terminated = jnp.stack([jnp.asarray(terminateds[a], jnp.bool_) for a in agents],
                                     axis=-1) | all_terminated[:, None]
        agent_truncated = jnp.stack([jnp.asarray(truncateds[a], jnp.bool_) for a in agents],
                                    axis=-1) | all_truncated[:, None]
        return reward, agent_terminated, agent_truncated, all_terminated, all_truncated

    def after_step(self, carry: MultiAgentCarry, acted, step, env_params):
        actions, extras, module_state, connector_state = acted
        agents, acting = self.agents, carry.acting
        failed = step.failed[:, None]  # (B, 1): the episode is dropped for every agent
        all_done = step.ended  # the episode ended (done or failed): a new one starts

        # Acting agents start a new agent step (they have no pending one: getting the
        # observation they act on completed it).
        def start_step(new: dict, old: dict) -> dict:
            return {a: jax.tree.map(lambda n, o, i=i: _select(acting[:, i], n, o), new[a],
                                    old[a]) for i, a in enumerate(agents)}

        pending_obs = start_step(carry.obs, carry.pending_obs)
        pending_action = start_step(actions, carry.pending_action)
        pending_extras = start_step(extras, carry.pending_extras)
        pending = carry.pending | acting
        ends = (step.terminated | step.truncated) & ~carry.agent_done & ~failed
        to_act = self._acting_mask(step.env_state, env_params)  # of the next (reset) state
        gets_obs = to_act & ~all_done[:, None] & ~carry.agent_done & ~ends
        pending_reward = jnp.where(acting, 0.0, carry.pending_reward)
        pending_reward = pending_reward + jnp.where(pending, step.reward, 0.0)
        completed = pending & (gets_obs | ends)
        terminated = completed & ends & step.terminated
        truncated = completed & ends & step.truncated & ~step.terminated
        agent_len = carry.agent_len + completed.astype(jnp.int32)
        agent_return = carry.agent_return + jnp.where(completed, pending_reward, 0.0)
        agent_len_in_call = carry.agent_len_in_call + completed.astype(jnp.int32)
        agent_done = jnp.where(all_done[:, None], False, carry.agent_done | ends)
        module_index = carry.module_index
        if not self.spec.mapping.is_static:
            module_index = jnp.where(
                all_done[:, None],
                self._module_indices(carry.mapping_key, carry.episode_count
                                     + all_done.astype(jnp.int32)), module_index)
        reset = all_done[:, None]
        fields = dict(
            connector_state=connector_state,
            last_step_reward=(None if carry.last_step_reward is None else jnp.where(
                completed, pending_reward, carry.last_step_reward)),
            acting=to_act & ~agent_done,
            agent_done=agent_done,
            pending=pending & ~completed & ~failed,
            pending_obs=pending_obs,
            pending_action=pending_action,
            pending_extras=pending_extras,
            pending_reward=jnp.where(completed | failed, 0.0, pending_reward),
            module_index=module_index,
            agent_len=jnp.where(reset, 0, agent_len),
            agent_len_in_call=jnp.where(reset, 0, agent_len_in_call),
            agent_return=jnp.where(reset, 0.0, agent_return),
            # A new episode (or a recreated sub-env) starts from the initial state.
            module_state={m: jax.tree.map(
                lambda init, cur, m=m: _select(jnp.tile(all_done, len(self.groups[m])),
                                               init, cur),
                self._initial_module_state()[m], module_state[m]) for m in self.stateful},
        )
        flags = (acting.astype(jnp.uint8) | (completed.astype(jnp.uint8) << 1)
                 | (terminated.astype(jnp.uint8) << 2) | (truncated.astype(jnp.uint8) << 3))
        all_flags = pack_step_flags(step.all_terminated, step.all_truncated, step.failed)
        record = _StepRecord(
            flags=flags, all_flags=all_flags, obs=pending_obs, actions=pending_action,
            rewards=jnp.where(completed, pending_reward, 0.0), next_obs=step.final_obs,
            extra_model_outputs=pending_extras, env_rewards=step.reward,
            module_index=None if self.spec.mapping.is_static else carry.module_index,
            valid=jnp.ones((), jnp.bool_))
        return fields, record

    def callback_view(self, carry: MultiAgentCarry, acted, step, info) -> StepView:
        """Per-agent dicts (the episode's flags under "__all__"); see `StepView`."""
        actions, extras = acted[:2]
        agents = self.agents
        per_agent = lambda x: {a: x[:, i] for i, a in enumerate(agents)}  # noqa: E731
        terminated = {**per_agent(step.terminated), ALL: step.all_terminated}
        truncated = {**per_agent(step.truncated), ALL: step.all_truncated}
        return StepView(obs=carry.obs, action=dict(actions), reward=per_agent(step.reward),
                        terminated=terminated, truncated=truncated, next_obs=step.final_obs,
                        info=info, extra_model_outputs={
                            a: {k: v for k, v in extras[a].items() if k != "state_out"}
                            for a in agents},
                        acting=per_agent(carry.acting))

    @staticmethod
    def record_counts(record: _StepRecord):
        episodes = jnp.sum(((record.all_flags & (TERMINATED_FLAG | TRUNCATED_FLAG)) != 0)
                           .astype(jnp.int32))
        return episodes, jnp.sum(((record.flags & _COMPLETED) != 0).astype(jnp.int32))

    @staticmethod
    def begin_chunk(carry: MultiAgentCarry, call_step_offset) -> MultiAgentCarry:
        """The first chunk of a `sample()` call starts counting the call's agent steps."""
        return carry.replace(agent_len_in_call=jnp.where(
            call_step_offset == 0, 0, carry.agent_len_in_call))

    # ------------------------------------------------------------------ after the scan
    def decode(self, records: _StepRecord, start: MultiAgentCarry) -> MultiAgentTrajectory:
        """Decodes the flags and derives the per-step episode counters from the end flags
        and the chunk-start counters (vectorised over `(T, B)`)."""
        chunk_len, num_envs = records.valid.shape[0], self.spec.num_envs
        has = lambda bit: (records.flags & bit) != 0  # noqa: E731
        completed = has(_COMPLETED)
        all_terminated = (records.all_flags & TERMINATED_FLAG) != 0
        all_truncated = (records.all_flags & TRUNCATED_FLAG) != 0
        failed = (records.all_flags & FAILED_FLAG) != 0
        ended = all_terminated | all_truncated | failed  # (T, B); False past the last step
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

        mapping = self.spec.mapping
        if mapping.is_static:
            module_index = jnp.broadcast_to(jnp.asarray(mapping.static_indices()),
                                            (chunk_len, num_envs, self.num_agents))
        else:
            module_index = records.module_index
        return MultiAgentTrajectory(
            acted=has(_ACTED), completed=completed, obs=records.obs, actions=records.actions,
            rewards=records.rewards, next_obs=records.next_obs, terminated=has(_TERMINATED),
            truncated=has(_TRUNCATED), extra_model_outputs=records.extra_model_outputs,
            env_rewards=records.env_rewards, all_terminated=all_terminated,
            all_truncated=all_truncated, failed=failed, module_index=module_index,
            episode_len=episode_len,
            agent_len=since_episode_start(completed.astype(jnp.int32), start.agent_len),
            agent_return=since_episode_start(records.rewards, start.agent_return),
            valid=records.valid)

    @staticmethod
    def ring_input(traj: MultiAgentTrajectory) -> RingInput:
        return RingInput(done=traj.all_terminated | traj.all_truncated, failed=traj.failed,
                         valid=traj.valid, episode_return=jnp.sum(traj.agent_return, axis=-1),
                         episode_len=traj.episode_len)

    def after_ring(self, carry: MultiAgentCarry, traj: MultiAgentTrajectory,
                   start: MultiAgentCarry, update) -> MultiAgentCarry:
        """The per-agent and per-module rings and step counters."""
        chunk_len, num_envs = traj.episode_len.shape
        episode_done = traj.all_terminated | traj.all_truncated  # (T, B); as the ring's
        flat_index = jnp.arange(chunk_len * num_envs, dtype=jnp.int32).reshape(chunk_len,
                                                                               num_envs)
        counted = episode_done & (flat_index <= update.last_counted)
        present = traj.agent_len > 0  # (T, B, A)
        to_first = lambda x: jnp.moveaxis(x, -1, 0)  # noqa: E731
        ring = jax.vmap(write_episodes, in_axes=(0, 0, 0, 0, None))
        agent_metrics = ring(carry.agent_metrics, to_first(counted[..., None] & present),
                             to_first(traj.agent_return), to_first(traj.agent_len),
                             start.vector_step)
        one_hot = traj.module_index[..., None] == jnp.arange(self.num_modules)  # (T,B,A,M)
        in_module = one_hot & present[..., None]
        module_return = jnp.sum(jnp.where(in_module, traj.agent_return[..., None], 0.0),
                                axis=2)
        module_len = jnp.sum(jnp.where(in_module, traj.agent_len[..., None], 0), axis=2)
        module_present = jnp.any(in_module, axis=2)
        module_metrics = ring(carry.module_metrics,
                              to_first(counted[..., None] & module_present),
                              to_first(module_return), to_first(module_len), start.vector_step)
        completed = traj.completed  # False on invalid steps
        agent_steps = jnp.sum(completed, axis=(0, 1)).astype(jnp.uint32)
        module_steps = jnp.sum(completed[..., None] & one_hot, axis=(0, 1, 2)).astype(
            jnp.uint32)
        return carry.replace(agent_metrics=agent_metrics, module_metrics=module_metrics,
                             agent_steps=carry.agent_steps + agent_steps,
                             module_steps=carry.module_steps + module_steps)

    def init_lookback(self, record: _StepRecord) -> MultiAgentLookback:
        zeros = lambda tree: zeros_like_steps(tree, self.spec.lookback_len)  # noqa: E731
        return MultiAgentLookback(obs=zeros(record.obs), actions=zeros(record.actions),
                                  rewards=zeros(record.rewards),
                                  extra_model_outputs=zeros(record.extra_model_outputs))

    def roll_lookback(self, lookback: MultiAgentLookback, traj: MultiAgentTrajectory,
                      steps_taken) -> MultiAgentLookback:
        lookback_len = self.spec.lookback_len
        if lookback_len == 0:
            return lookback
        obs, actions, extras, rewards = {}, {}, {}, []
        for i, agent in enumerate(self.agents):
            positions = last_positions(traj.completed[:, :, i], lookback_len)
            gather = lambda old, new, p=positions: gather_last(old, new, p)  # noqa: E731
            obs[agent] = jax.tree.map(gather, lookback.obs[agent], traj.obs[agent])
            actions[agent] = jax.tree.map(gather, lookback.actions[agent],
                                          traj.actions[agent])
            extras[agent] = jax.tree.map(gather, lookback.extra_model_outputs[agent],
                                         traj.extra_model_outputs[agent])
            rewards.append(gather(lookback.rewards[:, :, i], traj.rewards[:, :, i]))
        return MultiAgentLookback(obs=obs, actions=actions,
                                  rewards=jnp.stack(rewards, axis=-1),
                                  extra_model_outputs=extras)

    @staticmethod
    def info_extras(start: MultiAgentCarry, carry: MultiAgentCarry,
                    traj: MultiAgentTrajectory, agent_steps_done) -> dict:
        # A failed episode's agent steps of this call, from one scan over the rows that
        # runs only when a sub-env failed.
        failed = traj.failed  # (T, B); False past the last step
        discarded = jax.lax.cond(
            count_true(failed) > 0,
            lambda: jnp.sum(jnp.where(failed[..., None], _agent_steps_in_call(traj, start),
                                      0)),
            lambda: jnp.zeros((), jnp.int32))
        return dict(agent_steps=agent_steps_done, discarded_agent_steps=discarded,
                    start_agent_len=start.agent_len)


def _agent_steps_in_call(traj: MultiAgentTrajectory, start: MultiAgentCarry) -> jax.Array:
    """(T, B, A) int32: the completed agent steps of step t's episode within the current
    `sample()` call, up to and including step t."""
    ended = traj.all_terminated | traj.all_truncated | traj.failed  # False past the last step

    def row(running, xs):
        completed, end = xs
        running = running + completed.astype(jnp.int32)
        return jnp.where(end[:, None], 0, running), running

    _, per_step = jax.lax.scan(row, start.agent_len_in_call, (traj.completed, ended))
    return per_step


def make_multi_agent_rollout_fns(spec: MultiAgentRolloutSpec, mode: str) -> ChunkFns:
    """The pure rollout functions of a multi-agent `spec` for one policy `mode`; the
    signatures are those of `jaxrunner.core.rollout.make_rollout_fns`."""
    return make_chunk_fns(MultiAgentLayout(spec, mode))


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


__all__ = ["ModuleBatch", "MultiAgentCarry", "MultiAgentLayout", "MultiAgentLookback",
           "MultiAgentRolloutSpec", "MultiAgentTrajectory", "make_module_batch_fn",
           "make_multi_agent_rollout_fns"]
