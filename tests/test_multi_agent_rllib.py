"""`MultiAgentEpisodeBatch.to_rllib()`: real `ray.rllib` `MultiAgentEpisode`s that pass
RLlib's own `validate()`, agree with jaxrunner's episode views (agents, modules, data,
flags, returns, lengths, cuts and lookback), join across cuts with RLlib's
`concat_episode`, and equal the episode RLlib builds itself step by step from the same
env steps (`add_env_reset` / `add_env_step`: its reward accumulation and env-step map).

Turn-based `TicTacToe-v0` (one agent acts per step, sides drawn per episode) and
simultaneous `MultiAgentCartPole-v1` (all agents act; each pole ends on its own)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from jaxrunner import MultiAgentEnvRunner, RunnerConfig
from jaxrunner.episodes.rllib_conversion import env_to_agent_steps
from jaxrunner.rllib.episodes import to_rllib_episode, to_rllib_episodes
from multi_agent_helpers import whole_episodes

pytestmark = pytest.mark.usefixtures("fast_compiles")

pytest.importorskip("ray.rllib")
from ray.rllib.env.multi_agent_episode import (  # noqa: E402
    MultiAgentEpisode as RLlibMultiAgentEpisode)
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode  # noqa: E402

LOOKBACK = 2


def self_play(agent_id, episode):
    return episode.choose(episode.coin() == (agent_id == "player_x"), "main", "opponent")


def first_pole_alone(agent_id, episode):
    return "p0" if agent_id == "agent_0" else "p1"


def make_config(name: str) -> RunnerConfig:
    if name == "tictactoe":
        config = (RunnerConfig().environment("TicTacToe-v0")
                  .multi_agent(policies={"main", "opponent"}, policy_mapping_fn=self_play)
                  .debugging(seed=11))
    else:
        config = (RunnerConfig().environment("MultiAgentCartPole-v1",
                                             env_config={"num_agents": 3})
                  .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=first_pole_alone)
                  .debugging(seed=4))
    return (config.env_runners(num_envs_per_env_runner=2, rollout_fragment_length=5,
                               episode_lookback_horizon=LOOKBACK)
            .rl_module(model_config={"fcnet_hiddens": [8]}))


@pytest.fixture(scope="module", params=["tictactoe", "cartpole"])
def runner(request):
    runner = MultiAgentEnvRunner(config=make_config(request.param))
    runner.name = request.param
    yield runner
    runner.stop()


def assert_same_agent_chunk(theirs, mine, *, episode_id, module_id, weights_seq_no):
    """An RLlib agent episode equals a jaxrunner agent chunk."""
    assert isinstance(theirs, RLlibEpisode)
    theirs.validate()
    assert theirs.id_ == mine.id_ and theirs.agent_id == mine.agent_id
    assert theirs.module_id == mine.module_id == module_id
    assert theirs.multi_agent_episode_id == episode_id
    assert theirs.t_started == mine.t_started and len(theirs) == len(mine)
    assert theirs.is_terminated == mine.is_terminated
    assert theirs.is_truncated == mine.is_truncated
    assert theirs.get_return() == pytest.approx(mine.get_return())
    np.testing.assert_array_equal(theirs.get_observations(), mine.observations)
    np.testing.assert_array_equal(theirs.get_actions(), mine.actions)
    np.testing.assert_array_equal(theirs.get_rewards(), mine.rewards)
    for name in ("action_logp", "action_dist_inputs"):
        np.testing.assert_array_equal(theirs.get_extra_model_outputs(name),
                                      mine.extra_model_outputs[name])
    np.testing.assert_array_equal(theirs.get_extra_model_outputs("weights_seq_no"),
                                  np.full(len(mine), weights_seq_no))
    # The lookback is RLlib's lookback buffer.
    assert theirs.observations.lookback == mine.len_lookback_buffer
    assert theirs.actions.lookback == mine.len_lookback_buffer
    if mine.len_lookback_buffer:
        np.testing.assert_array_equal(
            theirs.get_actions(slice(-mine.len_lookback_buffer, 0),
                               neg_index_as_lookback=True), mine.lookback_actions)
        np.testing.assert_array_equal(
            theirs.get_rewards(slice(-mine.len_lookback_buffer, 0),
                               neg_index_as_lookback=True), mine.lookback_rewards)


def assert_same_episode(theirs, mine, *, weights_seq_no=0):
    """An RLlib multi-agent episode equals a jaxrunner episode chunk."""
    assert isinstance(theirs, RLlibMultiAgentEpisode)
    theirs.validate()
    assert theirs.id_ == mine.id_
    assert theirs.env_t_started == mine.env_t_started and theirs.env_t == mine.env_t
    assert len(theirs) == len(mine) == theirs.env_steps()
    assert theirs.is_terminated == mine.is_terminated
    assert theirs.is_truncated == mine.is_truncated
    assert theirs.agent_ids == mine.agent_ids
    assert theirs.agent_steps() == mine.agent_steps()
    assert theirs.get_return() == pytest.approx(mine.get_return())
    for agent_id in mine.possible_agents:
        # The mapping the runner's policy_mapping_fn chose, for every agent of the env.
        assert theirs.module_for(agent_id) == mine.module_for(agent_id)
    for agent_id, chunk in mine.agent_episodes.items():
        assert theirs.agent_t_started[agent_id] == chunk.t_started
        assert_same_agent_chunk(theirs.agent_episodes[agent_id], chunk, episode_id=mine.id_,
                                module_id=mine.module_for(agent_id),
                                weights_seq_no=weights_seq_no)
    # RLlib's own consumers of the episode work on it.
    sample_batch = theirs.get_sample_batch()
    assert sample_batch.env_steps() == len(mine)
    assert {a: len(b) for a, b in sample_batch.policy_batches.items()} == {
        a: len(c) for a, c in mine.agent_episodes.items()}
    assert theirs.get_terminateds() == {
        **{a: c.is_terminated for a, c in mine.agent_episodes.items()},
        "__all__": mine.is_terminated}
    # Every env time the map says an agent observed gives back that agent's observation
    # (RLlib's env-step getter reads the map, then the agent's episode).
    for k in range(len(mine) + 1):
        for agent_id, obs in theirs.get_observations(k).items():
            agent_t = theirs.env_t_to_agent_t[agent_id].data[k]
            chunk = mine.agent_episodes[agent_id]
            np.testing.assert_array_equal(obs, chunk.observations[agent_t - chunk.t_started])


def test_to_rllib__valid_rllib_episodes_equal_to_the_views_across_cuts(runner):
    runner.sample(num_timesteps=2, force_reset=True)
    batches = [runner.sample(num_timesteps=7), runner.sample(num_timesteps=9),
               runner.sample(num_timesteps=3), runner.sample(num_episodes=3)]
    for batch in batches:
        ours, theirs = list(batch), batch.to_rllib()
        assert len(theirs) == len(ours) > 0
        for mine, episode in zip(ours, theirs):
            assert_same_episode(episode, mine, weights_seq_no=batch.weights_seq_no)
    # Cut episodes continue (same id, env_t_started = the previous chunk's env_t, agents
    # with lookback) ...
    cut = [e for batch in batches[1:3] for e in batch if e.env_t_started > 0]
    assert cut and any(c.len_lookback_buffer > 0 for e in cut
                       for c in e.agent_episodes.values())
    # ... and episode mode returns whole finished episodes.
    assert all(e.is_done and e.env_t_started == 0 for e in batches[3])
    assert len(batches[3].to_rllib()) == 3


def test_to_rllib__weights_seq_no_and_module_mapping_travel(runner):
    weights = runner.get_state()["rl_module"]
    runner.set_state({"rl_module": weights, "weights_seq_no": 6})
    batch = runner.sample(num_timesteps=6)
    for mine, episode in zip(batch, batch.to_rllib()):
        assert_same_episode(episode, mine, weights_seq_no=6)
        # The recorded mapping survives pickling (RLlib ships episodes through Ray).
        copied = pickle.loads(pickle.dumps(episode))
        assert {a: copied.module_for(a) for a in mine.possible_agents} == mine.agent_to_module
        with pytest.raises(KeyError, match="not an agent of this episode"):
            episode.agent_to_module_mapping_fn("nobody", episode)
    # to_rllib_episodes (the RLlib integration's entry point) gives the same episodes.
    again = to_rllib_episodes(batch, weights_seq_no=6)
    assert [e.id_ for e in again] == [e.id_ for e in batch.to_rllib()]
    with pytest.raises(ValueError, match="per-agent spaces"):
        to_rllib_episode(batch[0], observation_space=batch.observation_spaces)
    if runner.name == "tictactoe":
        # Both sides are drawn per episode: both modules play X somewhere.
        more = runner.sample(num_episodes=8)
        assert {e.module_for("player_x") for e in more} == {"main", "opponent"}


def test_to_rllib__rllib_concat_episode_joins_cut_chunks(runner):
    runner.sample(num_timesteps=2, force_reset=True)
    scale = 1 if runner.name == "tictactoe" else 6  # three poles last longer than a game
    batches = [runner.sample(num_timesteps=k * scale) for k in (3, 7, 2, 5, 9, 4, 11)]
    rllib_whole: dict = {}
    for batch in batches:
        for chunk in batch.to_rllib():
            if chunk.id_ in rllib_whole:
                rllib_whole[chunk.id_].concat_episode(chunk)
            elif chunk.env_t_started == 0:
                rllib_whole[chunk.id_] = chunk
    ours, finished = whole_episodes(batches)
    assert finished
    joined = 0
    for episode_id in finished:
        mine, theirs = ours[episode_id], rllib_whole[episode_id]
        theirs.validate()
        assert theirs.is_done and theirs.env_t_started == 0 and len(theirs) == len(mine)
        assert theirs.get_return() == pytest.approx(mine.get_return())
        for agent_id, chunk in mine.agent_episodes.items():
            sa = theirs.agent_episodes[agent_id]
            assert len(sa) == len(chunk) and sa.t_started == 0
            assert sa.get_return() == pytest.approx(chunk.get_return())
            np.testing.assert_array_equal(sa.get_observations(), chunk.observations)
            np.testing.assert_array_equal(sa.get_actions(), chunk.actions)
            np.testing.assert_array_equal(sa.get_rewards(), chunk.rewards)
        joined += sum(1 for b in batches for e in b if e.id_ == episode_id) > 1
    assert joined, "some finished episode should have been cut across calls"


# ---------------------------------------------------------------------- RLlib's own episode
def rllib_step_by_step(mine):
    """The RLlib `MultiAgentEpisode` that RLlib's runner would build from the env steps of
    a whole jaxrunner episode, with `add_env_reset` / `add_env_step`: which agents
    observe and act at each env step (`acted`, `completed`), the actions and model
    outputs they sent, the rewards the env gave every agent (`env_rewards`, which
    RLlib accumulates itself) and the terminated / truncated flags."""
    episode = RLlibMultiAgentEpisode(
        id_=mine.id_, observation_space=dict(mine.observation_spaces),
        action_space=dict(mine.action_spaces),
        agent_to_module_mapping_fn=lambda agent_id, _: mine.module_for(agent_id))
    length = len(mine)
    chunks = mine.agent_episodes
    next_obs = {a: 0 for a in chunks}  # index of the agent's next observation to send
    next_act = {a: 0 for a in chunks}
    done: set = set()

    def observe(agent_id):
        value = chunks[agent_id].observations[next_obs[agent_id]]
        next_obs[agent_id] += 1
        return value

    episode.add_env_reset(observations={a: observe(a) for a in chunks if mine.acted[a][0]})
    for k in range(length):
        actions, extras = {}, {}
        for a in chunks:
            if mine.acted[a][k]:
                j = next_act[a]
                actions[a] = chunks[a].actions[j]
                extras[a] = {n: v[j] for n, v in chunks[a].extra_model_outputs.items()}
                next_act[a] += 1
        observations, terminateds, truncateds = {}, {}, {}
        for a in chunks:
            last_step = mine.completed[a][k] and next_obs[a] == len(chunks[a])
            first_seen = k + 1 < length and mine.acted[a][k + 1] and next_obs[a] == 0
            if mine.completed[a][k] or first_seen:
                observations[a] = observe(a)
            if last_step and chunks[a].is_done:
                terminateds[a] = chunks[a].is_terminated
                truncateds[a] = chunks[a].is_truncated
        rewards = {a: float(mine.env_rewards[a][k]) for a in mine.possible_agents
                   if a not in done}
        terminateds["__all__"] = k == length - 1 and mine.is_terminated
        truncateds["__all__"] = k == length - 1 and mine.is_truncated
        episode.add_env_step(observations, actions, rewards, terminateds=terminateds,
                             truncateds=truncateds, extra_model_outputs=extras)
        done |= {a for a in terminateds if a != "__all__" and terminateds[a]}
        done |= {a for a in truncateds if a != "__all__" and truncateds[a]}
    return episode


def test_to_rllib__whole_episode_equals_rllibs_step_by_step_episode(runner):
    batch = runner.sample(num_episodes=4)
    for mine, theirs in zip(batch, batch.to_rllib()):
        reference = rllib_step_by_step(mine)
        reference.validate()
        assert reference.is_done and theirs.is_done
        assert (reference.is_terminated, reference.is_truncated) == (
            theirs.is_terminated, theirs.is_truncated)
        assert len(theirs) == len(reference) and theirs.agent_ids == reference.agent_ids
        # RLlib's own accumulation of the env's rewards gives the same agent rewards and
        # returns (rewards received before an agent's first observation are not its own).
        assert theirs.get_return() == pytest.approx(reference.get_return())
        for agent_id, sa in reference.agent_episodes.items():
            ours = theirs.agent_episodes[agent_id]
            assert len(ours) == len(sa)
            assert (ours.is_terminated, ours.is_truncated) == (sa.is_terminated,
                                                               sa.is_truncated)
            np.testing.assert_allclose(ours.get_rewards(), np.asarray(sa.get_rewards()),
                                       rtol=1e-6)
            np.testing.assert_array_equal(ours.get_observations(),
                                          np.asarray(sa.get_observations()))
            # The env-step -> agent-step map is the one RLlib built itself.
            assert (list(theirs.env_t_to_agent_t[agent_id].data)
                    == list(reference.env_t_to_agent_t[agent_id].data)), agent_id
        assert theirs.get_agents_that_stepped() == reference.get_agents_that_stepped()


def test_to_rllib__cut_chunk_successor_from_rllib_cut(runner):
    """RLlib's `cut()` continues a converted ongoing chunk: same id, env_t, agents."""
    runner.sample(num_timesteps=2, force_reset=True)
    ongoing = []
    for _ in range(10):  # cut chunks with agent steps (illegal moves end games early)
        batch = runner.sample(num_timesteps=8)
        ongoing += [e for e in batch.to_rllib() if not e.is_done and e.agent_episodes]
    assert ongoing
    for episode in ongoing:
        successor = episode.cut(len_lookback_buffer=0)
        successor.validate()
        assert successor.id_ == episode.id_ and successor.env_t_started == episode.env_t
        assert len(successor) == 0
        # The agents observing at the cut (and not done there) continue, with the same
        # agent episode ids and t_started = their predecessor's t.
        assert successor.agent_ids == {a for a in episode.get_observations(-1)
                                       if not episode.agent_episodes[a].is_done}
        for agent_id, sa in successor.agent_episodes.items():
            if agent_id in episode.agent_episodes:
                before = episode.agent_episodes[agent_id]
                assert sa.id_ == before.id_ and sa.t_started == before.t
                np.testing.assert_array_equal(sa.get_observations(0),
                                              before.get_observations(-1))


