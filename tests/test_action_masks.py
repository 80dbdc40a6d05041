"""Action masks inside the compiled chunk: an env with `action_mask(state, params)` (pgx,
Jumanji adapters) gets only legal actions in every policy mode — masked logits for the
module (recorded as the masked distribution) and uniform legal random actions — for the
single- and the multi-agent layout. pgx ends a game with a -1 penalty for an illegal move,
so a runner that never takes one never sees that penalty."""

import numpy as np
import pytest

pytest.importorskip("pgx")

import jaxrunner as jr  # noqa: E402
from jaxrunner.modules.distributions import MASKED_LOGIT  # noqa: E402

MODES = [{"random_actions": True}, {"explore": True}, {"explore": False}]


def _tic_tac_toe_runner():
    config = (jr.RunnerConfig().environment("pgx/tic_tac_toe")
              .env_runners(num_envs_per_env_runner=32, rollout_fragment_length=20)
              .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, ep: "shared")
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .debugging(seed=0))
    return jr.MultiAgentEnvRunner(config=config)


@pytest.mark.parametrize("mode", MODES, ids=["random", "explore", "inference"])
def test_multi_agent__pgx_tic_tac_toe_never_takes_an_illegal_move(mode):
    runner = _tic_tac_toe_runner()
    moves = 0
    for _ in range(3):
        for episode in runner.sample(**mode):
            for agent in episode.agent_episodes.values():
                obs = np.asarray(agent.observations)[:-1]  # (n, 3, 3, 2) the mover's view
                actions = np.asarray(agent.actions)
                occupied = obs[..., 0] | obs[..., 1]
                rows, cols = actions // 3, actions % 3
                assert not occupied[np.arange(len(actions)), rows, cols].any()
                moves += len(actions)
                if not mode.get("random_actions"):
                    inputs = np.asarray(agent.extra_model_outputs["action_dist_inputs"])
                    illegal = occupied.reshape(len(actions), 9)
                    assert np.all(inputs[illegal] <= MASKED_LOGIT / 2)
                    assert np.all(np.isfinite(agent.extra_model_outputs["action_logp"]))
    assert moves > 500


@pytest.mark.parametrize("mode", MODES, ids=["random", "explore", "inference"])
def test_single_agent__pgx_2048_never_takes_an_illegal_move(mode):
    config = (jr.RunnerConfig().environment("pgx/2048")
              .env_runners(num_envs_per_env_runner=16, rollout_fragment_length=50)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .debugging(seed=0))
    runner = jr.SingleAgentEnvRunner(config=config)
    steps = 0
    for _ in range(3):
        for episode in runner.sample(**mode):
            rewards = np.asarray(episode.rewards)
            assert np.all(rewards >= 0), "an illegal move was penalised"
            steps += len(episode)
            if mode.get("random_actions"):
                # Uniform over the legal moves: log-probabilities of 1 / (1..4 moves).
                logp = np.asarray(episode.extra_model_outputs["action_logp"])
                assert np.all(np.isin(np.round(np.exp(-logp)), [1, 2, 3, 4]))
    assert steps >= 3 * 16 * 50
