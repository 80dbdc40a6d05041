"""Env resolution for both kinds of env a runner can step: compiled (gymnax-style, JAX)
and host (any gymnasium env, stepped in Python as a `gymnasium.vector` env, or an EnvPool
pool).

`config.env` resolves in this order (docs/envs.md "Resolution"):

1. a `jaxrunner.register_env` name, then a Ray Tune `register_env` name (looked up only
   when Ray is already imported; `jaxrunner.envs.registry.named_env_creator`): the creator
   is called with the `EnvContext` (for a Tune name, as RLlib passes it);
2. a callable creator, or a gymnasium `Env` / `VectorEnv` *class* (called like a creator,
   see `_ClassCreator`);
3. a gymnax `Environment` instance, a suite id (`"brax/ant"`, ...) or a gymnax id such as
   "CartPole-v1" (compiled; a gymnax id wins over a gymnasium id of the same name);
4. `"gymnasium:<id>"` (`env_config` is passed to `gymnasium.make` as kwargs), a
   `gymnasium.Env` or `gymnasium.vector.VectorEnv` instance (host);
5. `"envpool:<id>"`: EnvPool's C++ thread pool (`jaxrunner.envs.envpool_env`).

A creator may return a compiled env, a `gymnasium.Env` (called once per sub-env,
`env_context.vector_index` = sub-env index) or a `gymnasium.vector.VectorEnv` (called
once; its `num_envs` must match the config).

How host sub-envs are vectorized is RLlib's `env_runners(gym_env_vectorize_mode=...)`:
"sync" (default; `gymnasium.vector.SyncVectorEnv`, in the runner's process), "async"
(`gymnasium.vector.AsyncVectorEnv`: one sub-process per sub-env, started with "spawn"
because the runner's process runs JAX threads, which `fork` would not copy safely) or
"vector_entry_point" (the env's own vector env: a creator or class is called once with
`num_envs` in its `env_config`, a gymnasium id uses its registered `vector_entry_point`).
`env_runners(remote_worker_envs=True)` steps the sub-envs in sub-processes too ("async"
unless "vector_entry_point" is set) and sets `env_context.remote`. A gymnasium id
registered with a `vector_entry_point` and no `entry_point` is used as its vector env in
any mode. For compiled envs none of these settings changes anything (the `vmap` is the
vectorization), except that "async" / "vector_entry_point" set for a gymnax id that is
also a gymnasium id is an error saying that the gymnax env took precedence.

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
import inspect
import logging
from typing import Any, Callable

import gymnasium as gym

from jaxrunner.envs import registry
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.kind import SINGLE_AGENT, check_env_kind

logger = logging.getLogger(__name__)

GYMNASIUM_PREFIX = "gymnasium:"
ENVPOOL_PREFIX = "envpool:"
#: RLlib's `gym_env_vectorize_mode` values (`gymnasium.VectorizeMode`).
VECTORIZE_MODES = tuple(mode.value for mode in gym.VectorizeMode)
SYNC, ASYNC, VECTOR_ENTRY_POINT = "sync", "async", "vector_entry_point"
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


def vectorize_mode_of(mode: Any, remote_worker_envs: bool = False) -> str:
    """The effective vectorize mode: `mode` as a `VECTORIZE_MODES` string (a
    `gymnasium.VectorizeMode` is accepted), "async" for `remote_worker_envs` unless the
    env's own vector entry point is asked for. A `ValueError` lists the valid values."""
    try:
        value = gym.VectorizeMode(mode).value
    except ValueError:
        raise ValueError(
            f"gym_env_vectorize_mode={mode!r} is not a gymnasium.VectorizeMode; use one of "
            f"{list(VECTORIZE_MODES)} (or gymnasium.VectorizeMode.SYNC / ASYNC / "
            "VECTOR_ENTRY_POINT).") from None
    if remote_worker_envs and value == SYNC:
        return ASYNC
    return value


def _vector_kwargs(mode: str) -> dict:
    """gymnasium vector env keywords for "sync" / "async": `SAME_STEP` autoreset (a
    finished sub-env is reset in the same step, its final observation in
    `infos["final_obs"]`); "async" sub-processes are started with "spawn"."""
    kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    if mode == ASYNC:
        kwargs["context"] = "spawn"
    return kwargs


