"""Sub-environment fault tolerance of the compiled runner: failure flags, non-finite
checks, recreation of the failed sub-env only, discarded episodes, errors."""

import logging

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole

import jaxrunner as jr
from jaxrunner.core.rollout import mark_step_failed
from jaxrunner.testing.envs import FlakyEnv

PERIOD = 100  # about 1% of steps fail


def _config(mode="flag", restart=True, num_envs=64, **fault_kwargs):
    inner, _ = gymnax.make("CartPole-v1")
    return (jr.RunnerConfig().environment(FlakyEnv(inner, PERIOD, mode))
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=50)
            .fault_tolerance(restart_failed_sub_environments=restart, **fault_kwargs)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))


@pytest.mark.parametrize("mode", ["flag", "nan"])
def test_restart__200k_steps_failed_episodes_discarded_and_counted(mode, caplog):
    runner = jr.SingleAgentEnvRunner(config=_config(mode))
    injected, returned, calls = 0, 0, 0
    finished_returns = []
    with caplog.at_level(logging.WARNING):
        while returned < 200_000:
            asked = 5000
            batch = runner.sample(num_timesteps=asked)
            calls += 1
            steps = sum(len(e) for e in batch)
            assert steps >= asked and steps == batch.env_steps
            returned += steps
            traj = jax.device_get(batch.trajectory())
            injected += int(FlakyEnv.fails(np.asarray(traj.obs)[traj.valid], PERIOD).sum())
            for episode in batch:
                episode.validate()
                # No returned step comes from an episode whose sub-env failed.
                assert not FlakyEnv.fails(np.asarray(episode.observations[:-1]), PERIOD).any()
                assert np.all(np.isfinite(episode.observations))
                if episode.is_done:
                    finished_returns.append(episode)
    metrics = runner.get_metrics()
    assert injected > 1000
    assert metrics["num_env_step_failures"] == injected
    assert metrics["num_env_steps_discarded"] > 0
    assert (metrics["num_env_steps_sampled"]
            == returned + metrics["num_env_steps_discarded"])
    # Failed episodes never reach the metrics: the window holds finite CartPole returns.
    assert np.isfinite(metrics["episode_return_mean"])
    assert metrics["episode_return_min"] >= 1.0
    # One warning per call with failures, never one per failure.
    warnings = [r for r in caplog.records if "sub-environment step failure" in r.message]
    assert 0 < len(warnings) <= calls


def test_restart__episode_mode_returns_only_complete_unfailed_episodes():
    runner = jr.SingleAgentEnvRunner(config=_config())
    batch = runner.sample(num_episodes=200)
    assert len(batch) == 200
    for episode in batch:
        assert episode.is_done and episode.t_started == 0
        assert not FlakyEnv.fails(np.asarray(episode.observations[:-1]), PERIOD).any()


def test_no_restart__raises_with_the_hint_and_next_sample_starts_clean():
    runner = jr.SingleAgentEnvRunner(config=_config(restart=False))
    with pytest.raises(RuntimeError, match=r"Sub-environment \d+ .*failed at vector step \d+.*"
                                           r"restart_failed_sub_environments=True"):
        runner.sample(num_timesteps=5000)
    assert runner.get_metrics()["num_env_step_failures"] > 0
    # A runner on a well-behaved env with the same settings keeps working after errors.
    healthy = jr.SingleAgentEnvRunner(
        config=_config(restart=False).environment("CartPole-v1"))
    assert healthy.sample(num_timesteps=640).env_steps == 640
    # The failing runner keeps failing with the same clear error, and still counts.
    failures = runner.get_metrics()["num_env_step_failures"]
    with pytest.raises(RuntimeError, match="restart_failed_sub_environments=True"):
        runner.sample(num_timesteps=5000)
    assert runner.get_metrics()["num_env_step_failures"] > failures


