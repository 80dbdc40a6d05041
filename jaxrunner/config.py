"""`RunnerConfig`: a builder with RLlib `AlgorithmConfig`'s method and attribute names.

Each setting is one row of `SETTINGS` (name, builder, default, check, doc); the builder
methods with their signatures and docstrings, the defaults, validated attribute access,
`to_dict()`, `copy()` and the unknown-name errors are generated from the rows. A setter
validates when it is called, so a bad value fails at the line that set it, not inside a
compiled rollout; a rejected call changes nothing. Setters return `self` so calls chain::

    config = (
        RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=64, rollout_fragment_length=128)
        .debugging(seed=0)
    )

Attribute names are RLlib's (`config.num_envs_per_env_runner`, `config.batch_mode`, ...).
Reading or setting an attribute that does not exist raises `AttributeError`, and a builder
given a keyword it does not take raises `TypeError`, both naming the closest valid name.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import math
import textwrap
from typing import Any, Callable, Mapping

import numpy as np

from jaxrunner.modules.rl_module import (
    DEFAULT_MLP_MODEL_CONFIG_KEYS,
    DefaultMLPModule,
    RLModuleSpec,
)


class _NotProvided:
    """A builder keyword left out: the setting keeps its current value."""

    def __repr__(self) -> str:
        return "NotProvided"


NotProvided = _NotProvided()


def _closest(name: Any, candidates) -> list[str]:
    if not isinstance(name, str):
        return []
    return difflib.get_close_matches(name, [str(c) for c in candidates], n=3, cutoff=0.6)


def _hint(name: Any, candidates) -> str:
    matches = _closest(name, candidates)
    return (" Did you mean " + " or ".join(map(repr, matches)) + "?") if matches else ""


# ---------------------------------------------------------------------- checks
@dataclasses.dataclass(frozen=True)
class _Check:
    """Turns a given value into the stored one, or raises; `annotation` is what the
    builder's signature shows."""

    annotation: str
    coerce: Callable[[str, Any], Any]


def _got(value: Any) -> str:
    return f"got {value!r} of type {type(value).__name__}"


def _scalar(kind: str, minimum: int = 0, *, none_ok=False, auto_ok=False) -> _Check:
    """An int (`kind="int"`) or number (`"float"`) >= `minimum`. Numpy integer (and, for a
    number, floating) scalars are accepted and stored as Python ones; bools never are."""
    types = (int, np.integer) if kind == "int" else (int, float, np.integer, np.floating)
    what = f"{'an int' if kind == 'int' else 'a number'} >= {minimum}"
    also = " or None" * none_ok + " or 'auto'" * auto_ok

    def coerce(name, value):
        if (none_ok and value is None) or (auto_ok and isinstance(value, str)
                                           and value == "auto"):
            return None if value is None else "auto"
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, types):
            raise TypeError(f"{name} must be {what}{also}, {_got(value)}.")
        if not value >= minimum:  # also catches NaN
            raise ValueError(f"{name} must be >= {minimum}{also}, got {value}.")
        return int(value) if isinstance(value, (int, np.integer)) else float(value)

    return _Check(kind + " | None" * none_ok + " | str" * auto_ok, coerce)


def _coerce_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, {_got(value)}.")
    return bool(value)


def _choice(*choices: Any) -> _Check:
    def coerce(name, value):
        for choice in choices:  # type-strict (1 is not True); a numpy str is a str
            if (isinstance(value, type(choice)) and isinstance(value, bool) == isinstance(
                    choice, bool) and value == choice):
                return choice
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}."
                         + _hint(value, [c for c in choices if isinstance(c, str)]))

    return _Check(" | ".join(sorted({type(c).__name__ for c in choices})), coerce)


def _optional(annotation: str, kind: str, test: Callable[[Any], bool]) -> _Check:
    def coerce(name, value):
        if value is not None and not test(value):
            raise TypeError(f"{name} must be {kind} or None, {_got(value)}.")
        return value

    return _Check(annotation, coerce)


def _coerce_dict(name, value):
    if not isinstance(value, (Mapping, type(None))):
        raise TypeError(f"{name} must be a dict (or None for {{}}), {_got(value)}.")
    return dict(value or {})


