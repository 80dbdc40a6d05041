"""RLModules: pure Flax policies over an explicit params pytree.

An `RLModule` is stateless: `init(key)` returns its params, and the three forward passes
are pure functions of `(params, batch)`, so the rollout can call them inside `lax.scan`.
A batch is a dict with `"obs"` of shape `(B, *obs_shape)`; the passes return a dict with
`"action_dist_inputs"` of shape `(B, D)` (and `"vf_preds"` `(B,)` from `forward_train` of a
full module). The action distribution class turns `action_dist_inputs` into actions.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from jaxrunner.modules.distributions import distribution_for

DEFAULT_MODULE_ID = "default_policy"

_ACTIVATIONS = {
    "tanh": jnp.tanh, "relu": jax.nn.relu, "elu": jax.nn.elu, "swish": jax.nn.swish,
    "silu": jax.nn.silu, "gelu": jax.nn.gelu, "linear": None, None: None,
}


class RLModule(abc.ABC):
    """A policy (and optionally value) network with pure forward passes.

    Subclasses set `observation_space` / `action_space` (gymnasium spaces) in `__init__`
    and implement `init` and `_forward`. `action_dist_cls` defaults to the distribution
    for the action space (`Categorical` for Discrete, `DiagGaussian` for Box).
    """

    def __init__(self, observation_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 model_config: dict | None = None, inference_only: bool = False):
        self.observation_space = observation_space
        self.action_space = action_space
        self.model_config = dict(model_config or {})
        self.inference_only = inference_only
        self.action_dist_cls = distribution_for(action_space)

    @abc.abstractmethod
    def init(self, key: jax.Array) -> Any:
        """Returns freshly initialised params (a pytree of arrays)."""

    @abc.abstractmethod
    def _forward(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Returns at least `{"action_dist_inputs": (B, D)}`."""

    def forward_inference(self, params: Any, batch: dict[str, jax.Array]) -> dict:
        """Acting without exploration (the runner takes the deterministic action)."""
        return self._forward(params, batch)

    def forward_exploration(self, params: Any, batch: dict[str, jax.Array]) -> dict:
        """Acting with exploration (the runner samples from the distribution)."""
        return self._forward(params, batch)

    def forward_train(self, params: Any, batch: dict[str, jax.Array]) -> dict:
        """Outputs a learner needs (subclasses add `vf_preds`)."""
        return self._forward(params, batch)

    def params_for_inference(self, params: Any) -> Any:
        """Keeps from `params` (possibly of a full module) what this module acts with."""
        return params


def preprocess_observations(obs: jax.Array, space: gym.spaces.Space) -> jax.Array:
    """(B, *obs_shape) -> (B, F) float32: one-hot for Discrete, flatten for Box."""
    if isinstance(space, gym.spaces.Discrete):
        return jax.nn.one_hot(obs.astype(jnp.int32), int(space.n), dtype=jnp.float32)
    batch = obs.shape[0]
    return obs.reshape(batch, -1).astype(jnp.float32)


class _MLP(nn.Module):
    hiddens: Sequence[int]
    activation: str | None
    out_dim: int
    out_scale: float = 0.01

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for width in self.hiddens:
            x = nn.Dense(width, kernel_init=nn.initializers.orthogonal(math.sqrt(2)))(x)
            if act is not None:
                x = act(x)
        return nn.Dense(self.out_dim,
                        kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class DefaultMLPModule(RLModule):
    """RLlib's default PPO module layout: an MLP policy net and, unless `inference_only`,
    a separate MLP value net.

    `model_config`: `fcnet_hiddens` (default [256, 256]), `fcnet_activation` ("tanh").
    Params: `{"pi": ...}` (inference only) or `{"pi": ..., "vf": ...}`.
    """

    def __init__(self, observation_space, action_space, model_config=None,
                 inference_only=False):
        super().__init__(observation_space, action_space, model_config, inference_only)
        hiddens = tuple(self.model_config.get("fcnet_hiddens", (256, 256)))
        activation = self.model_config.get("fcnet_activation", "tanh")
        self._obs_dim = int(math.prod(
            (observation_space.n,) if isinstance(observation_space, gym.spaces.Discrete)
            else observation_space.shape))
        out_dim = self.action_dist_cls.required_input_dim(action_space)
        self._pi = _MLP(hiddens, activation, out_dim, 0.01)
        self._vf = None if inference_only else _MLP(hiddens, activation, 1, 1.0)

    def init(self, key: jax.Array) -> Any:
        pi_key, vf_key = jax.random.split(key)
        dummy = jnp.zeros((1, self._obs_dim), jnp.float32)
        params = {"pi": self._pi.init(pi_key, dummy)["params"]}
        if self._vf is not None:
            params["vf"] = self._vf.init(vf_key, dummy)["params"]
        return params

    def _forward(self, params, batch):
        x = preprocess_observations(batch["obs"], self.observation_space)
        return {"action_dist_inputs": self._pi.apply({"params": params["pi"]}, x)}

    def forward_train(self, params, batch):
        out = self._forward(params, batch)
        if self._vf is not None and "vf" in params:
            x = preprocess_observations(batch["obs"], self.observation_space)
            out["vf_preds"] = self._vf.apply({"params": params["vf"]}, x)[..., 0]
        return out

    def params_for_inference(self, params):
        if self.inference_only:
            return {"pi": params["pi"]}
        return params


@dataclasses.dataclass
class RLModuleSpec:
    """How to build an RLModule (RLlib's `RLModuleSpec`).

    Args:
        module_class: an `RLModule` subclass taking `(observation_space, action_space,
            model_config, inference_only)`. Defaults to `DefaultMLPModule`.
        observation_space, action_space: gymnasium spaces; filled from the env if None.
        model_config: passed to the module.
        inference_only: build only what acting needs (no value head).
    """

    module_class: type | None = None
    observation_space: gym.spaces.Space | None = None
    action_space: gym.spaces.Space | None = None
    model_config: dict | None = None
    inference_only: bool = False

    def build(self) -> RLModule:
        if self.observation_space is None or self.action_space is None:
            raise ValueError(
                "RLModuleSpec.build() needs observation_space and action_space; the runner "
                "fills them from the env, or set them yourself."
            )
        module_class = self.module_class or DefaultMLPModule
        if not (isinstance(module_class, type) and issubclass(module_class, RLModule)):
            raise TypeError(
                f"RLModuleSpec.module_class must be a subclass of jaxrunner.RLModule, got "
                f"{module_class!r}."
            )
        return module_class(self.observation_space, self.action_space,
                            dict(self.model_config or {}), self.inference_only)
