"""Action distributions against numpy / scipy references."""

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from jaxrunner.modules.distributions import (Categorical, DiagGaussian, Deterministic,
                                             MultiCategorical, SquashedGaussian,
                                             distribution_for)

RNG = np.random.default_rng(0)


def test_categorical__logp_entropy_match_numpy():
    logits = RNG.normal(size=(5, 4)).astype(np.float32)
    dist = Categorical.from_inputs(jnp.asarray(logits))
    actions = np.array([0, 3, 1, 2, 3])
    probs = special.softmax(logits.astype(np.float64), axis=-1)
    np.testing.assert_allclose(dist.logp(jnp.asarray(actions)),
                               np.log(probs[np.arange(5), actions]), rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), stats.entropy(probs, axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(dist.deterministic_sample(), logits.argmax(-1))


def test_categorical__sample_frequencies_follow_probs():
    logits = jnp.log(jnp.array([[0.1, 0.6, 0.3]]))
    keys = jax.random.split(jax.random.key(0), 20000)
    samples = jax.vmap(lambda k: Categorical.from_inputs(logits).sample(k)[0])(keys)
    freqs = np.bincount(np.asarray(samples), minlength=3) / len(samples)
    np.testing.assert_allclose(freqs, [0.1, 0.6, 0.3], atol=0.015)


def test_multi_categorical__sums_independent_parts():
    space = gym.spaces.MultiDiscrete([3, 2])
    logits = RNG.normal(size=(4, 5)).astype(np.float32)
    dist = MultiCategorical.for_space(space)(jnp.asarray(logits))
    actions = np.array([[0, 1], [2, 0], [1, 1], [2, 1]])
    p1 = special.softmax(logits[:, :3].astype(np.float64), -1)
    p2 = special.softmax(logits[:, 3:].astype(np.float64), -1)
    expected = np.log(p1[np.arange(4), actions[:, 0]]) + np.log(p2[np.arange(4), actions[:, 1]])
    np.testing.assert_allclose(dist.logp(jnp.asarray(actions)), expected, rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), stats.entropy(p1, axis=-1)
                               + stats.entropy(p2, axis=-1), rtol=1e-5)
    sample = dist.sample(jax.random.key(1))
    assert sample.shape == (4, 2) and sample.dtype == jnp.int32
    assert np.all(np.asarray(sample) < np.array([3, 2]))
    np.testing.assert_array_equal(dist.deterministic_sample(),
                                  np.stack([p1.argmax(-1), p2.argmax(-1)], -1))
    assert MultiCategorical.required_input_dim(space) == 5


def test_diag_gaussian__logp_entropy_match_scipy():
    mean = RNG.normal(size=(3, 2)).astype(np.float32)
    log_std = RNG.normal(scale=0.3, size=(3, 2)).astype(np.float32)
    dist = DiagGaussian.from_inputs(jnp.asarray(np.concatenate([mean, log_std], -1)))
    actions = RNG.normal(size=(3, 2)).astype(np.float32)
    ref = stats.norm(mean.astype(np.float64), np.exp(log_std.astype(np.float64)))
    np.testing.assert_allclose(dist.logp(jnp.asarray(actions)),
                               ref.logpdf(actions).sum(-1), rtol=1e-4)
    np.testing.assert_allclose(dist.entropy(), ref.entropy().sum(-1), rtol=1e-5)
    np.testing.assert_allclose(dist.deterministic_sample(), mean)
    samples = jax.vmap(lambda k: dist.sample(k))(jax.random.split(jax.random.key(2), 20000))
    np.testing.assert_allclose(np.asarray(samples).std(0), np.exp(log_std), rtol=0.05)


def test_squashed_gaussian__change_of_variables():
    mean = RNG.normal(size=(4, 2)).astype(np.float32)
    log_std = RNG.normal(scale=0.2, size=(4, 2)).astype(np.float32)
    dist = SquashedGaussian.from_inputs(jnp.asarray(np.concatenate([mean, log_std], -1)))
    u = RNG.normal(size=(4, 2))
    actions = np.tanh(u)
    ref = stats.norm(mean.astype(np.float64), np.exp(log_std.astype(np.float64)))
    expected = (ref.logpdf(u) - np.log(1 - actions ** 2)).sum(-1)
    np.testing.assert_allclose(dist.logp(jnp.asarray(actions, jnp.float32)), expected,
                               rtol=1e-3, atol=1e-3)
    sample = np.asarray(dist.sample(jax.random.key(0)))
    assert np.all(np.abs(sample) < 1.0)
    np.testing.assert_allclose(dist.deterministic_sample(), np.tanh(mean), rtol=1e-6)
    np.testing.assert_allclose(dist.entropy(), ref.entropy().sum(-1), rtol=1e-5)


def test_deterministic__point_mass():
    value = RNG.normal(size=(3, 2)).astype(np.float32)
    dist = Deterministic.from_inputs(jnp.asarray(value))
    np.testing.assert_array_equal(dist.sample(jax.random.key(0)), value)
    np.testing.assert_array_equal(dist.deterministic_sample(), value)
    np.testing.assert_array_equal(dist.logp(jnp.asarray(value)), np.zeros(3))
    np.testing.assert_array_equal(dist.entropy(), np.zeros(3))


def test_distribution_for__spaces():
    assert distribution_for(gym.spaces.Discrete(3)) is Categorical
    assert distribution_for(gym.spaces.MultiDiscrete([2, 2])) is MultiCategorical
    assert distribution_for(gym.spaces.Box(-1, 1, (2,))) is DiagGaussian
    with pytest.raises(ValueError, match="Discrete, MultiDiscrete and 1-D Box"):
        distribution_for(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))
