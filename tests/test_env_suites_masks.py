"""Action masks: `MaskedCategorical`, `masked_logits`, `sample_legal` (pure, no env)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrunner.modules.distributions import (MASKED_LOGIT, Categorical, MaskedCategorical,
                                             masked_logits, sample_legal)

LOGITS = jnp.array([[3.0, 0.5, -1.0, 2.0],
                    [0.0, 0.0, 0.0, 0.0],
                    [1.0, 2.0, 3.0, 4.0]])
MASK = jnp.array([[False, True, True, True],
                  [True, False, True, False],
                  [False, False, False, False]])  # last row: nothing legal -> all legal


def _expected_probs(logits, mask):
    mask = np.asarray(mask)
    mask = mask | ~mask.any(-1, keepdims=True)
    z = np.where(mask, np.asarray(logits, np.float64), -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def test_masked_categorical__illegal_actions_have_probability_zero():
    dist = MaskedCategorical.from_inputs(LOGITS, MASK)
    actions = jnp.broadcast_to(jnp.arange(4), (3, 4)).T  # (4, 3): every action per row
    probs = np.exp(np.asarray(jax.vmap(dist.logp)(actions))).T  # (3, 4)
    np.testing.assert_allclose(probs, _expected_probs(LOGITS, MASK), atol=1e-6)
    assert probs[0, 0] == 0.0 and probs[1, 1] == 0.0 and probs[1, 3] == 0.0
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_masked_categorical__sample_and_argmax_stay_legal():
    dist = MaskedCategorical.from_inputs(LOGITS, MASK)
    np.testing.assert_array_equal(np.asarray(dist.deterministic_sample()), [3, 0, 3])
    keys = jax.random.split(jax.random.key(0), 4000)
    samples = np.asarray(jax.jit(jax.vmap(dist.sample))(keys))  # (4000, 3)
    legal = np.asarray(MASK) | ~np.asarray(MASK).any(-1, keepdims=True)
    assert all(legal[row, samples[:, row]].all() for row in range(3))
    freq = np.stack([np.bincount(samples[:, r], minlength=4) / 4000 for r in range(3)])
    np.testing.assert_allclose(freq, _expected_probs(LOGITS, MASK), atol=0.03)


def test_masked_categorical__entropy_is_that_of_the_masked_distribution():
    dist = MaskedCategorical.from_inputs(LOGITS, MASK)
    p = _expected_probs(LOGITS, MASK)
    expected = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
    np.testing.assert_allclose(np.asarray(dist.entropy()), expected, atol=1e-5)
    np.testing.assert_allclose(float(dist.entropy()[1]), np.log(2.0), atol=1e-6)


def test_masked_logits__plain_categorical_agrees_with_masked_distribution():
    """What a module reports as `action_dist_inputs` rebuilds the same distribution."""
    inputs = masked_logits(LOGITS, MASK)
    assert float(inputs[0, 0]) == MASKED_LOGIT
    plain, masked = Categorical.from_inputs(inputs), MaskedCategorical.from_inputs(LOGITS, MASK)
    actions = jnp.array([1, 2, 0])
    np.testing.assert_allclose(np.asarray(plain.logp(actions)),
                               np.asarray(masked.logp(actions)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(plain.entropy()), np.asarray(masked.entropy()),
                               atol=1e-5)
    np.testing.assert_array_equal(np.asarray(plain.deterministic_sample()),
                                  np.asarray(masked.deterministic_sample()))


def test_masked_categorical__no_mask_is_the_plain_categorical():
    dist, plain = MaskedCategorical.from_inputs(LOGITS), Categorical.from_inputs(LOGITS)
    actions = jnp.array([0, 1, 3])
    np.testing.assert_allclose(np.asarray(dist.logp(actions)),
                               np.asarray(plain.logp(actions)), atol=1e-6)


def test_sample_legal__uniform_over_legal_actions():
    keys = jax.random.split(jax.random.key(1), 3000)
    samples = np.asarray(jax.jit(jax.vmap(lambda k: sample_legal(k, MASK)))(keys))
    assert samples.shape == (3000, 3) and samples.dtype == np.int32
    freq0 = np.bincount(samples[:, 0], minlength=4) / 3000
    np.testing.assert_allclose(freq0, [0, 1 / 3, 1 / 3, 1 / 3], atol=0.04)
    assert set(np.unique(samples[:, 1])) == {0, 2}
    assert set(np.unique(samples[:, 2])) == {0, 1, 2, 3}


@pytest.mark.parametrize("shape", [(4,), (2, 5, 4)])
def test_masked_categorical__any_batch_shape(shape):
    logits = jax.random.normal(jax.random.key(2), shape)
    mask = jax.random.bernoulli(jax.random.key(3), 0.5, shape)
    dist = jax.jit(MaskedCategorical.from_inputs)(logits, mask)
    sample = dist.sample(jax.random.key(4))
    assert sample.shape == shape[:-1] and dist.logp(sample).shape == shape[:-1]
    assert bool(jnp.all(jnp.isfinite(dist.logp(sample))))
    assert dist.entropy().shape == shape[:-1]
