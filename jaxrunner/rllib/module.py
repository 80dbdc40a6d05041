"""RLlib's default PPO policy network, layer for layer, as a pure Flax module.

RLlib's `DefaultPPOTorchRLModule` (also APPO's and IMPALA's default) acts with an MLP
encoder followed by an MLP pi head, each a `TorchMLP` whose `nn.Sequential` holds
`Linear`, optional `LayerNorm` (eps=1e-3) and activation layers in this order:

    encoder: [Linear -> (LayerNorm) -> act] for every width in fcnet_hiddens
             (the last, "output" layer of the encoder also gets the activation)
    pi head: [Linear -> (LayerNorm) -> head_act] for every width in head_fcnet_hiddens,
             then a linear output Linear (no LayerNorm, no activation)
    Box actions: the log-std half of the output is clamped to +-log_std_clip_param,
             or, with free_log_std, a state-independent `pi.log_std` is clamped and
             appended to the mean.

`PPOLayout.build` replays RLlib's construction rules to get the exact op list, with the
index each op has in the torch `nn.Sequential` (so `encoder.actor_encoder.net.mlp.2.weight`
maps to `params["encoder"]["layers_2"]["kernel"]`). `RLlibPPOModule` is a jaxrunner
`RLModule` running that op list with Flax linen layers at full float32 matmul precision,
so its `action_dist_inputs` equal the torch module's to float rounding.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.modules.rl_module import RLModule
from jaxrunner.rllib.errors import UnsupportedRLlibSetupError

# torch.nn class name -> (canonical name, JAX function). RLlib resolves an activation
# name by `getattr(torch.nn, name)` first and then by these lower-case aliases.
_TORCH_ACTIVATIONS = {
    "Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "SiLU": "silu", "GELU": "gelu",
}
_LOWER_ALIASES = {"tanh": "tanh", "relu": "relu", "elu": "elu", "swish": "silu",
                  "silu": "silu"}
_JAX_ACTIVATIONS = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "elu": jax.nn.elu,
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # torch.nn.GELU() is exact erf
}
_LAYERNORM_EPS = 1e-3  # TorchMLP uses nn.LayerNorm(dim, eps=0.001)

# Keys of a full (learner) PPO/APPO state dict that the acting network does not use.
NON_INFERENCE_PREFIXES = ("vf.", "encoder.critic_encoder.", "_old_encoder.", "_old_pi.")


def canonical_activation(name: Any, *, setting: str) -> str | None:
    """RLlib's torch activation name -> "tanh" | "relu" | "elu" | "silu" | "gelu" | None.

    Follows `ray.rllib.models.utils.get_activation_fn(name, framework="torch")`; raises
    `UnsupportedRLlibSetupError` for anything else (callables, other torch layers).
    """
    if name is None or (isinstance(name, str) and name.lower() == "linear"):
        return None
    if isinstance(name, str):
        if name in _TORCH_ACTIVATIONS:
            return _TORCH_ACTIVATIONS[name]
        if name.lower() in _LOWER_ALIASES:
            return _LOWER_ALIASES[name.lower()]
    supported = sorted(set(_TORCH_ACTIVATIONS) | set(_LOWER_ALIASES) | {"linear", "None"})
    raise UnsupportedRLlibSetupError(
        f"model_config[{setting!r}]={name!r} cannot be compiled by JaxEnvRunner; "
        f"supported activations: {supported}."
    )


class Dense(NamedTuple):
    """`nn.Linear(in_features, features)` at position `index` of the torch Sequential."""

    index: int
    in_features: int
    features: int


class LayerNorm(NamedTuple):
    """`nn.LayerNorm(features, eps=1e-3)` at position `index` of the torch Sequential."""

    index: int
    features: int


class Activation(NamedTuple):
    """A parameter-free activation layer (canonical name)."""

    index: int
    name: str


def torch_mlp_ops(input_dim: int, hidden: list[int], hidden_activation: str | None,
                  hidden_layernorm: bool, output_dim: int | None,
                  output_activation: str | None, output_layernorm: bool) -> tuple:
    """The layers `ray.rllib.core.models.torch.primitives.TorchMLP` builds, in order."""
    ops: list = []
    dims = [input_dim] + list(hidden) + ([output_dim] if output_dim else [])
    for i in range(len(dims) - 1):
        is_output = output_dim is not None and i == len(dims) - 2
        ops.append(Dense(len(ops), dims[i], dims[i + 1]))
        if not is_output:
            if hidden_layernorm:
                ops.append(LayerNorm(len(ops), dims[i + 1]))
            if hidden_activation is not None:
                ops.append(Activation(len(ops), hidden_activation))
        elif output_layernorm:
            ops.append(LayerNorm(len(ops), dims[i + 1]))
    if output_dim is not None and output_activation is not None:
        ops.append(Activation(len(ops), output_activation))
    return tuple(ops)


@dataclasses.dataclass(frozen=True)
class PPOLayout:
    """The acting network of RLlib's default PPO module for given spaces and model config.

    Attributes:
        obs_dim: width of the (1-D Box) observation.
        encoder_prefix: torch key prefix of the encoder's Sequential
            ("encoder.encoder.net.mlp" with vf_share_layers, else
            "encoder.actor_encoder.net.mlp").
        encoder_ops, pi_ops: the layers of each Sequential, in order.
        dist_dim: width of `action_dist_inputs` (n for Discrete, 2 * A for Box).
        clip_log_std: Box actions: clamp the log-std half to +-log_std_clip_param.
        free_log_std: Box actions: the log-std is the parameter `pi.log_std`.
        log_std_clip_param: the clamp bound.
    """

    obs_dim: int
    encoder_prefix: str
    encoder_ops: tuple
    pi_ops: tuple
    dist_dim: int
    clip_log_std: bool
    free_log_std: bool
    log_std_clip_param: float

    @classmethod
    def build(cls, observation_space: gym.spaces.Space, action_space: gym.spaces.Space,
              model_config: Mapping[str, Any]) -> "PPOLayout":
        """Replays `PPOCatalog` + `TorchMLP` construction; raises
        `UnsupportedRLlibSetupError` for what the torch module would build differently
        (LSTM, CNN, other spaces)."""
        cfg = dict(model_config)
        if cfg.get("use_lstm"):
            raise UnsupportedRLlibSetupError(
                "model_config['use_lstm']=True: RLlib builds a recurrent (LSTM) encoder, "
                "whose state JaxEnvRunner does not carry through its compiled rollout."
            )
        if not (isinstance(observation_space, gym.spaces.Box)
                and len(observation_space.shape) == 1):
            kind = ("a CNN encoder" if isinstance(observation_space, gym.spaces.Box)
                    and len(observation_space.shape) == 3 else "no default MLP encoder")
            raise UnsupportedRLlibSetupError(
                f"Observation space {observation_space}: RLlib's default catalog builds "
                f"{kind} for it; JaxEnvRunner compiles only the MLP encoder of a 1-D Box "
                "observation."
            )
        if isinstance(action_space, gym.spaces.Discrete):
            is_box = False
            dist_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            is_box = True
            dist_dim = 2 * int(math.prod(action_space.shape))
        else:
            raise UnsupportedRLlibSetupError(
                f"Action space {action_space}: JaxEnvRunner samples Categorical (Discrete) "
                "and DiagGaussian (1-D Box) actions only."
            )
        hiddens = list(cfg.get("fcnet_hiddens", [256, 256]))
        if not hiddens or not all(isinstance(h, (int, np.integer)) and h > 0
                                  for h in hiddens):
            raise UnsupportedRLlibSetupError(
                f"model_config['fcnet_hiddens']={hiddens!r}: RLlib's MLP encoder needs a "
                "non-empty list of positive layer widths."
            )
        free_log_std = bool(cfg.get("free_log_std", False))
        if free_log_std and not is_box:
            raise UnsupportedRLlibSetupError(
                "model_config['free_log_std']=True needs a Box action space (RLlib allows "
                "it only for DiagGaussian distributions)."
            )
        act = canonical_activation(cfg.get("fcnet_activation", "tanh"),
                                   setting="fcnet_activation")
        head_act = canonical_activation(cfg.get("head_fcnet_activation", "relu"),
                                        setting="head_fcnet_activation")
        layernorm = bool(cfg.get("fcnet_use_layernorm", False))
        obs_dim = int(observation_space.shape[0])
        encoder_ops = torch_mlp_ops(obs_dim, hiddens[:-1], act, layernorm, hiddens[-1], act,
                                    layernorm)
        out_dim = dist_dim // 2 if free_log_std else dist_dim
        pi_ops = torch_mlp_ops(hiddens[-1], list(cfg.get("head_fcnet_hiddens", []) or []),
                               head_act, bool(cfg.get("head_fcnet_use_layernorm", False)),
                               out_dim, None, False)
        prefix = ("encoder.encoder.net.mlp" if cfg.get("vf_share_layers", True)
                  else "encoder.actor_encoder.net.mlp")
        return cls(obs_dim=obs_dim, encoder_prefix=prefix, encoder_ops=encoder_ops,
                   pi_ops=pi_ops, dist_dim=dist_dim, clip_log_std=is_box,
                   free_log_std=free_log_std,
                   log_std_clip_param=float(cfg.get("log_std_clip_param", 20.0)))


class _TorchLayout(nn.Module):
    """A Flax MLP running `ops` exactly as the torch Sequential does (B, F) -> (B, out)."""

    ops: tuple

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for op in self.ops:
            if isinstance(op, Dense):
                x = nn.Dense(op.features, name=f"layers_{op.index}",
                             precision=jax.lax.Precision.HIGHEST)(x)
            elif isinstance(op, LayerNorm):
                x = nn.LayerNorm(epsilon=_LAYERNORM_EPS, use_fast_variance=False,
                                 name=f"layers_{op.index}")(x)
            else:
                x = _JAX_ACTIVATIONS[op.name](x)
        return x


class RLlibPPOModule(RLModule):
    """jaxrunner module equal to RLlib's default PPO module's acting path.

    `model_config` is RLlib's (merged with `DefaultModelConfig`'s defaults); the layout is
    `self.layout`. Params: `{"encoder": {"layers_<i>": {"kernel", "bias"} or {"scale",
    "bias"}}, "pi": {...}}` plus `"log_std"` `(A,)` with `free_log_std`. Inference only:
    the value function stays with the torch learner.
    """

    def __init__(self, observation_space, action_space, model_config=None,
                 inference_only=True):
        super().__init__(observation_space, action_space, model_config, inference_only)
        self.layout = PPOLayout.build(observation_space, action_space, self.model_config)
        self._encoder = _TorchLayout(self.layout.encoder_ops)
        self._pi = _TorchLayout(self.layout.pi_ops)

    def init(self, key: jax.Array) -> Any:
        enc_key, pi_key = jax.random.split(key)
        obs = jnp.zeros((1, self.layout.obs_dim), jnp.float32)
        params = {"encoder": self._encoder.init(enc_key, obs)["params"]}
        latent = self._encoder.apply({"params": params["encoder"]}, obs)
        params["pi"] = self._pi.init(pi_key, latent)["params"]
        if self.layout.free_log_std:
            params["log_std"] = jnp.zeros((self.layout.dist_dim // 2,), jnp.float32)
        return params

    def _forward(self, params: Any, batch: dict) -> dict:
        obs = batch["obs"]
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        latent = self._encoder.apply({"params": params["encoder"]}, x)
        out = self._pi.apply({"params": params["pi"]}, latent)
        bound = self.layout.log_std_clip_param
        if self.layout.free_log_std:
            log_std = jnp.clip(params["log_std"], -bound, bound)
            out = jnp.concatenate([out, jnp.broadcast_to(log_std, out.shape)], axis=-1)
        elif self.layout.clip_log_std:
            mean, log_std = jnp.split(out, 2, axis=-1)
            out = jnp.concatenate([mean, jnp.clip(log_std, -bound, bound)], axis=-1)
        return {"action_dist_inputs": out}

    def params_for_inference(self, params: Any) -> Any:
        return params


__all__ = ["NON_INFERENCE_PREFIXES", "PPOLayout", "RLlibPPOModule", "canonical_activation",
           "torch_mlp_ops"]