def _same_step(env_fns: list, mode: str = SYNC) -> gym.vector.VectorEnv:
    """A `SyncVectorEnv` (or, for "async", an `AsyncVectorEnv` with one spawned
    sub-process per sub-env) of `env_fns` with `_vector_kwargs(mode)`."""
    cls = gym.vector.AsyncVectorEnv if mode == ASYNC else gym.vector.SyncVectorEnv
    return cls(env_fns, **_vector_kwargs(mode))


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception as error:  # noqa: BLE001 - only a probe; the runner builds its own
        logger.debug("Closing a probed env raised %s: %s", type(error).__name__, error)


class _SubEnvFn:
    """Builds sub-env `index` with `creator` (picklable, for "async" sub-processes)."""

    def __init__(self, creator: Callable, context: EnvContext, index: int, origin: str):
        self.creator, self.context, self.index, self.origin = creator, context, index, origin

    def __call__(self) -> gym.Env:
        env = _call_user(self.creator, self.context.copy_with_overrides(
            vector_index=self.index), what=self.origin)
        if not isinstance(env, gym.Env):
            raise TypeError(f"{self.origin} returned {type(env).__name__} for sub-env "
                            f"{self.index}; expected a gymnasium Env as for sub-env 0.")
        return env


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
                         name: str, mode: str = SYNC) -> HostEnvSource:
    """A host source from a creator whose first result `first` is a gymnasium env."""
    origin = f"the env creator {name!r}"
    if isinstance(first, gym.vector.VectorEnv):
        _check_vector(first, num_envs, origin)
        pending = [first]
        vector_context = _vector_context(context, num_envs) if mode == VECTOR_ENTRY_POINT \
            else context

        def build_vector() -> gym.vector.VectorEnv:
            if pending:
                return pending.pop()
            env = _call_user(creator, vector_context, what=origin)
            if not isinstance(env, gym.vector.VectorEnv):
                raise TypeError(f"{origin} returned {type(env).__name__} when recreated; "
                                "expected a gymnasium VectorEnv as the first time.")
            return _check_vector(env, num_envs, origin)

        return HostEnvSource(name=name, build=build_vector)
    if mode == VECTOR_ENTRY_POINT:
        _close_quietly(first)
        raise TypeError(
            f"gym_env_vectorize_mode='vector_entry_point': {origin} returned a single "
            f"gymnasium Env ({type(first).__name__}), not a gymnasium VectorEnv. With this "
            "mode the creator is called once with env_config['num_envs'] and must return "
            "the vector env; use gym_env_vectorize_mode='sync' (or 'async') to vectorize "
            "single envs.")
    if mode == ASYNC:
        _close_quietly(first)  # every sub-env is built in its own sub-process
        fns = [_SubEnvFn(creator, context, i, origin) for i in range(num_envs)]
        return HostEnvSource(name=name, build=lambda: _call_user(
            lambda: _same_step(fns, ASYNC), what=f"{origin} (async sub-envs)"))
    pending_single = [first]

    def make_one(index: int) -> gym.Env:
        if index == 0 and pending_single:
            return pending_single.pop()
        return _SubEnvFn(creator, context, index, origin)()

    def build_single() -> gym.vector.VectorEnv:
        envs = [make_one(i) for i in range(num_envs)]
        return _same_step([lambda e=e: e for e in envs])

    return HostEnvSource(name=name, build=build_single)


def _vector_context(context: EnvContext, num_envs: int) -> EnvContext:
    """The context a vector entry point gets: `env_config` plus `num_envs` (as RLlib)."""
    return context.copy_with_overrides(env_config={**context, "num_envs": num_envs})


_CONTEXT_PARAMETER_NAMES = ("config", "env_config", "env_context", "context", "ctx")


class _ClassCreator:
    """A gymnasium `Env` / `VectorEnv` class used as `config.env`, called like a creator.

    RLlib calls such a class with the `EnvContext` (`MyEnv(config)`, its examples'
    convention). A class whose constructor has no parameter named like a context
    (`config`, `env_config`, `env_context`, `context`, `ctx`) and no required positional
    parameter is gymnasium-style (`CartPoleEnv(sutton_barto_reward=True)`): it gets
    `env_config` as keyword arguments instead (a `VectorEnv` class also `num_envs`)."""

    def __init__(self, cls: type):
        self.cls = cls
        self.__name__ = cls.__name__
        try:
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            params = []
        self.takes_context = any(p.name in _CONTEXT_PARAMETER_NAMES for p in params) or any(
            p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name != "num_envs" for p in params)

    def __call__(self, context: EnvContext) -> Any:
        if self.takes_context:
            return self.cls(context)
        return self.cls(**dict(context))


