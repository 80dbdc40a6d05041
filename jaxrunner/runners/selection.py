"""Which runner class a config gets: RLlib's `EnvRunnerGroup` rule (reference spec §1),
plus the env's own kind.

`runner_class_for(config)`:

1. `config.env_runner_cls`, if set;
2. `MultiAgentEnvRunner` when `config.is_multi_agent` (`config.multi_agent(...)` with
   several policies, or one not named "default_policy");
3. `MultiAgentEnvRunner` when the env is a multi-agent env (`env_kind(config)`), so
   `environment("MultiAgentCartPole-v1")` or `"TicTacToe-v0"` works without
   `multi_agent()` (every agent then maps to "default_policy"); this includes host
   multi-agent envs (an RLlib `MultiAgentEnv` or PettingZoo env, as an instance, a
   class, a creator or a registered name);
4. `SingleAgentEnvRunner` otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

from jaxrunner.config import RunnerConfig
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.kind import MULTI_AGENT, SINGLE_AGENT, check_env_kind, env_kind_of

logger = logging.getLogger(__name__)


def _close_host_env(env: Any) -> None:
    from jaxrunner.envs.gymnasium_env import is_host_env
    from jaxrunner.envs.host_multi_agent import is_host_multi_agent_env

    if is_host_env(env) or is_host_multi_agent_env(env):
        try:
            env.close()
        except Exception as error:  # noqa: BLE001 - only probed; the runner builds its own
            logger.debug("Closing the probed env raised %s: %s", type(error).__name__, error)


def env_kind(config: RunnerConfig) -> str:
    """`"multi_agent"` or `"single_agent"`: the kind of runner `config.env` needs.

    Decided without building the env for names (`"jaxmarl/<id>"`, the built-in
    multi-agent names, `"gymnasium:<id>"`, gymnax ids) and instances. For any other
    `register_env` name or a callable creator, the creator is called once with
    `EnvContext(config.env_config)` and its result inspected (a gymnasium env it returns
    is closed again); a creator that raises counts as single-agent, and the runner then
    reports the error.
    """
    if not isinstance(config, RunnerConfig):
        raise TypeError(f"config must be a jaxrunner.RunnerConfig, got {type(config).__name__}.")
    from jaxrunner.envs import multi_agent, registry

    spec = config.env
    if spec is None:
        return SINGLE_AGENT
    if isinstance(spec, str):
        if spec.startswith(multi_agent.JAXMARL_PREFIX):
            return MULTI_AGENT
        if spec in multi_agent.BUILTIN_MULTI_AGENT_ENVS and (
                registry.registered_env_creator(spec) is multi_agent.BUILTIN_MULTI_AGENT_ENVS[spec]):
            return MULTI_AGENT
        from jaxrunner.envs.host_multi_agent import creator_for_name

        creator = creator_for_name(spec)  # jaxrunner's registry, then Ray Tune's
        if creator is None:
            return SINGLE_AGENT  # a gymnax id, "gymnasium:<id>" or an unknown name
    elif hasattr(spec, "step") and hasattr(spec, "reset") and not isinstance(spec, type):
        return env_kind_of(spec)
    elif isinstance(spec, type) and env_kind_of(spec) == MULTI_AGENT:
        return MULTI_AGENT  # an RLlib MultiAgentEnv or PettingZoo class: not probed
    elif callable(spec):
        creator = spec
    else:
        return SINGLE_AGENT
    context = (config.env_config if isinstance(config.env_config, EnvContext)
               else EnvContext(config.env_config))
    try:
        result = creator(context)
    except Exception as error:  # noqa: BLE001 - the runner reports (or retries) it
        logger.debug("Probing the env kind: the creator raised %s: %s",
                     type(error).__name__, error)
        return SINGLE_AGENT
    kind = env_kind_of(result)
    if kind == SINGLE_AGENT or not isinstance(result, tuple):
        _close_host_env(result[0] if isinstance(result, tuple) and result else result)
    return kind


def runner_class_for(config: RunnerConfig) -> type:
    """The runner class for `config` (see the module docstring for the order)."""
    if not isinstance(config, RunnerConfig):
        raise TypeError(f"config must be a jaxrunner.RunnerConfig, got {type(config).__name__}.")
    if config.env_runner_cls is not None:
        return config.env_runner_cls
    if config.is_multi_agent or env_kind(config) == MULTI_AGENT:
        from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner

        return MultiAgentEnvRunner
    from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner

    return SingleAgentEnvRunner


__all__ = ["check_env_kind", "env_kind", "runner_class_for"]
