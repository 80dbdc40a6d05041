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
| `MaskedCategorical` | Discrete(n) with a legal-action mask | n logits (+ mask `(..., n)` bool) | `(...)` int32 |

Action masks (board games, Jumanji): an env with `action_mask(state, params) -> bool[n]`
says which actions are legal. `MaskedCategorical.from_inputs(logits, mask)` gives illegal
actions probability 0 (their logits replaced by `MASKED_LOGIT`), and its `sample`,
`deterministic_sample`, `logp` and `entropy` are those of the masked distribution;
`masked_logits(logits, mask)` is what a module should report as `action_dist_inputs` so
that a learner rebuilding a plain `Categorical` from them gets the same distribution;
`sample_legal(key, mask)` draws a uniformly random legal action (`random_actions=True`).
A row without any legal action is treated as all legal (pgx marks every action legal at a
terminal state for this reason), so no distribution is ever empty.
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


MASKED_LOGIT = -1e9  # logit of an illegal action: exp() of it is 0 in float32


def _effective_mask(mask: jax.Array) -> jax.Array:
    """`mask` as bool, with rows that allow nothing turned into rows that allow everything."""
    mask = jnp.asarray(mask, jnp.bool_)
    return mask | ~jnp.any(mask, axis=-1, keepdims=True)


def masked_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """`(..., n)` logits with illegal actions (mask False) set to `MASKED_LOGIT`.

    Args:
        logits: `(..., n)` float.
        mask: `(..., n)` bool (broadcastable), True for legal actions.
    """
    mask = _effective_mask(jnp.broadcast_to(mask, logits.shape))
    return jnp.where(mask, logits, jnp.asarray(MASKED_LOGIT, logits.dtype))


def sample_legal(key: jax.Array, mask: jax.Array) -> jax.Array:
    """A uniformly random legal action per row: `(...)` int32 from a `(..., n)` bool mask."""
    mask = _effective_mask(mask)
    return jax.random.categorical(key, jnp.where(mask, 0.0, MASKED_LOGIT)).astype(jnp.int32)


class MaskedCategorical(struct.PyTreeNode):
    """Categorical over the legal actions only.

    Inputs: logits `(..., n)` and a legal-action mask `(..., n)` bool; actions `(...)`
    int32. Illegal actions have probability 0: `sample` and `deterministic_sample` never
    return one, `logp` of one is about `MASKED_LOGIT` (effectively -inf), and `entropy`
    sums over legal actions only. `logits` holds the masked logits (`masked_logits`).
    """

    logits: jax.Array
    mask: jax.Array

    @classmethod
    def from_inputs(cls, inputs: jax.Array, mask: jax.Array | None = None
                    ) -> "MaskedCategorical":
        """From `(..., n)` logits and a `(..., n)` bool mask (None: every action legal)."""
        if mask is None:
            mask = jnp.ones(inputs.shape, jnp.bool_)
        mask = _effective_mask(jnp.broadcast_to(mask, inputs.shape))
        return cls(logits=masked_logits(inputs, mask), mask=mask)

    @staticmethod
    def required_input_dim(space: gym.spaces.Discrete) -> int:
        return int(space.n)

    def _log_probs(self) -> jax.Array:
        return jax.nn.log_softmax(self.logits)

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def deterministic_sample(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def logp(self, actions: jax.Array) -> jax.Array:
        return jnp.take_along_axis(self._log_probs(), actions[..., None].astype(jnp.int32),
                                   axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        log_probs = self._log_probs()
        return -jnp.sum(jnp.where(self.mask, jnp.exp(log_probs) * log_probs, 0.0), axis=-1)


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