# ---------------------------------------------------------------------- the env-step map
def test_env_to_agent_steps__turns_cuts_and_pending_actions():
    acted = np.array([True, False, True, False])
    completed = np.array([False, True, False, True])
    # Observes at 0, 2 (acts) and 2, 4 (its steps complete): agent steps 0, 1, 2.
    assert env_to_agent_steps(acted=acted, completed=completed, agent_t_started=0,
                              num_agent_steps=2) == [0, "S", 1, "S", 2]
    # A cut chunk whose first step began before it (its action pending at the cut).
    assert env_to_agent_steps(acted=np.array([False, True]),
                              completed=np.array([True, False]),
                              agent_t_started=4, num_agent_steps=1) == ["S", 5, "S"]
    # An agent about to act after the chunk; an agent seen before, idle in the chunk.
    assert env_to_agent_steps(acted=np.zeros(2, bool), completed=np.zeros(2, bool),
                              agent_t_started=0, num_agent_steps=0,
                              acts_at_end=True) == ["S", "S", 0]
    assert env_to_agent_steps(acted=np.zeros(2, bool), completed=np.zeros(2, bool),
                              agent_t_started=3, num_agent_steps=0) == ["S", "S", "S"]
    # Never seen: no map, as RLlib keeps none for agents that have not appeared.
    assert env_to_agent_steps(acted=np.zeros(2, bool), completed=np.zeros(2, bool),
                              agent_t_started=0, num_agent_steps=0) is None
    with pytest.raises(ValueError, match="Inconsistent agent chunk"):
        env_to_agent_steps(acted=np.ones(3, bool), completed=np.ones(3, bool),
                           agent_t_started=0, num_agent_steps=1)


