"""After warm-up, `sample(n)` for any `n` (and `get_metrics()`) compiles nothing at all."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxrunner

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 3


def test_compile_once__counter_sees_compilations(compile_counter):
    """The counter is live: a fresh jitted function compiles once, then never again."""
    fresh = jax.jit(lambda x: x * 3 + 1)
    fresh(jnp.arange(5))
    assert compile_counter.count >= 1
    compile_counter.reset()
    fresh(jnp.arange(5))
    assert compile_counter.count == 0


def test_compile_once__any_n_after_warm_up(compile_counter):
    runner = jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=NUM_ENVS, fragment=8, max_chunk_length=4))
    # Warm-up: one timestep call, one episode call, one get_metrics.
    assert len(runner.sample(num_timesteps=5)) > 0
    assert len(runner.sample(num_episodes=1)) == 1
    runner.get_metrics()
    assert compile_counter.count > 0  # the warm-up did compile
    compile_counter.reset()

    sizes = [("num_timesteps", n) for n in (1, 2, 3, 4, 7, 12, 13, 25, 40, 61, 100)]
    sizes += [("num_episodes", k) for k in (2, 3, 5, 8)]
    assert len(sizes) == 15
    total_steps = 0
    for name, n in sizes:
        batch = runner.sample(**{name: n})
        # Reading the host views is part of the normal use and must not compile either.
        total_steps += sum(len(episode) for episode in batch)
        if name == "num_episodes":
            assert len(batch) == n
        else:
            assert n <= batch.env_steps <= n + NUM_ENVS - 1
    runner.sample()  # the default size
    runner.sample(num_timesteps=0)
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled"] >= total_steps
    assert compile_counter.count == 0, "\n".join(compile_counter.messages)
