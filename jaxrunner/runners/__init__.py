"""Runners: thin stateful shells that own a device carry and jitted rollout functions."""

from jaxrunner.runners.env_runner import EnvRunner as EnvRunner
from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner as MultiAgentEnvRunner
from jaxrunner.runners.selection import runner_class_for as runner_class_for
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner as SingleAgentEnvRunner

__all__ = ["EnvRunner", "MultiAgentEnvRunner", "SingleAgentEnvRunner", "runner_class_for"]
