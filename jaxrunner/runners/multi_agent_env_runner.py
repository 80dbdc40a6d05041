"""`MultiAgentEnvRunner`: RLlib's multi-agent runner contract over a compiled rollout.

A thin stateful shell like `SingleAgentEnvRunner`: it owns the device carry, the params
of every module and one jitted chunk function per policy mode, and turns `sample()`
arguments into calls of the same compiled chunk. The semantics (who acts, how rewards
accumulate, what an agent step is) are in `jaxrunner.core.multi_agent_rollout`; the
episode-to-module mapping in `jaxrunner.core.mapping`.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.config import RunnerConfig
from jaxrunner.connectors.actions import make_actions_for_env
from jaxrunner.core.mapping import (AgentMapping, MappingEpisode, default_policy_mapping_fn,
                                    mapping_episode, trace_mapping)
from jaxrunner.core.multi_agent_rollout import (MultiAgentRolloutSpec, make_module_batch_fn,
                                                make_multi_agent_rollout_fns)
from jaxrunner.core.rollout import NO_EPISODE_LIMIT
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.multi_agent import ALL, make_multi_agent_env
from jaxrunner.envs.spaces import action_dtype, batched_space, to_gymnasium
from jaxrunner.episodes.multi_agent_episode import MultiAgentEpisodeBatch
from jaxrunner.errors import SampleArgumentError, StateStructureError
from jaxrunner.metrics.multi_agent import MultiAgentRunnerMetrics
from jaxrunner.modules.multi_rl_module import MultiRLModule
from jaxrunner.modules.rl_module import RLModuleSpec, init_params
from jaxrunner.runners.env_runner import EnvRunner
from jaxrunner.runners.single_agent_env_runner import (_ALL_COMPONENTS, _DEFAULT_COMPONENTS,
                                                       _STATE_KEYS, COMPONENT_CARRY,
                                                       COMPONENT_ENV_TO_MODULE_CONNECTOR,
                                                       COMPONENT_MODULE_TO_ENV_CONNECTOR,
                                                       COMPONENT_RL_MODULE, _as_set,
                                                       _check_same_structure)

COUNT_STEPS_BY = ("env_steps", "agent_steps")
# An agent_steps-mode sample() gives up after this many vector steps without any agent
# step completing (an env whose agents never get an observation nor finish).
_MAX_IDLE_VECTOR_STEPS = 100_000


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


class MultiAgentEnvRunner(EnvRunner):
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
        if isinstance(config, RunnerConfig) and not config.is_multi_agent:
            raise ValueError(
                "MultiAgentEnvRunner needs a multi-agent config, but config.is_multi_agent is "
                f"False (policies={sorted(config.policies)}). Configure the modules with "
                "config.multi_agent(policies={'p0', 'p1'}, policy_mapping_fn=lambda "
                "agent_id, episode: ...), or use SingleAgentEnvRunner (or "
                "jaxrunner.runner_class_for(config)) for a single-agent config."
            )
        super().__init__(config=config, worker_index=worker_index, num_workers=num_workers,
                         **kwargs)
        cfg = self.config
        if cfg.count_steps_by not in COUNT_STEPS_BY:
            raise ValueError(f"count_steps_by must be one of {list(COUNT_STEPS_BY)}, got "
                             f"{cfg.count_steps_by!r}.")
        if cfg.seed is None:
            self._seed = None
            seed_for_key = int.from_bytes(os.urandom(4), "little")
        else:
            self._seed = int(cfg.seed + (worker_index or 0) + 1_000_000 * cfg.in_evaluation)
            seed_for_key = self._seed
        self._base_key = jax.random.key(seed_for_key)
        self._id_prefix = hashlib.sha1(
            f"ma-{seed_for_key}-{worker_index}-"
            f"{os.urandom(8).hex() if cfg.seed is None else ''}".encode()).hexdigest()[:12]
        self.num_envs = cfg.num_envs_per_env_runner
        self.spaces = spaces
        self.env = None
        self.env_params = None
        self.env_name: str | None = None
        self.module: MultiRLModule | None = None
        self._agent_ids: tuple[str, ...] = ()
        self._mapping: AgentMapping | None = None
        self._params: dict | None = None
        self._weights_seq_no = 0
        self._metrics: MultiAgentRunnerMetrics | None = None
        self._carry = None
        self._lookback = None
        self._needs_reset = True
        self._compiled: dict[str, Any] = {}
        self._stopped = False
        if (worker_index is None or worker_index > 0 or cfg.create_env_on_local_worker
                or cfg.num_env_runners == 0):
            self.make_env()
        self.make_module()

    # ------------------------------------------------------------------ construction
    def make_env(self) -> None:
        """Builds the env from `config.env` and checks that it follows the protocol and
        traces with JAX (fixed agents, dict keys, `agents_to_act`)."""
        cfg = self.config
        if isinstance(cfg.env_config, EnvContext):
            context = cfg.env_config
        else:
            context = EnvContext(cfg.env_config, worker_index=self.worker_index,
                                 num_workers=self.num_workers)
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

    def _module_spaces(self, module_id: str, spec: RLModuleSpec, mapping: AgentMapping | None
                       ) -> tuple[gym.spaces.Space, gym.spaces.Space]:
        if self.env is None:
            if module_id not in (self.spaces or {}):
                raise ValueError(f"No spaces for module {module_id!r} in the spaces given to "
                                 "this runner.")
            return self.spaces[module_id]
        members = [a for a in self._agent_ids if module_id in mapping.candidates[a]]
        if members:
            obs, act = self.observation_spaces[members[0]], self.action_spaces[members[0]]
            for agent in members[1:]:
                if (self.observation_spaces[agent], self.action_spaces[agent]) != (obs, act):
                    raise ValueError(
                        f"Agents {members[0]!r} and {agent!r} can both map to module "
                        f"{module_id!r} but have different spaces ({obs}, {act} vs "
                        f"{self.observation_spaces[agent]}, {self.action_spaces[agent]}); a "
                        "module acts in one observation and action space."
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
        pairs = {(repr(self.observation_spaces[a]), repr(self.action_spaces[a]))
                 for a in self._agent_ids}
        if len(pairs) == 1:
            first = self._agent_ids[0]
            return self.observation_spaces[first], self.action_spaces[first]
        raise ValueError(
            f"No agent maps to module {module_id!r}, so its spaces cannot be taken from the "
            "env; give them: config.multi_agent(policies={"
            f"{module_id!r}: RLModuleSpec(observation_space=..., action_space=...)}})."
        )

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
        if self.env is not None:
            fn = cfg.policy_mapping_fn or default_policy_mapping_fn(module_ids)
            mapping = trace_mapping(fn, self._agent_ids, module_ids)
        modules = {}
        for module_id in module_ids:
            spec = self._module_spec(module_id)
            obs_space, act_space = self._module_spaces(module_id, spec, mapping)
            modules[module_id] = RLModuleSpec(
                module_class=spec.module_class, observation_space=obs_space,
                action_space=act_space,
                model_config={**cfg.model_config_with_defaults, **(spec.model_config or {})},
                inference_only=True).build()
        module = MultiRLModule(modules, policies_to_train=cfg.policies_to_train)
        params = init_params(module, jax.random.fold_in(self._base_key, 1))
        if mapping is not None:
            self._check_modules_fit(module, params, mapping)
        self.module = module
        self._mapping = mapping
        self._params = jax.device_put(params)
        if (self._metrics is None or self._metrics.agent_ids != self._agent_ids
                or self._metrics.module_ids != module_ids):
            self._metrics = MultiAgentRunnerMetrics(self.num_envs, self._agent_ids, module_ids)
        self._carry = None
        self._needs_reset = True
        self._compiled = {}

    def _check_modules_fit(self, module: MultiRLModule, params: dict, mapping: AgentMapping
                           ) -> None:
        for module_id in module.module_ids:
            members = [a for a in self._agent_ids if module_id in mapping.candidates[a]]
            if not members:
                continue
            rl_module = module[module_id]
            act_space = self.action_spaces[members[0]]
            needed = rl_module.action_dist_cls.required_input_dim(act_space)
            batch = self.num_envs * len(members)
            obs_space = self.observation_spaces[members[0]]
            obs = jax.ShapeDtypeStruct((batch,) + tuple(obs_space.shape),
                                       np.dtype(obs_space.dtype))
            try:
                out = jax.eval_shape(rl_module.forward_exploration, params[module_id],
                                     {"obs": obs})
            except Exception as error:  # noqa: BLE001 - re-raised with context
                raise ValueError(
                    f"Module {module_id!r} ({type(rl_module).__name__}) fails on a batch of "
                    f"observations of shape {obs.shape} ({type(error).__name__}: {error})."
                ) from error
            got = getattr(out.get("action_dist_inputs"), "shape", None)
            if got != (batch, needed):
                raise ValueError(
                    f"Module {module_id!r} outputs action_dist_inputs of shape {got}, but "
                    f"the action space {act_space} needs ({batch}, {needed}). Make the "
                    f"module's last layer output {needed} values."
                )

    def _chunk_len(self) -> int:
        fragment = self.config.get_rollout_fragment_length(self.worker_index or 0)
        return max(1, min(fragment, self.config.max_chunk_length))

    def _spec(self) -> MultiAgentRolloutSpec:
        cfg = self.config
        return MultiAgentRolloutSpec(
            env=self.env, module=self.module, mapping=self._mapping,
            gymnax_action_spaces=self._gymnax_action_spaces,
            action_spaces=self.action_spaces, num_envs=self.num_envs,
            chunk_len=self._chunk_len(), lookback_len=cfg.episode_lookback_horizon,
            metrics_window=cfg.metrics_window,
            actions_for_env={a: make_actions_for_env(
                self.action_spaces[a], normalize_actions=cfg.normalize_actions,
                clip_actions=cfg.clip_actions, env_dtype=self._env_action_dtypes[a])
                for a in self._agent_ids})

    def _fns(self, mode: str) -> dict:
        """The rollout functions for `mode`, jitted once per runner build."""
        if mode not in self._compiled:
            fns = make_multi_agent_rollout_fns(self._spec(), mode)
            self._compiled[mode] = {
                "init_carry": jax.jit(fns.init_carry),
                "reset_carry": jax.jit(fns.reset_carry, donate_argnums=(0,)),
                "init_lookback": jax.jit(fns.init_lookback),
                "chunk": jax.jit(fns.chunk, donate_argnums=(0,)),
            }
        return self._compiled[mode]

    def _module_batch_fn(self):
        if "module_batches" not in self._compiled:
            self._compiled["module_batches"] = jax.jit(make_module_batch_fn(self._spec()))
        return self._compiled["module_batches"]

    def _ensure_carry(self) -> None:
        if self._carry is None:
            fns = self._fns("explore")
            self._carry = fns["init_carry"](jax.random.fold_in(self._base_key, 2),
                                            jax.random.fold_in(self._base_key, 3),
                                            self._params, self.env_params)
            self._lookback = fns["init_lookback"](self._carry, self._params, self.env_params)
            self._needs_reset = False

    def mapping_episode(self, env_index: int, episode_index: int) -> MappingEpisode:
        """The `episode` argument `policy_mapping_fn` gets for episode `episode_index` of
        sub-env `env_index` (concrete arrays: call the mapping on it to see its choice)."""
        self._ensure_carry()
        return mapping_episode(self._carry.mapping_key, env_index, episode_index,
                               self._mapping.module_ids)

    # ------------------------------------------------------------------ sampling
    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None,
               explore: bool | None = None, random_actions: bool = False,
               force_reset: bool = False) -> MultiAgentEpisodeBatch:
        """Samples `num_timesteps` steps (in `config.count_steps_by` units) or
        `num_episodes` whole episodes.

        "env_steps": between `n` and `n + num_envs - 1` env steps (the sum of the returned
        episodes' `len()`). "agent_steps": between `n` and `n + num_envs * num_agents - 1`
        completed agent steps (the sum of their `agent_steps()`). Episodes still running
        are cut and continue in the next call (same ids; per agent the single-agent
        contract holds). Episode mode resets every sub-env and returns exactly `k`
        episodes that started and finished in the call. With neither size,
        `batch_mode` decides ("truncate_episodes": `rollout_fragment_length * num_envs`
        units; "complete_episodes": `num_envs` episodes).
        """
        self._check_sample_args(num_timesteps, num_episodes, explore, random_actions,
                                force_reset)
        start_time = time.perf_counter()
        explore = self.config.explore if explore is None else explore
        mode = "random" if random_actions else ("explore" if explore else "inference")
        if num_timesteps is None and num_episodes is None:
            if self.config.batch_mode == "truncate_episodes":
                num_timesteps = (self.config.get_rollout_fragment_length(self.worker_index or 0)
                                 * self.num_envs)
            else:
                num_episodes = self.num_envs
        fns = self._fns(mode)
        self._ensure_carry()
        if num_episodes is not None or force_reset or self._needs_reset:
            self._carry = fns["reset_carry"](self._carry, self.env_params)
            self._needs_reset = False
        lookback_at_start = self._lookback
        chunks, infos = [], []
        chunk_len = self._chunk_len()
        if num_episodes is not None:
            vector_steps, counted, returned_steps = 0, 0, 0
            while counted < num_episodes:
                info = self._run_chunk(fns, chunk_len, num_episodes - counted,
                                       NO_EPISODE_LIMIT, chunks, infos)
                steps, episodes, ep_steps = jax.device_get(
                    (info.num_steps, info.num_episodes, info.episode_env_steps))
                vector_steps += int(steps)
                counted += int(episodes)
                returned_steps += int(ep_steps)
            self._needs_reset = True  # episodes in flight are dropped, as in RLlib
            discarded = vector_steps * self.num_envs - returned_steps
            batch_mode = "episodes"
        elif self.config.count_steps_by == "env_steps":
            vector_steps = math.ceil(num_timesteps / self.num_envs)
            remaining = vector_steps
            while remaining > 0:
                steps = min(remaining, chunk_len)
                self._run_chunk(fns, steps, NO_EPISODE_LIMIT, NO_EPISODE_LIMIT, chunks, infos)
                remaining -= steps
            discarded = 0
            batch_mode = "timesteps"
        else:
            vector_steps, agent_steps, idle = 0, 0, 0
            while agent_steps < num_timesteps:
                limit = min(num_timesteps - agent_steps, int(NO_EPISODE_LIMIT))
                info = self._run_chunk(fns, chunk_len, NO_EPISODE_LIMIT, limit, chunks, infos)
                steps, completed = (int(x) for x in jax.device_get(
                    (info.num_steps, info.agent_steps)))
                vector_steps += steps
                agent_steps += completed
                idle = idle + steps if completed == 0 else 0
                if idle >= _MAX_IDLE_VECTOR_STEPS:
                    raise RuntimeError(
                        f"sample(num_timesteps={num_timesteps}) with count_steps_by="
                        f"'agent_steps': the env {self.env_name!r} completed no agent step in "
                        f"{idle} vector steps (no agent got an observation or finished). "
                        "Check its agents_to_act() and termination, or count env_steps."
                    )
            discarded = 0
            batch_mode = "timesteps"
        jax.block_until_ready(self._carry.vector_step)
        first = infos[0] if infos else None
        start_info = ((first.start_episode_count, first.start_episode_len,
                       first.start_agent_len) if first else
                      (self._carry.episode_count, self._carry.episode_len,
                       self._carry.agent_len))
        batch = MultiAgentEpisodeBatch(
            chunks=tuple(chunks), start_info=start_info, lookback=lookback_at_start,
            num_steps=vector_steps, num_envs=self.num_envs, mode=batch_mode,
            num_episodes=num_episodes, id_prefix=self._id_prefix, agent_ids=self._agent_ids,
            module_ids=self.module.module_ids, observation_spaces=self.observation_spaces,
            action_spaces=self.action_spaces, module_batch_fn=self._module_batch_fn(),
            weights_seq_no=self._weights_seq_no)
        self._metrics.record_sample(vector_steps=vector_steps,
                                    env_steps=vector_steps * self.num_envs,
                                    discarded_env_steps=discarded, start_time=start_time,
                                    end_time=time.perf_counter())
        return batch

    def _run_chunk(self, fns, num_steps: int, episodes_limit, agent_steps_limit,
                   chunks: list, infos: list):
        carry, lookback, traj, info = fns["chunk"](
            self._carry, self._lookback, self._params, self.env_params, np.int32(num_steps),
            np.int32(episodes_limit), np.int32(agent_steps_limit))
        self._carry, self._lookback = carry, lookback
        chunks.append(traj)
        infos.append(info)
        return info

    def _check_sample_args(self, num_timesteps, num_episodes, explore, random_actions,
                           force_reset) -> None:
        if self._stopped:
            raise RuntimeError("This runner was stopped; create a new one to sample.")
        if num_timesteps is not None and num_episodes is not None:
            raise SampleArgumentError(
                "Pass either num_timesteps or num_episodes to sample(), not both "
                f"(got num_timesteps={num_timesteps}, num_episodes={num_episodes})."
            )
        for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise SampleArgumentError(f"{name} must be an int >= 0, got {value!r}.")
            if value < 0:
                raise SampleArgumentError(f"{name} must be >= 0, got {value}.")
        for name, value in (("random_actions", random_actions), ("force_reset", force_reset)):
            if not isinstance(value, bool):
                raise SampleArgumentError(f"{name} must be True or False, got {value!r}.")
        if explore is not None and not isinstance(explore, bool):
            raise SampleArgumentError(f"explore must be True, False or None, got {explore!r}.")
        if self.env is None:
            raise ValueError(
                "This runner has no env: it is the local runner (worker_index=0) of a group "
                "with remote runners. Sample on the remote runners, or set "
                "config.env_runners(create_env_on_local_worker=True)."
            )
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
    def get_metrics(self) -> dict[str, Any]:
        """RLlib's metric keys for the steps and episodes since the last call, with the
        per-agent and per-module keys as `{id: value}` dicts."""
        if self._metrics is None:
            raise ValueError("This runner has no module (no env and no spaces).")
        if self._carry is None:
            from jaxrunner.core.carry import MetricRegisters

            empty = jax.device_get(MetricRegisters.create(1))
            stack = lambda n: jax.tree.map(  # noqa: E731
                lambda x: np.zeros((n,) + np.shape(x), np.asarray(x).dtype), empty)
            values = (empty, stack(len(self._agent_ids)), stack(len(self.module.module_ids)),
                      np.zeros(len(self._agent_ids)), np.zeros(len(self.module.module_ids)))
        else:
            c = self._carry
            values = jax.device_get((c.metrics, c.agent_metrics, c.module_metrics,
                                     c.agent_steps, c.module_steps))
        self._metrics.general.weights_seq_no = self._weights_seq_no
        metrics = self._metrics.reduce(*values)
        self.num_env_steps_sampled_lifetime = self._metrics.env_steps_lifetime
        return metrics

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
        from jaxrunner.core.carry import MetricRegisters

        module_ids = tuple(self.module.module_ids)
        if self._carry is None:
            general = jax.device_get(MetricRegisters.create(1))
            window = self._metrics.general.window_values(general)
            window["agent_episode_return"] = {a: np.zeros(0, np.float64)
                                              for a in self._agent_ids}
            window["module_episode_return"] = {m: np.zeros(0, np.float64) for m in module_ids}
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
        return window

    # ------------------------------------------------------------------ state
    def get_state(self, components: Any = None, *, not_components: Any = None,
                  inference_only: bool = True, **kwargs: Any) -> dict[str, Any]:
        """The runner's state as host numpy: "rl_module" (`{module_id: weights}`, with
        "weights_seq_no"), the connector states, `num_env_steps_sampled_lifetime`, and
        "env_runner_carry" (RNG keys, env states, pending agent steps, counters, metric
        registers) only when asked for by name."""
        wanted = _as_set(components)
        unwanted = _as_set(not_components) or set()
        for given in (wanted or set()) | unwanted:
            if given not in _ALL_COMPONENTS:
                raise ValueError(f"Unknown state component {given!r}; valid components are "
                                 f"{list(_ALL_COMPONENTS)}.")

        def selected(name: str) -> bool:
            if name in unwanted:
                return False
            return name in _DEFAULT_COMPONENTS if wanted is None else name in wanted

        state: dict[str, Any] = {"num_env_steps_sampled_lifetime":
                                 self._metrics.env_steps_lifetime if self._metrics else 0}
        if selected(COMPONENT_RL_MODULE) and self._params is not None:
            state[COMPONENT_RL_MODULE] = jax.device_get(self._params)
            state["weights_seq_no"] = self._weights_seq_no
        if selected(COMPONENT_ENV_TO_MODULE_CONNECTOR):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = {}
        if selected(COMPONENT_MODULE_TO_ENV_CONNECTOR):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = {}
        if selected(COMPONENT_CARRY) and self.env is not None:
            self._ensure_carry()
            carry, lookback = jax.device_get((_keys_to_data(self._carry), self._lookback))
            state[COMPONENT_CARRY] = {"carry": carry, "lookback": lookback,
                                      "needs_reset": self._needs_reset,
                                      "key_impl": str(jax.random.key_impl(self._carry.key)),
                                      "metrics": self._metrics.get_state()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores `get_state()` output. `rl_module` is `{module_id: weights}` (a subset of
        the modules is fine); weights apply only if `weights_seq_no` is 0 or newer than the
        runner's. A wrong structure raises `StateStructureError` and changes nothing."""
        if not isinstance(state, dict):
            raise StateStructureError(
                f"set_state expects the dict get_state() returns, got {type(state).__name__}.")
        unknown = set(state) - _STATE_KEYS
        if unknown:
            raise StateStructureError(f"set_state: unknown keys {sorted(unknown)}; expected "
                                      f"some of {sorted(_STATE_KEYS)}.")
        for name in (COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR):
            if name in state and state[name] not in ({}, None):
                raise StateStructureError(
                    f"set_state: {name} carries state {state[name]!r}, but this runner's "
                    "pipeline has no stateful connectors.")
        new_params, seq = None, int(state.get("weights_seq_no", 0) or 0)
        if COMPONENT_RL_MODULE in state and (seq == 0 or seq > self._weights_seq_no):
            weights = state[COMPONENT_RL_MODULE]
            if self.module is None:
                raise ValueError("set_state: this runner has no module to load weights into.")
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
                _check_same_structure(self._params[module_id], module_weights,
                                      f"rl_module weights of {module_id!r}")
                new_params[module_id] = jax.tree.map(lambda old, new: jnp.asarray(new, old.dtype),
                                                     self._params[module_id], module_weights)
        carry_state = state.get(COMPONENT_CARRY)
        new_carry = None
        if carry_state is not None:
            self._ensure_carry()
            current = jax.device_get((_keys_to_data(self._carry), self._lookback))
            _check_same_structure(current, (carry_state["carry"], carry_state["lookback"]),
                                  "env_runner_carry")
            impl = carry_state.get("key_impl") or jax.random.key_impl(self._carry.key)
            restored = jax.tree.map(
                lambda old, new: (jax.random.wrap_key_data(jnp.asarray(new), impl=impl)
                                  if _is_key(old) else jnp.asarray(new, old.dtype)),
                self._carry, carry_state["carry"])
            new_carry = (restored, jax.device_put(carry_state["lookback"]))
        if new_params is not None:
            self._params = new_params
            if seq > 0:
                self._weights_seq_no = seq
        if "num_env_steps_sampled_lifetime" in state and self._metrics is not None:
            self._metrics.env_steps_lifetime = int(state["num_env_steps_sampled_lifetime"])
            self.num_env_steps_sampled_lifetime = self._metrics.env_steps_lifetime
        if new_carry is not None:
            self._carry, self._lookback = new_carry
            self._needs_reset = bool(carry_state["needs_reset"])
            self._metrics.set_state(carry_state["metrics"])

    # ------------------------------------------------------------------ the rest
    def get_spaces(self) -> dict[str, tuple]:
        """`{module_id: (obs_space, act_space)}` plus `__env__` (batched) and
        `__env_single__` (`gym.spaces.Dict` keyed by agent id)."""
        if self.env is None:
            if self.spaces is None:
                raise ValueError("This runner has neither an env nor spaces given to it.")
            return dict(self.spaces)
        single = (gym.spaces.Dict(self.observation_spaces), gym.spaces.Dict(self.action_spaces))
        spaces = {"__env__": (batched_space(single[0], self.num_envs),
                              batched_space(single[1], self.num_envs)),
                  "__env_single__": single}
        for module_id in self.module.module_ids:
            rl_module = self.module[module_id]
            spaces[module_id] = (rl_module.observation_space, rl_module.action_space)
        return spaces

    def assert_healthy(self) -> None:
        if self._stopped:
            raise AssertionError("The runner was stopped.")
        if self.env is None or self.module is None:
            raise AssertionError(
                f"Runner (worker_index={self.worker_index}) is not healthy: env="
                f"{self.env_name!r}, module={self.module!r}.")

    def stop(self) -> None:
        """Releases the carry and compiled functions; safe to call again."""
        self._stopped = True
        self._carry = None
        self._lookback = None
        self._compiled = {}

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self._agent_ids

    @property
    def weights_seq_no(self) -> int:
        return self._weights_seq_no

    def __repr__(self) -> str:
        return (f"MultiAgentEnvRunner(env={self.env_name!r}, num_envs={self.num_envs}, "
                f"agents={list(self._agent_ids)}, modules="
                f"{list(self.module.module_ids) if self.module else None}, "
                f"worker_index={self.worker_index})")


__all__ = ["MultiAgentEnvRunner"]
