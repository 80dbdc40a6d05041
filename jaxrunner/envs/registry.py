"""Env resolution: `register_env` names, Ray Tune names, callables, gymnax ids and gymnax
env objects.

`config.env` resolves in this order (DESIGN.md "Construction"; docs/envs.md "Resolution";
host envs are resolved first by `jaxrunner.envs.gymnasium_env.resolve_env`):

1. a name given to `register_env(name, creator)`;
1b. a name given to Ray Tune's `ray.tune.registry.register_env(name, creator)`
   (`tune_env_creator`; only looked up when Ray is already imported in this process, so
   `import jaxrunner` and a Ray-free process never import Ray). The creator gets the
   `EnvContext` as RLlib passes it;
2. a callable `creator(env_context) -> (env, env_params)`;
3. a gymnax `Environment` instance (its `default_params` are used);
4. `"<suite>/<id>"` for the JAX env suites (`"brax/ant"`, `"craftax/Craftax-Symbolic-v1"`,
   `"jumanji/Snake-v1"`, `"navix/<id>"`, `"xminigrid/<id>"`, `"pgx/<id>"`,
   `"playground/<name>"`), `env_config` going to the suite's own constructor; env objects
   of those suites (given directly or by a creator) and envs with gymnax's pre-1.0 step API
   are adapted to the env protocol (`jaxrunner.envs.adapters`);
5. a gymnax id such as "CartPole-v1". Its `env_config` keys are the env's `EnvParams`
   fields (e.g. `{"max_steps_in_episode": 100}`, set on `env.default_params` with
   `.replace`) and its constructor's keyword arguments (e.g. `{"use_minimal_action_set":
   False}` for MinAtar); a key that is neither is a `ValueError` listing both and the
   close matches (`gymnax_env_config_keys(env_id)` lists them).

An unknown name is an `UnknownEnvError` (a `ValueError`) that names the close matches.

`check_jax_env(env, env_params, name)` checks what gymnax's `Environment.step` needs of a
custom env (a `time` field in the state, `max_steps_in_episode` in the params) and warns
(`OldStyleDoneWarning`) when its `step_env` reports the time limit as termination.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import sys
import warnings
from typing import Any, Callable

from jaxrunner.envs.context import EnvContext

_REGISTRY: dict[str, Callable[[EnvContext], Any]] = {}

# gymnax ids that cannot run on a machine without internet access: they download a data
# set when created.
_NEEDS_DOWNLOAD = {"MNISTBandit-bsuite": "downloads the MNIST data set when it is created"}


class UnknownEnvError(ValueError):
    """`config.env` names no registered env and no gymnax id."""


class OldStyleDoneWarning(UserWarning):
    """A custom gymnax env's `step_env` returns `done` including the time limit."""


