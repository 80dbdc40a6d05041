"""Host multi-agent envs: RLlib `MultiAgentEnv` subclasses and PettingZoo envs, stepped in
Python by `MultiAgentEnvRunner` (`jaxrunner.runners.host_multi_agent_env`).

What `config.env` may be for a host multi-agent env:

* an instance of `ray.rllib.env.multi_agent_env.MultiAgentEnv`, of a PettingZoo
  `ParallelEnv`, or of a PettingZoo `AECEnv` (converted with PettingZoo's own
  `aec_to_parallel`, which refuses AEC envs whose turns do not map to parallel steps);
  the runner deep-copies it for each of its `num_envs_per_env_runner` sub-envs and for
  every recreation after a failure;
* such a class: an RLlib env class is built as `cls(env_context)` (RLlib's
  `EnvContext`), a PettingZoo class as `cls(**env_context)`;
* a creator `ctx -> env`, or a name given to `jaxrunner.register_env` (or Ray Tune's
  `register_env`) with one: called
  once per sub-env (and again for each recreation) with the `EnvContext` of the runner,
  whose `vector_index` is the sub-env's index.

`HostMultiAgentEnv` puts both APIs behind RLlib's: `reset(seed) -> obs dict` for the agents
with an observation, `step(actions) -> (obs, rewards, terminateds, truncateds)` with the
`"__all__"` flags. The agents are the env's `possible_agents` (fixed; agents join and
leave by having an observation or not). RLlib envs without `possible_agents` give them
through `get_agent_ids()` or the keys of `observation_spaces`.

PettingZoo parallel envs have no `"__all__"`: the episode ends when `env.agents` is empty
(every agent terminated or truncated); it is terminated if no agent ended by truncation at
that last step, truncated otherwise. An RLlib env step without `"__all__"` in a dict ends
the episode for that flag once every agent is done.

No Ray or PettingZoo import happens here unless such an env is given (their classes are
looked up in `sys.modules`: an instance of them means the user imported them).
"""

from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym

from jaxrunner.envs.context import EnvContext

ALL = "__all__"
RLLIB = "rllib"
PETTINGZOO_PARALLEL = "pettingzoo_parallel"
PETTINGZOO_AEC = "pettingzoo_aec"


def _class(module: str, name: str) -> type | None:
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def host_multi_agent_api(obj: Any) -> str | None:
    """`"rllib"`, `"pettingzoo_parallel"`, `"pettingzoo_aec"` for such an env instance or
    class, else None."""
    cls = obj if isinstance(obj, type) else type(obj)
    for api, module, name in ((RLLIB, "ray.rllib.env.multi_agent_env", "MultiAgentEnv"),
                              (PETTINGZOO_PARALLEL, "pettingzoo.utils.env", "ParallelEnv"),
                              (PETTINGZOO_AEC, "pettingzoo.utils.env", "AECEnv")):
        base = _class(module, name)
        if base is not None and issubclass(cls, base):
            return api
    # PettingZoo wrappers (e.g. OrderEnforcingWrapper) subclass the base classes, but
    # check the duck type of a parallel env too (a ParallelEnv-like class of its own).
    return None


def is_host_multi_agent_env(obj: Any) -> bool:
    """Whether `obj` is an RLlib `MultiAgentEnv` or PettingZoo env (instance or class)."""
    return host_multi_agent_api(obj) is not None