def _spec_dict(name, specs: dict) -> dict:
    for module_id, spec in specs.items():
        if not isinstance(module_id, str):
            raise TypeError(f"{name} must name modules by str ids, got {module_id!r}.")
        if not isinstance(spec, (RLModuleSpec, type(None))):
            raise TypeError(f"{name}[{module_id!r}] must be a jaxrunner.RLModuleSpec or "
                            f"None, {_got(spec)}.")
    return dict(specs)


def _coerce_policies(name, policies):
    if isinstance(policies, (list, tuple, set, frozenset)):
        policies = set(_spec_dict(name, dict.fromkeys(policies)))
    elif isinstance(policies, dict):
        policies = _spec_dict(name, policies)
    else:
        raise TypeError(f"policies must be a set/list of module ids or a dict {{module_id: "
                        f"RLModuleSpec or None}}, {_got(policies)}.")
    if not policies:
        raise ValueError("policies must name at least one module id.")
    return policies


def _coerce_rl_module_spec(name, spec):
    if isinstance(spec, dict):
        return _spec_dict(name, spec)
    if not isinstance(spec, (RLModuleSpec, type(None))):
        raise TypeError(f"rl_module_spec must be a jaxrunner.RLModuleSpec, a dict "
                        f"{{module_id: RLModuleSpec}} or None, {_got(spec)}.")
    return spec


_DEFAULT_MODEL_CONFIG = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}
_ACTIVATIONS = ("tanh", "relu", "elu", "swish", "silu", "gelu", "linear", None)


def _coerce_model_config(where, model_config):
    model_config = _coerce_dict(where, model_config)
    hiddens = model_config.get("fcnet_hiddens", [])
    if not isinstance(hiddens, (list, tuple)) or not all(
            isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h > 0
            for h in hiddens):
        raise ValueError(f"{where}['fcnet_hiddens'] must be a list of positive ints (layer "
                         f"widths), got {hiddens!r}.")
    if "fcnet_hiddens" in model_config:
        model_config["fcnet_hiddens"] = [int(h) for h in hiddens]
    if model_config.get("fcnet_activation", "tanh") not in _ACTIVATIONS:
        raise ValueError(f"{where}['fcnet_activation'] must be one of {list(_ACTIVATIONS)}, "
                         f"got {model_config['fcnet_activation']!r}.")
    return model_config


def _coerce_vectorize_mode(name, value):
    import gymnasium as gym

    if isinstance(value, gym.VectorizeMode):
        return value.value
    values = [mode.value for mode in gym.VectorizeMode]
    if not isinstance(value, str) or value not in values:
        raise ValueError(f"{name} must be one of {values} or a gymnasium.VectorizeMode, "
                         f"{_got(value)}." + _hint(value, values))
    return value


_INT0, _INT1, _NUM, _BOOL = _scalar("int", 0), _scalar("int", 1), _scalar("float"), _Check(
    "bool", _coerce_bool)
_CALLABLE = _optional("Callable | None", "a callable", callable)
_ENV = _optional("Any", "a registered name or gymnax id (str), a callable creator(env_context)"
                 " -> (env, env_params), or a gymnax Environment",
                 lambda env: isinstance(env, str) or callable(env) or hasattr(env, "step"))


def _custom_metrics(name, value):
    from jaxrunner.callbacks import _coerce_custom_metrics  # lazy: callbacks imports config

    return _coerce_custom_metrics(name, value)


# ---------------------------------------------------------------------- the rows
@dataclasses.dataclass(frozen=True)
class Setting:
    """One `RunnerConfig` setting: its builder method, default, check and one-line doc."""

    name: str
    builder: str
    default: Any
    check: _Check
    doc: str
    positional: bool = False  # the builder also takes it as its first positional argument