def register_env(name: str, creator: Callable[[EnvContext], Any]) -> None:
    """Registers `creator` under `name` so `config.environment(name)` finds it.

    Args:
        name: the env name to use in `RunnerConfig.environment(env=name)`.
        creator: `creator(env_context) -> (env, env_params)`, where `env` follows the
            gymnax `Environment` API and `env_params` its params pytree. Returning a bare
            env (no tuple) uses `env.default_params`.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_env: name must be a non-empty str, got {name!r}.")
    if not callable(creator):
        raise TypeError(
            f"register_env({name!r}, creator): creator must be callable as "
            f"creator(env_context) -> (env, env_params); got {type(creator).__name__}."
        )
    _REGISTRY[name] = creator


def registered_env_names() -> list[str]:
    """Names registered with `register_env`."""
    return sorted(_REGISTRY)


def registered_env_creator(name: str) -> Callable[[EnvContext], Any] | None:
    """The creator `register_env(name, creator)` registered, or None for another name."""
    return _REGISTRY.get(name)


def unregister_env(name: str) -> None:
    """Removes a `register_env` name (a KeyError naming the registered ones if unknown)."""
    if name not in _REGISTRY:
        raise KeyError(f"{name!r} is not a registered env; registered: {sorted(_REGISTRY)}.")
    del _REGISTRY[name]


# ---------------------------------------------------------------------- Ray Tune's registry
def _tune_registry_module() -> Any:
    """`ray.tune.registry` if a Tune registration can exist in this process, else None.

    Never imports Ray: without `ray` in `sys.modules` nothing can have been registered with
    Tune here. `ray.tune` itself (seconds to import) is only imported when it already is,
    or when this process is connected to Ray and Ray's internal KV store (which backs
    Tune's registry, so a name registered in the driver is visible in every worker of the
    job) holds Tune registry entries.
    """
    if "ray" not in sys.modules:
        return None
    module = sys.modules.get("ray.tune.registry")
    if module is not None:
        return module
    try:
        from ray.experimental import internal_kv
    except ImportError:  # pragma: no cover - a partial Ray install
        return None
    try:
        if not internal_kv._internal_kv_initialized():
            return None  # not connected: a registration here would have imported ray.tune
        if not internal_kv._internal_kv_list(b"TuneRegistry:"):
            return None
    except Exception:  # noqa: BLE001 - a KV store that cannot answer holds nothing usable
        return None
    import ray.tune.registry as module

    return module


def tune_env_creator(name: str) -> Callable[[Any], Any] | None:
    """The creator `ray.tune.registry.register_env(name, creator)` registered (in this
    process or, through Ray's internal KV store, in the driver of this Ray job), or None.

    Looked up after `register_env` names; returns None without importing Ray when Ray is
    not imported in this process.
    """
    if not isinstance(name, str):
        return None
    module = _tune_registry_module()
    if module is None:
        return None
    registry = module._global_registry
    try:
        if not registry.contains(module.ENV_CREATOR, name):
            return None
        return registry.get(module.ENV_CREATOR, name)
    except Exception:  # noqa: BLE001 - e.g. a job id that is not known yet
        return None


def find_env_creator(name: str) -> tuple[Callable[[Any], Any], str] | None:
    """`(creator, origin)` for a name registered with jaxrunner (`origin="jaxrunner"`,
    first) or with Ray Tune (`origin="tune"`), or None."""
    creator = _REGISTRY.get(name) if isinstance(name, str) else None
    if creator is not None:
        return creator, "jaxrunner"
    creator = tune_env_creator(name)
    if creator is not None:
        return creator, "tune"
    return None


def named_env_creator(name: str) -> Callable[[EnvContext], Any] | None:
    """The creator registered as `name`, ready to call with a jaxrunner `EnvContext`:
    a `register_env` creator as it is, then a Ray Tune creator wrapped to get the
    context as RLlib passes it (`call_tune_creator`); None for any other name (or a
    non-string). The one look-up of registered names every resolver uses."""
    found = find_env_creator(name)
    if found is None:
        return None
    creator, origin = found
    if origin == "tune":
        return functools.partial(call_tune_creator, creator)
    return creator


def call_tune_creator(creator: Callable[[Any], Any], env_context: EnvContext) -> Any:
    """Calls a Tune-registered creator with the `EnvContext` as RLlib passes it: one
    positional dict (`env_config`) with `worker_index`, `num_workers`, `vector_index`,
    `remote` and `recreated_worker` attributes. When RLlib is already imported, the
    context is RLlib's own `ray.rllib.env.env_context.EnvContext` (so `isinstance`
    checks in RLlib-written creators hold); RLlib is never imported for it."""
    rllib_context = sys.modules.get("ray.rllib.env.env_context")
    if rllib_context is not None and not isinstance(env_context, rllib_context.EnvContext):
        env_context = rllib_context.EnvContext(
            dict(env_context), worker_index=env_context.worker_index or 0,
            vector_index=env_context.vector_index, remote=env_context.remote,
            num_workers=env_context.num_workers,
            recreated_worker=env_context.recreated_worker)
    return creator(env_context)


def gymnax_env_ids(runnable_only: bool = True) -> list[str]:
    """Every gymnax id; with `runnable_only`, those that need no download."""
    import gymnax

    ids = list(gymnax.registered_envs)
    if runnable_only:
        ids = [i for i in ids if i not in _NEEDS_DOWNLOAD]
    return ids


def _as_env_and_params(result: Any, origin: str) -> tuple[Any, Any]:
    if isinstance(result, tuple) and len(result) == 2:
        env, params = result
    else:
        env, params = result, None
    if isinstance(env, type):
        raise TypeError(
            f"{origin} returned the class {env.__name__}, not an env instance. Return an "
            f"instance: `return {env.__name__}()` (or `env = {env.__name__}(); return env, "
            "env.default_params`)."
        )
    from jaxrunner.envs import adapters  # env suites (Brax, Jumanji, pgx, ...), pre-1.0 gymnax

    env, params = adapters.adapt(env, params)
    if not (hasattr(env, "reset") and hasattr(env, "step")):
        raise TypeError(
            f"{origin} returned {type(env).__name__}, which is not a gymnax-style env: "
            "expected an object with reset(key, params) and step(key, state, action, params) "
            "(subclass gymnax.environments.environment.Environment), or a tuple "
            "(env, env_params)."
        )
    if params is None:
        params = getattr(env, "default_params", None)
    return env, params


def reject_env_class(env_spec: Any) -> None:
    """`config.env` set to an env *class* (gymnax `Environment` or jaxrunner
    `MultiAgentEnv` subclass) is a `TypeError` that says to pass an instance or a
    creator: such a class is not a creator (it does not take an `EnvContext`)."""
    if not isinstance(env_spec, type):
        return
    from jaxrunner.envs.multi_agent import MultiAgentEnv

    base = _gymnax_base()
    if (base is not None and issubclass(env_spec, base)) or issubclass(env_spec,
                                                                       MultiAgentEnv):
        name = env_spec.__name__
        raise TypeError(
            f"config.env is the env class {name}, not an env instance or a creator. Pass "
            f"an instance, config.environment({name}()), or a creator, "
            f"config.environment(lambda env_context: {name}(...))."
        )


def make_jax_env(env_spec: Any, env_context: EnvContext) -> tuple[Any, Any, str]:
    """Builds `(env, env_params, name)` from `config.env` and an `EnvContext`."""
    reject_env_class(env_spec)
    if env_spec is None:
        raise ValueError(
            "No env is configured: call config.environment(env=...) with a gymnax id "
            "(e.g. 'CartPole-v1'), a name given to jaxrunner.register_env, a callable "
            "creator(env_context) -> (env, env_params), or a gymnax Environment."
        )
    if isinstance(env_spec, str):
        creator = named_env_creator(env_spec)
        if creator is not None:
            env, params = _as_env_and_params(creator(env_context),
                                             f"the creator registered as {env_spec!r}")
            return env, params, env_spec
        from jaxrunner.envs import adapters

        if adapters.suite_prefix_of(env_spec) is not None:  # "brax/ant", "pgx/chess", ...
            env, params = adapters.make_suite_env(env_spec, env_context)
            return env, params, env_spec
        ids = gymnax_env_ids(runnable_only=False)
        if env_spec in _NEEDS_DOWNLOAD:
            raise ValueError(
                f"The gymnax env {env_spec!r} {_NEEDS_DOWNLOAD[env_spec]}, which this "
                "machine cannot do. Register a creator that loads the data from a local file "
                "instead (jaxrunner.register_env)."
            )
        if env_spec in ids:
            env, params = make_gymnax_env(env_spec, dict(env_context))
            return env, params, env_spec
        candidates = sorted(set(ids) | set(_REGISTRY))
        matches = difflib.get_close_matches(env_spec, candidates, n=3, cutoff=0.5)
        hint = (" Did you mean " + " or ".join(repr(m) for m in matches) + "?") if matches else ""
        raise UnknownEnvError(
            f"Unknown env {env_spec!r}: it is neither a name given to "
            "jaxrunner.register_env or ray.tune.registry.register_env (the latter is looked "
            f"up only once Ray is imported) nor a gymnax id.{hint} Run `jaxrunner envs` to "
            "list every env id."
        )
    from jaxrunner.envs import adapters

    if not isinstance(env_spec, type) and (
            (hasattr(env_spec, "step") and hasattr(env_spec, "reset"))
            or adapters.suite_of_object(env_spec) is not None):
        env, params = _as_env_and_params(env_spec, "config.env")
        return env, params, getattr(env, "name", type(env).__name__)
    if callable(env_spec):
        env, params = _as_env_and_params(env_spec(env_context),
                                         f"the env creator {getattr(env_spec, '__name__', env_spec)!r}")
        return env, params, getattr(env, "name", type(env).__name__)
    raise TypeError(f"config.env has an unsupported type: {type(env_spec).__name__}.")


# ---------------------------------------------------------------------- gymnax ids
def _constructor_args(cls: type) -> list[str]:
    """The named keyword arguments of `cls.__init__` (not `*args`/`**kwargs`)."""
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return []
    return [name for name, p in list(parameters.items())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def gymnax_env_config_keys(env_id: str) -> dict[str, list[str]]:
    """The `env_config` keys a gymnax id takes: `{"params": [EnvParams fields],
    "constructor": [keyword arguments of the env class]}`."""
    import gymnax

    env, params = gymnax.make(env_id)
    fields = [f.name for f in dataclasses.fields(params)] if dataclasses.is_dataclass(
        params) else []
    return {"params": fields, "constructor": _constructor_args(type(env))}


def _like_default(name: str, value: Any, default: Any, env_id: str) -> Any:
    """`value` with the type (and dtype/shape) of the default `EnvParams` field, so a
    changed field never changes the compiled program's argument types."""
    import jax.numpy as jnp
    import numpy as np

    if isinstance(default, bool) or isinstance(default, (int, float)):
        kind = type(default)
        try:
            converted = kind(value)
        except (TypeError, ValueError):
            converted = None
        if converted is None or (kind is int and converted != value):
            raise ValueError(
                f"env_config[{name!r}]={value!r} for {env_id!r}: the EnvParams field "
                f"{name!r} is a {kind.__name__} (default {default!r}); give a "
                f"{kind.__name__}."
            )
        return converted
    if hasattr(default, "shape") and hasattr(default, "dtype"):
        array = np.asarray(value)
        if array.shape != tuple(default.shape):
            raise ValueError(
                f"env_config[{name!r}] for {env_id!r} has shape {array.shape}, but the "
                f"EnvParams field {name!r} has shape {tuple(default.shape)} "
                f"({default.dtype}); give an array of that shape."
            )
        return jnp.asarray(array, dtype=default.dtype)
    return value


