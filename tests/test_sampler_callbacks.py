"""Device-callback custom metrics in the fused loop (`jaxrunner.Sampler`).

Pinned: N fused `sample()` calls report the custom keys `runner.get_metrics()` reports
after N `runner.sample()` calls from the same state (every reduction: max, mean over a
window, windowed sum, lifetime sums, since-last sums), bit for bit, for one call and as
arrays per iteration and seed under `lax.scan` + `jax.vmap`; the state round trip
(`to_runner_state` / `from_runner_state`) carries the callback state, ring and sums, so a
runner that takes over (and a fused loop that takes back) reports the same values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.metrics import reduce_sample_metrics

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS, T, CALLS = 4, 12, 5


def start(view):
    return {"max_x": jnp.zeros((), jnp.float32), "steps": jnp.zeros((), jnp.int32)}


def step(state, view):
    return {"max_x": jnp.maximum(state["max_x"], jnp.abs(view.obs[0])),
            "steps": state["steps"] + 1}


def end(state, view):
    return {"max_abs_x": state["max_x"], "max_x_mean3": state["max_x"],
            "max_x_sum": state["max_x"], "len_sum": state["steps"],
            "terminated": view.terminated, "len_last2": state["steps"]}


CUSTOM = {"max_abs_x": "max",  # over the episode window
          "max_x_mean3": jaxrunner.MetricSpec("mean", window=3),
          "max_x_sum": "sum",  # lifetime sum of non-integer values
          "len_sum": "sum",  # lifetime sum of integers
          "terminated": jaxrunner.MetricSpec("sum", clear_on_reduce=True),
          "len_last2": {"reduce": "sum", "window": 2}}
NAMES = tuple(sorted(CUSTOM))
INTEGER_VALUED = ("len_sum", "terminated", "len_last2")


def custom(metrics: dict) -> dict:
    return {k: metrics[k] for k in NAMES if k in metrics}


@pytest.fixture(scope="module")
def runner():
    config = (make_config(num_envs=NUM_ENVS, fragment=T, hiddens=(8,), seed=1)
              .reporting(metrics_num_episodes_for_smoothing=6)
              .callbacks(on_episode_start=start, on_episode_step=step, on_episode_end=end,
                         custom_metrics=CUSTOM))
    r = jaxrunner.SingleAgentEnvRunner(config=config)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def reference(runner):
    """The runner's own numbers from its fresh state: get_metrics() after every call, and
    once after CALLS calls; the runner is put back to its start."""
    start_state = runner.get_state(components="all")
    per_call = []
    for _ in range(CALLS):
        runner.sample(num_timesteps=NUM_ENVS * T)
        per_call.append(runner.get_metrics())
    runner.set_state(start_state)
    for _ in range(CALLS):
        runner.sample(num_timesteps=NUM_ENVS * T)
    once = runner.get_metrics()
    runner.set_state(start_state)
    return start_state, per_call, once


def test_custom_metrics__per_call_equal_runner_get_metrics(runner, reference):
    start_state, per_call, once = reference
    sampler = runner.sampler
    assert tuple(sampler.custom_metrics) == NAMES
    assert sampler.custom_metrics["max_x_mean3"].window == 3
    assert sampler.custom_metrics["max_abs_x"].window == 6  # the episode window
    # The reference saw every kind of value: episodes ended, some terminated.
    assert once["num_episodes"] >= NUM_ENVS and once["terminated"] >= 1
    assert set(custom(once)) == set(NAMES)
    state = sampler.from_runner_state(start_state)
    params = runner.get_state()["rl_module"]
    for expected in per_call:
        state, _, metrics = sampler.sample_jit(state, params)
        reduced = sampler.reduce_metrics(metrics)
        assert custom(reduced) == custom(expected)
        assert reduced["num_episodes"] == expected["num_episodes"]
    with pytest.raises(ValueError, match="custom_metrics=sampler.custom_metrics"):
        reduce_sample_metrics(metrics)
    # The fused state handed to the runner: one get_metrics() reports the CALLS calls, as
    # the runner's own get_metrics() after CALLS sample() calls.
    runner.set_state(sampler.to_runner_state(state))
    assert custom(runner.get_metrics()) == custom(once)
    assert once["terminated"] == sum(m.get("terminated", 0.0) for m in per_call)
    # ... and the runner's state back in a fused loop: its next call equals the runner's.
    handed = runner.get_state(components="all")
    runner.sample(num_timesteps=NUM_ENVS * T)
    expected_next = runner.get_metrics()
    back = sampler.from_runner_state(handed)
    _, _, metrics = sampler.sample_jit(back, params)
    assert custom(sampler.reduce_metrics(metrics)) == custom(expected_next)
    assert expected_next["len_sum"] > once["len_sum"]  # the lifetime sums carried on
    runner.set_state(start_state)


def test_custom_metrics__scan_and_vmap_give_arrays_per_seed_and_iteration(runner, reference):
    _, per_call, _ = reference
    sampler = runner.sampler
    params = runner.get_state()["rl_module"]

    def loop(key):
        def body(state, _):
            state, _, metrics = sampler.sample(state, params)
            return state, metrics

        return jax.lax.scan(body, sampler.init(key), None, length=CALLS)

    # Seed 0 is the runner's own start (its default key); seed 1 another.
    keys = jnp.stack([sampler.default_key, jax.random.key(11)])
    final, metrics = jax.jit(jax.vmap(loop))(keys)
    reduced = sampler.reduce_metrics(metrics)
    for name in NAMES:
        assert reduced[name].shape == (2, CALLS), name
        expected = np.asarray([m.get(name, np.nan) for m in per_call])
        if name in INTEGER_VALUED:  # episode boundaries and lengths: exact
            np.testing.assert_array_equal(reduced[name][0], expected, err_msg=name)
        else:
            # XLA compiles the vmapped scan as another program than the runner's chunk:
            # CartPole's float32 physics may round differently (1 ulp) in it, so the
            # cart positions these metrics read agree to float32 precision only. The
            # reduction itself is exact (the single-call test and `one` below).
            np.testing.assert_allclose(reduced[name][0], expected, rtol=1e-6, err_msg=name)
    assert not np.array_equal(reduced["len_sum"][0], reduced["len_sum"][1])
    # Each stacked entry is the reduction of that seed's and iteration's metrics alone.
    one = sampler.reduce_metrics(jax.tree.map(lambda x: x[1, -1], metrics))
    assert custom(one) == {k: float(reduced[k][1, -1]) for k in NAMES
                           if not np.isnan(reduced[k][1, -1])}
    # Seed 1's final state, handed to the runner, reports that seed's lifetime sums.
    runner.set_state(sampler.to_runner_state(jax.tree.map(lambda x: x[1], final)))
    got = runner.get_metrics()
    assert got["len_sum"] == reduced["len_sum"][1, -1]
    assert got["max_x_sum"] == reduced["max_x_sum"][1, -1]
    assert got["terminated"] == np.nansum(reduced["terminated"][1])
    runner.set_state(reference[0])


def test_custom_lifetime_sums__keep_float64_precision_on_the_device():
    """The device pair `(hi, lo)` keeps sums a float32 accumulator rounds away: exact
    while the sum fits in 48 bits (as float64 is), else within 2**-48 per addition."""
    from jaxrunner.sampler import _add_exact

    def total(values):
        def body(pair, x):
            return _add_exact(*pair, x), None

        zero = jnp.zeros((1,), jnp.float32)
        (hi, lo), _ = jax.lax.scan(body, (zero, zero), values[:, None])
        return hi, lo

    total = jax.jit(total)

    def host_sum(values):  # the runner's float64 host sum of float32 chunk sums
        out = 0.0
        for v in values:
            out += float(v)
        return out

    # Multiples of 1/8 summing to ~2**33: 36 bits, exact both ways; float32 is not.
    exact = np.float32([2.0**24, 1.0, 0.125, 0.375, 2.0**20 + 0.5, 7.25, 3.0]).repeat(60)
    hi, lo = total(jnp.asarray(exact))
    assert float(hi[0]) + float(lo[0]) == host_sum(exact)
    assert float(np.cumsum(exact, dtype=np.float32)[-1]) != host_sum(exact)
    # Arbitrary floats: off by far less than float32's 2**-24.
    values = np.random.default_rng(0).uniform(0, 2.0**20, 400).astype(np.float32)
    hi, lo = total(jnp.asarray(values))
    error = abs(float(hi[0]) + float(lo[0]) - host_sum(values))
    assert error <= len(values) * 2.0**-48 * host_sum(values)
