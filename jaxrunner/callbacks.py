"""Callbacks of a runner, configured through `config.callbacks(...)` with RLlib's event
names (see docs/callbacks.md).

Device callbacks (pure JAX, inside the compiled chunk; `jaxrunner.core.callbacks`):
`on_episode_start(start) -> state`, `on_episode_step(state, step) -> state`,
`on_episode_end(state, step) -> {name: scalar}`; their metrics reduce as
`custom_metrics={name: "mean" | "min" | "max" | "sum" | MetricSpec(...)}` says.

Host callbacks (Python, in the runner's process), called with keywords as RLlib calls
them: `on_environment_created(env_runner, metrics_logger, env, env_context)` after each
env (re)creation, `on_sample_end(env_runner, metrics_logger, samples)` at the end of each
`sample()` (`samples` is the returned `EpisodeBatch` / `MultiAgentEpisodeBatch`), and,
wrapped in `on_host(fn)`, `on_episode_end(episode, env_runner, metrics_logger, env_index)`
for each episode that finished in a `sample()`, given as a host episode. The host episode
end costs what the device one avoids: the call's episodes are built on the host (one
transfer of the whole batch per `sample()`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxrunner.core.callbacks import DeviceCallbacks, MetricSpec
from jaxrunner.metrics.custom import MetricsLogger, check_name, runner_window


@dataclasses.dataclass(frozen=True)
class HostCallback:
    """A callback that runs on the host (see `on_host`)."""

    fn: Callable

    def __call__(self, **kwargs: Any) -> Any:
        return self.fn(**kwargs)


def on_host(fn: Callable) -> HostCallback:
    """Marks `fn` as a host `on_episode_end(episode, env_runner, metrics_logger, env_index)`:
    `config.callbacks(on_episode_end=jaxrunner.on_host(fn))`. Each `sample()` then builds
    its finished episodes on the host (a transfer) to call it."""
    if not callable(fn):
        raise TypeError(f"on_host() takes a callable, got {fn!r}.")
    return fn if isinstance(fn, HostCallback) else HostCallback(fn)


def device_callbacks(config: Any) -> DeviceCallbacks | None:
    """The config's device callbacks (unbound: their metric names are read when the chunk
    is traced), or None when none is configured."""
    end = config.on_episode_end
    start, step = config.on_episode_start, config.on_episode_step
    if isinstance(end, HostCallback):
        end = None
    if end is None:
        if start is not None or step is not None:
            given = [n for n, f in (("on_episode_start", start), ("on_episode_step", step))
                     if f is not None]
            raise ValueError(
                f"config.callbacks({', '.join(given)}=...) without a device on_episode_end: "
                "device callbacks report their metrics from on_episode_end(state, step) -> "
                "{name: scalar}; add it (or drop the others).")
        if config.custom_metrics:
            raise ValueError(
                "config.callbacks(custom_metrics=...) names metrics of a device "
                "on_episode_end, but none is configured.")
        return None
    if step is not None and start is None:
        raise ValueError(
            "config.callbacks(on_episode_step=...) needs on_episode_start to create the "
            "per-episode state it updates (on_episode_start(start) -> state).")
    specs = dict(config.custom_metrics)
    windows = [runner_window(s, config.metrics_window, config.num_env_runners)
               for s in specs.values()]
    return DeviceCallbacks(on_episode_start=start, on_episode_step=step, on_episode_end=end,
                           custom_metrics=specs,
                           window=max([config.metrics_window] + windows))


def _coerce_custom_metrics(name: str, value: Any) -> dict[str, MetricSpec]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict {{metric name: reduce}} (or None), got "
                        f"{value!r}.")
    out = {}
    for key, spec in value.items():
        check_name(key, name)
        out[key] = MetricSpec.coerce(key, spec)
    return out


def env_index_of(episode: Any) -> int:
    """The sub-env an episode ran on: its `env_index`, else read from its id (a runner
    prefix, the sub-env index as 5 hex digits, the episode counter as 8)."""
    index = getattr(episode, "env_index", None)
    return int(index) if index is not None else int(episode.id_[-13:-8], 16)


class RunnerCallbacks:
    """The host half of a runner's callbacks: its `MetricsLogger` and the host calls."""

    def __init__(self, config: Any, reserved: tuple[str, ...] = ()):
        self.config = config
        self.logger = MetricsLogger(config.metrics_window, config.num_env_runners, reserved)

    def environment_created(self, runner: Any, env: Any, env_context: Any) -> None:
        fn = self.config.on_environment_created
        if fn is not None:
            fn(env_runner=runner, metrics_logger=self.logger, env=env,
               env_context=env_context)

    def sample_end(self, runner: Any, batch: Any) -> None:
        end = self.config.on_episode_end
        if isinstance(end, HostCallback):
            for episode in batch:
                if episode.is_done:
                    end(episode=episode, env_runner=runner, metrics_logger=self.logger,
                        env_index=env_index_of(episode))
        fn = self.config.on_sample_end
        if fn is not None:
            fn(env_runner=runner, metrics_logger=self.logger, samples=batch)


__all__ = ["HostCallback", "RunnerCallbacks", "device_callbacks", "env_index_of", "on_host"]
