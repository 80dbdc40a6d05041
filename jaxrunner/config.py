"""`RunnerConfig`: a builder with RLlib `AlgorithmConfig`'s method and attribute names.

Every setter validates its values when it is called, so a bad value fails at the line that
set it, not later inside a compiled rollout. Setters return `self` so calls chain::

    config = (
        RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=64, rollout_fragment_length=128)
        .debugging(seed=0)
    )

Attribute names are RLlib's (`config.num_envs_per_env_runner`, `config.batch_mode`, ...).
Setting or reading an attribute that does not exist raises `AttributeError` naming the
closest valid name.
"""

from __future__ import annotations

import copy
import difflib
import math
from typing import Any, Callable

_NOT_PROVIDED = object()

# Defaults follow RLlib's AlgorithmConfig (see the reference spec §8).
_DEFAULTS: dict[str, Any] = {
    # environment()
    "env": None,
    "env_config": {},
    "normalize_actions": True,
    "clip_actions": False,
    "disable_env_checking": False,
    # env_runners()
    "env_runner_cls": None,
    "num_env_runners": 0,
    "create_env_on_local_worker": False,
    "num_envs_per_env_runner": 1,
    "num_cpus_per_env_runner": 1,
    "num_gpus_per_env_runner": 0,
    "sample_timeout_s": 60.0,
    "max_requests_in_flight_per_env_runner": 1,
    "env_to_module_connector": None,
    "module_to_env_connector": None,
    "add_default_connectors_to_env_to_module_pipeline": True,
    "add_default_connectors_to_module_to_env_pipeline": True,
    "episode_lookback_horizon": 1,
    "merge_env_runner_states": "training_only",
    "broadcast_env_runner_states": True,
    "rollout_fragment_length": 200,
    "batch_mode": "truncate_episodes",
    "explore": True,
    "episodes_to_numpy": True,
    # jaxrunner-specific env_runners() options.
    "max_chunk_length": 256,
    "autoreset_mode": "gymnax",
    "shard_envs_across_devices": True,
    "partial_reset_ratio": 16,
    # training() values RLlib uses to derive rollout_fragment_length="auto".
    "train_batch_size_per_learner": 4000,
    "num_learners": 0,
    # fault_tolerance()
    "restart_failed_env_runners": True,
    "ignore_env_runner_failures": False,
    "max_num_env_runner_restarts": 1000,
    "delay_between_env_runner_restarts_s": 60.0,
    "restart_failed_sub_environments": False,
    "num_consecutive_env_runner_failures_tolerance": 100,
    "env_runner_health_probe_timeout_s": 30.0,
    "env_runner_restore_timeout_s": 1800.0,
    # jaxrunner-specific fault_tolerance() options.
    "check_finite": True,
    "num_consecutive_sub_env_failures_tolerance": 100,
    # multi_agent()
    "policies": {"default_policy"},
    "policy_mapping_fn": None,
    "policies_to_train": None,
    "count_steps_by": "env_steps",
    # rl_module()
    "model_config": {},
    "rl_module_spec": None,
    # reporting()
    "metrics_num_episodes_for_smoothing": 100,
    # debugging()
    "seed": None,
    # evaluation
    "in_evaluation": False,
}

_BATCH_MODES = ("truncate_episodes", "complete_episodes")
_COUNT_STEPS_BY = ("env_steps", "agent_steps")
_DEFAULT_MODEL_CONFIG = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}
_ACTIVATIONS = ("tanh", "relu", "elu", "swish", "silu", "gelu", "linear", None)


def _close_match_hint(name: str, candidates) -> str:
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    if matches:
        return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"
    return ""


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int >= {minimum}, got {value!r} of type "
            f"{type(value).__name__}."
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return value


