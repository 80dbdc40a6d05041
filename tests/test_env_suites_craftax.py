"""Craftax through `CraftaxEnv` (pre-1.0 gymnax step API, Craftax's own spaces), against
Craftax's own loop and through `SingleAgentEnvRunner` by name. Craftax compiles for a minute
or more on a 2-core CPU, so this file keeps to Craftax-Classic-Symbolic with short episodes.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxrunner.envs import adapters

from env_suite_helpers import Reference, run_beside_reference, smoke_sample, uniform_choice

craftax_env = pytest.importorskip("craftax.craftax_env")

pytestmark = pytest.mark.usefixtures("fast_compiles")

ENV_ID = "Craftax-Classic-Symbolic-v1"


class CraftaxReference(Reference):
    """Craftax's own env without auto-reset: `done` covers the time limit, which Craftax
    counts in `state.timestep` against `params.max_timesteps`."""

    def __init__(self, max_timesteps: int):
        self.env = craftax_env.make_craftax_env_from_name(ENV_ID, auto_reset=False)
        self.params = self.env.default_params.replace(max_timesteps=max_timesteps)

    def reset(self, key):
        obs, state = self.env.reset(key, self.params)
        return state, obs

    def step(self, state, action, key):
        obs, state, reward, done, _ = self.env.step(key, state, action, self.params)
        time_up = state.timestep >= self.params.max_timesteps
        return state, obs, reward, done & ~time_up, time_up


def test_craftax__matches_its_own_loop():
    env, params = adapters.make_suite_env(f"craftax/{ENV_ID}", {"max_timesteps": 12})
    assert env.observation_space(params).shape == (1345,)
    assert env.action_space(params).n == 17
    ends = run_beside_reference(env, params, CraftaxReference(12), uniform_choice(17, seed=0),
                                steps=40)
    assert [t for t, _, tr in ends if tr] == [11, 23, 35]


def test_craftax__object_from_craftax_is_adapted():
    inner = craftax_env.make_craftax_env_from_name(ENV_ID, auto_reset=True)
    env, params = adapters.adapt(inner)
    assert isinstance(env, adapters.SuiteAdapter) and env.suite == "craftax"
    assert params.max_timesteps == inner.default_params.max_timesteps


def test_craftax__runner_by_name():
    runner, episodes, metrics = smoke_sample(f"craftax/{ENV_ID}", {"max_timesteps": 10},
                                             num_timesteps=32)
    finished = [e for e in episodes if e.is_done]
    assert finished and all(e.is_truncated and len(e) == 10 for e in finished)
    assert metrics["num_episodes"] >= 1
    assert np.isfinite(metrics["episode_return_mean"])


@pytest.mark.slow  # full Craftax compiles for minutes on 2 cores; by name: the test above
def test_cli__sample_craftax_symbolic(capsys):
    """`jaxrunner sample --env craftax/Craftax-Symbolic-v1` (the full game, 8,268-float
    observations) samples and reports RLlib's metrics."""
    import json

    from jaxrunner.cli import main

    assert main(["sample", "--env", "craftax/Craftax-Symbolic-v1", "--num-envs", "4",
                 "--fragment", "8", "--timesteps", "32", "--hiddens", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["env_steps"] == 32
    assert report["metrics"]["num_env_steps_sampled_lifetime"] == 32