class HostMultiAgentEnv:
    """One Python multi-agent env behind RLlib's dict API (see the module docstring).

    Attributes:
        env: the user's env (a PettingZoo AEC env converted to parallel).
        api: `"rllib"` or `"pettingzoo_parallel"` (an AEC env reports the latter).
        possible_agents: tuple of str agent ids, fixed.
    """

    def __init__(self, env: Any, name: str):
        api = host_multi_agent_api(env)
        if api is None:
            raise TypeError(f"{name!r} ({type(env).__name__}) is neither an RLlib "
                            "MultiAgentEnv nor a PettingZoo env.")
        if api == PETTINGZOO_AEC:
            from pettingzoo.utils.conversions import aec_to_parallel

            try:
                env = aec_to_parallel(env)
            except Exception as error:  # noqa: BLE001 - re-raised with context
                raise TypeError(
                    f"The PettingZoo AEC env {name!r} cannot be stepped as a parallel env "
                    f"(pettingzoo.utils.conversions.aec_to_parallel: "
                    f"{type(error).__name__}: {error}). Give a PettingZoo ParallelEnv, or "
                    "wrap the game in an RLlib MultiAgentEnv whose observations name the "
                    "player to move.") from error
            api = PETTINGZOO_PARALLEL
        self.env, self.api, self.name = env, api, name
        self.possible_agents = self._possible_agents()

    def _possible_agents(self) -> tuple:
        env = self.env
        agents = getattr(env, "possible_agents", None)
        if not agents and self.api == RLLIB:
            spaces = getattr(env, "observation_spaces", None)
            if isinstance(spaces, dict) and spaces:
                agents = list(spaces)
            elif callable(getattr(env, "get_agent_ids", None)):
                agents = sorted(env.get_agent_ids())
        agents = tuple(agents or ())
        if not agents or len(set(agents)) != len(agents) or ALL in agents:
            raise ValueError(
                f"The multi-agent env {self.name!r} must list its agents in "
                f"`possible_agents` (distinct ids, not {ALL!r}), got {agents!r}. Set "
                "self.possible_agents (and self.agents) in the env's __init__."
            )
        return agents

    def observation_space(self, agent: Any) -> gym.spaces.Space:
        return self._space(agent, "observation")

    def action_space(self, agent: Any) -> gym.spaces.Space:
        return self._space(agent, "action")

    def _space(self, agent: Any, what: str) -> gym.spaces.Space:
        env = self.env
        space = None
        if self.api == PETTINGZOO_PARALLEL:
            space = getattr(env, f"{what}_space")(agent)
        else:
            getter = getattr(env, f"get_{what}_space", None)
            spaces = getattr(env, f"{what}_spaces", None)
            if isinstance(spaces, dict) and agent in spaces:
                space = spaces[agent]
            elif callable(getter):
                space = getter(agent)
            else:
                whole = getattr(env, f"{what}_space", None)
                if isinstance(whole, gym.spaces.Dict) and agent in whole.spaces:
                    space = whole[agent]
        if not isinstance(space, gym.spaces.Space):
            raise ValueError(
                f"The multi-agent env {self.name!r} has no {what} space for agent "
                f"{agent!r} (got {space!r}). Give one per agent: self.{what}_spaces = "
                f"{{agent_id: gymnasium.spaces...}} (RLlib) or {what}_space(agent) "
                "(PettingZoo).")
        return space

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None) -> dict:
        """Starts an episode; returns the observations of the agents that act first."""
        out = self.env.reset(seed=seed)
        obs = out[0] if isinstance(out, tuple) and len(out) == 2 else out
        if not isinstance(obs, dict):
            raise TypeError(f"{self.name!r}: reset() must return (obs dict, infos dict), got "
                            f"{type(out).__name__}.")
        return obs

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict]:
        """One env step: `(obs, rewards, terminateds, truncateds)`, the last two with
        `"__all__"`."""
        out = self.env.step(actions)
        if not isinstance(out, tuple) or len(out) != 5:
            raise TypeError(
                f"{self.name!r}: step() must return (obs, rewards, terminateds, truncateds, "
                f"infos) dicts, got {type(out).__name__}"
                + (f" of {len(out)}" if isinstance(out, tuple) else "") + ".")
        obs, rewards, terminateds, truncateds, _ = out
        terminateds, truncateds = dict(terminateds or {}), dict(truncateds or {})
        if self.api == PETTINGZOO_PARALLEL:
            over = not getattr(self.env, "agents", ())
            cut = any(bool(truncateds.get(a, False)) for a in self.possible_agents)
            terminateds[ALL] = over and not cut
            truncateds[ALL] = over and cut
        else:
            for flags in (terminateds, truncateds):
                if ALL not in flags:
                    flags[ALL] = False
        return dict(obs or {}), dict(rewards or {}), terminateds, truncateds

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


