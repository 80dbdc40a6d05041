"""Translation of an RLlib `AlgorithmConfig` into a jaxrunner `RunnerConfig`.

`runner_config_from_rllib(algo_config)` (also `RunnerConfig.from_rllib`) copies every
setting the two configs share (same names, same meaning), resolves the env to a JAX env,
and puts RLlib's full model config into an `RLModuleSpec` for `RLlibPPOModule`. It raises
`UnsupportedRLlibSetupError` for what a compiled rollout cannot reproduce.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrunner.config import RunnerConfig
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.registry import (call_tune_creator, gymnax_env_ids, registered_env_names,
                                     tune_env_creator)
from jaxrunner.modules.rl_module import RLModuleSpec
from jaxrunner.rllib.errors import UnsupportedRLlibSetupError
from jaxrunner.rllib.module import RLlibPPOModule, canonical_activation

# Settings with the same name and meaning in RLlib's AlgorithmConfig and RunnerConfig.
SHARED_SETTINGS = (
    # environment()
    "normalize_actions", "clip_actions", "disable_env_checking",
    # env_runners()
    "num_env_runners", "create_env_on_local_worker", "num_envs_per_env_runner",
    "num_cpus_per_env_runner", "num_gpus_per_env_runner", "sample_timeout_s",
    "max_requests_in_flight_per_env_runner", "episode_lookback_horizon",
    "merge_env_runner_states", "broadcast_env_runner_states", "rollout_fragment_length",
    "batch_mode", "explore", "episodes_to_numpy",
    # A compiled env's creator sees it as `env_context.remote`, as in RLlib.
    # (`gym_env_vectorize_mode` is not copied: it only acts on host envs, which
    # JaxEnvRunner refuses, and RLlib's "async" for a gymnax id such as "CartPole-v1"
    # would become the gymnax-precedence error naming a "gymnasium:" env it cannot run.)
    "remote_worker_envs",
    # training()
    "train_batch_size_per_learner", "num_learners",
    # fault_tolerance()
    "restart_failed_env_runners", "ignore_env_runner_failures",
    "max_num_env_runner_restarts", "delay_between_env_runner_restarts_s",
    "restart_failed_sub_environments", "num_consecutive_env_runner_failures_tolerance",
    "env_runner_health_probe_timeout_s", "env_runner_restore_timeout_s",
    # multi_agent()
    "count_steps_by",
    # reporting(), debugging(), evaluation
    "metrics_num_episodes_for_smoothing", "seed", "in_evaluation",
)

# Per-step callbacks run inside RLlib's Python env loop; a compiled rollout has no such
# loop. on_episode_end is called after each sample() for every episode that finished in it
# (as jaxrunner's host on_episode_end); per-step measurements are jaxrunner's device
# callbacks (docs/callbacks.md).
UNSUPPORTED_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step")


class TuneEnvCreator:
    """Looks up `name` in Ray Tune's env registry when called (in whichever process).

    Ray Tune's registry is shared by every Ray worker, so a JAX env registered with
    `ray.tune.registry.register_env(name, creator)` in the driver is found inside remote
    runners too. `creator(env_context)` must return a gymnax-style `(env, env_params)`
    (or a gymnax env); it gets the context as RLlib passes it
    (`jaxrunner.envs.registry.call_tune_creator`).
    """

    def __init__(self, name: str):
        self.name = name

    def __call__(self, env_context: EnvContext) -> Any:
        from ray.tune.registry import ENV_CREATOR, _global_registry

        return call_tune_creator(_global_registry.get(ENV_CREATOR, self.name), env_context)

    def __repr__(self) -> str:
        return f"TuneEnvCreator({self.name!r})"


def resolve_env(env: Any) -> Any:
    """RLlib's `config.env` -> a `RunnerConfig.environment(env=...)` value.

    Order: a `jaxrunner.register_env` name, a Ray Tune registry name (looked up lazily,
    see `TuneEnvCreator`), a gymnax id, a callable creator. Anything else cannot be
    compiled.
    """
    if env is None:
        raise ValueError(
            "config.env is not set: call config.environment('CartPole-v1') (a gymnax id) "
            "or register a JAX env first."
        )
    if isinstance(env, str):
        if env in registered_env_names():
            return env
        if tune_env_creator(env) is not None:
            return TuneEnvCreator(env)
        if env in gymnax_env_ids(runnable_only=False):
            return env
        raise UnsupportedRLlibSetupError(
            f"config.env={env!r} is not a JAX env: it is neither a gymnax id, nor a name "
            "given to jaxrunner.register_env or ray.tune.registry.register_env. "
            "JaxEnvRunner compiles the env's step function, so gymnasium envs cannot run "
            "in it; use RLlib's SingleAgentEnvRunner for them."
        )
    if isinstance(env, type):
        raise UnsupportedRLlibSetupError(
            f"config.env={env.__name__} is a class; JaxEnvRunner needs a JAX env: pass a "
            "creator callable `creator(env_context) -> (env, env_params)` instead."
        )
    if callable(env):
        return env
    raise UnsupportedRLlibSetupError(f"config.env has an unsupported type {type(env)!r}.")


def rllib_model_config(algo_config: Any) -> dict[str, Any]:
    """The model config RLlib's catalog builds the default module from (the algorithm's
    `model_config` over `DefaultModelConfig`'s defaults)."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    spec = algo_config.get_rl_module_spec()
    given = spec.model_config if spec.model_config is not None else algo_config.model_config
    if dataclasses.is_dataclass(given):
        given = dataclasses.asdict(given)
    return dataclasses.asdict(DefaultModelConfig()) | dict(given or {})


