"""Runners: thin stateful shells that own a device carry and jitted rollout functions."""

from jaxrunner.runners.env_runner import EnvRunner as EnvRunner
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner as SingleAgentEnvRunner

__all__ = ["EnvRunner", "SingleAgentEnvRunner"]
