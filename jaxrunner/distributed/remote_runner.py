"""The Ray actor that hosts one env runner, and the process settings it starts with.

`RemoteEnvRunner` is a thin wrapper: it builds `runner_cls(config=..., worker_index=i,
num_workers=n)` in its own process and forwards calls to it. The wrapper adds what only
makes sense across processes:

* batches leave the process as host numpy (`EpisodeBatch.to_numpy()`), so the receiver
  never needs the sender's device;
* `sample_get_state_and_metrics()` puts the batch into the object store and returns its
  reference, so a learner can fetch the batch without the driver in between;
* `get_node_info()` reports where the runner runs (node id, host, pid, JAX platform);
* after a crash, Ray re-runs `__init__` with the same arguments (same `worker_index`);
  such a restarted runner refuses to sample until the group has restored its state
  (`restore()`), so no batch is ever taken with stale weights.

JAX reads its platform and memory flags once, when it is imported. The actor options
(`actor_options()`) set `JAX_PLATFORMS` and `XLA_PYTHON_CLIENT_PREALLOCATE` as
`runtime_env` environment variables, which Ray applies before the worker process starts,
so they hold before this module (and JAX with it) is imported there.
"""

from __future__ import annotations

import copy
import os
import socket
import time
import warnings
from typing import Any, Callable

import ray

from jaxrunner.config import RunnerConfig
from jaxrunner.envs.registry import register_env


class RunnerNotRestoredError(RuntimeError):
    """A restarted runner was asked to sample before its state was restored."""