def is_gymnasium_class(obj: Any) -> bool:
    """Whether `obj` is a gymnasium `Env` or `VectorEnv` subclass."""
    return isinstance(obj, type) and issubclass(obj, (gym.Env, gym.vector.VectorEnv))


def _gymnasium_id_source(env_id: str, context: EnvContext, num_envs: int,
                         mode: str = SYNC) -> HostEnvSource:
    spec = None
    if ":" not in env_id:  # "module:Id" ids register on import, inside gymnasium.make
        try:
            spec = gym.spec(env_id)
        except gym.error.Error as error:
            raise ValueError(
                f"Unknown gymnasium env id {env_id!r} in {GYMNASIUM_PREFIX + env_id!r} "
                f"({type(error).__name__}: {error})."
            ) from error
    kwargs = dict(context)
    if spec is not None and spec.entry_point is None and spec.vector_entry_point is not None:
        mode = VECTOR_ENTRY_POINT  # registered as a vector env only
    if mode == VECTOR_ENTRY_POINT and spec is not None and spec.vector_entry_point is None:
        raise ValueError(
            f"gym_env_vectorize_mode='vector_entry_point', but the gymnasium id "
            f"{env_id!r} has no vector_entry_point registered; use 'sync' or 'async'.")
    # The env's own vector env takes no vector_kwargs (its autoreset mode is its own).
    vector_kwargs = {} if mode == VECTOR_ENTRY_POINT else {
        "vector_kwargs": _vector_kwargs(mode)}

    def build() -> gym.vector.VectorEnv:
        return _call_user(
            lambda: gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode,
                                 **vector_kwargs, **kwargs),
            what=f"gymnasium.make_vec({env_id!r}, vectorization_mode={mode!r}, "
                 f"**{kwargs!r})")

    return HostEnvSource(name=GYMNASIUM_PREFIX + env_id, build=build)


def _instance_source(env: Any, num_envs: int, mode: str = SYNC) -> HostEnvSource:
    name = getattr(getattr(env, "spec", None), "id", None) or type(env).__name__
    if isinstance(env, gym.vector.VectorEnv):
        _check_vector(env, num_envs, "config.env")
        if mode == ASYNC:
            raise ValueError(
                f"config.env is a gymnasium VectorEnv instance ({type(env).__name__}); it "
                "is stepped as it is, so gym_env_vectorize_mode='async' / "
                "remote_worker_envs=True cannot apply. Pass an AsyncVectorEnv, or a "
                "creator of single envs with gym_env_vectorize_mode='async'.")
        return HostEnvSource(name=name, build=lambda: env, owned=False)
    if mode == VECTOR_ENTRY_POINT:
        raise ValueError(
            f"gym_env_vectorize_mode='vector_entry_point', but config.env is a single "
            f"gymnasium Env instance ({type(env).__name__}); pass a VectorEnv (or its "
            "class / a creator returning one), or use 'sync' / 'async'.")

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
        return _same_step([copy_of_instance for _ in range(num_envs)], mode)

    return HostEnvSource(name=name, build=build)


def _refuse_host_settings_for_compiled(env_spec: Any, name: str, mode: str,
                                       explicit_mode: str) -> None:
    """"async" / "vector_entry_point" asked for an env that resolved to a compiled one:
    an error for a gymnax id that gymnasium also registers (the user most likely meant
    gymnasium's env); other compiled envs ignore the setting (documented)."""
    if explicit_mode == SYNC:
        return
    if isinstance(env_spec, str) and env_spec in gym.registry:
        raise ValueError(
            f"gym_env_vectorize_mode={explicit_mode!r} asks for gymnasium vectorization, "
            f"but {env_spec!r} resolved to the gymnax (compiled) env: gymnax ids take "
            "precedence over gymnasium ids of the same name, and a compiled env is "
            "vectorized by jax.vmap, so the setting cannot apply. Use "
            f"config.environment({GYMNASIUM_PREFIX + env_spec!r}) to step gymnasium's env "
            "on the host, or drop gym_env_vectorize_mode.")
    logger.debug("gym_env_vectorize_mode=%r has no effect on the compiled env %r.", mode,
                 name)


