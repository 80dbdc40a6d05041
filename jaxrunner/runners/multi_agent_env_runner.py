"""`MultiAgentEnvRunner`: RLlib's multi-agent runner contract over a compiled rollout.

A thin stateful shell like `SingleAgentEnvRunner`: it owns the device carry, the params
of every module and one jitted chunk function per policy mode, and turns `sample()`
arguments into calls of the same compiled chunk. The semantics (who acts, how rewards
accumulate, what an agent step is) are in `jaxrunner.core.multi_agent_rollout`; the
episode-to-module mapping in `jaxrunner.core.mapping`; the per-agent connector pipelines
in `jaxrunner.connectors.multi_agent`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.config import RunnerConfig
from jaxrunner.connectors.base import ConnectorContext, ConnectorPipeline, call_factory
from jaxrunner.connectors.env_to_module import default_env_to_module_pieces
from jaxrunner.connectors.module_to_env import NormalizeAndClipActions
from jaxrunner.connectors.multi_agent import MultiAgentConnectorPipeline, copy_pieces
from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.mapping import (AgentMapping, MappingEpisode, default_policy_mapping_fn,
                                    mapping_episode, trace_mapping)
from jaxrunner.core.multi_agent_rollout import (MultiAgentRolloutSpec, make_module_batch_fn,
                                                make_multi_agent_rollout_fns)
from jaxrunner.envs.multi_agent import ALL, make_multi_agent_env
from jaxrunner.envs.spaces import action_dtype, batched_space, to_gymnasium
from jaxrunner.episodes.multi_agent_episode import MultiAgentEpisodeBatch
from jaxrunner.errors import StateStructureError
from jaxrunner.metrics.multi_agent import MultiAgentRunnerMetrics
from jaxrunner.modules.multi_rl_module import MultiRLModule
from jaxrunner.modules.rl_module import RLModuleSpec
from jaxrunner.runners.compiled_runner import (COMPONENT_ENV_TO_MODULE_CONNECTOR,
                                               COMPONENT_MODULE_TO_ENV_CONNECTOR, STATE_HINT,
                                               CompiledEnvRunner, check_module_fits)
from jaxrunner.structure import check_same_structure

COUNT_STEPS_BY = ("env_steps", "agent_steps")


def _is_multi_agent_env(config: RunnerConfig) -> bool:
    """The env is multi-agent (a config without `.multi_agent()` then maps every agent to
    its single module, `"default_policy"`)."""
    from jaxrunner.runners.selection import MULTI_AGENT, env_kind

    return config.env is not None and env_kind(config) == MULTI_AGENT


def _batch_struct(space: gym.spaces.Space, num_envs: int) -> Any:
    """`jax.ShapeDtypeStruct`s of a batch of `num_envs` observations of `space` (JAX
    dtypes: float64 becomes float32)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _batch_struct(s, num_envs) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_batch_struct(s, num_envs) for s in space.spaces)
    return jax.ShapeDtypeStruct((num_envs,) + tuple(space.shape or ()),
                                jax.dtypes.canonicalize_dtype(space.dtype))