def jax_env_vars(num_gpus: float) -> dict[str, str]:
    """Environment a runner process needs before JAX is imported: no memory
    preallocation (several runners may share an accelerator) and the platform (CUDA when
    the runner was given a GPU, else CPU). A compilation cache turned on in the driver
    (`jaxrunner.enable_compilation_cache`) is passed on, so restarted or new runners load
    their compiled rollout instead of compiling it."""
    env = {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "JAX_PLATFORMS": "cuda" if num_gpus > 0 else "cpu",
    }
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def actor_options(config: RunnerConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ray actor options for a runner of `config` (resources, restarts, environment).

    `extra` (the group's `actor_options`) is merged in last; its
    `runtime_env["env_vars"]` are added to (and may override) the JAX variables.
    """
    max_restarts = (config.max_num_env_runner_restarts if config.restart_failed_env_runners
                    else 0)
    options: dict[str, Any] = {
        "num_cpus": config.num_cpus_per_env_runner,
        "num_gpus": config.num_gpus_per_env_runner,
        "max_restarts": max_restarts,
        "max_task_retries": 0,
        "scheduling_strategy": "SPREAD",
    }
    extra = copy.deepcopy(extra or {})
    runtime_env = dict(extra.pop("runtime_env", None) or {})
    env_vars = {**jax_env_vars(config.num_gpus_per_env_runner),
                **dict(runtime_env.pop("env_vars", None) or {})}
    options["runtime_env"] = {**runtime_env, "env_vars": env_vars}
    options.update(extra)
    return options


def node_info(worker_index: int) -> dict[str, Any]:
    """Where the calling process runs: Ray node id, host name, IP, pid and JAX setup.

    `jax_platforms` is the value JAX read when it was imported (`jax.config`), so it
    shows whether `JAX_PLATFORMS` was set early enough.
    """
    import jax

    context = ray.get_runtime_context() if ray.is_initialized() else None
    return {
        "worker_index": worker_index,
        "node_id": context.get_node_id() if context is not None else None,
        "hostname": socket.gethostname(),
        "ip": ray.util.get_node_ip_address() if ray.is_initialized() else None,
        "pid": os.getpid(),
        "jax_platforms": jax.config.jax_platforms,
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(device) for device in jax.devices()],
        "xla_python_client_preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
    }


def call_runner(runner: Any, func: Callable | str, args: tuple, kwargs: dict) -> Any:
    """`func(runner, *args, **kwargs)`, or the runner's attribute `func` called with the
    arguments (a non-callable attribute is returned as is)."""
    if callable(func):
        return func(runner, *args, **kwargs)
    attribute = getattr(runner, func)
    if callable(attribute):
        return attribute(*args, **kwargs)
    if args or kwargs:
        raise TypeError(f"{type(runner).__name__}.{func} is not callable; it takes no "
                        "arguments.")
    return attribute


class RemoteEnvRunner:
    """One env runner in its own Ray actor process (see the module docstring).

    Args:
        runner_cls: the `EnvRunner` subclass to build.
        config: the group's `RunnerConfig`.
        worker_index: 1..N.
        num_workers: N.
        registered_envs: `{name: creator}` registered with `register_env` in the driver;
            registered here too, so a `config.env` naming one resolves in this process.
    """

    def __init__(self, runner_cls: type, config: RunnerConfig, worker_index: int,
                 num_workers: int, registered_envs: dict[str, Callable] | None = None):
        for name, creator in (registered_envs or {}).items():
            register_env(name, creator)
        self.worker_index = worker_index
        with warnings.catch_warnings():  # Ray's property warns about its own internals
            warnings.simplefilter("ignore", DeprecationWarning)
            self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self._restored = not self.restarted
        self.runner = runner_cls(config=config, worker_index=worker_index,
                                 num_workers=num_workers)

    # ------------------------------------------------------------------ health, restore
    def ping(self) -> str:
        return "pong"

    def assert_healthy(self) -> None:
        self.runner.assert_healthy()

    def restore(self, weights_state: dict[str, Any], state: dict[str, Any]) -> int:
        """Applies the group's state to a (re)started runner: the latest weights
        (`{"rl_module", "weights_seq_no"}`, passed by reference: one object for all runners)
        and `state` (connector states, lifetime counter). Returns the runner's
        `weights_seq_no`. Sampling is allowed again afterwards."""
        self.runner.set_state({**resolve_refs(state), **resolve_refs(weights_state)})
        self._restored = True
        return getattr(self.runner, "weights_seq_no", 0)

    def exit_after(self, delay_s: float) -> None:
        """Ends this process after `delay_s` so that Ray restarts the actor (RLlib's
        `FaultAwareApply` behaviour after an error, with `delay_between_env_runner_restarts_s`)."""
        time.sleep(delay_s)
        os._exit(1)

    def _check_restored(self) -> None:
        if not self._restored:
            raise RunnerNotRestoredError(
                f"EnvRunner {self.worker_index} was restarted and its state (weights, "
                "connector states, counters) is not restored yet; the group restores it in "
                "probe_unhealthy_env_runners().")

    # ------------------------------------------------------------------ calls
    def apply(self, func: Callable | str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """`func(runner, *args, **kwargs)` or the runner's method named `func`; wrapper
        methods of the same name (`sample_get_state_and_metrics`, `get_node_info`) win."""
        self._check_restored()
        kwargs = kwargs or {}
        if isinstance(func, str) and func in _WRAPPER_METHODS:
            return getattr(self, func)(*args, **kwargs)
        result = call_runner(self.runner, func, args, kwargs)
        return _to_host(result)

    @ray.method(num_returns=2)
    def sample(self, kwargs: dict) -> tuple[Any, dict]:
        """`(batch as host numpy, {"env_steps", "worker_index"})`; two objects so the
        group can read the small one without fetching the batch."""
        self._check_restored()
        batch = _to_host(self.runner.sample(**kwargs))
        return batch, {"env_steps": int(getattr(batch, "env_steps", 0)),
                       "worker_index": self.worker_index}

    def sample_get_state_and_metrics(self) -> tuple[Any, dict, dict]:
        """`(ObjectRef of the batch (host numpy), state without weights, metrics)`."""
        self._check_restored()
        batch = _to_host(self.runner.sample())
        state = self.runner.get_state(not_components="rl_module")
        return ray.put(batch), state, self.runner.get_metrics()

    def get_metrics_and_window(self) -> tuple[dict, dict | None]:
        """`(get_metrics(), get_metrics_window())`; the window is None when the runner
        class has no `get_metrics_window`."""
        metrics = self.runner.get_metrics()
        window = getattr(self.runner, "get_metrics_window", None)
        return metrics, (window() if window is not None else None)

    def get_state(self, components: Any = None, not_components: Any = None) -> dict:
        return self.runner.get_state(components, not_components=not_components)

    def set_state(self, state: dict[str, Any]) -> int:
        """The runner's `set_state` with object references (the state, or its weights)
        resolved here: runners themselves never see Ray objects."""
        self.runner.set_state(resolve_refs(state))
        return getattr(self.runner, "weights_seq_no", 0)

    def get_node_info(self) -> dict[str, Any]:
        info = node_info(self.worker_index)
        info["restarted"] = self.restarted
        return info

    def stop(self) -> None:
        self.runner.stop()


_WRAPPER_METHODS = ("sample_get_state_and_metrics", "get_node_info")


def resolve_refs(state: Any) -> Any:
    """`state` with Ray object references fetched: the state itself if it is one, and the
    values of its top-level entries (e.g. `{"rl_module": ref}`)."""
    if isinstance(state, ray.ObjectRef):
        state = ray.get(state)
    if isinstance(state, dict) and any(isinstance(v, ray.ObjectRef) for v in state.values()):
        refs = {k: v for k, v in state.items() if isinstance(v, ray.ObjectRef)}
        values = dict(zip(refs, ray.get(list(refs.values()))))
        state = {k: values.get(k, v) for k, v in state.items()}
    return state


def _to_host(value: Any) -> Any:
    """Batches (anything with `to_numpy()`, e.g. `EpisodeBatch`) as host numpy."""
    to_numpy = getattr(value, "to_numpy", None)
    return to_numpy() if callable(to_numpy) else value


__all__ = ["RemoteEnvRunner", "RunnerNotRestoredError", "actor_options", "call_runner",
           "jax_env_vars", "node_info", "resolve_refs"]
