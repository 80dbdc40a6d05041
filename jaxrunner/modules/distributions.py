"""Action distributions over batches of `action_dist_inputs`.

Each class is a pytree built from the module's `action_dist_inputs` (shape `(..., D)`)
with `from_inputs`, and offers `sample(key)`, `deterministic_sample()`, `logp(actions)`
and `entropy()`. `required_input_dim(space)` says what `D` a module must output for an
action space.
"""

from __future__ import annotations

import math

import gymnasium as gym
import jax
import jax.numpy as jnp
from flax import struct

_LOG_2PI = math.log(2.0 * math.pi)


class Categorical(struct.PyTreeNode):
    """Categorical over `n` actions. Inputs: logits `(..., n)`; actions `(...)` int32."""

    logits: jax.Array

    @classmethod
    def from_inputs(cls, inputs: jax.Array) -> "Categorical":
        return cls(logits=inputs)

    @staticmethod
    def required_input_dim(space: gym.spaces.Discrete) -> int:
        return int(space.n)

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def deterministic_sample(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def logp(self, actions: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_probs, actions[..., None].astype(jnp.int32),
                                   axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        log_probs = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


class DiagGaussian(struct.PyTreeNode):
    """Diagonal Gaussian. Inputs: `(..., 2A)` = concat(mean, log_std); actions `(..., A)`."""

    mean: jax.Array
    log_std: jax.Array

    @classmethod
    def from_inputs(cls, inputs: jax.Array) -> "DiagGaussian":
        mean, log_std = jnp.split(inputs, 2, axis=-1)
        return cls(mean=mean, log_std=log_std)

    @staticmethod
    def required_input_dim(space: gym.spaces.Box) -> int:
        return 2 * int(math.prod(space.shape))

    def sample(self, key: jax.Array) -> jax.Array:
        noise = jax.random.normal(key, self.mean.shape, self.mean.dtype)
        return self.mean + jnp.exp(self.log_std) * noise

    def deterministic_sample(self) -> jax.Array:
        return self.mean

    def logp(self, actions: jax.Array) -> jax.Array:
        z = (actions - self.mean) * jnp.exp(-self.log_std)
        return jnp.sum(-0.5 * z * z - self.log_std - 0.5 * _LOG_2PI, axis=-1)

    def entropy(self) -> jax.Array:
        return jnp.sum(self.log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)


def distribution_for(action_space: gym.spaces.Space):
    """The default distribution class for an action space."""
    if isinstance(action_space, gym.spaces.Discrete):
        return Categorical
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return DiagGaussian
    raise ValueError(
        f"No default action distribution for {action_space}: the default module supports "
        "Discrete and 1-D Box action spaces. Bring your own RLModule (RLModuleSpec) for "
        "other spaces."
    )
