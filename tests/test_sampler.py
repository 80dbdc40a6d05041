"""The pure sampler (`jaxrunner.Sampler`): the runner's rollout inside the user's own jit
(single- and multi-agent).

Pinned: a fused loop of `sample()` calls equals the same number of `runner.sample()` calls
(trajectories and `get_metrics()`, bit for bit for a seed) through the state round trip;
nothing recompiles when only values change; `lax.scan` and `jax.vmap` over seeds, params
and env params; the host reduction to RLlib's keys (per seed under vmap); clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.metrics import reduce_sample_metrics

from conftest import host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS, T, CALLS = 3, 12, 4
# Wall-clock keys: the fused loop has no host clock.
WALL_CLOCK = {"sample", "time_between_sampling", "num_env_steps_sampled_lifetime_throughput",
              "episode_duration_sec_mean"}


def comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in WALL_CLOCK}


@pytest.fixture(scope="module")
def runner():
    config = make_config(num_envs=NUM_ENVS, fragment=T, hiddens=(8,),
                         episode_lookback_horizon=2).reporting(
        metrics_num_episodes_for_smoothing=5)
    return jaxrunner.SingleAgentEnvRunner(config=config)


@pytest.fixture(scope="module")
def runner_calls(runner):
    """CALLS runner.sample() calls from the runner's fresh state, then get_metrics()."""
    start = runner.get_state(components="all")
    trajs = [jax.device_get(runner.sample(num_timesteps=NUM_ENVS * T).trajectory())
             for _ in range(CALLS)]
    metrics = runner.get_metrics()
    after = runner.get_state(components="all")
    runner.set_state(start)
    return start, trajs, metrics, after


def test_fused_calls__equal_runner_calls_bit_for_bit(runner, runner_calls):
    start, trajs, runner_metrics, after = runner_calls
    sampler = runner.sampler
    assert (sampler.num_envs, sampler.num_steps) == (NUM_ENVS, T)
    state = sampler.from_runner_state(start)
    # A fresh runner's carry is the sampler's init from its default key.
    fresh = sampler.init(sampler.default_key)
    jax.tree.map(np.testing.assert_array_equal, host_tree(fresh), host_tree(state))
    params = runner.get_state()["rl_module"]
    fused = []
    for _ in range(CALLS):
        state, traj, metrics = sampler.sample_jit(state, params)
        fused.append(jax.device_get(traj))
    for ours, theirs in zip(fused, trajs):
        jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    # The fused metrics reduce to what the runner reports.
    reduced = reduce_sample_metrics(metrics)
    assert reduced["num_env_steps_sampled"] == NUM_ENVS * T  # one call's worth
    assert reduced["num_env_steps_sampled_lifetime"] == CALLS * NUM_ENVS * T
    for key in ("episode_return_mean", "episode_len_max", "num_episodes_lifetime",
                "num_env_steps_discarded_lifetime"):
        assert reduced[key] == runner_metrics[key], key
    # The state loads into the runner: same metrics as the runner's own calls, same carry.
    runner.set_state(sampler.to_runner_state(state))
    assert comparable(runner.get_metrics()) == comparable(runner_metrics)
    got = runner.get_state(components="env_runner_carry")["env_runner_carry"]
    jax.tree.map(np.testing.assert_array_equal, (got["carry"], got["lookback"]),
                 (after["env_runner_carry"]["carry"], after["env_runner_carry"]["lookback"]))
    # ... and comes back out: the next fused call equals the runner's next sample().
    back = sampler.from_runner_state(runner.get_state(components="all"))
    _, traj, _ = sampler.sample_jit(back, params, num_steps=5)
    expected = jax.device_get(runner.sample(num_timesteps=NUM_ENVS * 5).trajectory())
    traj = jax.device_get(traj)
    assert int(traj.valid.sum()) == 5
    np.testing.assert_array_equal(traj.actions[:5], expected.actions[:5])
    np.testing.assert_array_equal(traj.rewards[:5], expected.rewards[:5])


def test_sample__compiles_once_for_any_values(runner, compile_counter):
    sampler = runner.sampler
    params = sampler.params
    state = sampler.init(jax.random.key(1))
    state, _, _ = sampler.sample_jit(state, params, num_steps=3)  # warm-up
    shifted = jax.tree.map(lambda x: np.asarray(x) + np.float32(0.1), params)
    compile_counter.reset()
    for steps, p in ((T, shifted), (1, params), (7, shifted)):
        state, traj, _ = sampler.sample_jit(state, p, num_steps=steps)
        assert int(np.asarray(traj.valid).sum()) == steps
    assert compile_counter.count == 0, compile_counter.messages


