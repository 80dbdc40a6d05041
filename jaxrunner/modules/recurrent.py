"""A recurrent policy as a `LinenRLModule`: the complete example of a module that carries
state through the rollout.

    config.rl_module(rl_module_spec=jaxrunner.RLModuleSpec(
        GRUModule, model_config={"gru_size": 64, "fcnet_hiddens": [64]}))

The runner feeds `batch["state_in"]` (`{"h": (B, gru_size) float32}`), resets it to
`get_initial_state()` where an episode starts, and carries `"state_out"` to the next step
and across `sample()` calls; every step's `state_out` is recorded in the episode's
`extra_model_outputs["state_out"]`. `PPOLearner` refuses recurrent modules (it trains
feed-forward policies).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from jaxrunner.modules.rl_module import LinenRLModule


class GRUNetwork(nn.Module):
    """Dense encoder -> GRU cell -> policy head (and a value head unless
    `inference_only`).

    `__call__(obs (B, obs_dim) float32, state_in {"h": (B, gru_size)})` returns
    `({"action_dist_inputs": (B, D)[, "vf_preds": (B,)]}, {"h": (B, gru_size)})`.
    """

    hiddens: Sequence[int]
    gru_size: int
    out_dim: int
    value_head: bool

    @nn.compact
    def __call__(self, obs: jax.Array, state_in: dict[str, jax.Array]):
        x = obs
        for width in self.hiddens:
            x = jnp.tanh(nn.Dense(width)(x))
        h, _ = nn.GRUCell(features=self.gru_size)(state_in["h"], x)
        out = {"action_dist_inputs": nn.Dense(
            self.out_dim, kernel_init=nn.initializers.orthogonal(0.01))(h)}
        if self.value_head:
            out["vf_preds"] = nn.Dense(1)(h)[:, 0]
        return out, {"h": h}


class GRUModule(LinenRLModule):
    """A GRU policy over Box or Discrete observations.

    `model_config`: `gru_size` (default 64) and `fcnet_hiddens` (encoder widths before
    the GRU, default [64]). State: `{"h": (gru_size,) float32}`, zeros at episode start.
    """

    def __init__(self, observation_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 model_config: dict | None = None, inference_only: bool = False):
        if not isinstance(observation_space, (gym.spaces.Box, gym.spaces.Discrete)):
            raise ValueError(
                f"GRUModule takes Box or Discrete observations, got {observation_space}; "
                "keep the default connectors (they flatten Dict and Tuple observations)."
            )
        super().__init__(observation_space, action_space, model_config, inference_only)

    @property
    def gru_size(self) -> int:
        return int(self.model_config.get("gru_size", 64))

    def get_initial_state(self) -> Any:
        return {"h": jnp.zeros((self.gru_size,), jnp.float32)}

    def make_network(self) -> nn.Module:
        return GRUNetwork(hiddens=tuple(self.model_config.get("fcnet_hiddens", (64,))),
                          gru_size=self.gru_size, out_dim=self.action_dist_input_dim,
                          value_head=not self.inference_only)

    def _flat_obs(self, obs: jax.Array) -> jax.Array:
        space = self.observation_space
        if isinstance(space, gym.spaces.Discrete):
            return jax.nn.one_hot(obs.astype(jnp.int32), int(space.n), dtype=jnp.float32)
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)

    def _dummy_obs(self) -> jax.Array:
        space = self.observation_space
        size = int(space.n) if isinstance(space, gym.spaces.Discrete) else math.prod(
            space.shape)
        return jnp.zeros((1, size), jnp.float32)

    def _forward(self, params, batch):
        return super()._forward(params, {**batch, "obs": self._flat_obs(batch["obs"])})


__all__ = ["GRUModule", "GRUNetwork"]