@dataclass
class HostMultiAgentSource:
    """How to build the sub-envs of a host multi-agent runner.

    `build(index)` returns a fresh `HostMultiAgentEnv` for sub-env `index` (the first call
    for index 0 reuses the env built while resolving `config.env`)."""

    name: str
    build: Callable[[int], HostMultiAgentEnv]


def _call_creator(creator: Callable, context: EnvContext, index: int) -> Any:
    return creator(context.copy_with_overrides(vector_index=index)
                   if hasattr(context, "copy_with_overrides") else context)


def _class_creator(cls: type) -> Callable[[EnvContext], Any]:
    if host_multi_agent_api(cls) == RLLIB:
        params = [p for p in inspect.signature(cls).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return (lambda ctx: cls(ctx)) if params else (lambda ctx: cls())
    return lambda ctx: cls(**dict(ctx))


def creator_for_name(name: str) -> Callable | None:
    """The creator registered as `name` with `jaxrunner.register_env` or Ray Tune's
    `register_env` (called as RLlib calls it), or None."""
    from jaxrunner.envs import registry

    found = registry.find_env_creator(name)
    if found is None:
        return None
    creator, origin = found
    if origin == "tune":
        return lambda ctx: registry.call_tune_creator(creator, ctx)
    return creator


def host_multi_agent_source(env_spec: Any, context: EnvContext,
                            creator_for_name: Callable[[str], Callable | None] = creator_for_name
                            ) -> HostMultiAgentSource | None:
    """A `HostMultiAgentSource` when `config.env` is (or creates) a host multi-agent env,
    else None (a creator that raises is left for the JAX env path to report).

    Args:
        env_spec: `config.env`.
        context: the runner's `EnvContext`.
        creator_for_name: look-up of a registered name (None if unknown); default: the
            `jaxrunner.register_env` registry, then Ray Tune's.
    """
    if isinstance(env_spec, type):
        if not is_host_multi_agent_env(env_spec):
            return None
        creator, name = _class_creator(env_spec), env_spec.__name__
    elif is_host_multi_agent_env(env_spec):
        name = type(env_spec).__name__
        pristine = copy.deepcopy(env_spec)
        made = {"first": env_spec}

        def build_copy(index: int) -> HostMultiAgentEnv:
            env = made.pop("first", None) if index == 0 else None
            return HostMultiAgentEnv(env if env is not None else copy.deepcopy(pristine),
                                     name)

        return HostMultiAgentSource(name=name, build=build_copy)
    elif isinstance(env_spec, str):
        creator = creator_for_name(env_spec)
        if creator is None:
            return None
        name = env_spec
    elif callable(env_spec) and not (hasattr(env_spec, "step") and hasattr(env_spec, "reset")):
        creator, name = env_spec, getattr(env_spec, "__name__", type(env_spec).__name__)
    else:
        return None
    try:
        first = _call_creator(creator, context, 0)
    except Exception:  # noqa: BLE001 - the JAX env path calls it again and reports it
        return None
    if not is_host_multi_agent_env(first):
        return None
    made = {"first": first}

    def build(index: int) -> HostMultiAgentEnv:
        env = made.pop("first", None) if index == 0 else None
        return HostMultiAgentEnv(env if env is not None
                                 else _call_creator(creator, context, index), name)

    return HostMultiAgentSource(name=name, build=build)


__all__ = ["HostMultiAgentEnv", "HostMultiAgentSource", "host_multi_agent_api",
           "host_multi_agent_source", "is_host_multi_agent_env"]
