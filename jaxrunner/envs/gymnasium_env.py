"""Env resolution for both kinds of env a runner can step: compiled (gymnax-style, JAX)
and host (any gymnasium env, stepped in Python as a `gymnasium.vector` env).

`config.env` resolves to a host env when it is

* a string `"gymnasium:<id>"` (`env_config` is passed to `gymnasium.make` as kwargs);
* a `gymnasium.Env` or `gymnasium.vector.VectorEnv` instance;
* a `register_env` name or a callable whose `creator(env_context)` returns a
  `gymnasium.Env` (called once per sub-env, `env_context.vector_index` = sub-env index)
  or a `gymnasium.vector.VectorEnv` (called once; its `num_envs` must match the config).

Everything else resolves as before (`jaxrunner.envs.registry.make_jax_env`).

Exceptions raised while *creating* an env (inside a creator, `gymnasium.make`, a sub-env
constructor) are wrapped in `EnvCreationError` so the runner can retry them
(`create_with_retries`); configuration mistakes (unknown ids, wrong return types) are not.
Neither are bugs in the creator's code (`TypeError`, `NameError`, `AttributeError`,
`ValueError`, `LookupError`, ... : `PROGRAMMING_ERRORS`): a retry cannot fix them, so they
propagate unchanged, with a note naming the creator.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Callable

import gymnasium as gym

from jaxrunner.envs import registry
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.kind import SINGLE_AGENT, check_env_kind

logger = logging.getLogger(__name__)

GYMNASIUM_PREFIX = "gymnasium:"
RESTART_HINT = "config.fault_tolerance(restart_failed_sub_environments=True)"


class EnvCreationError(RuntimeError):
    """An exception raised by user code while creating an env (its `__cause__`)."""


# Exceptions that mean the creator's code (or its arguments) is wrong: retrying the same
# call cannot succeed, so they are not retried and not wrapped with advice to retry.
PROGRAMMING_ERRORS = (TypeError, NameError, AttributeError, ValueError, LookupError,
                      AssertionError, NotImplementedError, ImportError, SyntaxError,
                      ArithmeticError)


def is_host_env(obj: Any) -> bool:
    """Whether `obj` is a gymnasium env (single or vector) that runs on the host."""
    return isinstance(obj, (gym.Env, gym.vector.VectorEnv))


@dataclasses.dataclass
class HostEnvSource:
    """How to (re)build the gymnasium vector env of a host-env runner.

    `build()` returns a fresh `gymnasium.vector.VectorEnv` (the first call reuses what the
    creator returned during resolution, so creators are not called twice). `owned`: the
    runner built the env and may close and rebuild it (False for a `VectorEnv` instance
    the user passed: it is reset instead of rebuilt, and never closed).
    """

    name: str
    build: Callable[[], gym.vector.VectorEnv]
    owned: bool = True


def _same_step(env_fns: list) -> gym.vector.VectorEnv:
    """A `SyncVectorEnv` that resets a finished sub-env in the same step (its final
    observation in `infos["final_obs"]`)."""
    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _call_user(fn: Callable, *args: Any, what: str) -> Any:
    try:
        return fn(*args)
    except PROGRAMMING_ERRORS as error:
        error.add_note(f"(raised inside {what}; not retried: a {type(error).__name__} is a "
                       "bug in the creator or its arguments, which a retry cannot fix)")
        raise
    except Exception as error:  # noqa: BLE001 - re-raised, wrapped for the retry policy
        raise EnvCreationError(f"{what} raised {type(error).__name__}: {error}") from error


def _check_vector(env: gym.vector.VectorEnv, num_envs: int, origin: str) -> gym.vector.VectorEnv:
    if env.num_envs != num_envs:
        raise ValueError(
            f"{origin} returned a gymnasium VectorEnv with {env.num_envs} sub-envs, but "
            f"config.env_runners(num_envs_per_env_runner={num_envs}). Make them equal."
        )
    return env


def _source_from_creator(creator: Callable, first: Any, context: EnvContext, num_envs: int,
                         name: str) -> HostEnvSource:
    """A host source from a creator whose first result `first` is a gymnasium env."""
    origin = f"the env creator {name!r}"
    if isinstance(first, gym.vector.VectorEnv):
        _check_vector(first, num_envs, origin)
        pending = [first]

        def build_vector() -> gym.vector.VectorEnv:
            if pending:
                return pending.pop()
            env = _call_user(creator, context, what=origin)
            if not isinstance(env, gym.vector.VectorEnv):
                raise TypeError(f"{origin} returned {type(env).__name__} when recreated; "
                                "expected a gymnasium VectorEnv as the first time.")
            return _check_vector(env, num_envs, origin)

        return HostEnvSource(name=name, build=build_vector)
    pending_single = [first]

    def make_one(index: int) -> gym.Env:
        if index == 0 and pending_single:
            return pending_single.pop()
        env = _call_user(creator, context.copy_with_overrides(vector_index=index),
                         what=origin)
        if not isinstance(env, gym.Env):
            raise TypeError(f"{origin} returned {type(env).__name__} for sub-env {index}; "
                            "expected a gymnasium Env as for sub-env 0.")
        return env

    def build_single() -> gym.vector.VectorEnv:
        envs = [make_one(i) for i in range(num_envs)]
        return _same_step([lambda e=e: e for e in envs])

    return HostEnvSource(name=name, build=build_single)


def _gymnasium_id_source(env_id: str, context: EnvContext, num_envs: int) -> HostEnvSource:
    if ":" not in env_id:  # "module:Id" ids register on import, inside gymnasium.make
        try:
            gym.spec(env_id)
        except gym.error.Error as error:
            raise ValueError(
                f"Unknown gymnasium env id {env_id!r} in {GYMNASIUM_PREFIX + env_id!r} "
                f"({type(error).__name__}: {error})."
            ) from error
    kwargs = dict(context)

    def build() -> gym.vector.VectorEnv:
        return _call_user(
            lambda: gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                                 vector_kwargs={"autoreset_mode":
                                                gym.vector.AutoresetMode.SAME_STEP},
                                 **kwargs),
            what=f"gymnasium.make_vec({env_id!r}, **{kwargs!r})")

    return HostEnvSource(name=GYMNASIUM_PREFIX + env_id, build=build)


def _instance_source(env: Any, num_envs: int) -> HostEnvSource:
    name = getattr(getattr(env, "spec", None), "id", None) or type(env).__name__
    if isinstance(env, gym.vector.VectorEnv):
        _check_vector(env, num_envs, "config.env")
        return HostEnvSource(name=name, build=lambda: env, owned=False)

    def copy_of_instance() -> gym.Env:
        try:
            return copy.deepcopy(env)
        except Exception as error:  # noqa: BLE001 - re-raised with the fix
            raise TypeError(
                f"config.env is a gymnasium Env instance ({type(env).__name__}) that cannot "
                f"be deep-copied ({type(error).__name__}: {error}); the runner needs "
                f"{num_envs} independent copies and fresh ones after failures. Pass a "
                "creator instead: config.environment(lambda ctx: MyEnv(...)).") from error

    copy_of_instance()  # fail at construction, not at the first recreation

    def build() -> gym.vector.VectorEnv:
        return _same_step([copy_of_instance for _ in range(num_envs)])

    return HostEnvSource(name=name, build=build)


def resolve_env(env_spec: Any, context: EnvContext, num_envs: int
                ) -> tuple[str, Any]:
    """Resolves `config.env` to `("host", HostEnvSource)` or
    `("jax", (env, env_params, name))` for `SingleAgentEnvRunner`.

    A multi-agent env is a `TypeError` naming `MultiAgentEnvRunner` and
    `runner_class_for` (`jaxrunner.envs.kind.check_env_kind`); a compiled env is checked
    with `registry.check_jax_env`.

    Creators are called once here (their result is reused); exceptions they raise come
    out as `EnvCreationError`.
    """
    if isinstance(env_spec, str) and env_spec.startswith(GYMNASIUM_PREFIX):
        return "host", _gymnasium_id_source(env_spec[len(GYMNASIUM_PREFIX):], context,
                                            num_envs)
    if is_host_env(env_spec):
        return "host", _instance_source(env_spec, num_envs)
    registry.reject_env_class(env_spec)
    creator, name = None, None
    if isinstance(env_spec, str) and registry.registered_env_creator(env_spec) is not None:
        creator, name = registry.registered_env_creator(env_spec), env_spec
    elif callable(env_spec) and (isinstance(env_spec, type) or not (
            hasattr(env_spec, "step") and hasattr(env_spec, "reset"))):
        creator = env_spec
        name = getattr(env_spec, "__name__", type(env_spec).__name__)
    if creator is not None:
        result = _call_user(creator, context, what=f"the env creator {name!r}")
        if is_host_env(result):
            return "host", _source_from_creator(creator, result, context, num_envs, name)
        origin = (f"the creator registered as {name!r}" if isinstance(env_spec, str)
                  else f"the env creator {name!r}")
        env, params = registry._as_env_and_params(result, origin)
        if not isinstance(env_spec, str):
            name = getattr(env, "name", type(env).__name__)
        check_env_kind(env, SINGLE_AGENT, name)
        registry.check_jax_env(env, params, name)
        return "jax", (env, params, name)
    try:
        env, params, name = registry.make_jax_env(env_spec, context)
        check_env_kind(env, SINGLE_AGENT, name)
        registry.check_jax_env(env, params, name)
        return "jax", (env, params, name)
    except registry.UnknownEnvError as error:
        if isinstance(env_spec, str) and env_spec in gym.registry:
            raise ValueError(
                f"{error} {env_spec!r} is a gymnasium id: use "
                f"config.environment({GYMNASIUM_PREFIX + env_spec!r}) to step it on the "
                "host as a gymnasium vector env."
            ) from error
        raise


def create_with_retries(create: Callable[[], Any], *, restart: bool, tolerance: int,
                        what: str) -> Any:
    """Calls `create()`; on `EnvCreationError`, retries up to `tolerance` times (logging
    each failure) when `restart`, else raises `RuntimeError` with the setting to turn on.
    """
    attempts = 0
    while True:
        try:
            return create()
        except EnvCreationError as error:
            attempts += 1
            cause = error.__cause__ or error
            if not restart:
                raise RuntimeError(
                    f"Creating {what} failed ({error}). Set {RESTART_HINT} to retry env "
                    "creation (up to num_consecutive_sub_env_failures_tolerance times)."
                ) from cause
            if attempts > tolerance:
                raise RuntimeError(
                    f"Creating {what} failed {attempts} times in a row ({error}); giving up "
                    "(num_consecutive_sub_env_failures_tolerance="
                    f"{tolerance}). Fix the env creator, or raise "
                    "config.fault_tolerance(num_consecutive_sub_env_failures_tolerance=...)."
                ) from cause
            logger.warning("Creating %s failed (attempt %d, %d retries allowed); retrying.",
                           what, attempts, tolerance, exc_info=cause)


__all__ = ["GYMNASIUM_PREFIX", "PROGRAMMING_ERRORS", "EnvCreationError", "HostEnvSource", "create_with_retries",
           "is_host_env", "resolve_env"]
