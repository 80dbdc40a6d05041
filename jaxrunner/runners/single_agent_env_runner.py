"""`SingleAgentEnvRunner`: RLlib's single-agent runner contract over a compiled rollout.

The runner is a thin stateful shell: it owns the device carry (env states, observations,
RNG key, episode counters, metric registers), the module params and jitted chunk
functions, and turns `sample()` arguments into calls of the same compiled chunk.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.config import RunnerConfig
from jaxrunner.connectors.base import ConnectorContext, ConnectorPipeline, call_factory
from jaxrunner.connectors.env_to_module import default_env_to_module_pieces
from jaxrunner.connectors.module_to_env import NormalizeAndClipActions
from jaxrunner.core.carry import Lookback, RolloutCarry
from jaxrunner.core.rollout import (FAILURE_INFO_KEY, NO_EPISODE_LIMIT, RolloutSpec,
                                   check_partial_autoreset_env, make_rollout_fns,
                                   sample_action_space)
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.gymnasium_env import create_with_retries, resolve_env
from jaxrunner.envs.spaces import action_dtype, batched_space, to_gymnasium
from jaxrunner.episodes.batch import EpisodeBatch
from jaxrunner.errors import SampleArgumentError, StateStructureError
from jaxrunner.metrics.logger import RunnerMetrics
from jaxrunner.modules.rl_module import DEFAULT_MODULE_ID, RLModuleSpec, init_params
from jaxrunner.runners.env_runner import EnvRunner
from jaxrunner.runners.sharding import make_env_mesh, replicate, shard_carry

logger = logging.getLogger(__name__)

COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
COMPONENT_CARRY = "env_runner_carry"  # jaxrunner: RNG key + device carry, only when asked
_DEFAULT_COMPONENTS = (COMPONENT_RL_MODULE, COMPONENT_ENV_TO_MODULE_CONNECTOR,
                       COMPONENT_MODULE_TO_ENV_CONNECTOR)
_ALL_COMPONENTS = _DEFAULT_COMPONENTS + (COMPONENT_CARRY,)
_STATE_KEYS = set(_ALL_COMPONENTS) | {"weights_seq_no", "num_env_steps_sampled_lifetime"}


def _as_set(components: Any) -> set[str] | None:
    if components is None:
        return None
    if isinstance(components, str):
        return {components}
    return set(components)


def _tree_paths(tree: Any) -> dict[str, tuple]:
    return {jax.tree_util.keystr(path): (np.shape(leaf), np.result_type(leaf))
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _check_same_structure(expected: Any, given: Any, what: str) -> None:
    """Raises StateStructureError naming the first paths whose structure/shape differ."""
    want, got = _tree_paths(expected), _tree_paths(given)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(p for p in set(want) & set(got) if want[p][0] != got[p][0])
    if missing or extra or wrong:
        lines = []
        if missing:
            lines.append(f"missing entries {missing[:5]}")
        if extra:
            lines.append(f"unexpected entries {extra[:5]}")
        if wrong:
            lines.append("wrong shapes " + ", ".join(
                f"{p}: expected {want[p][0]}, got {got[p][0]}" for p in wrong[:5]))
        raise StateStructureError(
            f"set_state: the {what} does not fit this runner ({'; '.join(lines)}). Pass a "
            f"state produced by get_state() of a runner with the same env and module config."
        )


class SingleAgentEnvRunner(EnvRunner):
    """Samples a vector of `num_envs_per_env_runner` gymnax sub-envs with a Flax module,
    all inside one compiled `lax.scan`.

    Args:
        config: a `RunnerConfig`.
        worker_index: None (standalone), 0 (local runner of a group) or 1..N (remote).
        num_workers: remote runners in the group (default `config.num_env_runners`).
        spaces: `{"__env__": ..., "__env_single__": ..., "default_policy": ...}` for a local
            runner that has no env of its own.
    """

    def __init__(self, *, config: RunnerConfig, worker_index: int | None = None,
                 num_workers: int | None = None, spaces: dict | None = None, **kwargs: Any):
        super().__init__(config=config, worker_index=worker_index, num_workers=num_workers,
                         **kwargs)
        cfg = self.config
        if cfg.seed is None:
            self._seed = None
            seed_for_key = int.from_bytes(os.urandom(4), "little")
        else:
            self._seed = int(cfg.seed + (worker_index or 0) + 1_000_000 * cfg.in_evaluation)
            seed_for_key = self._seed
        self._base_key = jax.random.key(seed_for_key)
        # Episode ids: a per-runner prefix + sub-env index + per-sub-env episode counter.
        self._id_prefix = hashlib.sha1(
            f"{seed_for_key}-{worker_index}-{os.urandom(8).hex() if cfg.seed is None else ''}"
            .encode()).hexdigest()[:12]
        self.num_envs = cfg.num_envs_per_env_runner
        self.spaces = spaces
        self.env = None
        self.env_params = None
        self.env_name: str | None = None
        self._host = None  # HostEnvEngine when config.env is a gymnasium (host) env
        self.module = None
        self._params = None
        self._weights_seq_no = 0
        self._metrics = RunnerMetrics(self.num_envs)
        self._carry: RolloutCarry | None = None
        self._lookback: Lookback | None = None
        self._needs_reset = True
        self._compiled: dict[str, Any] = {}
        self._stopped = False
        self._mesh = make_env_mesh(self.num_envs, cfg.shard_envs_across_devices)
        if (worker_index is None or worker_index > 0 or cfg.create_env_on_local_worker
                or cfg.num_env_runners == 0):
            self.make_env()
        self.make_module()

    # ------------------------------------------------------------------ construction
    def make_env(self) -> None:
        """Builds the env from `config.env`: a compiled env (checked to jit with the vmap)
        or a gymnasium env stepped on the host (`jaxrunner.runners.host_env`).

        Exceptions raised while creating it are retried (each logged) up to
        `num_consecutive_sub_env_failures_tolerance` times with
        `restart_failed_sub_environments`; otherwise they raise `RuntimeError` naming it."""
        cfg = self.config
        if isinstance(cfg.env_config, EnvContext):
            context = cfg.env_config
        else:
            context = EnvContext(cfg.env_config, worker_index=self.worker_index,
                                 num_workers=self.num_workers)
        kind, resolved = create_with_retries(
            lambda: resolve_env(cfg.env, context, self.num_envs),
            restart=cfg.restart_failed_sub_environments,
            tolerance=cfg.num_consecutive_sub_env_failures_tolerance,
            what=f"the env {cfg.env!r}")
        if self._host is not None:
            self._host.close()
            self._host = None
        if kind == "host":
            from jaxrunner.runners.host_env import HostEnvEngine

            host = HostEnvEngine(self, resolved)
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
            obs = jax.eval_shape(lambda: self._host._obs_zeros())
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
        params = init_params(module, jax.random.fold_in(self._base_key, 1))
        self._check_module_fits(module, params, obs_space, act_space)
        self.module = module
        self._params = jax.device_put(params)
        self._compiled = {}
        self._carry = None
        self._needs_reset = True

    def _check_module_fits(self, module, params, obs_space, act_space) -> None:
        dist_cls = module.action_dist_cls
        needed = module.action_dist_input_dim
        obs = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((self.num_envs,) + tuple(s.shape), np.dtype(s.dtype)),
            obs_space, is_leaf=lambda s: isinstance(s, gym.spaces.Space)
            and not isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)))
        batch = {"obs": obs}
        if module.is_stateful():
            batch["state_in"] = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct((self.num_envs,) + jnp.shape(x),
                                               jnp.asarray(x).dtype),
                module.get_initial_state())
        try:
            out = jax.eval_shape(module.forward_exploration, params, batch)
        except Exception as error:  # noqa: BLE001 - re-raised with context
            raise ValueError(
                f"The module {type(module).__name__} fails on a batch of observations of "
                f"shape {obs.shape} ({type(error).__name__}: {error})."
            ) from error
        got = getattr(out.get("action_dist_inputs"), "shape", None)
        if got != (self.num_envs, needed):
            raise ValueError(
                f"The module {type(module).__name__} outputs action_dist_inputs of shape "
                f"{got}, but the action space {act_space} needs ({self.num_envs}, {needed}) "
                f"for a batch of {self.num_envs} observations ({dist_cls.__name__} takes "
                f"{needed} inputs per action). Make the module's last layer output {needed} "
                "values."
            )

    def _chunk_len(self) -> int:
        fragment = self.config.get_rollout_fragment_length(self.worker_index or 0)
        return max(1, min(fragment, self.config.max_chunk_length))

    def _fns(self, mode: str):
        """The rollout functions for `mode`, jitted once per runner build."""
        if mode not in self._compiled:
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
            )
            fns = make_rollout_fns(spec, mode)
            self._compiled[mode] = {
                "init_carry": jax.jit(fns.init_carry),
                "reset_carry": jax.jit(fns.reset_carry, donate_argnums=(0,)),
                "init_lookback": jax.jit(fns.init_lookback),
                "chunk": jax.jit(fns.chunk, donate_argnums=(0,)),
            }
        return self._compiled[mode]

    def _ensure_carry(self) -> None:
        if self._carry is None and self._host is not None:
            self._carry, self._lookback = self._host.init_carry()  # reset at next sample()
        elif self._carry is None:
            fns = self._fns("explore")
            self._carry = fns["init_carry"](jax.random.fold_in(self._base_key, 2),
                                            self.env_params)
            self._lookback = fns["init_lookback"](self._carry, self._params, self.env_params)
            self._needs_reset = False
            self._place_on_devices()

    def _place_on_devices(self) -> None:
        """Shards the sub-envs over the local devices (see `jaxrunner.runners.sharding`)."""
        if self._mesh is not None and self._carry is not None:
            self._carry, self._lookback = shard_carry(self._carry, self._lookback, self._mesh)
            self._params = replicate(self._params, self._mesh)

    # ------------------------------------------------------------------ sampling
    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None,
               explore: bool | None = None, random_actions: bool = False,
               force_reset: bool = False) -> EpisodeBatch:
        """Samples `num_timesteps` env steps or `num_episodes` whole episodes.

        Timestep mode returns between `n` and `n + num_envs - 1` env steps; episodes still
        running are cut and continue (same id, `t_started` = previous `t`) in the next
        call. Episode mode resets every sub-env first and returns exactly `k` episodes
        that started and finished in the call. With neither, `batch_mode` decides:
        "truncate_episodes" samples `rollout_fragment_length * num_envs` steps,
        "complete_episodes" samples `num_envs` episodes.

        Args:
            explore: sample from the action distribution (True) or take its
                deterministic action (False); None uses `config.explore`.
            random_actions: sample the action space uniformly, ignoring the module.
            force_reset: restart every sub-env before sampling.
        """
        self._check_sample_args(num_timesteps, num_episodes, explore, random_actions,
                                force_reset)
        start_time = time.perf_counter()
        explore = self.config.explore if explore is None else explore
        mode = "random" if random_actions else ("explore" if explore else "inference")
        if num_timesteps is None and num_episodes is None:
            if self.config.batch_mode == "truncate_episodes":
                num_timesteps = self._chunk_len_for_default() * self.num_envs
            else:
                num_episodes = self.num_envs
        if self._host is not None:
            batch, vector_steps, env_steps, discarded = self._host.sample(
                mode, num_timesteps, num_episodes, force_reset)
            self._metrics.record_sample(vector_steps=vector_steps, env_steps=env_steps,
                                        discarded_env_steps=discarded, start_time=start_time,
                                        end_time=time.perf_counter())
            return batch
        fns = self._fns(mode)
        recreations = 0
        while True:
            try:
                batch, vector_steps, env_steps, discarded = self._sample_chunks(
                    fns, num_timesteps, num_episodes, force_reset)
                break
            except jax.errors.JaxRuntimeError as error:
                # The device program itself failed (e.g. an XLA runtime error inside the
                # env): the whole vector env is recreated, as RLlib recreates it.
                recreations += 1
                self._metrics.env_step_failures_lifetime += 1
                self._carry, self._needs_reset = None, True
                tolerance = self.config.num_consecutive_sub_env_failures_tolerance
                if not self.config.restart_failed_sub_environments or recreations > tolerance:
                    raise RuntimeError(
                        f"sample() on runner {self.worker_index} failed with an XLA runtime "
                        f"error ({error}). "
                        + ("Set config.fault_tolerance(restart_failed_sub_environments=True) to "
                           "recreate the env and continue."
                           if not self.config.restart_failed_sub_environments else
                           f"It failed {recreations} times in a row "
                           "(num_consecutive_sub_env_failures_tolerance).")
                    ) from error
                logger.exception("XLA runtime error while sampling; recreating the env.")
                self.make_env()
                fns = self._fns(mode)
                force_reset = True
        self._metrics.record_sample(vector_steps=vector_steps, env_steps=env_steps,
                                    discarded_env_steps=discarded, start_time=start_time,
                                    end_time=time.perf_counter())
        return batch

    def _sample_chunks(self, fns, num_timesteps, num_episodes, force_reset):
        """Runs compiled chunks until the call's size is reached; returns the batch and
        `(vector_steps, env_steps, discarded_env_steps)`."""
        self._ensure_carry()
        if num_episodes is not None or force_reset or self._needs_reset:
            self._carry = fns["reset_carry"](self._carry, self.env_params)
            self._needs_reset = False
        self._failures_this_call = 0
        lookback_at_start = self._lookback
        chunks, infos = [], []
        vector_steps, discarded = 0, 0
        restart = self.config.restart_failed_sub_environments
        if num_episodes is not None:
            counted, returned_steps = 0, 0
            while counted < num_episodes:
                info = self._run_chunk(fns, self._chunk_len(), num_episodes - counted,
                                       vector_steps, chunks, infos)
                host = jax.device_get(info)
                self._book_failures([host], vector_steps)
                vector_steps += int(host.num_steps)
                counted += int(host.num_episodes)
                returned_steps += int(host.episode_env_steps)
            # Episodes in flight are dropped, as in RLlib; the next call starts fresh.
            self._needs_reset = True
            env_steps = vector_steps * self.num_envs
            discarded = env_steps - returned_steps
            batch_mode = "episodes"
        else:
            returned = 0
            planned = math.ceil(num_timesteps / self.num_envs)
            while planned > 0:
                first_new = len(infos)
                call_offset = vector_steps
                while planned > 0:
                    steps = min(planned, self._chunk_len())
                    self._run_chunk(fns, steps, NO_EPISODE_LIMIT, vector_steps, chunks, infos)
                    vector_steps += steps
                    planned -= steps
                # One scalar transfer per round; the rest of the chunk infos only when a
                # sub-env failed.
                if any(int(n) for n in jax.device_get(
                        [info.num_failures for info in infos[first_new:]])):
                    discarded += self._book_failures(jax.device_get(infos[first_new:]),
                                                     call_offset)
                returned = vector_steps * self.num_envs - discarded
                if restart and returned < num_timesteps:
                    # Failed episodes were discarded: top up to the promised size.
                    planned = math.ceil((num_timesteps - returned) / self.num_envs)
            env_steps = vector_steps * self.num_envs
            batch_mode = "timesteps"
        if self._failures_this_call:
            logger.warning("%d sub-environment step failure(s) on runner %s in this sample() "
                           "call; the failed sub-environments were recreated and %d env steps "
                           "of their episodes discarded.", self._failures_this_call,
                           self.worker_index, discarded)
        # Wait for the device so timers and episode durations measure the work itself.
        jax.block_until_ready(self._carry.vector_step)
        first = infos[0] if infos else None
        batch = EpisodeBatch(
            chunks=tuple(chunks),
            start_episode_count=first.start_episode_count if first else self._carry.episode_count,
            start_episode_len=first.start_episode_len if first else self._carry.episode_len,
            lookback=lookback_at_start, num_steps=vector_steps, num_envs=self.num_envs,
            mode=batch_mode, num_episodes=num_episodes, id_prefix=self._id_prefix,
            observation_space=self.observation_space, action_space=self.action_space,
            weights_seq_no=self._weights_seq_no,
            discarded_env_steps=discarded if batch_mode == "timesteps" else 0)
        return batch, vector_steps, env_steps, discarded

    def _book_failures(self, host_infos, call_offset: int) -> int:
        """Counts sub-env failures of finished chunks; raises when recovery is off or a
        sub-env keeps failing. Returns the env steps discarded with failed episodes."""
        failures = sum(int(i.num_failures) for i in host_infos)
        discarded = sum(int(i.discarded_env_steps) for i in host_infos)
        if failures == 0:
            return 0
        self._metrics.env_step_failures_lifetime += failures
        offset = call_offset
        first_step, first_env = None, None
        for info in host_infos:
            if first_step is None and int(info.first_failure_step) >= 0:
                first_step = offset + int(info.first_failure_step)
                first_env = int(info.first_failure_env)
            offset += int(info.num_steps)
        if not self.config.restart_failed_sub_environments:
            self._needs_reset = True
            raise RuntimeError(
                f"Sub-environment {first_env} of runner {self.worker_index} (env "
                f"{self.env_name!r}) failed at vector step {first_step} of this sample() call "
                f"({failures} failed steps in all: the env set info[{FAILURE_INFO_KEY!r}] or, "
                "with check_finite, returned a non-finite observation or reward). Set "
                "config.fault_tolerance(restart_failed_sub_environments=True) to recreate "
                "failed sub-environments and continue; the next sample() starts fresh."
            )
        tolerance = self.config.num_consecutive_sub_env_failures_tolerance
        if max(int(i.max_consecutive_failures) for i in host_infos) > tolerance:
            self._needs_reset = True
            raise RuntimeError(
                f"A sub-environment of runner {self.worker_index} (env {self.env_name!r}) "
                f"failed more than {tolerance} steps in a row even after being recreated: it "
                "fails forever. Fix the env, or raise "
                "config.fault_tolerance(num_consecutive_sub_env_failures_tolerance=...)."
            )
        self._failures_this_call += failures
        return discarded

    def _chunk_len_for_default(self) -> int:
        return self.config.get_rollout_fragment_length(self.worker_index or 0)

    def _run_chunk(self, fns, num_steps: int, episodes_limit, call_offset: int,
                   chunks: list, infos: list):
        carry, lookback, traj, info = fns["chunk"](
            self._carry, self._lookback, self._params, self.env_params,
            np.int32(num_steps), np.int32(episodes_limit), np.int32(call_offset))
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

    # ------------------------------------------------------------------ metrics
    def get_metrics(self) -> dict[str, Any]:
        """RLlib's metric keys for the steps and episodes since the last call.

        Smoothed episode keys (`episode_return_mean`, ...) cover the last
        `ceil(metrics_num_episodes_for_smoothing / num_env_runners)` finished episodes and
        are absent until an episode has finished. An episode cut across calls counts once,
        with its whole length and return.
        """
        if self._carry is None:
            registers = None
        else:
            registers = jax.device_get(self._carry.metrics)
        self._metrics.weights_seq_no = self._weights_seq_no
        if registers is None:
            from jaxrunner.core.carry import MetricRegisters

            registers = jax.device_get(MetricRegisters.create(1))
        metrics = self._metrics.reduce(registers)
        self.num_env_steps_sampled_lifetime = self._metrics.env_steps_lifetime
        return metrics

    def get_metrics_window(self) -> dict[str, np.ndarray]:
        """The finished episodes in this runner's smoothing window as host arrays:
        `episode_return`, `episode_len`, `episode_duration_sec` (each `(n,)`, n <= W).

        `EnvRunnerGroup.get_metrics()` merges these windows so that means are taken over
        all runners' episodes, not averaged per runner. Changes nothing (no reduce).
        """
        from jaxrunner.core.carry import MetricRegisters

        registers = (MetricRegisters.create(1) if self._carry is None
                     else self._carry.metrics)
        return self._metrics.window_values(jax.device_get(registers))

    # ------------------------------------------------------------------ state
    def get_state(self, components: Any = None, *, not_components: Any = None,
                  inference_only: bool = True, **kwargs: Any) -> dict[str, Any]:
        """The runner's state as host numpy.

        Components: "rl_module" (weights, with "weights_seq_no"),
        "env_to_module_connector", "module_to_env_connector" (connector states), and
        "env_runner_carry" (RNG key, env states, episode counters, metric registers) only
        when asked for by name. `num_env_steps_sampled_lifetime` is always included.
        """
        wanted = _as_set(components)
        unwanted = _as_set(not_components) or set()
        for given in (wanted or set()) | unwanted:
            if given not in _ALL_COMPONENTS:
                raise ValueError(
                    f"Unknown state component {given!r}; valid components are "
                    f"{list(_ALL_COMPONENTS)}."
                )

        def selected(name: str) -> bool:
            if name in unwanted:
                return False
            if wanted is None:
                return name in _DEFAULT_COMPONENTS
            return name in wanted

        state: dict[str, Any] = {
            "num_env_steps_sampled_lifetime": self._metrics.env_steps_lifetime}
        if selected(COMPONENT_RL_MODULE) and self._params is not None:
            state[COMPONENT_RL_MODULE] = jax.device_get(self._params)
            state["weights_seq_no"] = self._weights_seq_no
        for index, (name, pipeline) in enumerate(self._pipelines()):
            if selected(name):
                if self.env is not None:
                    self._ensure_carry()
                    state[name] = jax.device_get(
                        pipeline.get_state(self._carry.connector_state[index]))
                else:
                    state[name] = {}
        if selected(COMPONENT_CARRY) and self.env is not None:
            self._check_carry_capturable()
            self._ensure_carry()
            carry, lookback = jax.device_get(
                (self._carry.replace(key=jax.random.key_data(self._carry.key)),
                 self._lookback))
            state[COMPONENT_CARRY] = {
                "carry": carry, "lookback": lookback, "needs_reset": self._needs_reset,
                "key_impl": str(jax.random.key_impl(self._carry.key)),
                "metrics": self._metrics.get_state(),
            }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores `get_state()` output. Weights apply only if `weights_seq_no` is 0 or
        newer than the runner's; a wrong structure raises `StateStructureError` and leaves
        the runner as it was."""
        if not isinstance(state, dict):
            raise StateStructureError(
                f"set_state expects the dict get_state() returns, got {type(state).__name__}."
            )
        unknown = set(state) - _STATE_KEYS
        if unknown:
            raise StateStructureError(
                f"set_state: unknown keys {sorted(unknown)}; expected some of "
                f"{sorted(_STATE_KEYS)}."
            )
        # Validate everything before changing anything.
        new_params, seq = None, int(state.get("weights_seq_no", 0) or 0)
        if COMPONENT_RL_MODULE in state and (seq == 0 or seq > self._weights_seq_no):
            weights = state[COMPONENT_RL_MODULE]
            if isinstance(weights, dict) and set(weights) == {DEFAULT_MODULE_ID}:
                weights = weights[DEFAULT_MODULE_ID]
            if self.module is None:
                raise ValueError("set_state: this runner has no module to load weights into.")
            try:
                weights = self.module.params_for_inference(weights)
            except (KeyError, TypeError) as error:
                raise StateStructureError(
                    f"set_state: rl_module weights do not fit {type(self.module).__name__} "
                    f"({type(error).__name__}: {error})."
                ) from error
            _check_same_structure(self._params, weights, "rl_module weights")
            new_params = jax.tree.map(lambda old, new: jnp.asarray(new, old.dtype),
                                      self._params, weights)
        carry_state = state.get(COMPONENT_CARRY)
        new_carry = None
        if carry_state is not None:
            self._check_carry_capturable()
            self._ensure_carry()
            current = jax.device_get(
                (self._carry.replace(key=jax.random.key_data(self._carry.key)),
                 self._lookback))
            _check_same_structure(current, (carry_state["carry"], carry_state["lookback"]),
                                  "env_runner_carry")
            key = jax.random.wrap_key_data(
                jnp.asarray(carry_state["carry"].key),
                impl=carry_state.get("key_impl", None) or jax.random.key_impl(self._carry.key))
            new_carry = (jax.device_put(carry_state["carry"].replace(key=None)).replace(key=key),
                         jax.device_put(carry_state["lookback"]))
        connector_updates = {}
        for index, (name, pipeline) in enumerate(self._pipelines()):
            saved = state.get(name)
            if not saved:
                continue
            if self.env is None:
                raise StateStructureError(
                    f"set_state: this runner has no env, so no {name} to restore.")
            if not isinstance(saved, dict):
                raise StateStructureError(
                    f"set_state: {name} must be the dict get_state() returns, got "
                    f"{type(saved).__name__}.")
            self._ensure_carry()
            base = (new_carry[0] if new_carry is not None else self._carry).connector_state
            connector_updates[index] = pipeline.set_state(base[index], saved)
        # Apply.
        if new_params is not None:
            self._params = new_params
            if seq > 0:
                self._weights_seq_no = seq
        if "num_env_steps_sampled_lifetime" in state:
            self._metrics.env_steps_lifetime = int(state["num_env_steps_sampled_lifetime"])
            self.num_env_steps_sampled_lifetime = self._metrics.env_steps_lifetime
        if new_carry is not None:
            self._carry, self._lookback = new_carry
            self._needs_reset = bool(carry_state["needs_reset"])
            self._metrics.set_state(carry_state["metrics"])
        if connector_updates:
            states = list(self._carry.connector_state)
            for index, value in connector_updates.items():
                states[index] = jax.tree.map(jnp.asarray, value)
            self._carry = self._carry.replace(connector_state=tuple(states))
        if new_params is not None or new_carry is not None or connector_updates:
            self._place_on_devices()

    def _check_carry_capturable(self) -> None:
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

    def merge_connector_states(self, states: list[dict]) -> dict:
        """Combines several runners' connector components (from `get_state`) into one,
        e.g. mean-std statistics of the union of their samples."""
        out = {}
        for name, pipeline in self._pipelines():
            parts = [s[name] for s in states if s.get(name)]
            if parts:
                out[name] = pipeline.merge_states(parts)
        return out

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

    def assert_healthy(self) -> None:
        if self._stopped:
            raise AssertionError("The runner was stopped.")
        if self.env is None or self.module is None:
            raise AssertionError(
                f"Runner (worker_index={self.worker_index}) is not healthy: env="
                f"{self.env_name!r}, module={type(self.module).__name__ if self.module else None}."
            )

    def stop(self) -> None:
        """Releases the env, carry and compiled functions; safe to call again."""
        self._stopped = True
        self._carry = None
        self._lookback = None
        self._compiled = {}
        if self._host is not None:
            self._host.close()

    @property
    def weights_seq_no(self) -> int:
        return self._weights_seq_no

    def __repr__(self) -> str:
        return (f"SingleAgentEnvRunner(env={self.env_name!r}, num_envs={self.num_envs}, "
                f"worker_index={self.worker_index})")


__all__ = ["SingleAgentEnvRunner"]
