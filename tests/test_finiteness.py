"""Observations finite by construction (`jaxrunner.core.finiteness`): the jaxpr analysis,
and the fault check that leaves such observation leaves out without changing a sample."""

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.benchmarking import switched
from jaxrunner.core import chunk
from jaxrunner.core.finiteness import provably_finite
from minatar_helpers import NanOnceBreakout

INT = jax.ShapeDtypeStruct((3,), jnp.int32)
FLOAT = jax.ShapeDtypeStruct((3,), jnp.float32)
BOOL = jax.ShapeDtypeStruct((3,), jnp.bool_)


@pytest.mark.parametrize("fn, arg, finite", [
    (lambda b: b.astype(jnp.float32), BOOL, True),
    (lambda i: i.astype(jnp.float32), INT, True),
    (lambda i: i.astype(jnp.float16), INT, False),  # 2**31 overflows float16
    (lambda i: i.astype(jnp.int8).astype(jnp.float16), INT, True),
    (lambda x: x, FLOAT, False),  # a floating input can hold anything
    (lambda i: i.astype(jnp.float32) * 2.0, INT, False),  # arithmetic can overflow
    (lambda i: jnp.tanh(i * 3), INT, True),
    (lambda i: jnp.where(i > 0, 1.0, -1.0), INT, True),
    (lambda i: jnp.where(i > 0, 1.0, jnp.inf), INT, False),
    (lambda i: jnp.where(i > 0, 1.0, jnp.nan), INT, False),
    (lambda i: jnp.zeros((2, 3)).at[0].set(i.astype(jnp.float32)).reshape(-1), INT, True),
    (lambda i: jnp.concatenate([i.astype(jnp.float32), jnp.ones(2)]), INT, True),
    (lambda x: jnp.clip(x, -1.0, 1.0), FLOAT, False),  # clip(NaN) is NaN
    (lambda i: jax.jit(lambda j: j.astype(jnp.float32))(i), INT, True),
    (lambda i: jax.lax.cond(i[0] > 0, lambda j: j.astype(jnp.float32),
                            lambda j: jnp.zeros(3), i), INT, True),
    (lambda i: jax.lax.cond(i[0] > 0, lambda j: j.astype(jnp.float32),
                            lambda j: jnp.full(3, jnp.inf), i), INT, False),
    (lambda i: jax.lax.fori_loop(0, 3, lambda _, c: jnp.maximum(c, i.astype(jnp.float32)),
                                 jnp.zeros(3)), INT, True),
    (lambda i: jax.lax.fori_loop(0, 3, lambda _, c: c * 2.0, jnp.ones(3)), INT, False),
    (lambda i: jax.lax.scan(lambda c, _: (c, c.astype(jnp.float32)), i, None,
                            length=2)[1], INT, True),
])
def test_provably_finite__per_rule(fn, arg, finite):
    assert provably_finite(fn, arg) == finite


def test_provably_finite__a_pytree_of_leaves_and_none_for_an_untraceable_fn():
    out = provably_finite(lambda i: {"grid": i.astype(jnp.float32), "x": i * 1.5, "n": i}, INT)
    assert out == {"grid": True, "x": False, "n": True}

    def untraceable(i):
        raise TypeError("not traceable")

    assert provably_finite(untraceable, INT) is None


@pytest.mark.parametrize("env_id, finite", [
    ("Breakout-MinAtar", True), ("Asterix-MinAtar", True), ("Freeway-MinAtar", True),
    ("SpaceInvaders-MinAtar", True), ("CartPole-v1", False), ("Pendulum-v1", False),
])
def test_provably_finite__gymnax_observations(env_id, finite):
    env, params = gymnax.make(env_id)
    key = jax.random.key(0)
    _, state = env.reset(key, params)
    action = env.action_space(params).sample(key)
    # The auto-resetting step: the final observation and the next one.
    obs = provably_finite(lambda k, s, a: env.step(k, s, a, params)[0], key, state, action)
    assert obs is finite


def _minatar_config(num_envs=32):
    return (jr.RunnerConfig().environment("Breakout-MinAtar")
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=64)
            .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=3))


def _finite_checks_on(runner, shape) -> int:
    """`is_finite` equations on an operand of `shape` in the runner's traced chunk."""
    fns = runner._fns("explore")
    carry = runner._carry
    args = (carry, runner._lookback, runner._params, runner.env_params, np.int32(8),
            np.int32(1), np.int32(1), np.int32(0))
    jaxpr = jax.make_jaxpr(fns["chunk"])(*args)

    def count(eqns) -> int:
        total = 0
        for eqn in eqns:
            if eqn.primitive.name == "is_finite" and tuple(eqn.invars[0].aval.shape) == shape:
                total += 1
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        total += count(inner.eqns)
        return total

    return count(jaxpr.jaxpr.eqns)


def test_runner__minatar_observation_left_out_of_the_check_with_the_same_samples():
    proven = jr.SingleAgentEnvRunner(config=_minatar_config())
    with switched(chunk, "PROVE_OBS_FINITE", False):  # read at the chunk's first trace
        tested = jr.SingleAgentEnvRunner(config=_minatar_config())
        b = jax.device_get(tested.sample(num_timesteps=32 * 130).trajectory())
    a = jax.device_get(proven.sample(num_timesteps=32 * 130).trajectory())
    grid = (32, 400)  # the check reads each leaf as `(B, -1)`
    assert _finite_checks_on(proven, grid) == 0
    with switched(chunk, "PROVE_OBS_FINITE", False):
        assert _finite_checks_on(tested, grid) > 0
    for field in ("obs", "final_obs", "actions", "rewards", "terminated", "truncated",
                  "failed"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.terminated.any()
    assert proven.get_metrics()["episode_return_mean"] == tested.get_metrics()[
        "episode_return_mean"]


def test_runner__a_large_observation_not_proven_finite_is_still_checked():
    env = NanOnceBreakout()
    config = (_minatar_config(num_envs=8).environment(env)
              .fault_tolerance(restart_failed_sub_environments=True))
    runner = jr.SingleAgentEnvRunner(config=config)
    batch = runner.sample(num_timesteps=8 * 20)
    traj = jax.device_get(batch.trajectory())
    assert traj.failed.any()
    for episode in batch:
        assert np.all(np.isfinite(episode.observations))
    assert runner.get_metrics()["num_env_step_failures"] >= 1