def test_to_rllib__single_agent_views_inside_are_numpy_rllib_episodes(runner):
    batch = runner.sample(num_timesteps=4)
    episode = copy.deepcopy(batch[0])
    for agent_id, chunk in episode.agent_episodes.items():
        converted = chunk.to_rllib(weights_seq_no=2)
        assert converted.is_numpy and isinstance(converted, RLlibEpisode)
        assert converted.get_actions().dtype == np.int64  # Discrete, as gymnasium's
        assert converted.get_observations().dtype == np.float32


def test_to_rllib__agents_acting_next_complete_the_env_step_map(runner):
    """The batch knows which agents act right after it (the runner's `end_acting`), so an
    agent whose first observation comes at a cut chunk's last env time is on the map
    there (as in RLlib's own chunk), not only from the next chunk on."""
    batch = runner.sample(num_timesteps=2, force_reset=True)  # one env step per sub-env
    acting = np.asarray(
        runner.get_state(components="env_runner_carry")["env_runner_carry"]["carry"].acting)
    entered = 0
    for mine, episode in zip(batch, batch.to_rllib()):
        assert_same_episode(episode, mine, weights_seq_no=batch.weights_seq_no)
        assert not episode.is_done and len(episode) == 1
        for i, agent_id in enumerate(batch.agent_ids):
            seen = episode.env_t_to_agent_t.get(agent_id)
            assert (seen is not None and seen.data[-1] != "S") == bool(acting[mine.env_index, i])
            entered += seen is not None and list(seen.data) == ["S", 0]
    # TicTacToe: O gets its first observation after X's first move, at the cut; the
    # poles all act at once from the reset on.
    assert entered == (2 if runner.name == "tictactoe" else 0)
    if runner.name == "tictactoe":
        # Without that knowledge (a batch built without end_acting), O would enter the
        # map only in the next chunk.
        uninformed = copy.copy(batch)
        uninformed._end_acting, uninformed._episodes = None, None
        assert all("player_o" not in e.env_t_to_agent_t for e in uninformed.to_rllib())