# builder -> (docstring summary, rows (name, default, check, doc[, positional])).
# Defaults are RLlib AlgorithmConfig's (reference spec §8); "(jaxrunner)" marks our own.
_BUILDERS: dict[str, tuple[str, tuple]] = {
    "environment": ("Sets the env and how actions are fitted to its space.", (
        ("env", None, _ENV, "a `jaxrunner.register_env` name, a gymnax id ('CartPole-v1'), a "
         "creator `(env_context) -> (env, env_params)` or a gymnax env (default params).",
         True),
        ("env_config", {}, _Check("dict | None", _coerce_dict),
         "passed to the creator in the `EnvContext`; for a gymnax id, to `gymnax.make`."),
        ("normalize_actions", True, _BOOL, "map Box actions from [-1, 1] to the bounds, clip."),
        ("clip_actions", False, _BOOL, "clip Box actions to the bounds without rescaling."),
        ("disable_env_checking", False, _BOOL, "skip the checks of a newly built env."),
    )),
    "env_runners": ("Sets how env runners sample (RLlib's `env_runners()`).", (
        ("env_runner_cls", None, _optional("type | None", "a class",
                                           lambda cls: isinstance(cls, type)),
         "runner class; None picks the single- or multi-agent runner."),
        ("num_env_runners", 0, _INT0, "remote (Ray) runners; 0 samples in the local one."),
        ("create_env_on_local_worker", False, _BOOL,
         "the local runner gets an env even with remote runners."),
        ("num_envs_per_env_runner", 1, _INT1, "vectorized sub-environments per runner."),
        ("gym_env_vectorize_mode", "sync", _Check("str | gymnasium.VectorizeMode",
                                                  _coerce_vectorize_mode),
         "how host (gymnasium) sub-envs are vectorized: 'sync' (`SyncVectorEnv`, in the "
         "runner's process), 'async' (`AsyncVectorEnv`, one spawned sub-process each) or "
         "'vector_entry_point' (the env's own vector env); a `gymnasium.VectorizeMode` is "
         "stored as its value. No effect on compiled envs (the vmap vectorizes them), but "
         "'async' / 'vector_entry_point' for a gymnax id gymnasium also has (gymnax wins) "
         "is an error naming 'gymnasium:<id>'; refused for EnvPool and `VectorEnv` "
         "instances ('async')."),
        ("remote_worker_envs", False, _BOOL,
         "step host sub-envs in sub-processes (as 'async') and set `env_context.remote`; "
         "compiled envs only see `env_context.remote`."),
        ("num_cpus_per_env_runner", 1, _NUM, "CPUs each remote runner reserves."),
        ("num_gpus_per_env_runner", 0, _NUM, "GPUs each remote runner reserves (fractional)."),
        ("sample_timeout_s", 60.0, _scalar("float", none_ok=True),
         "seconds to wait for remote runners' samples; None: no limit."),
        ("max_requests_in_flight_per_env_runner", 1, _INT1,
         "sample requests in flight per remote runner."),
        ("env_to_module_connector", None, _CALLABLE,
         "factory `(env) -> connector(s)` after the default env-to-module connectors."),
        ("module_to_env_connector", None, _CALLABLE,
         "factory `(env) -> connector(s)` of the module-to-env pipeline."),
        ("add_default_connectors_to_env_to_module_pipeline", True, _BOOL,
         "keep the default env-to-module connectors."),
        ("add_default_connectors_to_module_to_env_pipeline", True, _BOOL,
         "keep the default module-to-env connectors."),
        ("episode_lookback_horizon", 1, _INT0, "steps a continued episode keeps as lookback."),
        ("merge_env_runner_states", "training_only", _choice(True, False, "training_only"),
         "merge the remote runners' connector states."),
        ("broadcast_env_runner_states", True, _BOOL,
         "send merged connector states back to the remote runners."),
        ("rollout_fragment_length", 200, _scalar("int", 1, auto_ok=True),
         "vector steps of a default `sample()`; 'auto': from the train batch size."),
        ("batch_mode", "truncate_episodes", _choice("truncate_episodes", "complete_episodes"),
         "a default `sample()` ends after the fragment, or at episode ends only."),
        ("explore", True, _BOOL, "sample actions (True) or take the deterministic ones."),
        ("episodes_to_numpy", True, _BOOL, "host episodes hold numpy arrays."),
        ("max_chunk_length", 256, _INT1,
         "longest compiled chunk; a longer `sample()` runs several (jaxrunner)."),
        ("autoreset_mode", "gymnax", _choice("gymnax", "partial"),
         "'gymnax': each sub-env computes a reset every step and selects it at an episode "
         "end; 'partial': only ceil(num_envs / partial_reset_ratio) resets per step, "
         "written into the finished sub-envs ('gymnax' on a step where more finish) "
         "(jaxrunner)."),
        ("partial_reset_ratio", 16, _INT1, "sub-envs per reset computed in 'partial' mode."),
        ("record_action_dist_inputs", True, _BOOL,
         "record the module's action_dist_inputs per step as an extra model output "
         "(B x D floats a step; RLlib learners read it, jaxrunner's PPO does not) "
         "(jaxrunner)."),
        ("final_obs_slots_per_env", "auto", _scalar("int", 1, auto_ok=True),
         "episode ends per sub-env a compiled chunk has room for (their final "
         "observations are stored, not every step's); 'auto': ceil(chunk length / 8) + 1 "
         "(chunks of at most 16 steps: every step). A chunk with more ends stops early "
         "and the next one continues (jaxrunner)."),
        ("steps_per_loop_check", "auto", _scalar("int", 1, auto_ok=True),
         "vector steps a compiled chunk takes between two tests of its stop condition (on "
         "a GPU each test waits for a device-to-host copy); 'auto': 1 on CPU, 16 on other "
         "devices. Every value samples the same steps (jaxrunner)."),
        ("shard_envs_across_devices", True, _BOOL, "split the sub-envs over the local devices "
         "with `jax.sharding` (if their count divides num_envs) (jaxrunner)."),
    )),
    "training": ("Sets the learner values `rollout_fragment_length='auto'` derives from.", (
        ("train_batch_size_per_learner", 4000, _INT1, "env steps per learner update."),
        ("num_learners", 0, _INT0, "learners; 0 counts as one."),
    )),
    "fault_tolerance": ("Sets sub-env and runner fault tolerance.", (
        ("restart_failed_env_runners", True, _BOOL, "restart a failed remote runner."),
        ("ignore_env_runner_failures", False, _BOOL, "go on without a failed remote runner."),
        ("max_num_env_runner_restarts", 1000, _INT0, "restarts per remote runner."),
        ("delay_between_env_runner_restarts_s", 60.0, _NUM, "seconds between two restarts."),
        ("restart_failed_sub_environments", False, _BOOL,
         "recreate a failed sub-env instead of failing `sample()`."),
        ("num_consecutive_env_runner_failures_tolerance", 100, _INT0,
         "consecutive failures before a runner is given up."),
        ("env_runner_health_probe_timeout_s", 30.0, _NUM, "seconds a health probe may take."),
        ("env_runner_restore_timeout_s", 1800.0, _NUM, "seconds restoring a runner may take."),
        ("check_finite", True, _BOOL,
         "a non-finite observation or reward is a sub-env failure (jaxrunner)."),
        ("num_consecutive_sub_env_failures_tolerance", 100, _INT1,
         "a sub-env failing this many steps in a row (or env creation this many times) "
         "stops `sample()` with an error (jaxrunner)."),
    )),
    "multi_agent": ("Sets the multi-agent setup (RLlib's `multi_agent()`).", (
        ("policies", {"default_policy"}, _Check("set | list | dict", _coerce_policies),
         "module ids, or a dict {module_id: RLModuleSpec or None}."),
        ("policy_mapping_fn", None, _CALLABLE, "`(agent_id, episode) -> module_id`."),
        ("policies_to_train", None, _Check("Any", lambda name, value: value),
         "module ids a learner trains; None: all."),
        ("count_steps_by", "env_steps", _choice("env_steps", "agent_steps"),
         "what `rollout_fragment_length` and `num_timesteps` count."),
    )),
    "rl_module": ("Sets the policy module.", (
        ("model_config", {}, _Check("dict | None", _coerce_model_config),
         "module options; the default module reads only `fcnet_hiddens` (default "
         "[256, 256]) and `fcnet_activation` (default 'tanh')."),
        ("rl_module_spec", None, _Check("RLModuleSpec | dict | None", _coerce_rl_module_spec),
         "a `jaxrunner.RLModuleSpec` of a user-written module, or a dict per module id."),
    )),
    "reporting": ("Sets the metrics smoothing window.", (
        ("metrics_num_episodes_for_smoothing", 100, _INT1,
         "episodes metrics average over (split between remote runners)."),
    )),
    "debugging": ("Sets the seed; runner `i` uses `seed + i` as RLlib does.", (
        ("seed", None, _scalar("int", none_ok=True), "base seed; None: no fixed seed."),
    )),
    "callbacks": ("Sets callbacks with RLlib's event names (see docs/callbacks.md).", (
        ("on_environment_created", None, _CALLABLE, "host: `(env_runner, metrics_logger, "
         "env, env_context)` after each env (re)creation."),
        ("on_episode_start", None, _CALLABLE, "device, one sub-env: `(start: EpisodeStart) "
         "-> state` (a pytree of arrays) of a new episode."),
        ("on_episode_step", None, _CALLABLE, "device, one sub-env: `(state, step: StepView) "
         "-> state` at every env step (same structure, shapes, dtypes)."),
        ("on_episode_end", None, _CALLABLE, "device, one sub-env: `(state, step) -> {name: "
         "scalar}`, the episode's custom metrics; or `jaxrunner.on_host(fn)`: host "
         "`(episode, env_runner, metrics_logger, env_index)` per finished episode (costs a "
         "transfer of each batch)."),
        ("on_sample_end", None, _CALLABLE, "host: `(env_runner, metrics_logger, samples)` "
         "at the end of each `sample()`."),
        ("custom_metrics", {}, _Check("dict | None", _custom_metrics),
         "{name: 'mean' | 'min' | 'max' | 'sum' | MetricSpec | dict} how "
         "on_episode_end's metrics reduce (default 'mean' over the episode window) "
         "(jaxrunner)."),
    )),
    "evaluation": ("Marks the config as an evaluation config.", (
        ("in_evaluation", False, _BOOL, "an evaluation config (seeds shift by 1e6)."),
    )),
}

