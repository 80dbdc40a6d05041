"""Observations that only hold small integers (`jaxrunner.core.value_range`): the jaxpr
analysis, and the final-observation store that keeps such leaves in a narrow integer
dtype without changing a sample."""

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.benchmarking import switched
from jaxrunner.core import chunk
from jaxrunner.core.dependence import trace_abstract
from jaxrunner.core.value_range import storage_dtypes
from minatar_helpers import NanOnceBreakout

# A constant a jitted function closes over: its values, not its finiteness, decide.
HALVES, TWOS = jnp.full(6, 0.5), jnp.full(6, 2.0)

INT = jax.ShapeDtypeStruct((6,), jnp.int32)
INT8 = jax.ShapeDtypeStruct((6,), jnp.int8)
FLOAT = jax.ShapeDtypeStruct((6,), jnp.float32)
BOOL = jax.ShapeDtypeStruct((6,), jnp.bool_)
F32, U8, I8, U16 = (jnp.dtype(d) for d in (jnp.float32, jnp.uint8, jnp.int8, jnp.uint16))


def _grid(b):
    return b.astype(jnp.float32)


@pytest.mark.parametrize("fn, arg, dtype", [
    (_grid, BOOL, U8),
    (lambda b: b.astype(jnp.float16), BOOL, U8),
    (lambda i: i.astype(jnp.float32), INT8, I8),
    (lambda i: i.astype(jnp.float32), INT, F32),  # int32's range: not exact, not narrow
    (lambda i: jnp.clip(i, 0, 200).astype(jnp.float32), INT, U8),
    (lambda i: jnp.clip(i, 0, 60000).astype(jnp.float32), INT, U16),
    (lambda i: jnp.clip(i, 0, 70000).astype(jnp.float32), INT, F32),  # no 16-bit dtype
    # bfloat16 rounds integers above 256: what comes back is not the integer put in.
    (lambda i: jnp.clip(i, 0, 1000).astype(jnp.bfloat16).astype(jnp.float32), INT, F32),
    (lambda b: (b.astype(jnp.int32) + b.astype(jnp.int32)).astype(jnp.float32), BOOL, U8),
    (lambda b: (b.astype(jnp.int32) * -3).astype(jnp.float32), BOOL, I8),
    (lambda i: (i.astype(jnp.int32) * 1000).astype(jnp.float32), INT8, F32),
    (lambda x: x, FLOAT, F32),  # a floating input can hold anything
    (lambda x: jnp.round(x), FLOAT, F32),
    (lambda b: _grid(b) * 2.0, BOOL, F32),  # float arithmetic: not followed
    (lambda b: _grid(b) + 0.5, BOOL, F32),
    (lambda b: -_grid(b), BOOL, F32),  # -0.0 would come back as +0.0
    (lambda b: jnp.where(b, 2.0, -0.0), BOOL, F32),
    (lambda b: jnp.where(b, 2.0, 0.5), BOOL, F32),  # a fraction
    (lambda b: jnp.where(b, 2.0, jnp.nan), BOOL, F32),
    (lambda b: jnp.where(b, 3.0, -1.0), BOOL, I8),
    (lambda b: jnp.abs(jnp.where(b, 3.0, -7.0)), BOOL, U8),
    (lambda b: jnp.floor(_grid(b)), BOOL, U8),
    (lambda b: jnp.maximum(_grid(b), 4.0), BOOL, U8),
    (lambda b: jnp.concatenate([_grid(b), jnp.full(2, 9.0)]), BOOL, U8),
    (lambda b: jnp.stack([_grid(b), _grid(~b)]).T.reshape(-1)[::2], BOOL, U8),
    (lambda b: jnp.zeros((2, 6)).at[1].set(_grid(b)).sum(0), BOOL, F32),  # a sum
    (lambda b: jnp.zeros((2, 6)).at[1].set(_grid(b)), BOOL, U8),
    (lambda b: jnp.pad(_grid(b), 2, constant_values=5.0), BOOL, U8),
    (lambda b: _grid(b).at[jnp.array([1, 9])].get(mode="fill"), BOOL, F32),  # NaN fill
    (lambda b: _grid(b).at[jnp.array([1, 9])].get(mode="fill", fill_value=0.0), BOOL, U8),
    # An integer gather's default fill is the dtype's minimum, not one of the operand's.
    (lambda b: b.astype(jnp.int32).at[jnp.array([1, 9])].get(mode="fill").astype(
        jnp.float32), BOOL, F32),
    (lambda b: jax.jit(lambda c: jnp.where(c, HALVES, 1.0))(b), BOOL, F32),
    (lambda b: jax.jit(lambda c: jnp.where(c, TWOS, 1.0))(b), BOOL, U8),
    (lambda b: jnp.full(3, _grid(b)[jnp.argmax(b)]), BOOL, U8),
    (lambda b: jnp.sort(_grid(b)), BOOL, U8),
    (lambda b: jax.jit(_grid)(b), BOOL, U8),
    (lambda b: jax.lax.cond(b[0], _grid, lambda c: jnp.full(6, 7.0), b), BOOL, U8),
    (lambda b: jax.lax.cond(b[0], _grid, lambda c: jnp.full(6, 0.25), b), BOOL, F32),
    (lambda b: jax.lax.fori_loop(0, 3, lambda _, c: jnp.maximum(c, _grid(b)), jnp.zeros(6)),
     BOOL, U8),
    # A counter that grows every step: widened to int32's range, then not exact.
    (lambda b: jax.lax.fori_loop(0, 3, lambda _, c: c + 1, b.astype(jnp.int32)
                                 ).astype(jnp.float32), BOOL, F32),
    (lambda b: jax.lax.scan(lambda c, _: (~c, _grid(c)), b, None, length=4)[1], BOOL, U8),
])
def test_storage_dtypes__per_rule(fn, arg, dtype):
    assert storage_dtypes(fn, arg) == dtype
    if dtype != F32:  # the narrow dtype holds every value of a concrete run exactly
        value = jax.jit(fn)(_concrete(arg))
        np.testing.assert_array_equal(value.astype(dtype).astype(value.dtype), value)


