"""Initialising a population under `jax.vmap` (`PPOLearner.fused_train(seeds=8)`,
`jax.vmap(learner.init_state)`) gives each member the params of its own key and cannot
hang XLA:CPU.

The hang: an orthogonal initialiser is a QR, a vmapped one a batched LAPACK QR, and on CPU
jaxlib's batched QR splits the batch onto XLA's intra-op thread pool and waits for it from
a thread of that pool. When every pool thread is inside such a QR (two cores, several
layers initialised at once) none is left to run the waiting work. `init_params`
initialises the members one after another under vmap instead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner.learners import PPOConfig, PPOLearner
from jaxrunner.modules.rl_module import init_params

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def test_vmapped_init_params__each_member_gets_its_own_keys_params():
    sampler = jaxrunner.make_sampler(make_config(hiddens=(8, 8)))
    learner = PPOLearner.from_sampler(sampler, PPOConfig())
    keys = jax.random.split(jax.random.key(5), 3)
    population = jax.jit(jax.vmap(lambda key: init_params(learner.module, key)))(keys)
    for i in range(3):
        alone = init_params(learner.module, keys[i])
        jax.tree.map(lambda batched, one: np.testing.assert_array_equal(batched[i], one),
                     jax.device_get(population), jax.device_get(alone))
    kernels = [leaf for leaf in jax.tree.leaves(population) if leaf.ndim == 3]
    assert kernels and not np.array_equal(kernels[0][0], kernels[0][1])  # keys differ


def test_fused_train_init__over_8_seeds_on_a_2_thread_pool_does_not_hang():
    """On two CPUs the batched QR hung in the first or second call; 30 calls must finish."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs for a two-thread XLA pool")
    two_cpus = sorted(os.sched_getaffinity(0))[:2]
    code = textwrap.dedent(f"""
        import os
        os.sched_setaffinity(0, {two_cpus!r})  # XLA sizes its intra-op pool from this
        import jax
        import jaxrunner
        from jaxrunner.learners import PPOConfig, PPOLearner
        config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
                  .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8))
        sampler = jaxrunner.make_sampler(config)
        train = PPOLearner.from_sampler(sampler, PPOConfig()).make_train(sampler, 1)
        init = jax.jit(jax.vmap(train.init))
        for i in range(30):
            jax.block_until_ready(init(jax.random.split(jax.random.key(i), 8)))
        print("finished")
    """)
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=180, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        pytest.fail("the vmapped init over 8 seeds hung (XLA:CPU's batched-QR deadlock)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished" in result.stdout