class MultiAgentEnvRunner(CompiledEnvRunner):
    """Samples `num_envs_per_env_runner` sub-envs of a JAX multi-agent env with a
    `MultiRLModule`, all inside one compiled `lax.scan`.

    Configure with `config.multi_agent(policies=..., policy_mapping_fn=...,
    count_steps_by=..., policies_to_train=...)`; `config.is_multi_agent` must be True.

    Args:
        config: a `RunnerConfig`.
        worker_index: None (standalone), 0 (local runner of a group) or 1..N (remote).
        num_workers: remote runners in the group (default `config.num_env_runners`).
        spaces: `{module_id: (obs_space, act_space), ...}` for a local runner that has no
            env of its own.
    """

    def __init__(self, *, config: RunnerConfig, worker_index: int | None = None,
                 num_workers: int | None = None, spaces: dict | None = None, **kwargs: Any):
        if isinstance(config, RunnerConfig) and not config.is_multi_agent and not (
                _is_multi_agent_env(config)):
            raise ValueError(
                "MultiAgentEnvRunner needs a multi-agent config, but config.is_multi_agent is "
                f"False (policies={sorted(config.policies)}). Configure the modules with "
                "config.multi_agent(policies={'p0', 'p1'}, policy_mapping_fn=lambda "
                "agent_id, episode: ...), or use SingleAgentEnvRunner (or "
                "jaxrunner.runner_class_for(config)) for a single-agent config."
            )
        super().__init__(config=config, worker_index=worker_index, num_workers=num_workers,
                         spaces=spaces, **kwargs)

    _id_salt = "ma-"

    def _init_fields(self) -> None:
        if self.config.count_steps_by not in COUNT_STEPS_BY:
            raise ValueError(f"count_steps_by must be one of {list(COUNT_STEPS_BY)}, got "
                             f"{self.config.count_steps_by!r}.")
        self._agent_ids: tuple[str, ...] = ()
        self._mapping: AgentMapping | None = None
        self._metrics: MultiAgentRunnerMetrics | None = None
        self._host = None  # HostMultiAgentEngine for an RLlib / PettingZoo env
        self.env_to_module = MultiAgentConnectorPipeline({})
        self.module_to_env = MultiAgentConnectorPipeline({})
        # {agent_id: observation space after the agent's env-to-module pipeline}
        self.module_observation_spaces: dict[str, gym.spaces.Space] = {}

    # ------------------------------------------------------------------ construction
    def make_env(self) -> None:
        """Builds the env from `config.env` and checks that it follows the protocol and
        traces with JAX (fixed agents, dict keys, `agents_to_act`)."""
        cfg = self.config
        context = self._env_context()
        if self._make_host_env(context):
            return
        env, env_params, name = make_multi_agent_env(cfg.env, context)
        agents = tuple(env.agents)
        if not agents or len(set(agents)) != len(agents) or not all(
                isinstance(a, str) and a and a != ALL for a in agents):
            raise ValueError(
                f"The env {name!r} must have a fixed, non-empty tuple of distinct str agent "
                f"ids in env.agents (not {ALL!r}); got {agents!r}."
            )
        obs_spaces_gx = {a: env.observation_space(a, env_params) for a in agents}
        act_spaces_gx = {a: env.action_space(a, env_params) for a in agents}
        self._check_env_traces(env, env_params, agents, act_spaces_gx, name)
        self.env, self.env_params, self.env_name = env, env_params, name
        self._agent_ids = agents
        self._gymnax_action_spaces = act_spaces_gx
        self.observation_spaces = {a: to_gymnasium(s) for a, s in obs_spaces_gx.items()}
        self.action_spaces = {a: to_gymnasium(s) for a, s in act_spaces_gx.items()}
        self._env_action_dtypes = {a: action_dtype(s) for a, s in act_spaces_gx.items()}
        self._carry = None
        self._needs_reset = True
        self._compiled = {}
        if self.module is not None:
            self.make_module()

    def _make_host_env(self, context) -> bool:
        """Builds a host engine (`jaxrunner.runners.host_multi_agent_env`) when
        `config.env` is an RLlib `MultiAgentEnv` or a PettingZoo env; returns whether."""
        from jaxrunner.envs.host_multi_agent import host_multi_agent_source

        if self._host is not None:
            self._host.close()
            self._host = None
        source = host_multi_agent_source(self.config.env, context)
        if source is None:
            return False
        from jaxrunner.runners.host_env import HostEngineSettings
        from jaxrunner.runners.host_multi_agent_env import HostMultiAgentEngine

        host = HostMultiAgentEngine(source, HostEngineSettings.from_config(
            self.config, seed=self._seed, worker_index=self.worker_index,
            chunk_len=self._chunk_len()))
        self._host, self.env, self.env_params, self.env_name = host, host, None, host.name
        self._agent_ids = host.agents
        self._gymnax_action_spaces = host.gymnax_action_spaces
        self.observation_spaces, self.action_spaces = (host.observation_spaces,
                                                       host.action_spaces)
        self._env_action_dtypes = {a: action_dtype(s) for a, s in host.action_spaces.items()}
        self._carry, self._needs_reset, self._compiled = None, True, {}
        if self.module is not None:
            self.make_module()
        return True

    def _host_programs(self, mode: str) -> dict:
        """The host engine's compiled pieces for `mode` (cached with `_compiled`, so a new
        module rebuilds them)."""
        key = ("host_multi_agent", mode)
        if key not in self._compiled:
            explore = None if mode == "explore" else self._host_programs("explore")
            self._compiled[key] = self._host.programs(self._spec(), mode, explore)
        return self._compiled[key]

    def _ensure_carry(self) -> None:
        if self._carry is None and self._host is not None:
            programs = self._host_programs("explore")
            self._carry = self._host.init_carry(jax.random.fold_in(self._base_key, 2),
                                                self._params, programs)
            self._lookback = self._host.init_lookback(self._carry, self._params, programs)
            self._needs_reset = True  # the host envs are reset by the next sample()
        else:
            super()._ensure_carry()

    def _sample_on_host(self, mode, num_timesteps, num_episodes, force_reset):
        if self._host is None:
            return None
        self._ensure_carry()
        try:
            return self._sample_chunks(self._host.fns(self._host_programs(mode)), mode,
                                       num_timesteps, num_episodes, force_reset)
        except BaseException:
            self._needs_reset = True  # the host envs moved on without the carry
            raise
        finally:
            self._general_metrics().env_step_failures_lifetime += self._host.take_failures()

    def _carry_capturable(self) -> None:
        if self._host is not None:
            raise ValueError(
                "The 'env_runner_carry' state component is not available for a host "
                f"multi-agent env ({self.env_name!r}): its state lives in Python objects. "
                "get_state() gives the weights and the step counters.")

    def stop(self) -> None:
        if self._host is not None:
            self._host.close()
        super().stop()

    def _check_env_traces(self, env, env_params, agents, act_spaces_gx, name) -> None:
        key = jax.random.key(0)

        def probe(key):
            obs, state = env.reset(key, env_params)
            to_act = env.agents_to_act(state, env_params)
            if not isinstance(to_act, dict) or set(to_act) != set(agents):
                raise ValueError(
                    f"The env {name!r}: agents_to_act() must return a dict keyed by exactly "
                    f"the env's agents {list(agents)}, got "
                    f"{sorted(to_act) if isinstance(to_act, dict) else to_act!r}. The set of "
                    "agents is fixed; mark agents that do not act with False."
                )
            actions = {a: jnp.zeros(tuple(act_spaces_gx[a].shape), act_spaces_gx[a].dtype)
                       for a in agents}
            return env.step(key, state, actions, env_params)

        try:
            jax.eval_shape(probe, key)
        except ValueError:
            raise
        except Exception as error:  # noqa: BLE001 - re-raised with context
            raise TypeError(
                f"The env {name!r} cannot be traced by JAX ({type(error).__name__}: {error}). "
                "jaxrunner compiles reset(), step() and agents_to_act() into one program: "
                "they must be pure JAX functions with no Python control flow on array values "
                "and no host I/O."
            ) from error

    def _module_spec(self, module_id: str) -> RLModuleSpec:
        cfg = self.config
        spec = None
        if isinstance(cfg.policies, dict):
            spec = cfg.policies.get(module_id)
        if spec is None and isinstance(cfg.rl_module_spec, dict):
            spec = cfg.rl_module_spec.get(module_id)
        if spec is None and isinstance(cfg.rl_module_spec, RLModuleSpec):
            spec = cfg.rl_module_spec
        spec = spec if spec is not None else RLModuleSpec()
        if not isinstance(spec, RLModuleSpec):
            raise TypeError(
                f"The spec of module {module_id!r} must be a jaxrunner.RLModuleSpec or None "
                f"(in config.multi_agent(policies={{id: spec}}) or config.rl_module("
                f"rl_module_spec={{id: spec}})), got {spec!r}."
            )
        return spec

    def _module_spaces(self, module_id: str, spec: RLModuleSpec, mapping: AgentMapping | None,
                       obs_spaces: dict[str, gym.spaces.Space]
                       ) -> tuple[gym.spaces.Space, gym.spaces.Space]:
        """The module's spaces: those of the agents that can map to it, the observation
        space after their env-to-module pipelines (`obs_spaces`)."""
        if self.env is None:
            if module_id not in (self.spaces or {}):
                raise ValueError(f"No spaces for module {module_id!r} in the spaces given to "
                                 "this runner.")
            return self.spaces[module_id]
        members = [a for a in self._agent_ids if module_id in mapping.candidates[a]]
        if members:
            obs, act = obs_spaces[members[0]], self.action_spaces[members[0]]
            for agent in members[1:]:
                if (obs_spaces[agent], self.action_spaces[agent]) != (obs, act):
                    env_same = (self.observation_spaces[agent], self.action_spaces[agent]) == (
                        self.observation_spaces[members[0]], self.action_spaces[members[0]])
                    raise ValueError(
                        f"Agents {members[0]!r} and {agent!r} can both map to module "
                        f"{module_id!r} but have different spaces ({obs}, {act} vs "
                        f"{obs_spaces[agent]}, {self.action_spaces[agent]}); a "
                        "module acts in one observation and action space."
                        + (" The env gives both agents the same spaces: their "
                           "env-to-module connector pipelines produce different "
                           "observation spaces. Make the pieces agree for agents that "
                           "share a module, or map the agents to different modules."
                           if env_same else "")
                    )
            for given, own, what in ((spec.observation_space, obs, "observation"),
                                     (spec.action_space, act, "action")):
                if given is not None and given != own:
                    raise ValueError(
                        f"Module {module_id!r} is given the {what} space {given}, but the "
                        f"agents mapped to it ({members}) have {own}."
                    )
            return obs, act
        if spec.observation_space is not None and spec.action_space is not None:
            return spec.observation_space, spec.action_space
        pairs = {(repr(obs_spaces[a]), repr(self.action_spaces[a])) for a in self._agent_ids}
        if len(pairs) == 1:
            first = self._agent_ids[0]
            return obs_spaces[first], self.action_spaces[first]
        raise ValueError(
            f"No agent maps to module {module_id!r}, so its spaces cannot be taken from the "
            "env; give them: config.multi_agent(policies={"
            f"{module_id!r}: RLModuleSpec(observation_space=..., action_space=...)}})."
        )

    def _env_spaces(self) -> dict[str, tuple]:
        """`__env__` (batched) and `__env_single__` spaces: `gym.spaces.Dict`s keyed by
        agent id (what a connector factory gets as `spaces`)."""
        single = (gym.spaces.Dict(self.observation_spaces), gym.spaces.Dict(self.action_spaces))
        return {"__env__": (batched_space(single[0], self.num_envs),
                            batched_space(single[1], self.num_envs)),
                "__env_single__": single}

    def _build_connectors(self) -> tuple[tuple[MultiAgentConnectorPipeline, ...], dict]:
        """The per-agent env-to-module and module-to-env pipelines (RLlib's
        `env_runners()` settings, as for the single-agent runner) and the observation
        space each agent's module input has; see `jaxrunner.connectors.multi_agent`.

        env-to-module: [FlattenObservations for Dict/Tuple spaces (default), *user pieces].
        module-to-env: [*user pieces, NormalizeAndClipActions (default)].
        The factories are called once; each agent gets a copy of their pieces."""
        cfg = self.config
        spaces = self._env_spaces()
        templates = {}
        for kind, factory in (("env_to_module", cfg.env_to_module_connector),
                              ("module_to_env", cfg.module_to_env_connector)):
            templates[kind] = ([] if factory is None else
                               call_factory(factory, self.env, spaces, bind_action_space=False))
        env_to_module, module_to_env = {}, {}
        for agent in self._agent_ids:
            act_space = self.action_spaces[agent]
            pieces = []
            if cfg.add_default_connectors_to_env_to_module_pipeline:
                pieces += default_env_to_module_pieces(self.observation_spaces[agent])
            pieces += copy_pieces(templates["env_to_module"], agent, "env_to_module")
            env_to_module[agent] = ConnectorPipeline(pieces)
            env_to_module[agent].bind_action_space(act_space)
            pieces = copy_pieces(templates["module_to_env"], agent, "module_to_env")
            if cfg.add_default_connectors_to_module_to_env_pipeline:
                pieces.append(NormalizeAndClipActions(
                    act_space, normalize_actions=cfg.normalize_actions,
                    clip_actions=cfg.clip_actions, env_dtype=self._env_action_dtypes[agent]))
            module_to_env[agent] = ConnectorPipeline(pieces)
            module_to_env[agent].bind_action_space(act_space)
        e2m = MultiAgentConnectorPipeline(env_to_module)
        m2e = MultiAgentConnectorPipeline(module_to_env)
        obs_spaces = e2m.recompute_observation_spaces(self.observation_spaces)
        self._check_connectors(e2m, m2e, obs_spaces)
        return (e2m, m2e), obs_spaces

    def _check_connectors(self, env_to_module: MultiAgentConnectorPipeline,
                          module_to_env: MultiAgentConnectorPipeline, obs_spaces: dict) -> None:
        """Both pipelines of every agent keep the batch axis and produce what the spaces
        say (traced with `eval_shape`: nothing runs or compiles)."""
        num_envs, agents = self.num_envs, self._agent_ids
        key = jax.eval_shape(lambda: jax.random.key(0))  # shapes only: nothing compiles
        if self._host is not None:
            obs = {a: _batch_struct(self.observation_spaces[a], num_envs) for a in agents}
        else:
            obs = jax.eval_shape(
                lambda k: jax.vmap(self.env.reset, in_axes=(0, None))(
                    jax.random.split(k, num_envs), self.env_params)[0], key)
        actions = {a: jax.eval_shape(
            lambda k, a=a: jax.vmap(self._gymnax_action_spaces[a].sample)(
                jax.random.split(k, num_envs)), key) for a in agents}
        flag = jax.ShapeDtypeStruct((num_envs,), jnp.bool_)
        contexts = {a: ConnectorContext(
            is_first=flag, prev_action=actions[a],
            prev_reward=jax.ShapeDtypeStruct((num_envs,), jnp.float32), mask=flag)
            for a in agents}
        expected = {a: (None if isinstance(obs_spaces[a], (gym.spaces.Dict, gym.spaces.Tuple))
                        else (num_envs,) + tuple(obs_spaces[a].shape)) for a in agents}
        env_to_module.check("env_to_module", obs, contexts, expected, num_envs)
        module_to_env.check("module_to_env", actions, contexts,
                            {a: actions[a].shape for a in agents}, num_envs)

    def make_module(self) -> None:
        """Builds the `MultiRLModule` and traces `policy_mapping_fn` (an unknown module id
        raises here, before anything is compiled). On an error the runner keeps its
        previous module, mapping and weights."""
        cfg = self.config
        if self.env is None and self.spaces is None:
            self.module = None
            return
        module_ids = tuple(sorted(cfg.policies))
        mapping = None
        pipelines = (MultiAgentConnectorPipeline({}), MultiAgentConnectorPipeline({}))
        obs_spaces: dict[str, gym.spaces.Space] = {}
        if self.env is not None:
            fn = cfg.policy_mapping_fn or default_policy_mapping_fn(module_ids)
            mapping = trace_mapping(fn, self._agent_ids, module_ids)
            pipelines, obs_spaces = self._build_connectors()
        modules = {}
        for module_id in module_ids:
            spec = self._module_spec(module_id)
            obs_space, act_space = self._module_spaces(module_id, spec, mapping, obs_spaces)
            modules[module_id] = RLModuleSpec(
                module_class=spec.module_class, observation_space=obs_space,
                action_space=act_space,
                model_config={**cfg.model_config_with_defaults, **(spec.model_config or {})},
                inference_only=True).build()
        module = MultiRLModule(modules, policies_to_train=cfg.policies_to_train)
        shapes = self._set_initial_params(module)
        if mapping is not None:
            self._check_modules_fit(module, shapes, mapping, obs_spaces)
        self.module = module
        self._mapping = mapping
        self.env_to_module, self.module_to_env = pipelines
        self.module_observation_spaces = obs_spaces
        if (self._metrics is None or self._metrics.agent_ids != self._agent_ids
                or self._metrics.module_ids != module_ids):
            self._metrics = MultiAgentRunnerMetrics(self.num_envs, self._agent_ids, module_ids)
        self._carry = None
        self._needs_reset = True
        self._compiled = {}

    def _pipelines(self) -> list[tuple[str, MultiAgentConnectorPipeline]]:
        return [(COMPONENT_ENV_TO_MODULE_CONNECTOR, self.env_to_module),
                (COMPONENT_MODULE_TO_ENV_CONNECTOR, self.module_to_env)]

    def _check_modules_fit(self, module: MultiRLModule, params: dict, mapping: AgentMapping,
                           obs_spaces: dict[str, gym.spaces.Space]) -> None:
        for module_id in module.module_ids:
            members = [a for a in self._agent_ids if module_id in mapping.candidates[a]]
            if not members:
                continue
            check_module_fits(module[module_id], params[module_id], obs_spaces[members[0]],
                              self.action_spaces[members[0]], self.num_envs * len(members),
                              f"Module {module_id!r}")

    def _spec(self) -> MultiAgentRolloutSpec:
        cfg = self.config
        return MultiAgentRolloutSpec(
            env=self.env, module=self.module, mapping=self._mapping,
            gymnax_action_spaces=self._gymnax_action_spaces,
            action_spaces=self.action_spaces, num_envs=self.num_envs,
            chunk_len=self._chunk_len(), lookback_len=cfg.episode_lookback_horizon,
            metrics_window=cfg.metrics_window,
            env_action_dtypes=dict(self._env_action_dtypes),
            env_to_module=self.env_to_module, module_to_env=self.module_to_env,
            check_finite=cfg.check_finite, autoreset_mode=cfg.autoreset_mode,
            partial_reset_ratio=cfg.partial_reset_ratio,
            restart_failed_sub_environments=cfg.restart_failed_sub_environments,
            callbacks=self._device_callbacks, steps_per_loop_check=self._steps_per_loop_check())

    def _rollout_fns(self, mode: str):
        return make_multi_agent_rollout_fns(self._spec(), mode)

    def _module_batch_fn(self):
        if "module_batches" not in self._compiled:
            self._compiled["module_batches"] = jax.jit(make_module_batch_fn(self._spec()))
        return self._compiled["module_batches"]

    def mapping_episode(self, env_index: int, episode_index: int) -> MappingEpisode:
        """The `episode` argument `policy_mapping_fn` gets for episode `episode_index` of
        sub-env `env_index` (concrete arrays: call the mapping on it to see its choice)."""
        self._ensure_carry()
        return mapping_episode(self._carry.mapping_key, env_index, episode_index,
                               self._mapping.module_ids)

    # ------------------------------------------------------------------ sampling
    def _counts_agent_steps(self) -> bool:
        return self.config.count_steps_by == "agent_steps"

    def _make_batch(self, chunks, infos, lookback_at_start, vector_steps, mode, num_episodes,
                    discarded) -> MultiAgentEpisodeBatch:
        first = infos[0] if infos else None
        start_info = ((first.start_episode_count, first.start_episode_len,
                       first.start_agent_len) if first else
                      (self._carry.episode_count, self._carry.episode_len,
                       self._carry.agent_len))
        return MultiAgentEpisodeBatch(
            chunks=tuple(chunks), start_info=start_info, lookback=lookback_at_start,
            num_steps=vector_steps, num_envs=self.num_envs, mode=mode,
            num_episodes=num_episodes, id_prefix=self._id_prefix, agent_ids=self._agent_ids,
            module_ids=self.module.module_ids, observation_spaces=self.observation_spaces,
            action_spaces=self.action_spaces, module_batch_fn=self._module_batch_fn(),
            weights_seq_no=self._weights_seq_no, discarded_env_steps=discarded,
            # A copy: the next sample() donates the carry's own buffer.
            end_acting=jnp.copy(self._carry.acting))

    def _check_layout_sample_args(self) -> None:
        if self.config.count_steps_by not in COUNT_STEPS_BY:
            raise ValueError(f"count_steps_by must be one of {list(COUNT_STEPS_BY)}, got "
                             f"{self.config.count_steps_by!r}.")
        if tuple(self.env.agents) != self._agent_ids:
            raise ValueError(
                f"The env {self.env_name!r} changed its agents from {list(self._agent_ids)} "
                f"to {list(self.env.agents)}. Multi-agent envs have a fixed set of agents "
                "(RLlib's possible_agents): keep env.agents fixed and say who acts with "
                "agents_to_act(); call make_env() to rebuild the runner for a new env."
            )

    # ------------------------------------------------------------------ metrics
    def _general_metrics(self):
        return None if self._metrics is None else self._metrics.general

    def _reduce_metrics(self) -> dict[str, Any]:
        """RLlib's keys, with the per-agent and per-module keys as `{id: value}` dicts."""
        if self._carry is None:
            empty = jax.device_get(MetricRegisters.create(1))
            stack = lambda n: jax.tree.map(  # noqa: E731
                lambda x: np.zeros((n,) + np.shape(x), np.asarray(x).dtype), empty)
            values = (empty, stack(len(self._agent_ids)), stack(len(self.module.module_ids)),
                      np.zeros(len(self._agent_ids)), np.zeros(len(self.module.module_ids)))
        else:
            c = self._carry
            values = jax.device_get((c.metrics, c.agent_metrics, c.module_metrics,
                                     c.agent_steps, c.module_steps))
        return self._metrics.reduce(*values)

    def get_metrics(self) -> dict[str, Any]:
        if self._metrics is None:
            raise ValueError("This runner has no module (no env and no spaces).")
        return super().get_metrics()

    def get_metrics_window(self) -> dict[str, Any]:
        """The finished episodes in this runner's smoothing windows as host arrays:
        `episode_return` float64, `episode_len` int64, `episode_duration_sec` float64
        (each `(n,)`, n <= W, over all episodes), `agent_episode_return`
        `{agent_id: (n_a,) float64}` (the episodes each agent stepped in) and
        `module_episode_return` `{module_id: (n_m,) float64}` (per module: the sum of the
        returns of its agents in an episode). Every agent and module id has an entry
        (empty when its window is).

        `EnvRunnerGroup.get_metrics()` merges these windows so that means are taken over
        all runners' episodes, not averaged per runner. Changes nothing (no reduce).
        """
        if self._metrics is None:
            raise ValueError("This runner has no module (no env and no spaces).")
        module_ids = tuple(self.module.module_ids)
        if self._carry is None:
            general = jax.device_get(MetricRegisters.create(1))
            window = self._metrics.general.window_values(general)
            window["agent_episode_return"] = {a: np.zeros(0, np.float64)
                                              for a in self._agent_ids}
            window["module_episode_return"] = {m: np.zeros(0, np.float64) for m in module_ids}
            window["custom_metrics"] = self._custom_metrics_window()
            return window
        general, agents, modules = jax.device_get(
            (self._carry.metrics, self._carry.agent_metrics, self._carry.module_metrics))

        def rows(registers: Any, ids: tuple[str, ...]) -> dict[str, np.ndarray]:
            sizes = np.asarray(registers.window_size)
            returns = np.asarray(registers.window_return, np.float64)
            return {name: returns[i, : int(sizes[i])] for i, name in enumerate(ids)}

        window = self._metrics.general.window_values(general)
        window["agent_episode_return"] = rows(agents, self._agent_ids)
        window["module_episode_return"] = rows(modules, module_ids)
        window["custom_metrics"] = self._custom_metrics_window()
        return window

    # ------------------------------------------------------------------ state
    def _load_weights(self, weights: Any) -> dict:
        """`rl_module` state is `{module_id: weights}`; a subset of the modules is fine."""
        if not isinstance(weights, dict) or not set(weights) <= set(self.module.module_ids):
            got = sorted(weights) if isinstance(weights, dict) else type(weights).__name__
            raise StateStructureError(
                f"set_state: rl_module must be a dict keyed by module ids (a subset of "
                f"{list(self.module.module_ids)}), got {got}.")
        new_params = dict(self._params)
        for module_id, module_weights in weights.items():
            try:
                module_weights = self.module[module_id].params_for_inference(module_weights)
            except (KeyError, TypeError) as error:
                raise StateStructureError(
                    f"set_state: weights of module {module_id!r} do not fit "
                    f"{type(self.module[module_id]).__name__} ({type(error).__name__}: "
                    f"{error}).") from error
            check_same_structure(self._params[module_id], module_weights,
                                 f"set_state: the rl_module weights of {module_id!r}",
                                 hint=STATE_HINT)
            new_params[module_id] = jax.tree.map(lambda old, new: jnp.asarray(new, old.dtype),
                                                 self._params[module_id], module_weights)
        return new_params

    # ------------------------------------------------------------------ the rest
    def get_spaces(self) -> dict[str, tuple]:
        """`{module_id: (obs_space, act_space)}` plus `__env__` (batched) and
        `__env_single__` (`gym.spaces.Dict` keyed by agent id).

        A module's observation space is the one its agents' env-to-module connector
        pipelines produce (the env's when they have no pieces), as in RLlib."""
        if self.env is None:
            if self.spaces is None:
                raise ValueError("This runner has neither an env nor spaces given to it.")
            return dict(self.spaces)
        spaces = self._env_spaces()
        for module_id in self.module.module_ids:
            rl_module = self.module[module_id]
            spaces[module_id] = (rl_module.observation_space, rl_module.action_space)
        return spaces

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self._agent_ids

    def __repr__(self) -> str:
        return (f"MultiAgentEnvRunner(env={self.env_name!r}, num_envs={self.num_envs}, "
                f"agents={list(self._agent_ids)}, modules="
                f"{list(self.module.module_ids) if self.module else None}, "
                f"worker_index={self.worker_index})")


__all__ = ["MultiAgentEnvRunner"]