def _concrete(arg):
    values = np.array([0, 1, 1, 0, 127, -128]) if arg.dtype != jnp.bool_ else np.array(
        [True, False, True, True, False, False])
    return jnp.asarray(values, arg.dtype)


def test_storage_dtypes__a_pytree_of_leaves_and_none_for_an_untraceable_fn():
    out = storage_dtypes(lambda b: {"grid": _grid(b), "x": _grid(b) * 1.5, "n": b}, BOOL)
    assert out == {"grid": U8, "x": F32, "n": jnp.dtype(jnp.bool_)}

    def untraceable(b):
        raise TypeError("not traceable")

    assert storage_dtypes(untraceable, BOOL) is None


@pytest.mark.parametrize("env_id, dtype", [
    ("Breakout-MinAtar", U8), ("Asterix-MinAtar", U8), ("Freeway-MinAtar", U8),
    ("SpaceInvaders-MinAtar", U8), ("CartPole-v1", F32), ("Pendulum-v1", F32),
    ("Acrobot-v1", F32),
])
def test_storage_dtypes__gymnax_observations(env_id, dtype):
    env, params = gymnax.make(env_id)
    key = jax.random.key(0)
    _, state = env.reset(key, params)
    action = env.action_space(params).sample(key)
    # The auto-resetting step: the final observation and the next one.
    assert storage_dtypes(lambda k, s, a: env.step(k, s, a, params)[0], key, state,
                          action) == dtype


def _config(env_id="Breakout-MinAtar", num_envs=32):
    return (jr.RunnerConfig().environment(env_id)
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=64)
            .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=3))