SETTINGS: dict[str, Setting] = {row[0]: Setting(row[0], builder, *row[1:])
                                for builder, (_, rows) in _BUILDERS.items() for row in rows}


# ---------------------------------------------------------------------- cross-setting check
def _check_default_module_keys(where: str, model_config: Mapping) -> None:
    unknown = [key for key in model_config if key not in DEFAULT_MLP_MODEL_CONFIG_KEYS]
    if unknown:
        raise ValueError(
            f"{where} key {unknown[0]!r} is not read by the default module (DefaultMLPModule) "
            f"and would be ignored.{_hint(unknown[0], DEFAULT_MLP_MODEL_CONFIG_KEYS)} Known "
            f"keys: {list(DEFAULT_MLP_MODEL_CONFIG_KEYS)}. A custom module gets any keys: set "
            "its RLModuleSpec(module_class=...) (rl_module_spec or policies) first or in the "
            "same call.")


def _check_model_config_keys(values: dict[str, Any]) -> None:
    """With only the default module, `model_config` keys it would not read are errors."""
    specs = [spec for holder in (values["rl_module_spec"], values["policies"])
             for spec in (holder.values() if isinstance(holder, dict) else [holder])
             if isinstance(spec, RLModuleSpec)]
    for spec in specs:
        if spec.module_class in (None, DefaultMLPModule) and spec.model_config:
            _coerce_model_config("RLModuleSpec.model_config", spec.model_config)
            _check_default_module_keys("RLModuleSpec.model_config", spec.model_config)
    if all(spec.module_class in (None, DefaultMLPModule) for spec in specs):
        _check_default_module_keys("model_config", values["model_config"])