def _gymnasium_keywords(env_id: str) -> set[str]:
    """Keyword arguments `gymnasium.make(env_id, ...)` takes: `gymnasium.make`'s own and
    the named parameters of the registered env's constructor."""
    import gymnasium as gym

    names = {"max_episode_steps", "render_mode", "disable_env_checker", "autoreset"}
    try:
        creator = gym.spec(env_id).entry_point
        if isinstance(creator, str):
            creator = gym.envs.registration.load_env_creator(creator)
        names |= set(inspect.signature(creator).parameters)
    except Exception:  # noqa: BLE001 - only used to phrase an error message
        pass
    return names


def gymnax_precedence_note(env_id: str, keys: Any = None) -> str:
    """For a gymnax id that gymnasium also registers (e.g. "CartPole-v1"), the sentence
    that says the gymnax env took precedence and how to get gymnasium's; else "". With
    `keys` (rejected `env_config` keys), only when one of them is a keyword gymnasium's
    env takes (`"sutton_barto_reward"`), not for a typo of a gymnax key."""
    import gymnasium as gym

    if env_id not in gym.registry:
        return ""
    if keys is not None and not set(map(str, keys)) & _gymnasium_keywords(env_id):
        return ""
    return (f" Note: {env_id!r} is both a gymnax id and a gymnasium id; the gymnax "
            "(compiled) env takes precedence. For gymnasium's env stepped on the host (with "
            "its own constructor keywords, e.g. an RLlib config written for it), use "
            f"config.environment('gymnasium:{env_id}').")


