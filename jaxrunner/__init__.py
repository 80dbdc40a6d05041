"""jaxrunner: RLlib's EnvRunner API with the env-step loop compiled by JAX.

Quickstart::

    import jaxrunner

    config = (jaxrunner.RunnerConfig()
              .environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=256)
              .debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    batch = runner.sample(num_timesteps=10_000)
    print(runner.get_metrics()["episode_return_mean"])

`jaxrunner.EnvRunnerGroup` (Ray) is imported on first use, so `import jaxrunner` and a
local runner need no Ray installed.
"""

# First, so that every later `import gymnax` finds it imported without its plotting
# libraries (see jaxrunner._gymnax_import).
from jaxrunner._gymnax_import import import_gymnax as _import_gymnax

_import_gymnax()

from jaxrunner.callbacks import on_host as on_host
from jaxrunner.compilation_cache import enable_compilation_cache as enable_compilation_cache
from jaxrunner.config import RunnerConfig as RunnerConfig
from jaxrunner.core.callbacks import CallbackError as CallbackError
from jaxrunner.core.callbacks import EpisodeStart as EpisodeStart
from jaxrunner.core.callbacks import MetricSpec as MetricSpec
from jaxrunner.core.callbacks import StepView as StepView
from jaxrunner.core.faults import mark_step_failed as mark_step_failed
from jaxrunner.envs.context import EnvContext as EnvContext
from jaxrunner.envs.registry import register_env as register_env
from jaxrunner.episodes.batch import EpisodeBatch as EpisodeBatch
from jaxrunner.episodes.multi_agent_episode import MultiAgentEpisode as MultiAgentEpisode
from jaxrunner.episodes.multi_agent_episode import (
    MultiAgentEpisodeBatch as MultiAgentEpisodeBatch)
from jaxrunner.episodes.single_agent_episode import SingleAgentEpisode as SingleAgentEpisode
from jaxrunner.errors import SampleArgumentError as SampleArgumentError
from jaxrunner.errors import StateStructureError as StateStructureError
from jaxrunner.errors import StepFailedRecreateEnvError as StepFailedRecreateEnvError
from jaxrunner.fork_warning import ignore_subprocess_fork_warning as _ignore_fork_warning
from jaxrunner.lowering import unrolled_threefry as unrolled_threefry
from jaxrunner.metrics.custom import MetricsLogger as MetricsLogger
from jaxrunner.modules.multi_rl_module import MultiRLModule as MultiRLModule
from jaxrunner.modules.recurrent import GRUModule as GRUModule
from jaxrunner.modules.rl_module import DefaultMLPModule as DefaultMLPModule
from jaxrunner.modules.rl_module import LinenRLModule as LinenRLModule
from jaxrunner.modules.rl_module import NNXRLModule as NNXRLModule
from jaxrunner.modules.rl_module import RLModule as RLModule
from jaxrunner.modules.rl_module import RLModuleSpec as RLModuleSpec
from jaxrunner.runners.env_runner import EnvRunner as EnvRunner
from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner as MultiAgentEnvRunner
from jaxrunner.runners.selection import runner_class_for as runner_class_for
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner as SingleAgentEnvRunner
from jaxrunner.sampler import SampleMetrics as SampleMetrics
from jaxrunner.sampler import Sampler as Sampler
from jaxrunner.sampler import SamplerState as SamplerState
from jaxrunner.sampler import make_sampler as make_sampler
from jaxrunner.structure import check_finite_tree as check_finite_tree
from jaxrunner.structure import check_same_structure as check_same_structure
from jaxrunner.structure import structure_diff as structure_diff

__version__ = "0.1.0"

# Ray's ray.init() forks (and exec()s) through subprocess after gymnax, imported above, has
# started a JAX backend: see jaxrunner.fork_warning.
_ignore_fork_warning()

_LAZY = {"EnvRunnerGroup": "jaxrunner.distributed.env_runner_group"}


def __getattr__(name: str):
    """`EnvRunnerGroup` on first access (it imports Ray; see `jaxrunner.distributed`)."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'jaxrunner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CallbackError",
    "DefaultMLPModule",
    "EnvContext",
    "EnvRunner",
    "EnvRunnerGroup",
    "EpisodeBatch",
    "EpisodeStart",
    "GRUModule",
    "LinenRLModule",
    "MetricSpec",
    "MetricsLogger",
    "MultiAgentEnvRunner",
    "MultiAgentEpisode",
    "MultiAgentEpisodeBatch",
    "MultiRLModule",
    "NNXRLModule",
    "RLModule",
    "RLModuleSpec",
    "RunnerConfig",
    "SampleArgumentError",
    "SampleMetrics",
    "Sampler",
    "SamplerState",
    "SingleAgentEnvRunner",
    "SingleAgentEpisode",
    "StateStructureError",
    "StepFailedRecreateEnvError",
    "StepView",
    "check_finite_tree",
    "check_same_structure",
    "enable_compilation_cache",
    "make_sampler",
    "mark_step_failed",
    "on_host",
    "register_env",
    "runner_class_for",
    "structure_diff",
    "unrolled_threefry",
]
