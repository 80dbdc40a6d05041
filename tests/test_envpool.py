"""`config.environment("envpool:<id>")`: EnvPool's C++ pool behind the host engine, its
next-step auto-reset mapped to RLlib's episodes (checked step by step against a plain
Python loop over raw EnvPool pools), with the host envs' metrics, state and fault
contract."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrunner as jr
from conftest import make_config
from jaxrunner.envs.envpool_env import EnvPoolVectorEnv

envpool = pytest.importorskip("envpool")

SEED, NUM_ENVS, LIMIT = 3, 3, 15


def _config(**kwargs):
    return make_config("envpool:CartPole-v1", num_envs=NUM_ENVS, fragment=40, hiddens=(8,),
                       seed=SEED).environment(env_config={"max_episode_steps": LIMIT}
                                              ).fault_tolerance(**kwargs)


@pytest.fixture(scope="module")
def runner():
    runner = jr.SingleAgentEnvRunner(config=_config())
    yield runner
    runner.stop()


def test_steps_equal_a_plain_python_loop_over_raw_envpool(runner):
    """Sub-env i of the pool is EnvPool's env seeded `seed + i`: replaying the recorded
    actions into one raw single-env pool per sub-env (EnvPool's own next-step auto-reset,
    whose reset step is skipped) gives the same observations, rewards, terminated,
    truncated and final observations; no reset step is ever recorded."""
    assert isinstance(runner.env, EnvPoolVectorEnv)
    batch = runner.sample(num_timesteps=NUM_ENVS * 40, random_actions=True, force_reset=True)
    traj = jax.device_get(batch.trajectory())
    steps = int(traj.valid.sum())
    assert traj.terminated[:steps].any() and traj.truncated[:steps].any()
    assert not (traj.terminated & traj.truncated).any()
    for i in range(NUM_ENVS):
        pool = envpool.make_gymnasium("CartPole-v1", num_envs=1, batch_size=1, seed=SEED + i,
                                      max_episode_steps=LIMIT)
        obs, _ = pool.reset()
        for t in range(steps):
            np.testing.assert_allclose(obs[0], traj.obs[t, i])
            obs, reward, terminated, truncated, _ = pool.step(
                np.asarray([traj.actions[t, i]], np.int32))
            assert (reward[0], terminated[0], truncated[0]) == (
                traj.rewards[t, i], traj.terminated[t, i], traj.truncated[t, i])
            np.testing.assert_allclose(obs[0], traj.final_obs[t, i])
            if terminated[0] or truncated[0]:
                obs, reward, *_ = pool.step(np.zeros((1,), np.int32))  # EnvPool's reset step
                assert reward[0] == 0.0
    for episode in batch:
        episode.validate()
        assert len(episode) <= LIMIT
        assert episode.is_truncated == (episode.is_done and not episode.is_terminated)


def test_episodes_metrics_state_and_determinism(runner):
    batch = runner.sample(num_episodes=6)
    assert len(batch) == 6 and all(e.is_done and e.t_started == 0 for e in batch)
    metrics = runner.get_metrics()
    returns = [float(np.sum(e.get_rewards())) for e in batch]
    assert metrics["num_episodes"] >= 6
    again = jr.SingleAgentEnvRunner(config=_config())
    again.set_state(runner.get_state(components="rl_module"))
    other = again.sample(num_episodes=6)
    fresh = jr.SingleAgentEnvRunner(config=_config()).sample(num_episodes=6)
    assert [len(e) for e in other] == [len(e) for e in fresh]  # one seed, one sample
    assert returns and all(r == len(e) for r, e in zip(returns, batch))
    with pytest.raises(ValueError, match="not available for the host"):
        runner.get_state(components="env_runner_carry")
    again.stop()


def test_a_failing_pool_is_recreated_with_a_fresh_seed_and_counted(monkeypatch):
    calls = {"n": 0}
    step = EnvPoolVectorEnv.step

    def failing_step(self, actions):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected EnvPool failure")
        return step(self, actions)

    monkeypatch.setattr(EnvPoolVectorEnv, "step", failing_step)
    runner = jr.SingleAgentEnvRunner(config=_config(restart_failed_sub_environments=True))
    batch = runner.sample(num_timesteps=30, random_actions=True)
    assert batch.env_steps >= 30
    metrics = runner.get_metrics()
    assert metrics["num_env_step_failures"] == 1 and metrics["num_env_steps_discarded"] > 0
    for episode in batch:
        episode.validate()
    # Rows 0-3 are the pool seeded with the runner's seed (sub-env i: seed + i); row 4 is
    # the first step of the recreated pool, whose fresh seed does not replay them.
    traj = jax.device_get(batch.trajectory())
    for i in range(NUM_ENVS):
        seeded = envpool.make_gymnasium("CartPole-v1", num_envs=1, batch_size=1,
                                        seed=SEED + i, max_episode_steps=LIMIT)
        first_obs = seeded.reset()[0][0]
        np.testing.assert_allclose(traj.obs[0, i], first_obs)
        assert not np.allclose(traj.obs[4, i], first_obs)
    runner.stop()


def test_bad_ids_and_settings_are_explained():
    with pytest.raises(ValueError, match="Did you mean 'CartPole-v1'"):
        jr.SingleAgentEnvRunner(config=make_config("envpool:CartPole-v9"))
    with pytest.raises(ValueError, match="EnvPool's own C\\+\\+ thread pool"):
        jr.SingleAgentEnvRunner(config=make_config("envpool:CartPole-v1",
                                                   gym_env_vectorize_mode="async"))