def check_supported(algo_config: Any) -> None:
    """Raises `UnsupportedRLlibSetupError` for RLlib setups JaxEnvRunner cannot run."""
    framework = getattr(algo_config, "framework_str", "torch")
    if framework != "torch":
        raise UnsupportedRLlibSetupError(
            f"framework={framework!r}: RLlib's new API stack trains torch modules, and "
            "JaxEnvRunner translates torch weights."
        )
    if not getattr(algo_config, "enable_env_runner_and_connector_v2", True):
        raise UnsupportedRLlibSetupError(
            "The old API stack (RolloutWorker) is on: JaxEnvRunner is an EnvRunner of the "
            "new API stack (config.api_stack(enable_rl_module_and_learner=True, "
            "enable_env_runner_and_connector_v2=True), RLlib's default)."
        )
    if algo_config.is_multi_agent:
        raise UnsupportedRLlibSetupError(
            f"Multi-agent configs (policies={sorted(algo_config.policies)}) are not "
            "supported by JaxEnvRunner yet."
        )
    for name in ("env_to_module_connector", "module_to_env_connector"):
        if getattr(algo_config, f"_{name}", None) is not None:
            raise UnsupportedRLlibSetupError(
                f"config.env_runners({name}=...) is set: RLlib connectors run on Python "
                "episodes between env steps, which the compiled rollout does not have. "
                "Only the default connector pipelines are supported."
            )
    for name in ("add_default_connectors_to_env_to_module_pipeline",
                 "add_default_connectors_to_module_to_env_pipeline"):
        if not getattr(algo_config, name, True):
            raise UnsupportedRLlibSetupError(
                f"config.env_runners({name}=False): JaxEnvRunner reproduces only RLlib's "
                "default connector pipelines."
            )
    from ray.rllib.callbacks.callbacks import RLlibCallback
    from ray.rllib.utils import force_list

    for cls in force_list(algo_config.callbacks_class):
        for hook in UNSUPPORTED_CALLBACKS:
            if isinstance(cls, type) and getattr(cls, hook, None) is not getattr(
                    RLlibCallback, hook):
                raise UnsupportedRLlibSetupError(
                    f"The callbacks class {cls.__name__} overrides {hook}(), which RLlib "
                    "calls from its per-step Python env loop; JaxEnvRunner steps the env "
                    "inside one compiled program and cannot call it. Compute episode "
                    "metrics in on_episode_end(episode, ...) or on_sample_end(env_runner, "
                    "metrics_logger, samples) from the returned episodes instead (supported, "
                    "as is on_environment_created), or run jaxrunner's own runner with "
                    "device callbacks (docs/callbacks.md)."
                )
    for hook in UNSUPPORTED_CALLBACKS:
        if getattr(algo_config, f"callbacks_{hook}", None) is not None:
            raise UnsupportedRLlibSetupError(
                f"config.callbacks({hook}=...) cannot run inside the compiled rollout; use "
                "on_episode_end or on_sample_end instead, or jaxrunner's own runner with "
                "device callbacks (docs/callbacks.md)."
            )
    _check_module_class(algo_config)