def make_gymnax_env(env_id: str, env_config: dict) -> tuple[Any, Any]:
    """`gymnax.make(env_id)` with `env_config` applied: keys that are keyword arguments
    of the env's constructor go to `gymnax.make`, keys that are `EnvParams` fields are
    set on its `default_params` (a key that is both goes to both). Any other key is a
    `ValueError` that lists the keys the env takes and the close matches."""
    import gymnax

    env, params = gymnax.make(env_id)
    if not env_config:
        return env, params
    keys = gymnax_env_config_keys(env_id)
    constructor = {k: v for k, v in env_config.items() if k in keys["constructor"]}
    fields = {k: v for k, v in env_config.items() if k in keys["params"]}
    unknown = [k for k in env_config if k not in constructor and k not in fields]
    if unknown:
        known = keys["params"] + keys["constructor"]
        close = sorted({m for k in unknown
                        for m in difflib.get_close_matches(str(k), known, n=3, cutoff=0.6)})
        hint = (" Did you mean " + " or ".join(repr(m) for m in close) + "?") if close else ""
        raise ValueError(
            f"env_config {dict(env_config)!r} for the gymnax env {env_id!r} has key(s) "
            f"{unknown} that are neither fields of its EnvParams ({keys['params']}) nor "
            f"arguments of its constructor ({keys['constructor'] or 'none'}).{hint} To "
            "build the env another way, register a creator with jaxrunner.register_env."
            + gymnax_precedence_note(env_id, unknown)
        )
    if constructor:
        try:
            env, params = gymnax.make(env_id, **constructor)
        except Exception as error:  # noqa: BLE001 - re-raised with the env and the keys
            raise ValueError(
                f"gymnax.make({env_id!r}, **{constructor!r}) (from env_config) raised "
                f"{type(error).__name__}: {error}"
            ) from error
    if fields:
        params = params.replace(**{k: _like_default(k, v, getattr(params, k), env_id)
                                   for k, v in fields.items()})
    return env, params


