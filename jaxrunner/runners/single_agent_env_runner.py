"""`SingleAgentEnvRunner`: RLlib's single-agent runner contract over the compiled chunk.

The shared shell (`jaxrunner.runners.compiled_runner`) does the sampling loop, state and
faults; this class builds the env (a gymnax-style env, or a gymnasium env stepped on the
host by `jaxrunner.runners.host_env`), the connectors and the module, and fills the
shell's hooks with the single-agent layout (`jaxrunner.core.rollout`).
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.connectors.base import ConnectorContext, ConnectorPipeline, call_factory
from jaxrunner.connectors.env_to_module import default_env_to_module_pieces
from jaxrunner.connectors.module_to_env import NormalizeAndClipActions
from jaxrunner.core.autoreset import check_partial_autoreset_env
from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.rollout import RolloutSpec, make_rollout_fns, sample_action_space
from jaxrunner.envs.gymnasium_env import create_with_retries, resolve_env
from jaxrunner.envs.spaces import action_dtype, batched_space, to_gymnasium
from jaxrunner.episodes.batch import EpisodeBatch
from jaxrunner.errors import StateStructureError
from jaxrunner.metrics.logger import RunnerMetrics
from jaxrunner.modules.rl_module import DEFAULT_MODULE_ID, RLModuleSpec
from jaxrunner.runners.compiled_runner import (COMPONENT_CARRY,
                                               COMPONENT_ENV_TO_MODULE_CONNECTOR,
                                               COMPONENT_MODULE_TO_ENV_CONNECTOR,
                                               STATE_HINT, CompiledEnvRunner,
                                               check_module_fits)
from jaxrunner.structure import check_same_structure

logger = logging.getLogger(__name__)


class SingleAgentEnvRunner(CompiledEnvRunner):
    """Samples a vector of `num_envs_per_env_runner` gymnax sub-envs with a Flax module,
    all inside one compiled `lax.scan`.

    Args:
        config: a `RunnerConfig`.
        worker_index: None (standalone), 0 (local runner of a group) or 1..N (remote).
        num_workers: remote runners in the group (default `config.num_env_runners`).
        spaces: `{"__env__": ..., "__env_single__": ..., "default_policy": ...}` for a local
            runner that has no env of its own.
    """

    def _init_fields(self) -> None:
        self._host = None  # HostEnvEngine when config.env is a gymnasium (host) env
        self._metrics = RunnerMetrics(self.num_envs)

    # ------------------------------------------------------------------ construction
    def make_env(self) -> None:
        """Builds the env from `config.env`: a compiled env (checked to jit with the vmap)
        or a gymnasium env stepped on the host (`jaxrunner.runners.host_env`).

        Exceptions raised while creating it are retried (each logged) up to
        `num_consecutive_sub_env_failures_tolerance` times with
        `restart_failed_sub_environments`; otherwise they raise `RuntimeError` naming it."""
        cfg = self.config
        context = self._env_context()
        kind, resolved = create_with_retries(
            lambda: resolve_env(cfg.env, context, self.num_envs, cfg.gym_env_vectorize_mode),
            restart=cfg.restart_failed_sub_environments,
            tolerance=cfg.num_consecutive_sub_env_failures_tolerance,
            what=f"the env {cfg.env!r}")
        if self._host is not None:
            self._host.close()
            self._host = None
        if kind == "host":
            from jaxrunner.runners.host_env import HostEngineSettings, HostEnvEngine

            host = HostEnvEngine(resolved, HostEngineSettings.from_config(
                cfg, seed=self._seed, worker_index=self.worker_index,
                chunk_len=self._chunk_len()))
            self.observation_space, self.action_space = host.observation_space, host.action_space
            self._env_action_dtype = host.env_action_dtype
            self._host = host
            self.env, self.env_params, self.env_name = host.env, None, host.name
        else:
            env, env_params, name = resolved
            act_space_gx = env.action_space(env_params)
            self.observation_space = to_gymnasium(env.observation_space(env_params))
            self.action_space = to_gymnasium(act_space_gx)
            self._env_action_dtype = action_dtype(act_space_gx)
            self._check_env_jits(env, env_params, name)
            if cfg.autoreset_mode == "partial":
                check_partial_autoreset_env(env)
            self.env, self.env_params, self.env_name = env, env_params, name
        self._carry = None
        self._needs_reset = True
        self._compiled = {}
        if self.module is not None:
            self.make_module()

    def _check_env_jits(self, env, env_params, name: str) -> None:
        key = jax.random.key(0)
        action = jax.eval_shape(lambda k: sample_action_space(self.action_space, k, 1)[0], key)
        try:
            obs, state = jax.eval_shape(env.reset, key, env_params)
            jax.eval_shape(env.step, key, state,
                           jnp.zeros(action.shape, self._env_action_dtype), env_params)
        except Exception as error:  # noqa: BLE001 - re-raised with context
            raise TypeError(
                f"The env {name!r} cannot be traced by JAX ({type(error).__name__}: {error}). "
                "jaxrunner compiles reset() and step() into one program: they must be pure "
                "JAX functions of (key, state, action, params) with no Python control flow on "
                "array values and no host I/O. Use jax.lax.cond/jnp.where instead of if/else "
                "on arrays."
            ) from error

    def _build_connectors(self) -> None:
        """The env-to-module and module-to-env pipelines (RLlib's `env_runners()` flags).

        env-to-module: [FlattenObservations for Dict/Tuple spaces (default), *user pieces].
        module-to-env: [*user pieces, NormalizeAndClipActions (default)].
        """
        cfg = self.config
        env_to_module, module_to_env = [], []
        if self.env is not None:
            spaces = self.get_spaces(env_only=True)
            if cfg.add_default_connectors_to_env_to_module_pipeline:
                env_to_module += default_env_to_module_pieces(self.observation_space)
            if cfg.env_to_module_connector is not None:
                env_to_module += call_factory(cfg.env_to_module_connector, self.env, spaces)
            if cfg.module_to_env_connector is not None:
                module_to_env += call_factory(cfg.module_to_env_connector, self.env, spaces)
            if cfg.add_default_connectors_to_module_to_env_pipeline:
                module_to_env.append(NormalizeAndClipActions(
                    self.action_space, normalize_actions=cfg.normalize_actions,
                    clip_actions=cfg.clip_actions, env_dtype=self._env_action_dtype))
        self.env_to_module = ConnectorPipeline(env_to_module)
        self.module_to_env = ConnectorPipeline(module_to_env)
        if self.env is not None:
            self.module_observation_space = self.env_to_module.recompute_observation_space(
                self.observation_space)
            self._check_connectors()
        else:
            self.module_observation_space = self.spaces[DEFAULT_MODULE_ID][0]

    def _check_connectors(self) -> None:
        """Both pipelines must keep the batch axis and produce what the spaces say."""
        num_envs = self.num_envs
        key = jax.random.key(0)
        if self._host is not None:
            obs = jax.eval_shape(self._host.obs_zeros)
        else:
            obs = jax.eval_shape(
                lambda k: jax.vmap(self.env.reset, in_axes=(0, None))(
                    jax.random.split(k, num_envs), self.env_params)[0], key)
        action = jax.eval_shape(lambda k: sample_action_space(self.action_space, k, num_envs),
                                key)
        ctx = ConnectorContext(is_first=jax.ShapeDtypeStruct((num_envs,), jnp.bool_),
                               prev_action=action,
                               prev_reward=jax.ShapeDtypeStruct((num_envs,), jnp.float32))
        for name, pipeline, x, expected in (
                ("env_to_module", self.env_to_module, obs,
                 (num_envs,) + tuple(self.module_observation_space.shape or ())),
                ("module_to_env", self.module_to_env, action, action.shape)):
            try:
                _, out = jax.eval_shape(pipeline, pipeline.init_state(num_envs), x, ctx)
            except Exception as error:  # noqa: BLE001 - re-raised with context
                raise ValueError(
                    f"The {name} connector pipeline {pipeline!r} fails on a batch of "
                    f"{num_envs} ({type(error).__name__}: {error})."
                ) from error
            shapes = {tuple(leaf.shape) for leaf in jax.tree.leaves(out)}
            if name == "env_to_module" and isinstance(
                    self.module_observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
                ok = all(s[:1] == (num_envs,) for s in shapes)
            else:
                ok = shapes == {tuple(expected)}
            if not ok:
                raise ValueError(
                    f"The {name} connector pipeline {pipeline!r} turns a batch of {num_envs} "
                    f"into shape(s) {sorted(shapes)}, expected {tuple(expected)}: every piece "
                    "must keep the leading batch axis and produce the shape its "
                    "recompute_observation_space() declares."
                )

    def make_module(self) -> None:
        """Builds the connector pipelines and the inference-only module for the spaces the
        module sees (after the env-to-module connectors), and checks the module's output."""
        cfg = self.config
        if self.env is None and self.spaces is None:
            self.module = None
            return
        self._build_connectors()
        obs_space = self.module_observation_space
        act_space = self.action_space if self.env is not None else self.spaces[
            DEFAULT_MODULE_ID][1]
        spec = cfg.rl_module_spec or RLModuleSpec()
        if not isinstance(spec, RLModuleSpec):
            raise TypeError(
                f"config.rl_module_spec must be a jaxrunner.RLModuleSpec, got {spec!r}."
            )
        spec = RLModuleSpec(
            module_class=spec.module_class,
            observation_space=spec.observation_space or obs_space,
            action_space=spec.action_space or act_space,
            model_config={**cfg.model_config_with_defaults, **(spec.model_config or {})},
            inference_only=True,
        )
        module = spec.build()
        shapes = self._set_initial_params(module)
        self._check_module_fits(module, shapes, obs_space, act_space)
        self.module = module
        self._compiled = {}
        self._carry = None
        self._needs_reset = True

    def _check_module_fits(self, module, params, obs_space, act_space) -> None:
        check_module_fits(module, params, obs_space, act_space, self.num_envs, "The module")

    def _rollout_fns(self, mode: str):
        spec = RolloutSpec(
            env=self.env, module=self.module, action_space=self.action_space,
            env_action_dtype=self._env_action_dtype, num_envs=self.num_envs,
            chunk_len=self._chunk_len(), lookback_len=self.config.episode_lookback_horizon,
            metrics_window=self.config.metrics_window,
            env_to_module=self.env_to_module, module_to_env=self.module_to_env,
            check_finite=self.config.check_finite,
            autoreset_mode=self.config.autoreset_mode,
            partial_reset_ratio=self.config.partial_reset_ratio,
            restart_failed_sub_environments=self.config.restart_failed_sub_environments,
            callbacks=self._device_callbacks,
            final_obs_slots_per_env=self.config.final_obs_slots_per_env,
            record_action_dist_inputs=self.config.record_action_dist_inputs,
            steps_per_loop_check=self._steps_per_loop_check(),
        )
        return make_rollout_fns(spec, mode)

    def _ensure_carry(self) -> None:
        if self._carry is None and self._host is not None:
            self._carry, self._lookback = self._host.init_carry(  # reset at next sample()
                jax.random.fold_in(self._base_key, 2), self._host_policy("explore"),
                self._params)
        else:
            super()._ensure_carry()

    # ------------------------------------------------------------------ sampling
    def _host_policy(self, mode: str):
        """The compiled policy step the host engine gets (cached with `_compiled`)."""
        if ("host_policy", mode) not in self._compiled:
            from jaxrunner.runners.host_env import make_host_policy

            self._compiled[("host_policy", mode)] = make_host_policy(
                module=self.module, env_to_module=self.env_to_module,
                module_to_env=self.module_to_env, action_space=self.action_space,
                env_action_dtype=self._env_action_dtype, num_envs=self.num_envs, mode=mode)
        return self._compiled[("host_policy", mode)]

    def _sample_on_host(self, mode, num_timesteps, num_episodes, force_reset):
        if self._host is None:
            return None
        from jaxrunner.runners.host_env import HostSampleRequest, HostSampleResult

        self._ensure_carry()
        request = HostSampleRequest(
            mode=mode, num_timesteps=num_timesteps, num_episodes=num_episodes,
            reset=force_reset or self._needs_reset, params=self._params, carry=self._carry,
            lookback=self._lookback, id_prefix=self._id_prefix,
            weights_seq_no=self._weights_seq_no)
        result = HostSampleResult(carry=self._carry, lookback=self._lookback)
        try:
            self._host.sample(request, self._host_policy(mode), result)
        finally:
            self._carry, self._lookback = result.carry, result.lookback
            self._needs_reset = result.needs_reset
            self._metrics.env_step_failures_lifetime += result.env_step_failures
            self.env = self._host.env
        return result.batch, result.vector_steps, result.env_steps, result.discarded

    def _make_batch(self, chunks, infos, lookback_at_start, vector_steps, mode, num_episodes,
                    discarded) -> EpisodeBatch:
        first = infos[0] if infos else None
        return EpisodeBatch(
            chunks=tuple(chunks),
            start_episode_count=first.start_episode_count if first else self._carry.episode_count,
            start_episode_len=first.start_episode_len if first else self._carry.episode_len,
            lookback=lookback_at_start, num_steps=vector_steps, num_envs=self.num_envs,
            mode=mode, num_episodes=num_episodes, id_prefix=self._id_prefix,
            observation_space=self.observation_space, action_space=self.action_space,
            weights_seq_no=self._weights_seq_no, discarded_env_steps=discarded)

    # ------------------------------------------------------------------ metrics
    def _general_metrics(self) -> RunnerMetrics:
        return self._metrics

    def _registers(self):
        return jax.device_get(MetricRegisters.create(1) if self._carry is None
                              else self._carry.metrics)

    def _reduce_metrics(self) -> dict[str, Any]:
        return self._metrics.reduce(self._registers())

    def get_metrics_window(self) -> dict[str, np.ndarray]:
        """The finished episodes in this runner's smoothing window as host arrays:
        `episode_return`, `episode_len`, `episode_duration_sec` (each `(n,)`, n <= W).

        `EnvRunnerGroup.get_metrics()` merges these windows so that means are taken over
        all runners' episodes, not averaged per runner. Changes nothing (no reduce).
        """
        window = self._metrics.window_values(self._registers())
        window["custom_metrics"] = self._custom_metrics_window()
        return window

    # ------------------------------------------------------------------ state
    def _load_weights(self, weights: Any) -> Any:
        if isinstance(weights, dict) and set(weights) == {DEFAULT_MODULE_ID}:
            weights = weights[DEFAULT_MODULE_ID]
        try:
            weights = self.module.params_for_inference(weights)
        except (KeyError, TypeError) as error:
            raise StateStructureError(
                f"set_state: rl_module weights do not fit {type(self.module).__name__} "
                f"({type(error).__name__}: {error})."
            ) from error
        current = self._params_like()  # weights replacing unbuilt params never build them
        check_same_structure(current, weights, "set_state: the rl_module weights",
                             hint=STATE_HINT)
        return jax.tree.map(lambda old, new: jnp.asarray(new, old.dtype), current, weights)

    def _carry_capturable(self) -> None:
        if self._host is not None:
            raise ValueError(
                f"The {COMPONENT_CARRY!r} state component is not available for the host "
                f"(gymnasium) env {self.env_name!r}: its state lives in Python objects the "
                "runner cannot capture or restore. get_state()/set_state() of the other "
                "components (weights, connector states, counters) work; a restored runner "
                "starts new episodes."
            )

    def _pipelines(self) -> list[tuple[str, ConnectorPipeline]]:
        return [(COMPONENT_ENV_TO_MODULE_CONNECTOR, self.env_to_module),
                (COMPONENT_MODULE_TO_ENV_CONNECTOR, self.module_to_env)]

    # ------------------------------------------------------------------ the rest
    def get_spaces(self, env_only: bool = False) -> dict[str, tuple]:
        """`__env__` (batched), `__env_single__` and `default_policy` spaces (gymnasium).

        The `default_policy` observation space is the one the module sees: after the
        env-to-module connectors, as in RLlib."""
        if self.env is None:
            if self.spaces is None:
                raise ValueError("This runner has neither an env nor spaces given to it.")
            return dict(self.spaces)
        spaces = {
            "__env__": (batched_space(self.observation_space, self.num_envs),
                        batched_space(self.action_space, self.num_envs)),
            "__env_single__": (self.observation_space, self.action_space),
        }
        if not env_only:
            spaces[DEFAULT_MODULE_ID] = (self.module_observation_space, self.action_space)
        return spaces

    def stop(self) -> None:
        """Releases the env, carry and compiled functions; safe to call again."""
        super().stop()
        if self._host is not None:
            self._host.close()

    def __repr__(self) -> str:
        return (f"SingleAgentEnvRunner(env={self.env_name!r}, num_envs={self.num_envs}, "
                f"worker_index={self.worker_index})")


__all__ = ["SingleAgentEnvRunner"]