# (settings whose change triggers it, check of the whole proposed config)
_CROSS_CHECKS = (({"model_config", "rl_module_spec", "policies"}, _check_model_config_keys),)


# ---------------------------------------------------------------------- generated builders
def _keyword_hint(key: str, own: list[str]) -> str:
    """A close match among the builder's own settings, else the builder that sets `key` (or
    its close match), else the builder's settings."""
    if _closest(key, own):
        return _hint(key, own)
    other = key if key in SETTINGS else next(iter(_closest(key, SETTINGS)), None)
    if other is None:
        return f" Its settings: {own}."
    call = f"config.{SETTINGS[other].builder}({other}=...)"
    return f" It is set by {call}." if other == key else f" Did you mean {call}?"


def _builder(name: str) -> Callable[..., "RunnerConfig"]:
    summary, _ = _BUILDERS[name]
    rows = [s for s in SETTINGS.values() if s.builder == name]
    own, positional = [s.name for s in rows], [s.name for s in rows if s.positional]
    kind = {True: inspect.Parameter.POSITIONAL_OR_KEYWORD,
            False: inspect.Parameter.KEYWORD_ONLY}

    def builder(self, *args: Any, **kwargs: Any) -> "RunnerConfig":
        if len(args) > len(positional):
            raise TypeError(f"{name}() takes {' and '.join(positional) or 'no setting'} "
                            f"positionally, got {len(args)} positional argument(s); pass "
                            f"settings by keyword: {name}({own[len(positional)]}=...).")
        for key, value in zip(positional, args):
            if key in kwargs:
                raise TypeError(f"{name}() got {key!r} both positionally and by keyword.")
            kwargs[key] = value
        for key in kwargs:
            if key not in own:
                raise TypeError(f"{name}() got an unknown setting {key!r}."
                                + _keyword_hint(key, own))
        self._apply({k: v for k, v in kwargs.items() if v is not NotProvided})
        return self

    builder.__name__, builder.__qualname__ = name, f"RunnerConfig.{name}"
    builder.__signature__ = inspect.Signature(
        [inspect.Parameter("self", kind[True])]
        + [inspect.Parameter(s.name, kind[s.positional], default=NotProvided,
                             annotation=s.check.annotation) for s in rows],
        return_annotation="RunnerConfig")
    builder.__doc__ = f"{summary}\n\nA setting left out keeps its value.\n\nArgs:\n" + "\n".join(
        textwrap.fill(f"{s.name}: {s.doc} Default: {s.default!r}.", 88, initial_indent="    ",
                      subsequent_indent="        ") for s in rows) + "\n"
    return builder


