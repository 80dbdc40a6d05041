"""`EnvRunner`: the abstract runner API (RLlib's `EnvRunner` surface)."""

from __future__ import annotations

import abc
import os
import tempfile
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

    # ------------------------------------------------------------------ checkpoints
    #: State components a checkpoint holds (subclasses with other components override).
    CHECKPOINT_COMPONENTS: tuple[str, ...] = (
        "rl_module", "env_to_module_connector", "module_to_env_connector", "env_runner_carry")

    def checkpoint_bytes(self) -> bytes:
        """The runner's whole state (`get_state` of `CHECKPOINT_COMPONENTS`: weights,
        connector states, counters, RNG key and device carry) in the checkpoint format of
        `jaxrunner.runners.checkpoint` (a versioned header, then msgpack)."""
        from jaxrunner.runners import checkpoint

        state = self.get_state(components=list(self.CHECKPOINT_COMPONENTS))
        return checkpoint.dump_state(state, checkpoint.writer_metadata(self))

    def restore_from_bytes(self, data: bytes, *, source: str = "checkpoint") -> None:
        """Restores `checkpoint_bytes()` output, possibly of another process.

        Raises `jaxrunner.runners.checkpoint.CheckpointError` for bytes that are foreign,
        truncated, corrupted or of a newer format, and `StateStructureError` for a state
        that does not fit this runner; the runner is unchanged in both cases.
        """
        from jaxrunner.runners import checkpoint

        template = self.get_state(components=list(self.CHECKPOINT_COMPONENTS))
        state, header = checkpoint.load_state(data, template, source=source)
        mine = checkpoint.writer_metadata(self)
        for key in ("env", "num_envs_per_env_runner"):
            if header.get(key) != mine[key]:
                from jaxrunner.errors import StateStructureError

                raise StateStructureError(
                    f"{source} was written by a runner with {key}={header.get(key)!r}; this "
                    f"runner has {key}={mine[key]!r}. Restore into a runner built from the "
                    "same config.")
        self.set_state(state)

    def save_to_path(self, path: str | os.PathLike | None = None, *,
                     state: dict[str, Any] | None = None) -> str:
        """Writes the runner's state into the directory `path` (RLlib's `Checkpointable`
        signature); returns the directory. With `path=None`, a new temporary directory.

        The file, `<path>/env_runner_state.ckpt`, is written atomically. Restoring it with
        `restore_from_path` into a runner built from the same config, in any process,
        makes the next `sample()` equal, bit for bit, to the one this runner would take.

        Args:
            state: a `get_state(components=CHECKPOINT_COMPONENTS)` dict to write instead
                of the runner's current state.
        """
        from jaxrunner.runners import checkpoint

        path = os.fspath(path) if path is not None else tempfile.mkdtemp(
            prefix="jaxrunner_ckpt_")
        if os.path.isfile(path):
            raise ValueError(f"save_to_path: {path!r} is a file; pass a directory path "
                             "(created if missing).")
        data = (self.checkpoint_bytes() if state is None
                else checkpoint.dump_state(state, checkpoint.writer_metadata(self)))
        checkpoint.write_file(os.path.join(path, checkpoint.FILE_NAME), data)
        return path

    def restore_from_path(self, path: str | os.PathLike) -> None:
        """Restores what `save_to_path` wrote (`path`: its directory, or the file itself)."""
        from jaxrunner.runners import checkpoint

        file = checkpoint.resolve_file(path)
        if not os.path.exists(file):
            raise FileNotFoundError(
                f"restore_from_path: no checkpoint at {os.fspath(path)!r} (looked for "
                f"{file!r}); pass the directory save_to_path() returned.")
        with open(file, "rb") as f:
            data = f.read()
        self.restore_from_bytes(data, source=f"checkpoint {file!r}")

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