def test_scan_and_vmap__over_seeds_params_and_env_params(runner):
    sampler = runner.sampler
    seeds = 2
    params = jax.tree.map(lambda x: jnp.stack([x, x * 0.5]), sampler.params)
    env_params = jax.tree.map(lambda x: jnp.stack([x, x]), sampler.env_params)
    env_params = env_params.replace(max_steps_in_episode=jnp.asarray([500, 6]))

    def train(key, params, env_params):
        state = sampler.init(key, params, env_params)

        def body(state, _):
            state, traj, metrics = sampler.sample(state, params, env_params)
            return state, (traj.truncated, metrics)

        return jax.lax.scan(body, state, None, length=2)

    keys = jnp.stack([sampler.default_key, jax.random.key(7)])
    state, (truncated, metrics) = jax.jit(jax.vmap(train))(keys, params, env_params)
    assert truncated.shape == (seeds, 2, T, NUM_ENVS)
    truncated = np.asarray(truncated)
    assert truncated[1].any() and not truncated[0].any()  # env params per seed
    reduced = reduce_sample_metrics(metrics)  # per seed and iteration
    assert reduced["num_env_steps_sampled"].shape == (seeds, 2)
    np.testing.assert_array_equal(reduced["num_env_steps_sampled_lifetime"],
                                  [[T * NUM_ENVS, 2 * T * NUM_ENVS]] * seeds)
    assert reduced["num_episodes_lifetime"][1, -1] >= 2 * NUM_ENVS
    assert reduced["episode_len_max"][1, -1] == 6
    # The last iteration's keys per seed equal one state's reduction.
    one = jax.tree.map(lambda x: x[1, -1], metrics)
    assert reduce_sample_metrics(one)["episode_len_mean"] == reduced["episode_len_mean"][1, -1]
    with pytest.raises(ValueError, match="one state"):
        sampler.to_runner_state(state)
    assert sampler.to_runner_state(jax.tree.map(lambda x: x[0], state))[
        "num_env_steps_sampled_lifetime"] == 2 * T * NUM_ENVS


def test_bad_input__raises_clear_errors(runner):
    sampler = runner.sampler
    state = sampler.init(jax.random.key(0))
    with pytest.raises(TypeError, match="Python bools"):
        sampler.sample(state, sampler.params, explore=jnp.asarray(True))
    with pytest.raises(jaxrunner.StateStructureError, match="env_runner_carry"):
        sampler.from_runner_state(runner.get_state())
    with pytest.raises(ValueError, match="mode must be one of"):
        sampler.chunk_fns("greedy")
    # Runners without a JAX env have no sampler.
    host = jaxrunner.SingleAgentEnvRunner(config=make_config("gymnasium:CartPole-v1"))
    with pytest.raises(ValueError, match="stepped on the host; a pure sampler needs a JAX env"):
        host.sampler
    host.stop()
    local = jaxrunner.SingleAgentEnvRunner(config=make_config(num_env_runners=2),
                                           worker_index=0)
    with pytest.raises(ValueError, match="has no env"):
        local.sampler


def _ma_start(view):
    return {"steps": jnp.zeros((), jnp.int32)}


def _ma_step(state, view):
    return {"steps": state["steps"] + view.acting["player_x"].astype(jnp.int32)}


def _ma_end(state, view):
    return {"x_moves": state["steps"], "x_reward": view.reward["player_x"]}


def test_multi_agent_fused_calls__equal_runner_calls():
    """With device callbacks: their custom keys come out of the fused calls too."""
    config = (jaxrunner.RunnerConfig().environment("TicTacToe-v0")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=6,
                           max_chunk_length=6)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .multi_agent(policies={"main", "opponent"},
                           policy_mapping_fn=lambda agent, episode: (
                               "main" if agent == "player_x" else "opponent"))
              .debugging(seed=3)
              .callbacks(on_episode_start=_ma_start, on_episode_step=_ma_step,
                         on_episode_end=_ma_end,
                         custom_metrics={"x_moves": "max", "x_reward": "sum"}))
    runner = jaxrunner.MultiAgentEnvRunner(config=config)
    start = runner.get_state(components="all")
    for _ in range(3):
        runner.sample(num_timesteps=12)
    expected = comparable(runner.get_metrics())
    runner.set_state(start)
    sampler = runner.sampler
    assert sampler.agent_ids == ("player_x", "player_o")
    state = sampler.from_runner_state(start)
    for _ in range(3):
        state, traj, metrics = sampler.sample_jit(state, sampler.params)
    reduced = sampler.reduce_metrics(metrics)
    assert reduced["num_env_steps_sampled_lifetime"] == 36
    assert "x_moves" in expected  # an episode ended
    for name in ("x_moves", "x_reward"):
        assert reduced[name] == expected[name], name
    assert reduced["num_agent_steps_sampled_lifetime"] == expected[
        "num_agent_steps_sampled_lifetime"]
    runner.set_state(sampler.to_runner_state(state))
    assert comparable(runner.get_metrics()) == expected