def _unknown(name: str) -> AttributeError:
    return AttributeError(f"RunnerConfig has no setting {name!r}." + _hint(name, SETTINGS))


class RunnerConfig:
    """Configuration of env runners, with RLlib `AlgorithmConfig` names and defaults.

    Set values with the builders below; each validates at once. `copy()` returns an
    independent, unfrozen copy; `freeze()` makes the config read-only. Every setting is
    listed, with its default and doc, in `jaxrunner.config.SETTINGS`.
    """

    environment = _builder("environment")
    env_runners = _builder("env_runners")
    training = _builder("training")
    fault_tolerance = _builder("fault_tolerance")
    multi_agent = _builder("multi_agent")
    rl_module = _builder("rl_module")
    reporting = _builder("reporting")
    debugging = _builder("debugging")
    callbacks = _builder("callbacks")
    evaluation = _builder("evaluation")

    def __init__(self):
        object.__setattr__(self, "_frozen", False)
        for setting in SETTINGS.values():
            object.__setattr__(self, setting.name, copy.deepcopy(setting.default))

    def __setattr__(self, name: str, value: Any) -> None:
        self.update_from_dict({name: value})

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: an unknown setting.
        raise AttributeError(name) if name.startswith("__") else _unknown(name)

    def _apply(self, values: dict[str, Any]) -> None:
        """Checks every value and the settings they combine with, then sets them all."""
        if self._frozen:
            raise RuntimeError(f"Cannot set {', '.join(values) or 'settings'}: this "
                               "RunnerConfig is frozen. Use config.copy() for an editable copy.")
        checked = {name: SETTINGS[name].check.coerce(name, value)
                   for name, value in values.items()}
        for triggers, check in _CROSS_CHECKS:
            if triggers & checked.keys():
                check({**self.to_dict(), **checked})
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def update_from_dict(self, values: dict[str, Any]) -> "RunnerConfig":
        """Sets settings by name, checked as their builders check them; all or none."""
        for name in values:
            if name not in SETTINGS:
                raise _unknown(name)
        self._apply(dict(values))
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
        """All settings as a plain dict (the values themselves, not copies)."""
        return {name: getattr(self, name) for name in SETTINGS}

    def copy(self, copy_frozen: bool = False) -> "RunnerConfig":
        """Returns an independent copy (unfrozen unless `copy_frozen`): containers are
        copied; callables, classes, envs and specs are shared."""
        new = RunnerConfig.__new__(RunnerConfig)
        object.__setattr__(new, "_frozen", bool(copy_frozen and self._frozen))
        for name, value in self.to_dict().items():
            object.__setattr__(new, name, copy.deepcopy(value) if isinstance(
                value, (dict, list, set)) else value)
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
        """`model_config` over the default module's defaults (a fresh dict)."""
        return copy.deepcopy({**_DEFAULT_MODEL_CONFIG, **self.model_config})

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
        changed = {k: v for k, v in self.to_dict().items() if v != SETTINGS[k].default}
        return f"RunnerConfig({changed})"
