"""Brax and MuJoCo Playground through `BraxEnv` / `PlaygroundEnv`, against the suites' own
episode wrapper (`EpisodeWrapper`'s `info["truncation"]`) and through
`SingleAgentEnvRunner`. Physics compiles for a minute or more on a 2-core CPU, so this file
uses the smallest tasks (inverted_pendulum, CartpoleBalance) and short episodes."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrunner.envs import adapters

from env_suite_helpers import Reference, run_beside_reference, smoke_sample

pytestmark = pytest.mark.usefixtures("fast_compiles")


class EpisodeWrapperReference(Reference):
    """The suite's own time limit: Brax's `EpisodeWrapper` (`done` at the limit too,
    `info["truncation"]` saying it was the limit), reset with `reset(rng)`."""

    def __init__(self, env, episode_length: int):
        from brax.envs.wrappers.training import EpisodeWrapper

        self.env = EpisodeWrapper(env, episode_length=episode_length, action_repeat=1)

    def reset(self, key):
        state = self.env.reset(key)
        return state, state.obs

    def step(self, state, action, key):
        del key
        state = self.env.step(state, action)
        truncated = state.info["truncation"] > 0
        return state, state.obs, state.reward, (state.done > 0) & ~truncated, truncated


def continuous_choice(size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return lambda t, mask: rng.uniform(-1.0, 1.0, (size,)).astype(np.float32)


def test_brax__matches_episode_wrapper_loop_with_fresh_resets():
    envs = pytest.importorskip("brax.envs")
    env, params = adapters.make_suite_env("brax/inverted_pendulum", {"episode_length": 6})
    assert env.observation_space(params).shape == (4,)
    space = env.action_space(params)
    assert space.shape == (1,) and float(space.low[0]) == -1.0 and float(space.high[0]) == 1.0
    reference = EpisodeWrapperReference(envs.get_environment("inverted_pendulum"), 6)
    ends = run_beside_reference(env, params, reference, continuous_choice(1), steps=60)
    assert any(te for _, te, _ in ends) and any(tr for _, _, tr in ends)


def test_brax__wrapped_env_is_refused():
    envs = pytest.importorskip("brax.envs")
    wrapped = envs.create("inverted_pendulum", episode_length=10)
    with pytest.raises(ValueError, match="give the bare env"):
        adapters.adapt(wrapped)


def test_brax__runner_by_name_partial_autoreset():
    pytest.importorskip("brax.envs")
    runner, episodes, metrics = smoke_sample("brax/inverted_pendulum", {"episode_length": 10},
                                             num_timesteps=32, autoreset_mode="partial")
    assert runner.action_space.shape == (1,)
    finished = [e for e in episodes if e.is_done]
    assert finished and all(len(e) <= 10 for e in finished)
    assert metrics["num_episodes"] >= 1 and np.isfinite(metrics["episode_return_mean"])


def test_playground__cartpole_balance_runner_by_object():
    registry = pytest.importorskip("mujoco_playground").registry
    inner = registry.load("CartpoleBalance", config_overrides={"episode_length": 12,
                                                               "impl": "jax"})
    env, params = adapters.adapt(inner)
    assert isinstance(env, adapters.SuiteAdapter) and env.suite == "playground"
    assert env.episode_length == 12
    runner, episodes, metrics = smoke_sample(lambda ctx: inner, num_timesteps=32)
    assert runner.observation_space.shape == (5,) and runner.action_space.shape == (1,)
    finished = [e for e in episodes if e.is_done]
    assert finished and all(e.is_truncated and len(e) == 12 for e in finished)
    assert metrics["num_episodes"] >= 1