# ---------------------------------------------------------------------- custom env checks
def _gymnax_base() -> type | None:
    try:
        from gymnax.environments.environment import Environment
    except ImportError:  # pragma: no cover - gymnax is a dependency
        return None
    return Environment


def _overrides(env: Any, base: type, method: str) -> bool:
    return getattr(type(env), method, None) is not getattr(base, method, None)


def check_jax_env(env: Any, env_params: Any, name: str) -> None:
    """Checks a gymnax `Environment` against what `Environment.step` needs, before
    anything is compiled.

    * The base `step` truncates with `is_truncated(state, params)`, i.e. `state.time >=
      params.max_steps_in_episode`: a state without `time` (or params without
      `max_steps_in_episode`) is a `TypeError` saying what to add, unless the env
      overrides `step` or `is_truncated`.
    * `step_env` must return natural termination only (`step` adds the time limit as
      `truncated`). For an env not shipped with gymnax, one step from the reset state
      with `time` set to one and two steps before the limit is probed: if only the step
      that reaches the limit is `done`, `step_env` reports the time limit as termination
      (the old gymnax `done`), so time-outs would come out terminated=True and
      truncated=True and a learner would stop bootstrapping. That is an
      `OldStyleDoneWarning` with the fix.

    Envs that are not gymnax `Environment`s, and envs whose reset or step cannot be
    run here, are left to the runner's own checks.
    """
    base = _gymnax_base()
    if base is None or not isinstance(env, base):
        return
    if _overrides(env, base, "step") or _overrides(env, base, "is_truncated"):
        return
    import jax

    try:
        _, state = jax.eval_shape(env.reset_env, jax.random.key(0), env_params)
    except Exception:  # noqa: BLE001 - the runner's tracing check reports it
        return
    missing = []
    if not hasattr(state, "time"):
        missing.append(f"its state ({type(state).__name__}) has no `time` field")
    if not hasattr(env_params, "max_steps_in_episode"):
        missing.append(f"its params ({type(env_params).__name__}) have no "
                       "`max_steps_in_episode` field")
    if missing:
        raise TypeError(
            f"The env {name!r} ({type(env).__name__}) cannot use gymnax's "
            f"Environment.step: {' and '.join(missing)}. The base step() truncates episodes "
            "with is_truncated(state, params) = state.time >= params.max_steps_in_episode. "
            "Add `time: int` to the state dataclass (0 in reset_env, state.time + 1 in "
            "step_env) and `max_steps_in_episode: int` to the params (subclass "
            "gymnax.environments.environment.EnvParams), or override "
            "is_truncated(state, params) if the env has no time limit."
        )
    if type(env).__module__.split(".")[0] == "gymnax":
        return  # gymnax's own envs follow the 1.0 contract
    _warn_if_done_includes_time_limit(env, env_params, name)


def _warn_if_done_includes_time_limit(env: Any, env_params: Any, name: str) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    try:
        limit = int(np.asarray(env_params.max_steps_in_episode))
    except (TypeError, ValueError):
        return
    if limit < 2:
        return

    def probe(key, params, time):
        # One step from the reset state with `time` set: (done, time after the step).
        _, state = env.reset_env(key, params)
        action = env.action_space(params).sample(key)
        state = state.replace(time=time)
        _, next_state, _, done, _ = env.step_env(key, state, action, params)
        return jnp.asarray(done, jnp.bool_), jnp.asarray(next_state.time, jnp.int32)

    try:
        done, time_after = jax.device_get(jax.jit(jax.vmap(probe, in_axes=(None, None, 0)))(
            jax.random.key(0), env_params, np.asarray([limit - 2, limit - 1], np.int32)))
        before, at_limit = bool(done[0]), bool(done[1])
        time_after = int(time_after[1])
    except Exception:  # noqa: BLE001 - a probe that cannot run proves nothing
        return
    if at_limit and not before and time_after == limit:
        warnings.warn(
            f"The env {name!r} ({type(env).__name__}): step_env() returns done=True on the "
            f"step that reaches max_steps_in_episode={limit} and not on the step before, so "
            "it looks like its `done` includes the time limit (the old gymnax API). "
            "gymnax's Environment.step adds the time limit itself as `truncated`, so time-outs "
            "would come out terminated=True and truncated=True and a learner would not "
            "bootstrap them. Return natural termination only from step_env (drop the "
            "`state.time >= params.max_steps_in_episode` term from `done`); see docs/envs.md.",
            OldStyleDoneWarning, stacklevel=3)
