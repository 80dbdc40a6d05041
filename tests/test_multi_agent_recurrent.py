"""Recurrent modules in the multi-agent runner: per module, the state starts at
`get_initial_state()` with every episode, advances only at the agent's own actions
(turn-based games), continues across `sample()` cuts, and each agent step records its
`state_out` — checked against the module applied step by step in Python."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.modules.recurrent import GRUModule


def _runner(env="TicTacToe-v0", fragment=7):
    spec = jr.RLModuleSpec(GRUModule, model_config={"gru_size": 8, "fcnet_hiddens": [8]})
    first = "player_x" if env == "TicTacToe-v0" else "agent_0"
    config = (jr.RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=fragment)
              .multi_agent(policies={"main": spec, "opponent": None},
                           policy_mapping_fn=lambda a, e: "main" if a == first else "opponent")
              .debugging(seed=1))
    return jr.MultiAgentEnvRunner(config=config), first


def _replay(runner, agent_chunks):
    """The GRU state after each of the agent's actions, computed one action at a time."""
    module = runner.module["main"]
    params = runner.get_state(components="rl_module")["rl_module"]["main"]
    h = jax.tree.map(lambda x: jnp.asarray(x)[None], module.get_initial_state())
    states = []
    for observations in agent_chunks:
        for obs in observations:
            out = module.forward_exploration(params, {"obs": jnp.asarray(obs)[None],
                                                      "state_in": h})
            h = out["state_out"]
            states.append(np.asarray(h["h"][0]))
    return np.stack(states)


@pytest.mark.parametrize("env", ["TicTacToe-v0", "MultiAgentCartPole-v1"])
def test_recurrent_state_reset_per_episode_advanced_per_action_and_carried_across_cuts(env):
    runner, agent = _runner(env)
    chunks: dict[str, list] = {}
    finished = []
    for _ in range(32):  # 7-step fragments: episodes are cut across calls
        for episode in runner.sample():
            if agent not in episode.agent_episodes:
                continue
            chunks.setdefault(episode.id_, []).append(episode.agent_episodes[agent])
            if episode.is_done:
                finished.append(episode.id_)
    cut = [i for i in finished if len(chunks[i]) > 1]
    assert len(finished) >= 4 and cut, "the test needs finished episodes cut across calls"
    for episode_id in finished:
        parts = chunks[episode_id]
        recorded = np.concatenate([np.asarray(p.extra_model_outputs["state_out"]["h"])
                                   for p in parts])
        expected = _replay(runner, [np.asarray(p.observations)[:-1] for p in parts])
        np.testing.assert_allclose(recorded, expected, rtol=1e-4, atol=1e-5)


def test_recurrent_module_in_every_policy_mode_and_state_round_trip():
    runner, agent = _runner()
    for kwargs in ({}, {"explore": False}, {"random_actions": True}):
        batch = runner.sample(**kwargs)
        assert any(agent in e.agent_episodes for e in batch)
    state = runner.get_state(components=["env_runner_carry", "rl_module"])
    expected = jax.device_get(runner.sample().trajectory())
    runner.set_state(state)
    again = jax.device_get(runner.sample().trajectory())
    jax.tree.map(np.testing.assert_array_equal, expected, again)
