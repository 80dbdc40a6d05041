"""Distributed sampling on Ray: `EnvRunnerGroup` (remote runner actors, weight and state
sync, metrics over all runners) and runner fault tolerance. Ray is used here only."""

from jaxrunner.distributed.actor_manager import EnvRunnerFailedError as EnvRunnerFailedError
from jaxrunner.distributed.env_runner_group import EnvRunnerGroup as EnvRunnerGroup
from jaxrunner.distributed.remote_runner import RemoteEnvRunner as RemoteEnvRunner
from jaxrunner.distributed.remote_runner import RunnerNotRestoredError as RunnerNotRestoredError

__all__ = ["EnvRunnerFailedError", "EnvRunnerGroup", "RemoteEnvRunner",
           "RunnerNotRestoredError"]
