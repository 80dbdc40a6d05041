"""Which kind of runner an env needs: single-agent (gymnax / gymnasium) or multi-agent
(`jaxrunner.envs.multi_agent.MultiAgentEnv`), and the error for the wrong one.

`env_kind_of(env)` looks at a built env (JAX, or a host RLlib / PettingZoo multi-agent
env); `jaxrunner.runners.selection.env_kind(config)`
resolves `config.env` first. Runners call `check_env_kind(env, runner_kind, name)` right
after building their env, so a multi-agent env given to `SingleAgentEnvRunner` fails with
what to use instead, before anything is traced.
"""

from __future__ import annotations

from typing import Any

SINGLE_AGENT = "single_agent"
MULTI_AGENT = "multi_agent"
RUNNER_FOR_KIND = {SINGLE_AGENT: "SingleAgentEnvRunner", MULTI_AGENT: "MultiAgentEnvRunner"}


def env_kind_of(env: Any) -> str:
    """`MULTI_AGENT` for a `MultiAgentEnv` instance (or an `(env, params)` tuple holding
    one) and for host multi-agent envs (an RLlib `MultiAgentEnv` or a PettingZoo env,
    instance or class; see `jaxrunner.envs.host_multi_agent`), else `SINGLE_AGENT`."""
    from jaxrunner.envs.host_multi_agent import is_host_multi_agent_env
    from jaxrunner.envs.multi_agent import MultiAgentEnv

    if isinstance(env, tuple) and len(env) == 2:
        env = env[0]
    if is_host_multi_agent_env(env):
        return MULTI_AGENT
    return MULTI_AGENT if isinstance(env, MultiAgentEnv) else SINGLE_AGENT


def check_env_kind(env: Any, runner_kind: str, name: str | None = None) -> None:
    """Raises `TypeError` when `env` needs the other runner kind.

    Args:
        env: the built env (gymnax `Environment`, `MultiAgentEnv`, ...).
        runner_kind: `SINGLE_AGENT` or `MULTI_AGENT`, the kind of the calling runner.
        name: the env's name for the message (default: its class name).
    """
    if runner_kind not in RUNNER_FOR_KIND:
        raise ValueError(f"runner_kind must be one of {sorted(RUNNER_FOR_KIND)}, got "
                         f"{runner_kind!r}.")
    kind = env_kind_of(env)
    if kind == runner_kind:
        return
    label = name if name is not None else type(env).__name__
    runner, needed = RUNNER_FOR_KIND[runner_kind], RUNNER_FOR_KIND[kind]
    if kind == MULTI_AGENT:
        raise TypeError(
            f"The env {label!r} ({type(env).__name__}) is a multi-agent env (dicts keyed by "
            f"agent id), which {runner} cannot step. Use jaxrunner.{needed}(config=config), "
            "or jaxrunner.runner_class_for(config)(config=config), which picks the runner "
            "class from the env; configure its modules with config.multi_agent(policies=..., "
            "policy_mapping_fn=...)."
        )
    raise TypeError(
        f"The env {label!r} ({type(env).__name__}) is a single-agent env, which {runner} "
        f"cannot step. Use jaxrunner.{needed}(config=config), or "
        "jaxrunner.runner_class_for(config)(config=config), which picks the runner class "
        "from the env; 'jaxmarl/<id>' gives a JaxMARL env, or wrap the env in a "
        "jaxrunner.envs.multi_agent.MultiAgentEnv subclass."
    )


__all__ = ["MULTI_AGENT", "RUNNER_FOR_KIND", "SINGLE_AGENT", "check_env_kind",
           "env_kind_of"]
