"""Action distributions over batches of `action_dist_inputs`.

Each class is a pytree built from the module's `action_dist_inputs` (shape `(..., D)`)
with `from_inputs`, and offers `sample(key)`, `deterministic_sample()`, `logp(actions)`
and `entropy()`. `required_input_dim(space)` says what `D` a module must output for an
action space; `distribution_for(space)` picks the default class.

| class | action space | inputs `D` | actions |
|---|---|---|---|
| `Categorical` | Discrete(n) | n logits | `(...)` int32 |
| `MultiCategorical` | MultiDiscrete(nvec) | sum(nvec) logits | `(..., len(nvec))` int32 |
| `DiagGaussian` | Box (A,) | 2A: mean, log_std | `(..., A)` float32 |
| `SquashedGaussian` | Box (A,) | 2A: mean, log_std | `(..., A)` in (-1, 1) |
| `Deterministic` | Box (A,) | A | `(..., A)` float32 |
"""

from __future__ import annotations

import math

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

_LOG_2PI = math.log(2.0 * math.pi)
_TANH_EPS = 1e-6


def _box_dim(space: gym.spaces.Box) -> int:
    return int(math.prod(space.shape))


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


class MultiCategorical(struct.PyTreeNode):
    """Independent categoricals, one per MultiDiscrete dimension.

    Inputs: the logits of each dimension, concatenated `(..., sum(nvec))`; actions
    `(..., len(nvec))` int32.
    """

    logits: jax.Array
    nvec: tuple[int, ...] = struct.field(pytree_node=False)

    @classmethod
    def for_space(cls, space: gym.spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
        return lambda inputs: cls(logits=inputs, nvec=nvec)

    @staticmethod
    def required_input_dim(space: gym.spaces.MultiDiscrete) -> int:
        return int(np.sum(space.nvec))

    def _parts(self) -> list[Categorical]:
        splits = np.cumsum(self.nvec)[:-1].tolist()
        return [Categorical(logits=part) for part in jnp.split(self.logits, splits, axis=-1)]

    def sample(self, key: jax.Array) -> jax.Array:
        keys = jax.random.split(key, len(self.nvec))
        return jnp.stack([p.sample(k) for p, k in zip(self._parts(), keys)], axis=-1)

    def deterministic_sample(self) -> jax.Array:
        return jnp.stack([p.deterministic_sample() for p in self._parts()], axis=-1)

    def logp(self, actions: jax.Array) -> jax.Array:
        return sum(p.logp(actions[..., i]) for i, p in enumerate(self._parts()))

    def entropy(self) -> jax.Array:
        return sum(p.entropy() for p in self._parts())


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
        return 2 * _box_dim(space)

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


class SquashedGaussian(struct.PyTreeNode):
    """`tanh` of a diagonal Gaussian: actions in (-1, 1) (then mapped to the Box bounds by
    `normalize_actions`). Inputs: `(..., 2A)` = concat(mean, log_std).

    `logp` applies the change of variables `log N(u) - sum log(1 - tanh(u)^2)` with
    `u = atanh(a)`. `entropy()` has no closed form; it returns the entropy of the
    underlying Gaussian (the usual stand-in; SAC-style learners use `-logp` of samples).
    """

    mean: jax.Array
    log_std: jax.Array

    @classmethod
    def from_inputs(cls, inputs: jax.Array) -> "SquashedGaussian":
        mean, log_std = jnp.split(inputs, 2, axis=-1)
        return cls(mean=mean, log_std=log_std)

    @staticmethod
    def required_input_dim(space: gym.spaces.Box) -> int:
        return 2 * _box_dim(space)

    def _base(self) -> DiagGaussian:
        return DiagGaussian(mean=self.mean, log_std=self.log_std)

    def sample(self, key: jax.Array) -> jax.Array:
        return jnp.tanh(self._base().sample(key))

    def deterministic_sample(self) -> jax.Array:
        return jnp.tanh(self.mean)

    def logp(self, actions: jax.Array) -> jax.Array:
        clipped = jnp.clip(actions, -1.0 + _TANH_EPS, 1.0 - _TANH_EPS)
        pre_tanh = jnp.arctanh(clipped)
        log_det = jnp.sum(jnp.log(1.0 - clipped * clipped), axis=-1)
        return self._base().logp(pre_tanh) - log_det

    def entropy(self) -> jax.Array:
        return self._base().entropy()


class Deterministic(struct.PyTreeNode):
    """A point mass: the inputs `(..., A)` are the action. `logp` is 0, entropy 0."""

    value: jax.Array

    @classmethod
    def from_inputs(cls, inputs: jax.Array) -> "Deterministic":
        return cls(value=inputs)

    @staticmethod
    def required_input_dim(space: gym.spaces.Box) -> int:
        return _box_dim(space)

    def sample(self, key: jax.Array) -> jax.Array:
        del key
        return self.value

    def deterministic_sample(self) -> jax.Array:
        return self.value

    def logp(self, actions: jax.Array) -> jax.Array:
        return jnp.zeros(actions.shape[:-1], actions.dtype)

    def entropy(self) -> jax.Array:
        return jnp.zeros(self.value.shape[:-1], self.value.dtype)


def distribution_for(action_space: gym.spaces.Space):
    """The default distribution class for an action space."""
    if isinstance(action_space, gym.spaces.Discrete):
        return Categorical
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return MultiCategorical
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return DiagGaussian
    raise ValueError(
        f"No action distribution for {action_space}: jaxrunner acts in Discrete, "
        "MultiDiscrete and 1-D Box action spaces. Flatten other action spaces in the env, "
        "or set RLModule.action_dist_cls to a distribution class of your own."
    )