def _check_number(name: str, value: Any, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value


def _check_choice(name: str, value: Any, choices) -> Any:
    if value not in choices:
        raise ValueError(
            f"{name} must be one of {list(choices)}, got {value!r}."
            + (_close_match_hint(value, [c for c in choices if isinstance(c, str)])
               if isinstance(value, str) else "")
        )
    return value


class RunnerConfig:
    """Configuration of env runners, with RLlib `AlgorithmConfig` names and defaults.

    Use the builder methods (`environment`, `env_runners`, `fault_tolerance`,
    `multi_agent`, `rl_module`, `reporting`, `debugging`, `training`) to set values; each
    validates at once. `copy()` returns an independent, unfrozen copy; `freeze()` makes
    the config read-only.
    """

    def __init__(self):
        object.__setattr__(self, "_frozen", False)
        for name, value in _DEFAULTS.items():
            object.__setattr__(self, name, copy.deepcopy(value))

    # ------------------------------------------------------------------ attribute guard
    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS:
            raise AttributeError(
                f"RunnerConfig has no setting {name!r}." + _close_match_hint(name, _DEFAULTS)
            )
        if self._frozen:
            raise RuntimeError(
                f"Cannot set {name!r}: this RunnerConfig is frozen. Use config.copy() to "
                "get an editable copy."
            )
        # Route through the validating setter so attribute writes are checked too.
        self.update_from_dict({name: value})

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: an unknown setting.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"RunnerConfig has no setting {name!r}." + _close_match_hint(name, _DEFAULTS)
        )

    def _set(self, **values: Any) -> None:
        if self._frozen:
            raise RuntimeError(
                "This RunnerConfig is frozen. Use config.copy() to get an editable copy."
            )
        for name, value in values.items():
            if value is not _NOT_PROVIDED:
                object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ builders
    def environment(
        self,
        env: Any = _NOT_PROVIDED,
        *,
        env_config: dict | None = _NOT_PROVIDED,
        normalize_actions: bool = _NOT_PROVIDED,
        clip_actions: bool = _NOT_PROVIDED,
        disable_env_checking: bool = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets the env: a registered name, a gymnax id, a callable or a gymnax env.

        Args:
            env: a name given to `jaxrunner.register_env`, a gymnax id such as
                "CartPole-v1", a callable `creator(env_context) -> (env, env_params)`, or
                a gymnax `Environment` instance (its default params are used).
            env_config: dict passed to the creator inside the `EnvContext`; for a gymnax
                id, passed as keyword arguments to `gymnax.make`.
            normalize_actions: map Box actions from [-1, 1] to the space's bounds (then
                clip), as RLlib's `NormalizeAndClipActions` does.
            clip_actions: clip Box actions to the bounds without rescaling.
        """
        if env_config is not _NOT_PROVIDED:
            if env_config is None:
                env_config = {}
            if not isinstance(env_config, dict):
                raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}.")
            env_config = dict(env_config)
        if env is not _NOT_PROVIDED and env is not None:
            if not (isinstance(env, str) or callable(env) or hasattr(env, "step")):
                raise TypeError(
                    "env must be a registered name or gymnax id (str), a callable "
                    f"creator(env_context) -> (env, env_params), or a gymnax Environment; "
                    f"got {type(env).__name__}."
                )
        for name, value in (("normalize_actions", normalize_actions),
                            ("clip_actions", clip_actions),
                            ("disable_env_checking", disable_env_checking)):
            if value is not _NOT_PROVIDED:
                _check_bool(name, value)
        self._set(env=env, env_config=env_config, normalize_actions=normalize_actions,
                  clip_actions=clip_actions, disable_env_checking=disable_env_checking)
        return self

    def env_runners(
        self,
        *,
        env_runner_cls: type | None = _NOT_PROVIDED,
        num_env_runners: int = _NOT_PROVIDED,
        create_env_on_local_worker: bool = _NOT_PROVIDED,
        num_envs_per_env_runner: int = _NOT_PROVIDED,
        num_cpus_per_env_runner: float = _NOT_PROVIDED,
        num_gpus_per_env_runner: float = _NOT_PROVIDED,
        sample_timeout_s: float | None = _NOT_PROVIDED,
        max_requests_in_flight_per_env_runner: int = _NOT_PROVIDED,
        env_to_module_connector: Callable | None = _NOT_PROVIDED,
        module_to_env_connector: Callable | None = _NOT_PROVIDED,
        add_default_connectors_to_env_to_module_pipeline: bool = _NOT_PROVIDED,
        add_default_connectors_to_module_to_env_pipeline: bool = _NOT_PROVIDED,
        episode_lookback_horizon: int = _NOT_PROVIDED,
        merge_env_runner_states: bool | str = _NOT_PROVIDED,
        broadcast_env_runner_states: bool = _NOT_PROVIDED,
        rollout_fragment_length: int | str = _NOT_PROVIDED,
        batch_mode: str = _NOT_PROVIDED,
        explore: bool = _NOT_PROVIDED,
        episodes_to_numpy: bool = _NOT_PROVIDED,
        max_chunk_length: int = _NOT_PROVIDED,
        autoreset_mode: str = _NOT_PROVIDED,
        partial_reset_ratio: int = _NOT_PROVIDED,
        shard_envs_across_devices: bool = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets how env runners sample (RLlib's `env_runners()`; same names, defaults).

        jaxrunner-only options:
            max_chunk_length: caps the length of one compiled rollout chunk; a `sample()`
                that needs more vector steps runs several chunks of the same program.
            autoreset_mode: "gymnax" (default: every sub-env computes a reset each step and
                selects it where its episode ended) or "partial" (only
                `ceil(num_envs / partial_reset_ratio)` resets are computed per step and
                written into the sub-envs that finished; a step where more finish falls
                back to "gymnax"; every episode still gets its own fresh reset).
            partial_reset_ratio: see `autoreset_mode` (default 16).
            shard_envs_across_devices: split the sub-envs over all local devices with
                `jax.sharding` (default True; needs `num_envs_per_env_runner` divisible by
                the device count, else one device is used).
        """
        if num_env_runners is not _NOT_PROVIDED:
            _check_int("num_env_runners", num_env_runners, minimum=0)
        if num_envs_per_env_runner is not _NOT_PROVIDED:
            if isinstance(num_envs_per_env_runner, int) and not isinstance(
                    num_envs_per_env_runner, bool) and num_envs_per_env_runner < 1:
                raise ValueError(
                    f"num_envs_per_env_runner must be >= 1 (the number of vectorized "
                    f"sub-environments per runner), got {num_envs_per_env_runner}."
                )
            _check_int("num_envs_per_env_runner", num_envs_per_env_runner, minimum=1)
        if num_cpus_per_env_runner is not _NOT_PROVIDED:
            _check_number("num_cpus_per_env_runner", num_cpus_per_env_runner)
        if num_gpus_per_env_runner is not _NOT_PROVIDED:
            _check_number("num_gpus_per_env_runner", num_gpus_per_env_runner)
        if sample_timeout_s is not _NOT_PROVIDED and sample_timeout_s is not None:
            _check_number("sample_timeout_s", sample_timeout_s)
        if max_requests_in_flight_per_env_runner is not _NOT_PROVIDED:
            _check_int("max_requests_in_flight_per_env_runner",
                       max_requests_in_flight_per_env_runner, minimum=1)
        for name, value in (("env_to_module_connector", env_to_module_connector),
                            ("module_to_env_connector", module_to_env_connector)):
            if value is not _NOT_PROVIDED and value is not None and not callable(value):
                raise TypeError(f"{name} must be a callable factory or None, got {value!r}.")
        for name, value in (
            ("create_env_on_local_worker", create_env_on_local_worker),
            ("add_default_connectors_to_env_to_module_pipeline",
             add_default_connectors_to_env_to_module_pipeline),
            ("add_default_connectors_to_module_to_env_pipeline",
             add_default_connectors_to_module_to_env_pipeline),
            ("broadcast_env_runner_states", broadcast_env_runner_states),
            ("explore", explore),
            ("episodes_to_numpy", episodes_to_numpy),
            ("shard_envs_across_devices", shard_envs_across_devices),
        ):
            if value is not _NOT_PROVIDED:
                _check_bool(name, value)
        if episode_lookback_horizon is not _NOT_PROVIDED:
            _check_int("episode_lookback_horizon", episode_lookback_horizon, minimum=0)
        if merge_env_runner_states is not _NOT_PROVIDED:
            _check_choice("merge_env_runner_states", merge_env_runner_states,
                          (True, False, "training_only"))
        if rollout_fragment_length is not _NOT_PROVIDED and rollout_fragment_length != "auto":
            _check_int("rollout_fragment_length", rollout_fragment_length, minimum=1)
        if batch_mode is not _NOT_PROVIDED:
            _check_choice("batch_mode", batch_mode, _BATCH_MODES)
        if max_chunk_length is not _NOT_PROVIDED:
            _check_int("max_chunk_length", max_chunk_length, minimum=1)
        if autoreset_mode is not _NOT_PROVIDED:
            _check_choice("autoreset_mode", autoreset_mode, ("gymnax", "partial"))
        if partial_reset_ratio is not _NOT_PROVIDED:
            _check_int("partial_reset_ratio", partial_reset_ratio, minimum=1)
        if env_runner_cls is not _NOT_PROVIDED and env_runner_cls is not None:
            if not isinstance(env_runner_cls, type):
                raise TypeError(f"env_runner_cls must be a class, got {env_runner_cls!r}.")
        self._set(
            env_runner_cls=env_runner_cls,
            num_env_runners=num_env_runners,
            create_env_on_local_worker=create_env_on_local_worker,
            num_envs_per_env_runner=num_envs_per_env_runner,
            num_cpus_per_env_runner=num_cpus_per_env_runner,
            num_gpus_per_env_runner=num_gpus_per_env_runner,
            sample_timeout_s=sample_timeout_s,
            max_requests_in_flight_per_env_runner=max_requests_in_flight_per_env_runner,
            env_to_module_connector=env_to_module_connector,
            module_to_env_connector=module_to_env_connector,
            add_default_connectors_to_env_to_module_pipeline=(
                add_default_connectors_to_env_to_module_pipeline),
            add_default_connectors_to_module_to_env_pipeline=(
                add_default_connectors_to_module_to_env_pipeline),
            episode_lookback_horizon=episode_lookback_horizon,
            merge_env_runner_states=merge_env_runner_states,
            broadcast_env_runner_states=broadcast_env_runner_states,
            rollout_fragment_length=rollout_fragment_length,
            batch_mode=batch_mode,
            explore=explore,
            episodes_to_numpy=episodes_to_numpy,
            max_chunk_length=max_chunk_length,
            autoreset_mode=autoreset_mode,
            partial_reset_ratio=partial_reset_ratio,
            shard_envs_across_devices=shard_envs_across_devices,
        )
        return self

    def training(
        self,
        *,
        train_batch_size_per_learner: int = _NOT_PROVIDED,
        num_learners: int = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets the learner-side values that `rollout_fragment_length="auto"` derives from."""
        if train_batch_size_per_learner is not _NOT_PROVIDED:
            _check_int("train_batch_size_per_learner", train_batch_size_per_learner, minimum=1)
        if num_learners is not _NOT_PROVIDED:
            _check_int("num_learners", num_learners, minimum=0)
        self._set(train_batch_size_per_learner=train_batch_size_per_learner,
                  num_learners=num_learners)
        return self

    def fault_tolerance(
        self,
        *,
        restart_failed_env_runners: bool = _NOT_PROVIDED,
        ignore_env_runner_failures: bool = _NOT_PROVIDED,
        max_num_env_runner_restarts: int = _NOT_PROVIDED,
        delay_between_env_runner_restarts_s: float = _NOT_PROVIDED,
        restart_failed_sub_environments: bool = _NOT_PROVIDED,
        num_consecutive_env_runner_failures_tolerance: int = _NOT_PROVIDED,
        env_runner_health_probe_timeout_s: float = _NOT_PROVIDED,
        env_runner_restore_timeout_s: float = _NOT_PROVIDED,
        check_finite: bool = _NOT_PROVIDED,
        num_consecutive_sub_env_failures_tolerance: int = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets sub-env and runner fault tolerance (RLlib's names and defaults).

        jaxrunner adds `check_finite` (default True: a non-finite observation or reward
        counts as a sub-env failure) and `num_consecutive_sub_env_failures_tolerance`
        (default 100: a sub-env that fails this many steps in a row, or env creation that
        fails this many times, stops `sample()` with an error instead of looping forever).
        """
        for name, value in (
            ("restart_failed_env_runners", restart_failed_env_runners),
            ("ignore_env_runner_failures", ignore_env_runner_failures),
            ("restart_failed_sub_environments", restart_failed_sub_environments),
            ("check_finite", check_finite),
        ):
            if value is not _NOT_PROVIDED:
                _check_bool(name, value)
        for name, value in (
            ("max_num_env_runner_restarts", max_num_env_runner_restarts),
            ("num_consecutive_env_runner_failures_tolerance",
             num_consecutive_env_runner_failures_tolerance),
        ):
            if value is not _NOT_PROVIDED:
                _check_int(name, value, minimum=0)
        if num_consecutive_sub_env_failures_tolerance is not _NOT_PROVIDED:
            _check_int("num_consecutive_sub_env_failures_tolerance",
                       num_consecutive_sub_env_failures_tolerance, minimum=1)
        for name, value in (
            ("delay_between_env_runner_restarts_s", delay_between_env_runner_restarts_s),
            ("env_runner_health_probe_timeout_s", env_runner_health_probe_timeout_s),
            ("env_runner_restore_timeout_s", env_runner_restore_timeout_s),
        ):
            if value is not _NOT_PROVIDED:
                _check_number(name, value)
        self._set(
            restart_failed_env_runners=restart_failed_env_runners,
            ignore_env_runner_failures=ignore_env_runner_failures,
            max_num_env_runner_restarts=max_num_env_runner_restarts,
            delay_between_env_runner_restarts_s=delay_between_env_runner_restarts_s,
            restart_failed_sub_environments=restart_failed_sub_environments,
            num_consecutive_env_runner_failures_tolerance=(
                num_consecutive_env_runner_failures_tolerance),
            env_runner_health_probe_timeout_s=env_runner_health_probe_timeout_s,
            env_runner_restore_timeout_s=env_runner_restore_timeout_s,
            check_finite=check_finite,
            num_consecutive_sub_env_failures_tolerance=num_consecutive_sub_env_failures_tolerance,
        )
        return self

    def multi_agent(
        self,
        *,
        policies: Any = _NOT_PROVIDED,
        policy_mapping_fn: Callable | None = _NOT_PROVIDED,
        policies_to_train: Any = _NOT_PROVIDED,
        count_steps_by: str = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets the multi-agent setup (RLlib's `multi_agent()`)."""
        if policies is not _NOT_PROVIDED:
            if isinstance(policies, (list, tuple, set)):
                policies = set(policies)
            elif isinstance(policies, dict):
                policies = dict(policies)
            else:
                raise TypeError(
                    f"policies must be a set/list of module ids or a dict, got {policies!r}."
                )
            if not policies:
                raise ValueError("policies must name at least one module id.")
        if policy_mapping_fn is not _NOT_PROVIDED and policy_mapping_fn is not None:
            if not callable(policy_mapping_fn):
                raise TypeError("policy_mapping_fn must be callable (agent_id, episode) -> id.")
        if count_steps_by is not _NOT_PROVIDED:
            _check_choice("count_steps_by", count_steps_by, _COUNT_STEPS_BY)
        self._set(policies=policies, policy_mapping_fn=policy_mapping_fn,
                  policies_to_train=policies_to_train, count_steps_by=count_steps_by)
        return self

    def rl_module(
        self,
        *,
        model_config: dict | None = _NOT_PROVIDED,
        rl_module_spec: Any = _NOT_PROVIDED,
    ) -> "RunnerConfig":
        """Sets the policy module.

        Args:
            model_config: options of the default MLP module: `fcnet_hiddens` (list of
                layer widths, default [256, 256]) and `fcnet_activation` (default "tanh").
            rl_module_spec: a `jaxrunner.RLModuleSpec` for a user-written module.
        """
        if model_config is not _NOT_PROVIDED:
            model_config = dict(model_config or {})
            hiddens = model_config.get("fcnet_hiddens", _DEFAULT_MODEL_CONFIG["fcnet_hiddens"])
            if not isinstance(hiddens, (list, tuple)) or not all(
                    isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hiddens):
                raise ValueError(
                    f"model_config['fcnet_hiddens'] must be a list of positive ints, got "
                    f"{hiddens!r}."
                )
            act = model_config.get("fcnet_activation", "tanh")
            if act not in _ACTIVATIONS:
                raise ValueError(
                    f"model_config['fcnet_activation'] must be one of {list(_ACTIVATIONS)}, "
                    f"got {act!r}."
                )
        self._set(model_config=model_config, rl_module_spec=rl_module_spec)
        return self

    def reporting(self, *, metrics_num_episodes_for_smoothing: int = _NOT_PROVIDED
                  ) -> "RunnerConfig":
        """Sets the metrics smoothing window (episodes)."""
        if metrics_num_episodes_for_smoothing is not _NOT_PROVIDED:
            _check_int("metrics_num_episodes_for_smoothing",
                       metrics_num_episodes_for_smoothing, minimum=1)
        self._set(metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing)
        return self

    def debugging(self, *, seed: int | None = _NOT_PROVIDED) -> "RunnerConfig":
        """Sets the seed; runner `i` uses `seed + i` as RLlib does."""
        if seed is not _NOT_PROVIDED and seed is not None:
            _check_int("seed", seed, minimum=0)
        self._set(seed=seed)
        return self

    def evaluation(self, *, in_evaluation: bool = _NOT_PROVIDED) -> "RunnerConfig":
        """Marks the config as an evaluation config (seeds shift by 1e6, as in RLlib)."""
        if in_evaluation is not _NOT_PROVIDED:
            _check_bool("in_evaluation", in_evaluation)
        self._set(in_evaluation=in_evaluation)
        return self

    # ------------------------------------------------------------------ generic access
    _SETTER_OF = {
        **{k: "environment" for k in ("env", "env_config", "normalize_actions",
                                      "clip_actions", "disable_env_checking")},
        **{k: "training" for k in ("train_batch_size_per_learner", "num_learners")},
        **{k: "fault_tolerance" for k in (
            "restart_failed_env_runners", "ignore_env_runner_failures",
            "max_num_env_runner_restarts", "delay_between_env_runner_restarts_s",
            "restart_failed_sub_environments", "num_consecutive_env_runner_failures_tolerance",
            "env_runner_health_probe_timeout_s", "env_runner_restore_timeout_s",
            "check_finite", "num_consecutive_sub_env_failures_tolerance")},
        **{k: "multi_agent" for k in ("policies", "policy_mapping_fn", "policies_to_train",
                                      "count_steps_by")},
        **{k: "rl_module" for k in ("model_config", "rl_module_spec")},
        "metrics_num_episodes_for_smoothing": "reporting",
        "seed": "debugging",
        "in_evaluation": "evaluation",
    }

    def update_from_dict(self, values: dict[str, Any]) -> "RunnerConfig":
        """Sets several settings by name, each validated by its builder method."""
        for name, value in values.items():
            if name not in _DEFAULTS:
                raise AttributeError(
                    f"RunnerConfig has no setting {name!r}." + _close_match_hint(name, _DEFAULTS)
                )
            setter = getattr(self, self._SETTER_OF.get(name, "env_runners"))
            setter(**{name: value})
        return self

    @classmethod
    def from_rllib(cls, algo_config: Any, **overrides: Any) -> "RunnerConfig":
        """Translates an RLlib `AlgorithmConfig` (see `jaxrunner.rllib.config`).

        `overrides` set jaxrunner-only settings such as `max_chunk_length`. Raises
        `jaxrunner.rllib.UnsupportedRLlibSetupError` for setups a compiled runner cannot
        reproduce.
        """
        from jaxrunner.rllib.config import runner_config_from_rllib

        return runner_config_from_rllib(algo_config, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """All settings as a plain dict."""
        return {name: getattr(self, name) for name in _DEFAULTS}

    def copy(self, copy_frozen: bool = False) -> "RunnerConfig":
        """Returns an independent copy (unfrozen unless `copy_frozen`)."""
        new = RunnerConfig.__new__(RunnerConfig)
        object.__setattr__(new, "_frozen", False)
        for name in _DEFAULTS:
            value = getattr(self, name)
            # Callables and classes are shared; containers are copied.
            if isinstance(value, (dict, list, set)):
                value = copy.deepcopy(value)
            object.__setattr__(new, name, value)
        if copy_frozen and self._frozen:
            new.freeze()
        return new

    def freeze(self) -> "RunnerConfig":
        """Makes the config read-only; `copy()` gives an editable one."""
        object.__setattr__(self, "_frozen", True)
        return self

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    # ------------------------------------------------------------------ derived values
    @property
    def model_config_with_defaults(self) -> dict[str, Any]:
        return {**_DEFAULT_MODEL_CONFIG, **(self.model_config or {})}

    @property
    def is_multi_agent(self) -> bool:
        """RLlib's definition: more than one policy, or one not named "default_policy"."""
        return len(self.policies) > 1 or "default_policy" not in self.policies

    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """Vector steps per sub-env a default `sample()` takes, as RLlib computes it."""
        if self.rollout_fragment_length != "auto":
            return self.rollout_fragment_length
        runners = self.num_env_runners or 1
        envs = self.num_envs_per_env_runner
        total = self.train_batch_size_per_learner * (self.num_learners or 1)
        rollout = total / (envs * runners)
        if int(rollout) != rollout:
            diff = total - int(rollout) * envs * runners
            if ((worker_index or 1) - 1) * envs >= diff:
                return max(1, int(rollout))
            return int(rollout) + 1
        return max(1, int(rollout))

    @property
    def metrics_window(self) -> int:
        """Episodes in each runner's smoothing window (RLlib's rule)."""
        return max(1, math.ceil(self.metrics_num_episodes_for_smoothing
                                / max(1, self.num_env_runners)))

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.to_dict().items() if v != _DEFAULTS[k]}
        return f"RunnerConfig({changed})"
