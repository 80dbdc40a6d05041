"""Distributed sampling on Ray: `EnvRunnerGroup` (remote runner actors, weight and state
sync, metrics over all runners) and runner fault tolerance.

This package is the only part of jaxrunner (besides the RLlib drop-in `jaxrunner.rllib`)
that imports Ray; `import jaxrunner` and a local runner work without Ray installed, and
`jaxrunner.EnvRunnerGroup` imports this package on first use.
"""

try:
    import ray as _ray  # noqa: F401 - only to fail early with the fix
except ImportError as _error:
    raise ImportError(
        "jaxrunner.distributed (EnvRunnerGroup, remote env runners) needs Ray, which is not "
        f"installed or cannot be imported ({type(_error).__name__}: {_error}). Install it "
        "with `pip install \"ray>=2.40\"`, or sample without Ray on a local runner: "
        "jaxrunner.SingleAgentEnvRunner / jaxrunner.MultiAgentEnvRunner."
    ) from _error

from jaxrunner.distributed.actor_manager import EnvRunnerFailedError as EnvRunnerFailedError
from jaxrunner.distributed.env_runner_group import EnvRunnerGroup as EnvRunnerGroup
from jaxrunner.distributed.env_runner_group import init_ray as init_ray
from jaxrunner.distributed.remote_runner import RemoteEnvRunner as RemoteEnvRunner
from jaxrunner.distributed.remote_runner import RunnerNotRestoredError as RunnerNotRestoredError
from jaxrunner.distributed.sample_args import check_sample_args as check_sample_args

__all__ = ["EnvRunnerFailedError", "EnvRunnerGroup", "RemoteEnvRunner",
           "RunnerNotRestoredError", "check_sample_args", "init_ray"]