class _FailsAtStepFive(CartPole):
    """CartPole whose sub-envs fail on the 5th step of every episode (and on no other)."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, reward, done, mark_step_failed(info, state.time == 5)


def test_no_restart__the_sample_after_the_error_starts_fresh():
    num_envs = 4
    runner = jr.SingleAgentEnvRunner(config=_config(restart=False, num_envs=num_envs)
                                     .environment(_FailsAtStepFive()))
    first = runner.sample(num_timesteps=4 * num_envs)  # 4 steps: no episode reaches step 5
    assert all(not e.is_done and e.t_started == 0 for e in first)
    with pytest.raises(RuntimeError, match="failed at vector step 0 of this sample"):
        runner.sample(num_timesteps=4 * num_envs)  # the 5th step of every episode fails
    # Started fresh: new episodes from step 0 (a continued carry would be past step 5, and
    # would continue the episodes of `first`).
    batch = runner.sample(num_timesteps=4 * num_envs)
    assert batch.env_steps == 4 * num_envs
    assert all(e.t_started == 0 and len(e) == 4 for e in batch)
    assert not {e.id_ for e in batch} & {e.id_ for e in first}


def test_check_finite_off__nan_passes_through_unchecked():
    runner = jr.SingleAgentEnvRunner(config=_config("nan", restart=False, check_finite=False))
    batch = runner.sample(num_timesteps=5000)
    traj = jax.device_get(batch.trajectory())
    assert not np.all(np.isfinite(traj.final_obs[traj.valid]))
    assert runner.get_metrics()["num_env_step_failures"] == 0


class _AlwaysFails(FlakyEnv):
    @staticmethod
    def fails(obs, period):
        return jnp.ones(obs.shape[:-1], jnp.bool_)


def test_env_that_fails_forever_stops_with_a_clear_error():
    inner, _ = gymnax.make("CartPole-v1")
    config = (_config(num_consecutive_sub_env_failures_tolerance=5)
              .environment(_AlwaysFails(inner, PERIOD)))
    runner = jr.SingleAgentEnvRunner(config=config)
    with pytest.raises(RuntimeError, match="fails forever"):
        runner.sample(num_timesteps=640)


class _EveryEpisodeFails(CartPole):
    """CartPole whose every episode fails at its third step (recreated, it runs again)."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, reward, done, mark_step_failed(info, state.time == 3)


@pytest.mark.timeout(120)
def test_env_whose_every_episode_fails_stops_with_a_clear_error_instead_of_topping_up():
    config = _config().environment(_EveryEpisodeFails())
    runner = jr.SingleAgentEnvRunner(config=config)
    with pytest.raises(RuntimeError, match="nearly every episode fails"):
        runner.sample(num_timesteps=640)
    # The runner still works: a call small enough for the steps in flight returns them.
    batch = runner.sample(num_timesteps=64)
    assert batch.env_steps >= 64


@pytest.mark.default_codegen  # two programs compared bit for bit (tests/conftest.py)
def test_fault_check_does_not_change_clean_runs():
    clean = jr.SingleAgentEnvRunner(config=_config().environment("CartPole-v1"))
    unchecked = jr.SingleAgentEnvRunner(config=_config(check_finite=False).environment(
        "CartPole-v1"))
    a = jax.device_get(clean.sample(num_timesteps=3200).trajectory())
    b = jax.device_get(unchecked.sample(num_timesteps=3200).trajectory())
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.actions, b.actions)
    assert not a.failed.any()


