"""`JaxEnvRunner`: an RLlib `EnvRunner` whose env-step loop is one compiled JAX program.

Drop it into any single-agent RLlib algorithm on the new API stack::

    config = (PPOConfig()
              .environment("CartPole-v1")          # a gymnax id (or a registered JAX env)
              .env_runners(env_runner_cls=JaxEnvRunner, num_env_runners=1,
                           num_envs_per_env_runner=16))
    algo = config.build_algo()
    algo.train()

What each RLlib component sees is unchanged:

* the Algorithm and `EnvRunnerGroup` construct it with `config=` and `worker_index=` /
  `num_workers=` / `spaces=` / `tune_trial_id=`, call `sample()`, `get_metrics()`,
  `get_state()`, `set_state()`, `get_spaces()`, `ping()`, `apply()`, `assert_healthy()`,
  `make_env()`, `make_module()`, `stop()` and `sample_get_state_and_metrics()`;
* learners receive `ray.rllib` `SingleAgentEpisode`s (numpy, with `action_logp`,
  `action_dist_inputs`, `weights_seq_no`, RLlib's cut/`t_started`/lookback semantics);
* the torch state dicts learners broadcast are applied to a torch copy of RLlib's
  inference module (`self.module`, what `Algorithm.get_module()` returns and what
  `get_state()` reports) and translated into the Flax params of the compiled policy;
* metrics are logged into RLlib's `MetricsLogger` with the keys, reduce methods and
  windows RLlib's `SingleAgentEnvRunner` uses, and `get_metrics()` returns its
  `reduce()` result, so `Algorithm` aggregation, Tune and loggers work unchanged.

Inside, a jaxrunner `SingleAgentEnvRunner` steps `num_envs_per_env_runner` vmapped gymnax
sub-envs with `RLlibPPOModule` in a `lax.scan`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from typing import Any, Collection, Optional, Union

import ray
from ray.rllib.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    DEFAULT_AGENT_ID,
    DEFAULT_MODULE_ID,
)
from ray.rllib.env.env_runner import NUM_ENV_STEP_FAILURES_LIFETIME, EnvRunner
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.utils import force_list
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    ENV_RUNNER_STATE_SERVER_PULL_TIMER,
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    SAMPLE_TIMER,
    TIME_BETWEEN_SAMPLING,
    WEIGHTS_SEQ_NO,
)
from ray.util import log_once

from jaxrunner.callbacks import env_index_of
from jaxrunner.envs.context import EnvContext
from jaxrunner.metrics import keys as jaxrunner_keys
from jaxrunner.rllib.config import check_supported, runner_config_from_rllib
from jaxrunner.rllib.episodes import to_rllib_episodes
from jaxrunner.rllib.errors import UnsupportedRLlibSetupError
from jaxrunner.rllib.module import PPOLayout
from jaxrunner.rllib.weights import torch_state_to_flax_params
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner

logger = logging.getLogger("ray.rllib")


class JaxEnvRunner(EnvRunner, Checkpointable):
    """RLlib `EnvRunner` sampling JAX envs with a compiled rollout.

    Args:
        config: the RLlib `AlgorithmConfig` (kept as `self.config`; the translated
            jaxrunner config is `self.runner_config`).
        worker_index: 0 for the local runner, 1..N for remote runners, None standalone.
        num_workers: number of remote runners (default `config.num_env_runners`).
        spaces: `get_spaces()` of a remote runner, for a local runner without an env.
        tune_trial_id: the Tune trial this runner samples for.

    Raises:
        UnsupportedRLlibSetupError: for configs the compiled runner cannot reproduce.
    """

    def __init__(self, *, config: Any, **kwargs: Any):
        if kwargs.get("worker_index"):
            # A remote runner shares its node's GPUs with torch learners: let JAX take GPU
            # memory as it needs it instead of 75% up front (only effective before JAX's
            # backend starts in this process; an explicit setting wins).
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        super().__init__(config=config, **kwargs)
        check_supported(self.config)
        self.tune_trial_id: Optional[str] = kwargs.get("tune_trial_id")
        self.spaces: dict = kwargs.get("spaces") or {}
        self._callbacks = [cls() for cls in force_list(self.config.callbacks_class)]
        self.runner_config = runner_config_from_rllib(self.config)
        self._runner: Optional[SingleAgentEnvRunner] = None
        self.env = None
        self.num_envs = 0
        self.module = None
        self._layout: Optional[PPOLayout] = None
        self._weights_seq_no = 0
        self._needs_initial_reset = True
        # id -> [((length, return, seconds), chunk)] of the running episodes' earlier chunks.
        self._ongoing_chunks: dict[str, list[tuple[tuple[int, float, float], Any]]] = (
            defaultdict(list))
        self._done_episode_stats: list[tuple[int, float, float]] = []
        self._env_step_failures_seen = 0
        self._time_after_sampling: Optional[float] = None
        self._env_runner_state_server = None  # set by IMPALA/APPO when configured
        self._stopped = False
        self._build_runner()
        self._on_environment_created()
        # RLlib's default connector pipelines: stateless, kept so the Algorithm and
        # EnvRunnerGroup can get/set/merge connector states as with RLlib's runner.
        self._env_to_module = self.config.build_env_to_module_connector(
            env=None, spaces=self.get_spaces(), device=None)
        self.make_module()
        self._module_to_env = self.config.build_module_to_env_connector(
            env=None, spaces=self.get_spaces())

    # ------------------------------------------------------------------ construction
    def _build_runner(self) -> None:
        """(Re)builds the jaxrunner runner; keeps the current Flax params if the network
        layout did not change."""
        params, old_layout = None, self._layout
        if self._runner is not None:
            if self._runner.module is not None:
                params = self._runner.get_state(components=COMPONENT_RL_MODULE).get(
                    COMPONENT_RL_MODULE)
            self._runner.stop()
        self._runner = SingleAgentEnvRunner(
            config=self.runner_config, worker_index=self.worker_index,
            num_workers=self.num_workers, spaces=self.spaces or None)
        self.env = self._runner.env
        self.num_envs = self._runner.num_envs if self.env is not None else 0
        self._needs_initial_reset = True
        self._layout = None
        if self._runner.module is not None:
            self._layout = self._runner.module.layout
            if params is not None and self._layout == old_layout:
                self._runner.set_state({COMPONENT_RL_MODULE: params,
                                        WEIGHTS_SEQ_NO: self._weights_seq_no})

    def make_env(self) -> None:
        """(Re)creates the JAX env from `self.config` (e.g. after `env_config` changed).

        The compiled rollout is rebuilt around the new env; weights are kept. Fires
        `on_environment_created(env_runner, metrics_logger, env, env_context)` with the
        gymnax env.
        """
        self.runner_config = runner_config_from_rllib(self.config)
        self._build_runner()
        self._on_environment_created()

    def _on_environment_created(self) -> None:
        if self.env is None:
            return
        env_context = EnvContext(dict(self.config.env_config or {}),
                                 worker_index=self.worker_index, num_workers=self.num_workers)
        make_callback(
            "on_environment_created",
            callbacks_objects=self._callbacks,
            callbacks_functions=self.config.callbacks_on_environment_created,
            kwargs=dict(env_runner=self, metrics_logger=self.metrics, env=self.env,
                        env_context=env_context),
        )

    def make_module(self) -> None:
        """Builds RLlib's inference-only torch module (`self.module`) and loads its weights
        into the compiled Flax policy, so both act identically from the start. If the
        model config changed, the compiled rollout is rebuilt for the new layout."""
        translated = runner_config_from_rllib(self.config)
        if (translated.rl_module_spec.model_config
                != self.runner_config.rl_module_spec.model_config):
            self.runner_config = translated
            self._build_runner()
        spec = self.config.get_rl_module_spec(spaces=self.get_spaces() or None,
                                              inference_only=True)
        try:
            self.module = spec.build()
        except NotImplementedError:  # as RLlib's runner: no module, random actions only
            self.module = None
            return
        if self._runner.module is None:
            return
        self._apply_torch_state(self.module.get_state(inference_only=True), seq_no=None)

    # ------------------------------------------------------------------ sampling
    def sample(self, *, num_timesteps: Optional[int] = None,
               num_episodes: Optional[int] = None, explore: Optional[bool] = None,
               random_actions: bool = False, force_reset: bool = False) -> list:
        """RLlib's `sample()`: `num_timesteps` env steps (episodes cut and continued in the
        next call) or `num_episodes` complete episodes; with neither, `batch_mode`
        decides. Returns `ray.rllib` `SingleAgentEpisode`s."""
        if self.env is None:
            raise ValueError(
                f"{self} doesn't have an env! It is the local runner of a group with remote "
                "runners; sample on the remote runners or set "
                "config.env_runners(create_env_on_local_worker=True)."
            )
        assert not (num_timesteps is not None and num_episodes is not None)
        if self._time_after_sampling is not None:
            self.metrics.log_value(key=TIME_BETWEEN_SAMPLING,
                                   value=time.perf_counter() - self._time_after_sampling)
        self._pull_state_from_server()
        self.metrics.log_value(key=WEIGHTS_SEQ_NO, value=self._weights_seq_no, window=1)
        with self.metrics.log_time(SAMPLE_TIMER):
            if explore is None:
                explore = self.config.explore
            if num_timesteps is None and num_episodes is None:
                if self.config.batch_mode == "truncate_episodes":
                    num_timesteps = (self.config.get_rollout_fragment_length(
                        self.worker_index) * self.num_envs)
                else:
                    num_episodes = self.num_envs
            if num_timesteps is not None:
                assert num_timesteps >= 0
            if num_episodes is not None:
                assert num_episodes >= 0
            if force_reset or num_episodes is not None or self._needs_initial_reset:
                # Episodes in flight are abandoned: forget their earlier chunks.
                self._ongoing_chunks.clear()
            start = time.perf_counter()
            batch = self._runner.sample(num_timesteps=num_timesteps,
                                        num_episodes=num_episodes, explore=explore,
                                        random_actions=random_actions,
                                        force_reset=force_reset)
            elapsed = time.perf_counter() - start
            self._needs_initial_reset = num_episodes is not None
            episodes = to_rllib_episodes(
                batch, weights_seq_no=self._weights_seq_no,
                observation_space=self._runner.observation_space,
                action_space=self._runner.action_space)
            vector_steps = batch.num_vector_steps
            # As RLlib counts: timestep mode, the steps returned (episodes discarded after
            # a sub-env failure are not); episode mode, every step taken, including those
            # of the episodes still running when the k-th finished (dropped).
            if num_episodes is None:
                env_steps = sum(len(e) for e in episodes)
            else:
                env_steps = vector_steps * self.num_envs
            seconds_per_step = elapsed / max(vector_steps, 1)
            finished = self._book_episodes(episodes, seconds_per_step)
            if num_episodes is None and vector_steps > 0:
                self._forget_dead_chunks(episodes)
            self._log_env_steps(metric=self._metrics_num_try_env_step, num_steps=vector_steps)
            self._log_env_steps(metric=self._metrics_num_env_steps_sampled,
                                num_steps=env_steps)
            self._increase_sampled_metrics(env_steps, len(finished))
            for episode, earlier in finished:  # RLlib calls it when the episode ends
                make_callback(
                    "on_episode_end",
                    callbacks_objects=self._callbacks,
                    callbacks_functions=self.config.callbacks_on_episode_end,
                    kwargs=dict(episode=episode, prev_episode_chunks=earlier,
                                env_runner=self, metrics_logger=self.metrics, env=self.env,
                                env_index=env_index_of(episode), rl_module=self.module))
            make_callback(
                "on_sample_end",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_sample_end,
                kwargs=dict(env_runner=self, metrics_logger=self.metrics, samples=episodes),
            )
        self._time_after_sampling = time.perf_counter()
        return episodes

    def _book_episodes(self, episodes: list, seconds_per_step: float) -> list[tuple]:
        """Remembers the running episodes' chunks with their lengths/returns/durations;
        whole-episode stats of finished episodes (all their chunks) wait for
        `get_metrics()`. Returns `[(finished episode, its earlier chunks)]` (RLlib's
        `on_episode_end(episode, prev_episode_chunks)`)."""
        finished = []
        for episode in episodes:
            length = len(episode)
            stats = (length, float(episode.get_return()), length * seconds_per_step)
            if episode.is_done:
                earlier = self._ongoing_chunks.pop(episode.id_, [])
                self._done_episode_stats.append(tuple(
                    sum(values) for values in zip(stats, *(s for s, _ in earlier))))
                finished.append((episode, [chunk for _, chunk in earlier]))
            else:
                self._ongoing_chunks[episode.id_].append((stats, episode))
        return finished

    def _forget_dead_chunks(self, episodes: list) -> None:
        """After a timestep-mode call that stepped: every running episode got a chunk;
        earlier chunks of any other id belong to episodes a failed sub-env discarded."""
        live = {episode.id_ for episode in episodes if not episode.is_done}
        for id_ in set(self._ongoing_chunks) - live:
            del self._ongoing_chunks[id_]

    def _pull_state_from_server(self) -> None:
        """IMPALA/APPO's `EnvRunnerStateServer`: take its state if newer than ours."""
        if self._env_runner_state_server is None:
            return
        try:
            with self.metrics.log_time(ENV_RUNNER_STATE_SERVER_PULL_TIMER):
                state = ray.get(self._env_runner_state_server.pull_if_newer.remote(
                    self._weights_seq_no))
        except ray.exceptions.RayError as error:
            state = None
            if log_once("jax_env_runner_state_server_pull_failed"):
                logger.warning("JaxEnvRunner could not pull state from the "
                               f"EnvRunnerStateServer ({type(error).__name__}); sampling "
                               "with the current weights.")
        if state is not None:
            self.set_state(state)

    # ------------------------------------------------------------------ metrics
    def _increase_sampled_metrics(self, num_steps: int, num_episodes: int) -> None:
        m = self.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, num_steps, reduce="sum")
        m.log_value((NUM_AGENT_STEPS_SAMPLED, DEFAULT_AGENT_ID), num_steps, reduce="sum")
        m.log_value((NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID), num_steps, reduce="sum")
        m.log_value(NUM_EPISODES, num_episodes, reduce="sum")
        m.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, num_steps, reduce="lifetime_sum",
                    with_throughput=True)
        m.log_value((NUM_AGENT_STEPS_SAMPLED_LIFETIME, DEFAULT_AGENT_ID), num_steps,
                    reduce="lifetime_sum")
        m.log_value((NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID), num_steps,
                    reduce="lifetime_sum")
        m.log_value(NUM_EPISODES_LIFETIME, num_episodes, reduce="lifetime_sum")

    def _log_episode_metrics(self, length: int, ret: float, sec: float) -> None:
        win = max(1, int(math.ceil(self.config.metrics_num_episodes_for_smoothing
                                   / (self.config.num_env_runners or 1))))
        m = self.metrics
        m.log_value(EPISODE_LEN_MEAN, length, window=win)
        m.log_value(EPISODE_RETURN_MEAN, ret, window=win)
        m.log_value(EPISODE_DURATION_SEC_MEAN, sec, window=win)
        m.log_value(("agent_episode_return_mean", DEFAULT_AGENT_ID), ret, window=win)
        m.log_value(("module_episode_return_mean", DEFAULT_MODULE_ID), ret, window=win)
        m.log_value(EPISODE_LEN_MIN, length, reduce="min", window=win)
        m.log_value(EPISODE_RETURN_MIN, ret, reduce="min", window=win)
        m.log_value(EPISODE_LEN_MAX, length, reduce="max", window=win)
        m.log_value(EPISODE_RETURN_MAX, ret, reduce="max", window=win)

    def get_metrics(self) -> dict:
        """`self.metrics.reduce()`, as RLlib's runners return it: Stats objects under
        RLlib's keys, which the Algorithm merges over runners under `env_runners`.

        Episode keys cover whole episodes (all chunks) finished since the last call,
        smoothed over `ceil(metrics_num_episodes_for_smoothing / num_env_runners)`
        episodes.
        """
        for length, ret, sec in self._done_episode_stats:
            self._log_episode_metrics(length, ret, sec)
        self._done_episode_stats.clear()
        if self._runner is not None and self.env is not None:
            failures = self._runner.get_metrics().get(jaxrunner_keys.NUM_ENV_STEP_FAILURES, 0)
            if failures > self._env_step_failures_seen:
                self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME,
                                       failures - self._env_step_failures_seen,
                                       reduce="lifetime_sum")
                self._env_step_failures_seen = failures
        return self.metrics.reduce()

    # ------------------------------------------------------------------ state
    def get_state(self, components: Optional[Union[str, Collection[str]]] = None, *,
                  not_components: Optional[Union[str, Collection[str]]] = None,
                  **kwargs: Any) -> dict:
        """RLlib's runner state: `num_env_steps_sampled_lifetime`, and if selected the
        module's torch state dict (+ `weights_seq_no`) and the connector states."""
        state: dict = {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime}
        if self._check_component(COMPONENT_RL_MODULE, components, not_components):
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                components=self._get_subcomponents(COMPONENT_RL_MODULE, components),
                not_components=self._get_subcomponents(COMPONENT_RL_MODULE,
                                                       not_components),
                **kwargs)
            state[WEIGHTS_SEQ_NO] = self._weights_seq_no
        if self._check_component(COMPONENT_ENV_TO_MODULE_CONNECTOR, components,
                                 not_components):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = self._env_to_module.get_state()
        if self._check_component(COMPONENT_MODULE_TO_ENV_CONNECTOR, components,
                                 not_components):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = self._module_to_env.get_state()
        return state

    def set_state(self, state: dict) -> None:
        """Applies connector states, weights (only if `weights_seq_no` is 0 or newer than
        ours; an `ObjectRef` is fetched, a `{"default_policy": ...}` dict unwrapped) and
        the lifetime step count. Weights are translated to Flax before anything changes,
        so a state of the wrong layout raises and leaves the runner as it was."""
        if COMPONENT_RL_MODULE in state:
            seq_no = state.get(WEIGHTS_SEQ_NO, 0) or 0
            if seq_no == 0 or self._weights_seq_no < seq_no:
                module_state = state[COMPONENT_RL_MODULE]
                if isinstance(module_state, ray.ObjectRef):
                    module_state = ray.get(module_state)
                if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
                    module_state = module_state[DEFAULT_MODULE_ID]
                self._apply_torch_state(module_state, seq_no=seq_no)
        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._env_to_module.set_state(state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
        if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
            self._module_to_env.set_state(state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    def _apply_torch_state(self, module_state: dict, seq_no: Optional[int]) -> None:
        params = None
        if self._layout is not None:
            params = torch_state_to_flax_params(module_state, self._layout)
        self.module.set_state(module_state)
        if params is not None:
            # The inner runner applies weights with seq 0 unconditionally.
            self._runner.set_state({COMPONENT_RL_MODULE: params,
                                    WEIGHTS_SEQ_NO: seq_no or 0})
        if seq_no:
            self._weights_seq_no = seq_no

    @property
    def flax_params(self) -> Any:
        """The compiled policy's current params (host numpy)."""
        return self._runner.get_state(components=COMPONENT_RL_MODULE)[COMPONENT_RL_MODULE]

    @property
    def layout(self) -> Optional[PPOLayout]:
        """The translated network layout (None until a module exists)."""
        return self._layout

    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    def get_checkpointable_components(self):
        # The module is restored through `set_state` (and not as a separate component),
        # so that the compiled policy's Flax params follow the torch weights.
        return [(COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
                (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env)]

    # ------------------------------------------------------------------ the rest
    def get_spaces(self) -> dict:
        """`{"__env__": batched spaces, "__env_single__": single spaces,
        "default_policy": (obs, act)}` (gymnasium), or the `spaces` given to a local
        runner without an env."""
        if self.env is None:
            return self.spaces
        return self._runner.get_spaces()

    def assert_healthy(self) -> None:
        """Raises AssertionError unless the env, the module and the compiled policy exist."""
        assert self.env is not None and self.module is not None and not self._stopped, (
            f"JaxEnvRunner (worker_index={self.worker_index}) is not healthy: "
            f"env={self.env!r}, module={type(self.module).__name__}, stopped={self._stopped}.")
        self._runner.assert_healthy()

    def stop(self) -> None:
        """Releases the compiled rollout and device buffers; safe to call again."""
        self._stopped = True
        if self._runner is not None:
            self._runner.stop()

    def __repr__(self) -> str:
        env = self._runner.env_name if self._runner is not None else None
        return (f"JaxEnvRunner(env={env!r}, num_envs={self.num_envs}, "
                f"worker_index={self.worker_index})")


__all__ = ["JaxEnvRunner", "UnsupportedRLlibSetupError"]
