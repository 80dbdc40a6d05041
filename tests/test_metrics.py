"""`get_metrics()`: RLlib's keys, the smoothing window, whole-episode accounting."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import jaxrunner

from conftest import make_config, whole_episodes

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 2
EPISODE_KEYS = ("episode_return_mean", "episode_return_min", "episode_return_max",
                "episode_len_mean", "episode_len_min", "episode_len_max",
                "episode_duration_sec_mean", "agent_episode_return_mean",
                "module_episode_return_mean")
COUNTER_KEYS = ("num_env_steps_sampled", "num_env_steps_sampled_lifetime",
                "num_env_steps_sampled_lifetime_throughput", "num_episodes",
                "num_episodes_lifetime", "num_env_step_failures", "weights_seq_no")


@pytest.fixture(scope="module")
def runner():
    """Smoothing window of 10 episodes (no remote runners: W = 10)."""
    config = make_config(num_envs=NUM_ENVS, fragment=8)
    config.reporting(metrics_num_episodes_for_smoothing=10)
    return jaxrunner.SingleAgentEnvRunner(config=config)


def test_metrics__keys_have_rllib_names(runner):
    runner.get_metrics()
    runner.sample(num_episodes=3)
    metrics = runner.get_metrics()
    for key in EPISODE_KEYS + COUNTER_KEYS:
        assert key in metrics, key
    assert set(metrics["agent_episode_return_mean"]) == {"default_agent"}
    assert set(metrics["module_episode_return_mean"]) == {"default_policy"}
    assert metrics["agent_episode_return_mean"]["default_agent"] == pytest.approx(
        metrics["episode_return_mean"])
    assert metrics["module_episode_return_mean"]["default_policy"] == pytest.approx(
        metrics["episode_return_mean"])
    assert metrics["num_env_step_failures"] == 0
    assert isinstance(metrics["episode_duration_sec_mean"], float)
    assert "sample" in metrics  # the sample timer
    for key in ("num_env_steps_sampled", "num_env_steps_sampled_lifetime", "num_episodes",
                "num_episodes_lifetime", "episode_len_min", "episode_len_max"):
        assert isinstance(metrics[key], int), key
    # CartPole pays 1 per step.
    assert metrics["episode_return_mean"] == pytest.approx(metrics["episode_len_mean"])


def test_metrics__episode_keys_absent_before_any_sample():
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=NUM_ENVS, fragment=8))
    metrics = runner.get_metrics()
    assert not set(EPISODE_KEYS) & set(metrics)
    assert metrics["num_episodes"] == 0 and metrics["num_env_steps_sampled"] == 0
    assert metrics["num_env_steps_sampled_lifetime"] == 0


@pytest.mark.parametrize("smoothing, num_env_runners", [(10, 0), (10, 3)])
def test_metrics__smoothing_window_is_last_w_episodes(smoothing, num_env_runners, request):
    window = max(1, math.ceil(smoothing / max(1, num_env_runners)))
    if num_env_runners == 0:
        runner = request.getfixturevalue("runner")  # built with smoothing 10
        assert runner.config.metrics_window == window
    else:
        config = make_config(num_envs=NUM_ENVS, fragment=8, num_env_runners=num_env_runners)
        config.reporting(metrics_num_episodes_for_smoothing=smoothing)
        runner = jaxrunner.SingleAgentEnvRunner(config=config)
    runner.get_metrics()
    finished = []
    for k in (3, 5, 7):  # episode mode returns them in the order they finished
        batch = runner.sample(num_episodes=k)
        finished += [(e.get_return(), len(e)) for e in batch]
    assert len(finished) > window
    metrics = runner.get_metrics()
    returns = np.array([r for r, _ in finished[-window:]])
    lengths = np.array([n for _, n in finished[-window:]])
    assert metrics["episode_return_mean"] == pytest.approx(returns.mean())
    assert metrics["episode_return_min"] == returns.min()
    assert metrics["episode_return_max"] == returns.max()
    assert metrics["episode_len_mean"] == pytest.approx(lengths.mean())
    assert metrics["episode_len_min"] == lengths.min()
    assert metrics["episode_len_max"] == lengths.max()
    assert metrics["num_episodes"] == len(finished)
    # A window over all episodes would give another mean (the check is not vacuous).
    all_lengths = np.array([n for _, n in finished])
    if not np.isclose(all_lengths.mean(), lengths.mean()):
        assert metrics["episode_len_mean"] != pytest.approx(all_lengths.mean())


def test_metrics__episode_durations_lie_within_the_calls_wall_time():
    """Each episode's duration is positive and no longer than the wall time of the
    `sample()` call it ran in, taken by the test around the call (no speed asserted)."""
    config = make_config(num_envs=NUM_ENVS, fragment=8)
    config.reporting(metrics_num_episodes_for_smoothing=1000)  # the window keeps them all
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    before = time.perf_counter()
    batch = runner.sample(num_episodes=4)  # a fresh runner: every episode starts in it
    wall = time.perf_counter() - before
    window = runner.get_metrics_window()
    metrics = runner.get_metrics()
    durations = window["episode_duration_sec"]
    assert durations.dtype == np.float64
    # The window holds the 4 returned episodes and any other that ended in the call.
    assert len(durations) == metrics["num_episodes"] >= len(batch) == 4
    lengths = window["episode_len"].tolist()
    for episode in batch:  # the returned episodes are in the window
        lengths.remove(len(episode))
    assert np.all(durations > 0.0), durations
    assert np.all(durations <= wall), (durations, wall)
    assert metrics["episode_duration_sec_mean"] == pytest.approx(durations.mean())
    assert 0.0 < metrics["episode_duration_sec_mean"] <= wall


def test_metrics__cut_episode_counted_once_whole():
    num_envs = 4
    config = make_config(num_envs=num_envs, fragment=8)
    config.reporting(metrics_num_episodes_for_smoothing=1000)  # window holds them all
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    batches = []
    reported_episodes = 0
    for call in range(200):
        batches.append(runner.sample(num_timesteps=num_envs))  # one vector step per call
        if call == 2:  # CartPole cannot end within 3 steps: no episode keys yet
            metrics = runner.get_metrics()
            assert not set(EPISODE_KEYS) & set(metrics), metrics
            assert metrics["num_episodes"] == 0
            assert metrics["num_env_steps_sampled"] == 3 * num_envs
        elif call % 10 == 9:
            reported_episodes += runner.get_metrics()["num_episodes"]
            if sum(e.is_done for b in batches for e in b) >= 4:
                break
    episodes, finished = whole_episodes(batches)
    done = [episodes[i] for i in finished]
    assert len(done) >= 4
    # Each finished episode was cut into many one-step chunks.
    assert all(len(e) > 1 for e in done)
    lengths = np.array([len(e) for e in done])
    returns = np.array([e.get_return() for e in done])
    assert len(set(lengths.tolist())) > 1  # min, max and mean are distinct checks
    metrics = runner.get_metrics()
    reported_episodes += metrics["num_episodes"]
    assert reported_episodes == len(done)
    assert metrics["num_episodes_lifetime"] == len(done)
    assert metrics["episode_len_max"] == lengths.max()
    assert metrics["episode_len_min"] == lengths.min()
    assert metrics["episode_len_mean"] == pytest.approx(lengths.mean())
    assert metrics["episode_return_mean"] == pytest.approx(returns.mean())
    assert metrics["episode_return_max"] == returns.max()


def test_metrics__per_call_and_lifetime_counters(runner):
    start = runner.get_metrics()  # drains the per-call counters
    lifetime_steps = start["num_env_steps_sampled_lifetime"]
    lifetime_episodes = start["num_episodes_lifetime"]

    first = runner.sample(num_timesteps=NUM_ENVS * 15)
    first_done = sum(e.is_done for e in first)
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled"] == NUM_ENVS * 15
    assert metrics["num_env_steps_sampled_lifetime"] == lifetime_steps + NUM_ENVS * 15
    assert metrics["num_episodes"] == first_done
    assert metrics["num_episodes_lifetime"] == lifetime_episodes + first_done

    second = runner.sample(num_timesteps=NUM_ENVS * 5)
    third = runner.sample(num_episodes=2)
    done = sum(e.is_done for e in second) + 2
    metrics = runner.get_metrics()
    # Per-call counters cover everything since the last get_metrics(), episode mode
    # included (its steps of episodes left unfinished are sampled steps too).
    assert metrics["num_env_steps_sampled"] == NUM_ENVS * 5 + third.num_vector_steps * NUM_ENVS
    assert metrics["num_env_steps_sampled_lifetime"] == (
        lifetime_steps + NUM_ENVS * 20 + third.num_vector_steps * NUM_ENVS)
    assert metrics["num_episodes"] == done
    assert metrics["num_episodes_lifetime"] == lifetime_episodes + first_done + done
    assert runner.get_state()["num_env_steps_sampled_lifetime"] == (
        metrics["num_env_steps_sampled_lifetime"])

    again = runner.get_metrics()  # nothing sampled since
    assert again["num_env_steps_sampled"] == 0 and again["num_episodes"] == 0
    assert again["num_env_steps_sampled_lifetime"] == metrics["num_env_steps_sampled_lifetime"]


def test_metrics__lifetime_counter_passes_int32(runner):
    big = 2**31 + 5
    runner.set_state({"num_env_steps_sampled_lifetime": big})
    runner.sample(num_timesteps=NUM_ENVS * 2)
    metrics = runner.get_metrics()
    assert metrics["num_env_steps_sampled_lifetime"] == big + NUM_ENVS * 2
    assert runner.get_state()["num_env_steps_sampled_lifetime"] == big + NUM_ENVS * 2
    runner.set_state({"num_env_steps_sampled_lifetime": 2**40})
    runner.sample(num_timesteps=NUM_ENVS)
    assert runner.get_metrics()["num_env_steps_sampled_lifetime"] == 2**40 + NUM_ENVS
