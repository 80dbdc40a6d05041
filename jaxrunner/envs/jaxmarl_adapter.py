"""`JaxMARLEnv`: runs a JaxMARL env (github.com/FLAIROx/JaxMARL) under jaxrunner's
multi-agent protocol.

JaxMARL envs take no params pytree, return one `dones` dict (with `"__all__"`) instead of
`terminateds`/`truncateds`, and every agent acts at every step. The adapter maps
`dones` to `terminateds` or to `truncateds` (`done_means`: MPE envs end on a step limit,
so their dones are truncations; the default for other envs is termination), makes
agents that are done stop acting, and converts JaxMARL spaces to gymnax ones. It calls the
env's `step_env` and lets jaxrunner's base class auto-reset, so the final observation of
each episode is kept.

Needs `pip install jaxmarl` (tested with jaxmarl 0.2.0 on MPE_simple_spread_v3).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces as gx

from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv


@struct.dataclass
class JaxMARLState:
    inner: Any  # the JaxMARL env state
    done: jax.Array  # (N,) bool: agents that are done


def _to_gymnax_space(space: Any) -> Any:
    if hasattr(space, "n"):
        return gx.Discrete(int(space.n))
    if hasattr(space, "low") and hasattr(space, "high"):
        return gx.Box(space.low, space.high, tuple(space.shape), space.dtype)
    raise TypeError(f"Unsupported JaxMARL space {space!r}: only Discrete and Box are "
                    "converted.")


class JaxMARLEnv(MultiAgentEnv):
    """Wraps a JaxMARL `MultiAgentEnv` instance.

    Args:
        env: the JaxMARL env object (`jaxmarl.make(id, **kwargs)`).
        done_means: "terminated" or "truncated": how JaxMARL `dones` are reported;
            None picks "truncated" for MPE envs (step-limit ends), else "terminated".
    """

    def __init__(self, env: Any, done_means: str | None = None):
        self.inner = env
        self.agents = tuple(env.agents)
        if done_means is None:
            done_means = ("truncated" if type(env).__module__.startswith(
                "jaxmarl.environments.mpe") else "terminated")
        if done_means not in ("terminated", "truncated"):
            raise ValueError(f"done_means must be 'terminated' or 'truncated', got "
                             f"{done_means!r}.")
        self.done_means = done_means

    @classmethod
    def from_id(cls, env_id: str, done_means: str | None = None, **kwargs: Any
                ) -> "JaxMARLEnv":
        """`JaxMARLEnv(jaxmarl.make(env_id, **kwargs))`."""
        try:
            import jaxmarl
        except ImportError as error:
            raise ImportError(
                f"'jaxmarl/{env_id}' needs the jaxmarl package: pip install jaxmarl."
            ) from error
        return cls(jaxmarl.make(env_id, **kwargs), done_means=done_means)

    @property
    def name(self) -> str:
        return f"jaxmarl/{type(self.inner).__name__}"

    def observation_space(self, agent_id: str, params: Any = None):
        return _to_gymnax_space(self.inner.observation_space(agent_id))

    def action_space(self, agent_id: str, params: Any = None):
        return _to_gymnax_space(self.inner.action_space(agent_id))

    def reset_env(self, key, params):
        del params
        obs, inner = self.inner.reset(key)
        return dict(obs), JaxMARLState(inner=inner,
                                       done=jnp.zeros((len(self.agents),), jnp.bool_))

    def step_env(self, key, state, actions, params):
        del params
        obs, inner, rewards, dones, _ = self.inner.step_env(key, state.inner, dict(actions))
        agent_done = jnp.stack([jnp.asarray(dones[a], jnp.bool_) for a in self.agents])
        newly = agent_done & ~state.done
        all_done = jnp.asarray(dones[ALL], jnp.bool_) | jnp.all(agent_done | state.done)
        flags = {agent: newly[i] for i, agent in enumerate(self.agents)}
        flags[ALL] = all_done
        no = {agent: jnp.zeros((), jnp.bool_) for agent in (*self.agents, ALL)}
        terminateds, truncateds = (flags, no) if self.done_means == "terminated" else (no,
                                                                                       flags)
        rewards = {a: jnp.asarray(rewards[a], jnp.float32) for a in self.agents}
        new_state = JaxMARLState(inner=inner, done=state.done | agent_done)
        return dict(obs), new_state, rewards, terminateds, truncateds, {}

    def agents_to_act(self, state, params):
        return {agent: ~state.done[i] for i, agent in enumerate(self.agents)}