def test_runner__minatar_store_kept_in_uint8_with_the_same_samples():
    narrow = jr.SingleAgentEnvRunner(config=_config())
    with switched(chunk, "NARROW_ROW_STORE", False):  # read at the chunk's first trace
        wide = jr.SingleAgentEnvRunner(config=_config())
        b_batch = wide.sample(num_timesteps=32 * 130)
    a_batch = narrow.sample(num_timesteps=32 * 130)
    stores = [c.final_obs_store.obs.dtype for c in (a_batch.chunks[0], b_batch.chunks[0])]
    assert stores == [U8, F32]
    a, b = jax.device_get((a_batch.trajectory(), b_batch.trajectory()))
    for field in ("obs", "final_obs", "actions", "rewards", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.final_obs.dtype == np.float32 and a.terminated.any()
    # The host episodes read the store's rows one by one: float32 and the same.
    episodes_a, episodes_b = list(a_batch), list(b_batch)
    assert len(episodes_a) == len(episodes_b) > 32
    for x, y in zip(episodes_a, episodes_b):
        obs_x, obs_y = np.asarray(x.get_observations()), np.asarray(y.get_observations())
        assert obs_x.dtype == np.float32
        np.testing.assert_array_equal(obs_x, obs_y)
    assert narrow.get_metrics()["episode_return_mean"] == wide.get_metrics()[
        "episode_return_mean"]


def test_runner__minatar_trajectory_obs_kept_in_uint8_and_read_widened():
    """The chunk records MinAtar's float32 grids in uint8 (`Trajectory.stored_obs`);
    every reader (`Trajectory.obs`, the dense final observations, host episodes and their
    lookback, the PPO update, the pure sampler) sees the float32 values it saw before."""
    from jaxrunner.learners.ppo import PPOConfig, PPOLearner

    narrow = jr.SingleAgentEnvRunner(config=_config(num_envs=16))
    with switched(chunk, "NARROW_TRAJECTORY_OBS", False):  # read at the chunk's first trace
        wide = jr.SingleAgentEnvRunner(config=_config(num_envs=16))
        wide_batches = [wide.sample(num_timesteps=16 * 50) for _ in range(2)]
    narrow_batches = [narrow.sample(num_timesteps=16 * 50) for _ in range(2)]
    a_chunk, b_chunk = narrow_batches[0].chunks[0], wide_batches[0].chunks[0]
    assert (a_chunk.stored_obs.dtype, a_chunk.obs_dtypes) == (U8, (F32,))
    assert (b_chunk.stored_obs.dtype, b_chunk.obs_dtypes) == (F32, None)
    assert a_chunk.stored_obs.nbytes * 4 == b_chunk.stored_obs.nbytes
    for a_batch, b_batch in zip(narrow_batches, wide_batches):
        a, b = a_batch.trajectory(), b_batch.trajectory()
        assert a.obs.dtype == a.final_obs.dtype == F32  # device arrays, read eagerly
        a_host, b_host = jax.device_get((a, b))
        for field in ("obs", "final_obs", "actions", "rewards", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(a_host, field), getattr(b_host, field),
                                          err_msg=field)
        assert a_host.obs.dtype == np.float32 and a_host.obs.any()
        episodes_a, episodes_b = list(a_batch), list(b_batch)
        assert len(episodes_a) == len(episodes_b) >= 16
        for x, y in zip(episodes_a, episodes_b):
            for obs_x, obs_y in ((x.get_observations(), y.get_observations()),
                                 (x.lookback_observations, y.lookback_observations)):
                assert np.asarray(obs_x).dtype == np.float32
                np.testing.assert_array_equal(obs_x, obs_y)
    # The second call's cut episodes carry lookback rolled from the narrow trajectory.
    assert any(len(e.lookback_observations) for e in narrow_batches[1])
    # The PPO update reads the widened observations inside its jit: the same update.
    learner = PPOLearner.from_runner(narrow, PPOConfig(num_epochs=1, num_minibatches=2))
    (a_state, a_stats), (b_state, b_stats) = (
        learner._update(learner.state, batch.trajectory())
        for batch in (narrow_batches[1], wide_batches[1]))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get((a_state.params, a_stats)),
                 jax.device_get((b_state.params, b_stats)))


def test_runner__a_small_observation_or_one_not_only_integers_keeps_its_dtype():
    runner = jr.SingleAgentEnvRunner(config=_config("CartPole-v1", num_envs=4))
    first = runner.sample(num_timesteps=40).chunks[0]
    assert first.final_obs_store.obs.dtype == first.stored_obs.dtype == F32
    assert first.obs_dtypes is None
    # Breakout's grid with a NaN written into it: large, but not only small integers.
    runner = jr.SingleAgentEnvRunner(config=_config(num_envs=8).environment(
        NanOnceBreakout()).fault_tolerance(restart_failed_sub_environments=True))
    first = runner.sample(num_timesteps=80).chunks[0]
    assert first.final_obs_store.obs.dtype == first.stored_obs.dtype == F32


def test_runner__the_step_is_traced_once_for_both_the_check_and_the_store(monkeypatch):
    """The fault check's finiteness and the store's dtypes are read from one trace of the
    vector step, once per compiled chunk."""
    traces = []

    def counted(fn, *args):
        traces.append(fn)
        return trace_abstract(fn, *args)

    monkeypatch.setattr(chunk, "trace_abstract", counted)
    runner = jr.SingleAgentEnvRunner(config=_config(num_envs=8))
    batch = runner.sample(num_timesteps=8 * 70)
    runner.sample(num_timesteps=8 * 10)
    assert len(traces) == 1
    assert batch.chunks[0].final_obs_store.obs.dtype == U8