def _host_source(env_spec: Any, context: EnvContext, num_envs: int, mode: str,
                 explicit_mode: str) -> HostEnvSource | None:
    """The source of an `"envpool:"` / `"gymnasium:"` id or a gymnasium env instance,
    else None."""
    if isinstance(env_spec, str) and env_spec.startswith(ENVPOOL_PREFIX):
        from jaxrunner.envs.envpool_env import envpool_source

        return envpool_source(env_spec[len(ENVPOOL_PREFIX):], context, num_envs,
                              explicit_mode)
    if isinstance(env_spec, str) and env_spec.startswith(GYMNASIUM_PREFIX):
        return _gymnasium_id_source(env_spec[len(GYMNASIUM_PREFIX):], context, num_envs,
                                    mode)
    if is_host_env(env_spec):
        return _instance_source(env_spec, num_envs, mode)
    return None


def _creator_of(env_spec: Any) -> tuple[Callable | None, str | None]:
    """`(creator, name)` of a gymnasium class or a callable creator, else `(None, None)`
    (an env object or a gymnax id, left to `registry.make_jax_env`)."""
    if is_gymnasium_class(env_spec):
        return _ClassCreator(env_spec), env_spec.__name__
    if callable(env_spec) and (isinstance(env_spec, type) or not (
            hasattr(env_spec, "step") and hasattr(env_spec, "reset"))):
        return env_spec, getattr(env_spec, "__name__", type(env_spec).__name__)
    return None, None


def resolve_env(env_spec: Any, context: EnvContext, num_envs: int,
                vectorize_mode: Any = SYNC) -> tuple[str, Any]:
    """Resolves `config.env` to `("host", HostEnvSource)` or
    `("jax", (env, env_params, name))` for `SingleAgentEnvRunner`, in the order of the
    module docstring.

    Args:
        env_spec: `config.env`.
        context: the `EnvContext` creators get (`context.remote` is
            `remote_worker_envs`: it turns "sync" into "async" for host envs).
        num_envs: `num_envs_per_env_runner`.
        vectorize_mode: `gym_env_vectorize_mode` (RLlib's values, `VECTORIZE_MODES`).

    A multi-agent env is a `TypeError` naming `MultiAgentEnvRunner` and
    `runner_class_for` (`jaxrunner.envs.kind.check_env_kind`); a compiled env is checked
    with `registry.check_jax_env`.

    Creators are called once here (their result is reused); exceptions they raise come
    out as `EnvCreationError`.
    """
    explicit_mode = vectorize_mode_of(vectorize_mode)
    mode = vectorize_mode_of(vectorize_mode, bool(getattr(context, "remote", False)))
    # An RLlib / PettingZoo multi-agent env (or class) is a gymnasium Env too: refuse it.
    check_env_kind(env_spec, SINGLE_AGENT, getattr(env_spec, "__name__", None))
    creator = registry.named_env_creator(env_spec)  # jaxrunner's registry, then Tune's
    name = env_spec
    if creator is None:
        host = _host_source(env_spec, context, num_envs, mode, explicit_mode)
        if host is not None:
            return "host", host
        registry.reject_env_class(env_spec)
        creator, name = _creator_of(env_spec)
    if creator is not None:
        first_context = _vector_context(context, num_envs) if mode == VECTOR_ENTRY_POINT \
            else context
        result = _call_user(creator, first_context, what=f"the env creator {name!r}")
        check_env_kind(result, SINGLE_AGENT, name)
        if is_host_env(result):
            return "host", _source_from_creator(creator, result, context, num_envs, name,
                                                mode)
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
        _refuse_host_settings_for_compiled(env_spec, name, mode, explicit_mode)
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


__all__ = ["ENVPOOL_PREFIX", "GYMNASIUM_PREFIX", "PROGRAMMING_ERRORS", "VECTORIZE_MODES",
           "EnvCreationError", "HostEnvSource", "create_with_retries", "is_gymnasium_class",
           "is_host_env", "resolve_env", "vectorize_mode_of"]
