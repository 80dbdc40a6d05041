"""Env resolution: `register_env` names, callables, gymnax ids and gymnax env objects.

`config.env` resolves in this order (DESIGN.md "Construction"):

1. a name given to `register_env(name, creator)`;
2. a callable `creator(env_context) -> (env, env_params)`;
3. a gymnax `Environment` instance (its `default_params` are used);
4. a gymnax id such as "CartPole-v1" (`env_config` is passed to `gymnax.make`).

An unknown name is a `ValueError` that names the close matches.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

from jaxrunner.envs.context import EnvContext

_REGISTRY: dict[str, Callable[[EnvContext], Any]] = {}

# gymnax ids that cannot run on a machine without internet access: they download a data
# set when created.
_NEEDS_DOWNLOAD = {"MNISTBandit-bsuite": "downloads the MNIST data set when it is created"}


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


def make_jax_env(env_spec: Any, env_context: EnvContext) -> tuple[Any, Any, str]:
    """Builds `(env, env_params, name)` from `config.env` and an `EnvContext`."""
    if env_spec is None:
        raise ValueError(
            "No env is configured: call config.environment(env=...) with a gymnax id "
            "(e.g. 'CartPole-v1'), a name given to jaxrunner.register_env, a callable "
            "creator(env_context) -> (env, env_params), or a gymnax Environment."
        )
    if isinstance(env_spec, str):
        if env_spec in _REGISTRY:
            env, params = _as_env_and_params(_REGISTRY[env_spec](env_context),
                                             f"the creator registered as {env_spec!r}")
            return env, params, env_spec
        ids = gymnax_env_ids(runnable_only=False)
        if env_spec in _NEEDS_DOWNLOAD:
            raise ValueError(
                f"The gymnax env {env_spec!r} {_NEEDS_DOWNLOAD[env_spec]}, which this "
                "machine cannot do. Register a creator that loads the data from a local file "
                "instead (jaxrunner.register_env)."
            )
        if env_spec in ids:
            import gymnax

            try:
                env, params = gymnax.make(env_spec, **dict(env_context))
            except TypeError as error:
                raise ValueError(
                    f"gymnax.make({env_spec!r}) rejected env_config {dict(env_context)!r}: "
                    f"{error}. Pass only keyword arguments that the env's constructor takes."
                ) from error
            return env, params, env_spec
        candidates = sorted(set(ids) | set(_REGISTRY))
        matches = difflib.get_close_matches(env_spec, candidates, n=3, cutoff=0.5)
        hint = (" Did you mean " + " or ".join(repr(m) for m in matches) + "?") if matches else ""
        raise ValueError(
            f"Unknown env {env_spec!r}: it is neither a name given to "
            f"jaxrunner.register_env nor a gymnax id.{hint} Run `jaxrunner envs` to list "
            "every env id."
        )
    if hasattr(env_spec, "step") and hasattr(env_spec, "reset") and not isinstance(env_spec, type):
        env, params = _as_env_and_params(env_spec, "config.env")
        return env, params, getattr(env, "name", type(env).__name__)
    if callable(env_spec):
        env, params = _as_env_and_params(env_spec(env_context),
                                         f"the env creator {getattr(env_spec, '__name__', env_spec)!r}")
        return env, params, getattr(env, "name", type(env).__name__)
    raise TypeError(f"config.env has an unsupported type: {type(env_spec).__name__}.")