def _check_module_class(algo_config: Any) -> None:
    from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import (
        DefaultAPPOTorchRLModule,
    )
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )

    spec = algo_config.get_rl_module_spec()
    if spec.module_class not in (DefaultPPOTorchRLModule, DefaultAPPOTorchRLModule):
        name = getattr(spec.module_class, "__name__", spec.module_class)
        raise UnsupportedRLlibSetupError(
            f"The RLModule class is {name}: JaxEnvRunner compiles RLlib's default "
            "PPO/APPO torch module only, whose weights it can translate layer by layer. "
            "A custom torch module cannot be run by the compiled runner."
        )
    if spec.catalog_class is not None:
        from ray.rllib.algorithms.appo.appo_catalog import APPOCatalog
        from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog

        if spec.catalog_class not in (PPOCatalog, APPOCatalog):
            raise UnsupportedRLlibSetupError(
                f"The RLModuleSpec uses the catalog {spec.catalog_class.__name__}; only "
                "RLlib's PPOCatalog/APPOCatalog layouts can be compiled."
            )
    model_config = rllib_model_config(algo_config)
    if model_config.get("use_lstm"):
        raise UnsupportedRLlibSetupError(
            "model_config['use_lstm']=True: a recurrent encoder's state cannot be carried "
            "through the compiled rollout yet."
        )
    canonical_activation(model_config.get("fcnet_activation"), setting="fcnet_activation")
    canonical_activation(model_config.get("head_fcnet_activation"),
                         setting="head_fcnet_activation")


def runner_config_from_rllib(algo_config: Any, **overrides: Any) -> RunnerConfig:
    """Builds the `RunnerConfig` of a jaxrunner runner that samples for `algo_config`.

    Args:
        algo_config: an RLlib `AlgorithmConfig` (PPO, APPO, IMPALA, ...).
        **overrides: jaxrunner-only settings (e.g. `max_chunk_length=128`) or any
            `RunnerConfig` setting to change after the translation.

    Returns:
        An unfrozen `RunnerConfig` whose `rl_module_spec` builds `RLlibPPOModule` with
        RLlib's model config.

    Raises:
        UnsupportedRLlibSetupError: for configs a compiled runner cannot reproduce (see
            `jaxrunner.rllib.errors.SUPPORTED`).
    """
    check_supported(algo_config)
    config = RunnerConfig()
    config.environment(resolve_env(algo_config.env),
                       env_config=dict(algo_config.env_config or {}))
    config.update_from_dict({name: getattr(algo_config, name) for name in SHARED_SETTINGS})
    model_config = rllib_model_config(algo_config)
    activation = canonical_activation(model_config.get("fcnet_activation"),
                                      setting="fcnet_activation")
    config.rl_module(
        model_config={"fcnet_hiddens": list(model_config["fcnet_hiddens"]),
                      "fcnet_activation": activation or "linear"},
        rl_module_spec=RLModuleSpec(module_class=RLlibPPOModule, model_config=model_config,
                                    inference_only=True),
    )
    if overrides:
        config.update_from_dict(overrides)
    return config


__all__ = ["SHARED_SETTINGS", "TuneEnvCreator", "check_supported", "resolve_env",
           "rllib_model_config", "runner_config_from_rllib"]
