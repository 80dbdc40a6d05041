"""Which runner class a config gets (RLlib's `EnvRunnerGroup` rule, reference spec §1)."""

from __future__ import annotations

from jaxrunner.config import RunnerConfig


def runner_class_for(config: RunnerConfig) -> type:
    """`config.env_runner_cls` if set; else `MultiAgentEnvRunner` when
    `config.is_multi_agent`, else `SingleAgentEnvRunner`."""
    if not isinstance(config, RunnerConfig):
        raise TypeError(f"config must be a jaxrunner.RunnerConfig, got {type(config).__name__}.")
    if config.env_runner_cls is not None:
        return config.env_runner_cls
    if config.is_multi_agent:
        from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner

        return MultiAgentEnvRunner
    from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner

    return SingleAgentEnvRunner


__all__ = ["runner_class_for"]
