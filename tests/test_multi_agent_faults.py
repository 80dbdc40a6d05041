"""Sub-env fault tolerance of the multi-agent runner: the same contract as single-agent
(the one chunk does it for both). A failed sub-env's episode is discarded for every
agent, never returned and never in the metrics, counted in `num_env_step_failures` and
`num_env_steps_discarded`; `sample()` still returns at least the asked size; with restarts
off a `RuntimeError` names the sub-env, the step and the setting."""

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole
from jaxrunner.testing.envs import FlakyEnv, make_flaky_multi_agent_env

PERIOD = 50  # about 2% of steps fail


def _config(mode="flag", restart=True, num_envs=16, count_steps_by="env_steps", **env_runners):
    env = make_flaky_multi_agent_env(MultiAgentCartPole(2), PERIOD, mode)
    return (jr.RunnerConfig().environment(env)
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=40,
                         **env_runners)
            .fault_tolerance(restart_failed_sub_environments=restart)
            .multi_agent(policies={"p0", "p1"}, count_steps_by=count_steps_by,
                         policy_mapping_fn=lambda agent, episode: "p0" if agent == "agent_0"
                         else "p1")
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))


def _first_agent_obs(episode):
    """agent_0's observations the agent acted on, `(n, 4)`."""
    agent = episode.agent_episodes.get("agent_0")
    return None if agent is None else np.asarray(agent.observations)[:-1]


@pytest.mark.parametrize("mode", ["flag", "nan"])
def test_restart__failed_episodes_discarded_for_every_agent_and_counted(mode):
    runner = jr.MultiAgentEnvRunner(config=_config(mode))
    injected, returned = 0, 0
    for _ in range(6):
        asked = 1000
        batch = runner.sample(num_timesteps=asked)
        steps = sum(len(e) for e in batch)
        assert steps >= asked and steps == batch.env_steps
        returned += steps
        traj = jax.device_get(batch.trajectory())
        injected += int((traj.failed & traj.valid[:, None]).sum())
        for episode in batch:
            episode.validate()
            obs = _first_agent_obs(episode)
            if obs is not None and len(obs):
                # No returned step comes from an episode whose sub-env failed.
                assert not FlakyEnv.fails(obs, PERIOD).any()
                assert np.all(np.isfinite(obs))
            for agent in episode.agent_episodes.values():
                assert np.all(np.isfinite(np.asarray(agent.observations)))
    metrics = runner.get_metrics()
    assert injected > 20
    assert metrics["num_env_step_failures"] == injected
    assert metrics["num_env_steps_discarded"] > 0
    assert metrics["num_env_steps_sampled"] == returned + metrics["num_env_steps_discarded"]
    assert np.isfinite(metrics["episode_return_mean"])
    assert metrics["episode_return_min"] >= 2.0  # both poles stand for at least one step


def test_restart__episode_mode_returns_only_unfailed_episodes_and_metrics_match():
    runner = jr.MultiAgentEnvRunner(config=_config(num_envs=8).reporting(
        metrics_num_episodes_for_smoothing=1000))
    batch = runner.sample(num_episodes=40)
    assert len(batch) == 40
    returns = []
    for episode in batch:
        assert episode.is_done and episode.env_t_started == 0
        obs = _first_agent_obs(episode)
        assert not FlakyEnv.fails(obs, PERIOD).any()
        returns.append(episode.get_return())
    metrics = runner.get_metrics()
    assert metrics["num_env_step_failures"] > 0
    assert metrics["num_episodes"] == 40
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(returns), rel=1e-5)
    # Per agent: the agent returns of the same episodes, nothing of the failed ones.
    agent_0 = [e.agent_episodes["agent_0"].get_return() for e in batch
               if "agent_0" in e.agent_episodes]
    assert metrics["agent_episode_return_mean"]["agent_0"] == pytest.approx(
        np.mean(agent_0), rel=1e-5)


def test_restart__agent_steps_mode_returns_at_least_the_asked_agent_steps():
    runner = jr.MultiAgentEnvRunner(config=_config(count_steps_by="agent_steps"))
    for asked in (500, 1500, 37):
        batch = runner.sample(num_timesteps=asked)
        assert batch.agent_steps() >= asked
        for episode in batch:
            obs = _first_agent_obs(episode)
            if obs is not None and len(obs):
                assert not FlakyEnv.fails(obs, PERIOD).any()
    assert runner.get_metrics()["num_env_step_failures"] > 0


@pytest.mark.parametrize("mode", ["flag", "nan"])
def test_no_restart__raises_naming_sub_env_step_and_setting(mode):
    runner = jr.MultiAgentEnvRunner(config=_config(mode, restart=False))
    with pytest.raises(RuntimeError, match=r"Sub-environment \d+ .*failed at vector step \d+.*"
                                           r"restart_failed_sub_environments=True"):
        for _ in range(20):
            runner.sample(num_timesteps=1000)
    assert runner.get_metrics()["num_env_step_failures"] > 0


def test_nan_observations_are_never_returned_silently():
    """Before the one chunk, a multi-agent runner returned NaN observations without a
    failure: now `check_finite` (on by default) discards and counts them."""
    runner = jr.MultiAgentEnvRunner(config=_config("nan"))
    batch = runner.sample(num_timesteps=2000)
    traj = jax.device_get(batch.trajectory())
    for episode in batch:
        for agent in episode.agent_episodes.values():
            assert np.all(np.isfinite(np.asarray(agent.observations)))
    assert int(traj.failed.sum()) == runner.get_metrics()["num_env_step_failures"] > 0


def test_failures_compile_nothing_after_warm_up(compile_counter):
    runner = jr.MultiAgentEnvRunner(config=_config())
    runner.sample(num_timesteps=200)
    runner.sample(num_episodes=2)
    runner.get_metrics()
    compile_counter.reset()
    for n in (1, 77, 640, 200):
        runner.sample(num_timesteps=n)
    runner.sample(num_episodes=5)
    metrics = runner.get_metrics()
    assert compile_counter.count == 0, compile_counter.messages
    assert metrics["num_env_step_failures"] > 0  # the chunks above did fail and recover