@pytest.mark.parametrize("mode", ["flag", "nan"])
def test_failures_and_recreation_compile_nothing_after_the_first_calls(mode, compile_counter):
    """Failure checks, recreation of failed sub-envs and the top-up to the asked size run
    inside the compiled program: once a timestep call and an episode call have run, calls
    with failures in them compile nothing (the `jax_log_compiles` counter stays at 0)."""
    num_envs = 16
    runner = jr.SingleAgentEnvRunner(config=_config(mode, num_envs=num_envs))
    runner.sample(num_timesteps=1600)  # 100 vector steps: about 16 failures recovered
    runner.sample(num_episodes=4)
    failures_before = runner.get_metrics()["num_env_step_failures"]
    assert failures_before > 0, "the warm-up should already have recovered failures"
    assert compile_counter.count > 0  # the first calls compiled: the counter is listening
    compile_counter.reset()
    returned = 0
    for n in (1, 37, 800, 1600, 2500):
        batch = runner.sample(num_timesteps=n)
        assert n <= batch.env_steps == sum(len(e) for e in batch)
        returned += batch.env_steps
    for k in (1, 6):
        assert len(runner.sample(num_episodes=k)) == k
    metrics = runner.get_metrics()
    # Failures happened after the first calls, so the recovery path ran without compiling.
    assert metrics["num_env_step_failures"] > failures_before
    assert metrics["num_env_steps_discarded"] > 0
    assert returned > 0
    assert compile_counter.count == 0, "\n".join(compile_counter.messages)


def test_mark_step_failed_helper_sets_the_documented_key():
    from jaxrunner.core.rollout import FAILURE_INFO_KEY

    info = mark_step_failed({"x": 1}, jnp.bool_(True))
    assert FAILURE_INFO_KEY == "env_step_failed" and bool(info[FAILURE_INFO_KEY])
    assert info["x"] == 1


@pytest.mark.parametrize("small_leaves_check", ["columns", "joined", "auto"])
@pytest.mark.parametrize("layout", ["small", "large", "mixed_dtypes"])
def test_all_finite__each_sub_env_flagged_exactly_whether_leaves_are_joined_or_not(
        layout, small_leaves_check, monkeypatch):
    """`all_finite` checks small floating leaves column by column (or joined into one
    reduction per dtype) and large ones leaf by leaf; either way a sub-env is finite iff
    every floating value of its entries is (integer leaves ignored), and no cast can turn
    a finite value into an infinite one (a float16 leaf next to float32 ones stays
    float16)."""
    from jaxrunner.core import faults
    from jaxrunner.core.faults import CONCATENATED_CHECK_MAX_BYTES, all_finite

    monkeypatch.setattr(faults, "SMALL_LEAVES_CHECK", small_leaves_check)
    assert faults.small_leaves_check() == {"auto": "joined"}.get(small_leaves_check,
                                                                 small_leaves_check)

    num_envs = 6
    obs_shape = {"small": (3,), "large": (CONCATENATED_CHECK_MAX_BYTES,),
                 "mixed_dtypes": (2, 2)}[layout]
    tree = {"obs": np.zeros((num_envs,) + obs_shape, np.float32),
            "reward": np.ones((num_envs,), np.float32),
            "count": np.full((num_envs, 2), 7, np.int32)}
    if layout == "mixed_dtypes":
        tree["half"] = np.full((num_envs, 2), 60000.0, np.float16)  # finite, near float16's max
        tree["reward"][:] = 1e6  # finite in float32, infinite if cast to float16
    small = sum(np.prod(v.shape[1:]) * v.dtype.itemsize for v in jax.tree.leaves(tree)
                if np.issubdtype(v.dtype, np.floating)) <= CONCATENATED_CHECK_MAX_BYTES
    assert small == (layout != "large")
    np.testing.assert_array_equal(all_finite(tree), np.ones(num_envs, bool))
    tree["obs"].reshape(num_envs, -1)[1, -1] = np.nan
    tree["reward"][3] = np.inf
    tree["count"][4] = -1  # integers are never a failure
    expected = np.array([True, False, True, False, True, True])
    if layout == "mixed_dtypes":
        tree["half"][5, 0] = -np.inf
        expected[5] = False
    np.testing.assert_array_equal(jax.jit(all_finite)(tree), expected)
    assert all_finite({"count": tree["count"]}) is None
