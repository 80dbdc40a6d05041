"""`EnvRunner`: the abstract runner API (RLlib's `EnvRunner` surface)."""

from __future__ import annotations

import abc
from typing import Any, Callable

from jaxrunner.config import RunnerConfig


class EnvRunner(abc.ABC):
    """Samples episodes from an env with a policy module.

    Args:
        config: the `RunnerConfig`; the runner keeps its own unfrozen copy.
        worker_index: 0 for the local runner of a group, 1..N for remote runners, None for
            a standalone runner.
        num_workers: number of remote runners in the group (default:
            `config.num_env_runners`).
    """

    def __init__(self, *, config: RunnerConfig, worker_index: int | None = None,
                 num_workers: int | None = None, **kwargs: Any):
        if not isinstance(config, RunnerConfig):
            raise TypeError(
                f"config must be a jaxrunner.RunnerConfig, got {type(config).__name__}. "
                "For an RLlib AlgorithmConfig use RunnerConfig.from_rllib(algo_config)."
            )
        self.config = config.copy(copy_frozen=False)
        self.worker_index = worker_index
        self.num_workers = config.num_env_runners if num_workers is None else num_workers
        self.num_env_steps_sampled_lifetime = 0

    @abc.abstractmethod
    def assert_healthy(self) -> None:
        """Raises AssertionError if the runner cannot sample."""

    @abc.abstractmethod
    def sample(self, **kwargs: Any) -> Any:
        """Returns sampled episodes."""

    @abc.abstractmethod
    def get_spaces(self) -> dict[str, tuple]:
        """Returns `{key: (observation_space, action_space)}`."""

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, Any]:
        """Returns the metrics accumulated since the last call."""

    @abc.abstractmethod
    def get_state(self, components: Any = None, *, not_components: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
        """Returns the runner's state (host numpy only)."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Restores state returned by `get_state`."""

    def make_env(self) -> None:
        """(Re)creates the env from `self.config`."""

    def make_module(self) -> None:
        """(Re)creates the module from `self.config`."""

    def stop(self) -> None:
        """Releases resources; safe to call more than once."""

    def sample_get_state_and_metrics(self) -> tuple[Any, dict, dict]:
        """`(sample(), get_state(not_components="rl_module"), get_metrics())`."""
        batch = self.sample()
        state = self.get_state(not_components="rl_module")
        return batch, state, self.get_metrics()

    def ping(self) -> str:
        """Health probe used by actor managers."""
        return "pong"

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Calls `func(self, *args, **kwargs)` (RLlib's `FaultAwareApply.apply`)."""
        return func(self, *args, **kwargs)

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
