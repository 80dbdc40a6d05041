"""pgx games as turn-based multi-agent envs (`PgxMultiAgentEnv`), against pgx's own loop
and through `MultiAgentEnvRunner`."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrunner import MultiAgentEnvRunner, RunnerConfig
from jaxrunner.envs import adapters
from jaxrunner.envs.multi_agent import ALL

pgx = pytest.importorskip("pgx")

pytestmark = pytest.mark.usefixtures("fast_compiles")


def test_tic_tac_toe__matches_pgx_loop():
    """Same keys and moves: the adapter's turns, rewards, ends and observations are pgx's.

    Moves are random legal ones, except every 7th, which is random (often illegal: pgx
    then ends the game with a penalty for the mover)."""
    env, params = adapters.make_suite_env("pgx/tic_tac_toe", {})
    game = pgx.make("tic_tac_toe")
    step, reset = jax.jit(env.step), jax.jit(env.reset)
    pgx_init, pgx_step = jax.jit(game.init), jax.jit(game.step)
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    obs, state = reset(key, params)
    ref = pgx_init(key)
    ends = []
    for t in range(200):
        acting = {a: bool(v) for a, v in env.agents_to_act(state, params).items()}
        mover = int(ref.current_player)
        assert acting == {"player_0": mover == 0, "player_1": mover == 1}, t
        legal = np.asarray(ref.legal_action_mask)
        np.testing.assert_array_equal(np.asarray(env.action_mask(state, params)
                                                 [f"player_{mover}"]), legal)
        move = int(rng.integers(9)) if t % 7 == 6 else int(rng.choice(np.flatnonzero(legal)))
        k = jax.random.fold_in(key, t)
        obs, state, rewards, terminateds, truncateds, infos = step(
            k, state, {f"player_{mover}": jnp.int32(move)}, params)
        # MultiAgentEnv.step: split(key) -> (step key, reset key); step_env gets the first.
        key_step, key_reset = jax.random.split(k)
        ref = pgx_step(ref, jnp.int32(move), key_step)
        for i in range(2):
            assert float(rewards[f"player_{i}"]) == float(ref.rewards[i]), t
            with warnings.catch_warnings():  # pgx: observe(state, player_id) deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                own_view = game.observe(ref, jnp.int32(i))
            np.testing.assert_array_equal(
                np.asarray(infos["final_observation"][f"player_{i}"]), np.asarray(own_view))
        assert bool(terminateds[ALL]) == bool(ref.terminated)
        assert not bool(truncateds[ALL])
        if ref.terminated:
            ends.append((t, [float(r) for r in ref.rewards]))
            ref = pgx_init(key_reset)
        np.testing.assert_array_equal(np.asarray(obs[f"player_{int(ref.current_player)}"]),
                                      np.asarray(ref.observation))
    assert len(ends) >= 10
    assert any(r == [1.0, -1.0] or r == [-1.0, 1.0] for _, r in ends)


def _config(**env_runners):
    return (RunnerConfig().environment("pgx/tic_tac_toe")
            .env_runners(**{"num_envs_per_env_runner": 2, "rollout_fragment_length": 8,
                            **env_runners})
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, ep: "shared")
            .debugging(seed=1))


@pytest.fixture(scope="module")
def runner():
    runner = MultiAgentEnvRunner(config=_config())
    yield runner
    runner.stop()


def test_runner__turns_alternate_and_rewards_are_per_player(runner):
    episodes = list(runner.sample(num_episodes=6))
    assert len(episodes) == 6
    for episode in episodes:
        episode.validate()
        players = episode.agent_episodes
        assert set(players) == {"player_0", "player_1"}
        lengths = sorted(len(players[a]) for a in players)
        # Turns alternate: the player who moved first has at most one move more.
        assert lengths[1] - lengths[0] <= 1 and sum(lengths) == len(episode)
        returns = {a: float(np.sum(players[a].rewards)) for a in players}
        assert returns["player_0"] == -returns["player_1"]  # zero-sum, credited to both
        assert episode.is_terminated
    metrics = runner.get_metrics()
    assert metrics["num_episodes"] >= 6


# Games pgx makes in under a second here; others (shogi, chess, animal shogi, gardner chess,
# go) build tables for 5-30 s when their module is imported, which is why listing the ids
# reads the player counts from the table instead.
QUICK_TO_MAKE = ("2048", "hex", "kuhn_poker", "leduc_holdem", "othello", "tic_tac_toe")


def test_pgx_player_table__covers_every_game_and_agrees_with_pgx():
    from jaxrunner.envs.adapters import pgx as pgx_adapter

    games = [i for i in pgx.available_envs() if not i.startswith("minatar-")]
    assert set(games) <= set(pgx_adapter.KNOWN_NUM_PLAYERS), (
        "pgx has games the table does not know (listing would make them): "
        f"{sorted(set(games) - set(pgx_adapter.KNOWN_NUM_PLAYERS))}")
    for game in QUICK_TO_MAKE:
        assert pgx_adapter.num_players(game) == int(pgx.make(game).num_players), game
    assert pgx_adapter.num_players("minatar-breakout") == 1
    assert "tic_tac_toe" in pgx_adapter.multi_player_ids()
    assert "2048" not in pgx_adapter.multi_player_ids()
