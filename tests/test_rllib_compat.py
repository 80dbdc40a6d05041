"""`batch.to_rllib()`: real RLlib episodes that RLlib's own code accepts."""

from __future__ import annotations

import numpy as np
import pytest

import jaxrunner

from conftest import make_config, whole_episodes

pytestmark = pytest.mark.usefixtures("fast_compiles")

pytest.importorskip("ray.rllib")
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode  # noqa: E402

NUM_ENVS = 2


@pytest.fixture(scope="module")
def runner():
    return jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=NUM_ENVS, fragment=8, episode_lookback_horizon=2))


def test_rllib_compat__to_rllib_gives_valid_rllib_episodes(runner):
    runner.set_state({"rl_module": runner.get_state()["rl_module"], "weights_seq_no": 4})
    batches = [runner.sample(num_timesteps=NUM_ENVS * 6),
               runner.sample(num_timesteps=NUM_ENVS * 9),
               runner.sample(num_episodes=2)]
    for batch in batches:
        ours = list(batch)
        theirs = batch.to_rllib()
        assert len(theirs) == len(ours)
        for mine, episode in zip(ours, theirs):
            assert isinstance(episode, RLlibEpisode)
            episode.validate()
            assert episode.id_ == mine.id_
            assert episode.t_started == mine.t_started
            assert len(episode) == len(mine)
            assert episode.get_return() == pytest.approx(mine.get_return())
            assert episode.is_terminated == mine.is_terminated
            assert episode.is_truncated == mine.is_truncated
            np.testing.assert_array_equal(episode.get_observations(), mine.observations)
            np.testing.assert_array_equal(episode.get_actions(), mine.actions)
            np.testing.assert_array_equal(episode.get_rewards(), mine.rewards)
            np.testing.assert_array_equal(
                episode.get_extra_model_outputs("action_logp"),
                mine.extra_model_outputs["action_logp"])
            # Numpy-backed, in the spaces' dtypes, every step marked with the weights
            # version that acted (as RLlib's runner records it).
            assert episode.is_numpy
            assert episode.get_actions().dtype == np.int64  # Discrete, as gymnasium's
            assert episode.get_observations().dtype == np.float32
            np.testing.assert_array_equal(episode.get_extra_model_outputs("weights_seq_no"),
                                          np.full(len(mine), batch.weights_seq_no))
            # The lookback is RLlib's lookback buffer.
            assert episode.observations.lookback == mine.len_lookback_buffer
            if mine.len_lookback_buffer:
                np.testing.assert_array_equal(
                    episode.get_actions(-1, neg_index_as_lookback=True),
                    mine.lookback_actions[-1])
    assert any(e.t_started > 0 for e in batches[1])
    assert all(e.is_done and e.t_started == 0 for e in batches[2])
    assert all(batch.weights_seq_no == 4 for batch in batches)


def test_rllib_compat__rllib_concat_episode_rebuilds_whole_episodes(runner):
    runner.sample(num_timesteps=NUM_ENVS, force_reset=True)
    batches = [runner.sample(num_timesteps=NUM_ENVS * k) for k in (7, 3, 11, 5, 9, 13)]
    # RLlib's concat_episode over the to_rllib() chunks ...
    rllib_whole: dict = {}
    for batch in batches:
        for chunk in batch.to_rllib():
            if chunk.id_ in rllib_whole:
                rllib_whole[chunk.id_].concat_episode(chunk)
            else:
                rllib_whole[chunk.id_] = chunk
    # ... agrees with jaxrunner's own views joined the same way.
    ours, finished = whole_episodes(batches)
    assert finished, "90 CartPole steps per sub-env should finish an episode"
    for id_ in finished:
        mine, theirs = ours[id_], rllib_whole[id_]
        theirs.validate()
        assert theirs.is_done
        assert len(theirs) == len(mine) and theirs.t_started == 0
        assert theirs.get_return() == pytest.approx(mine.get_return())
        assert theirs.get_return() == len(theirs)  # CartPole pays 1 per step
        np.testing.assert_array_equal(theirs.get_observations(), mine.observations)
        np.testing.assert_array_equal(theirs.get_actions(), mine.actions)
    # Some of them were cut across calls and joined from several chunks.
    chunks_per_id = {}
    for batch in batches:
        for chunk in batch:
            chunks_per_id[chunk.id_] = chunks_per_id.get(chunk.id_, 0) + 1
    assert max(chunks_per_id[i] for i in finished) >= 2
