"""`MultiAgentEnvRunner`: RLlib's multi-agent sampling contract over the compiled rollout.

Runners are shared through module-scoped fixtures (each compiles its rollout once); tests
that need a known starting point call `sample(force_reset=True)` or episode mode first.
"""

from __future__ import annotations

import numpy as np
import pytest

import jaxrunner
from jaxrunner import MultiAgentEnvRunner, RunnerConfig, SingleAgentEnvRunner
from jaxrunner.core.mapping import UnknownModuleError
from jaxrunner.errors import StateStructureError
from multi_agent_helpers import (Relay, assert_same_episode, count_compiles,
                                 reference_rollout, relay_creator, whole_episodes)

jaxrunner.register_env("MultiAgentRelayTest-v0", relay_creator)


def self_play(agent_id, episode):
    """Sides drawn per episode: "main" plays X in about half of the episodes."""
    return episode.choose(episode.coin() == (agent_id == "player_x"), "main", "opponent")


def ttt_config(**env_runners):
    return (RunnerConfig().environment("TicTacToe-v0")
            .env_runners(**{"num_envs_per_env_runner": 2, "rollout_fragment_length": 6,
                            "max_chunk_length": 6, "episode_lookback_horizon": 2,
                            **env_runners})
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .multi_agent(policies={"main", "opponent"}, policy_mapping_fn=self_play,
                         policies_to_train=["main"])
            .reporting(metrics_num_episodes_for_smoothing=3)
            .debugging(seed=3))


def relay_config(count_steps_by="env_steps", horizon=1000, num_envs=1, seed=0):
    return (RunnerConfig().environment("MultiAgentRelayTest-v0",
                                       env_config={"horizon": horizon})
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=8,
                         episode_lookback_horizon=1)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .multi_agent(policies={"shared"}, count_steps_by=count_steps_by)
            .debugging(seed=seed))


@pytest.fixture(scope="module")
def ttt():
    runner = MultiAgentEnvRunner(config=ttt_config())
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def relay_pair():
    """Two runners with the same seed (long episodes, one sub-env), and the first one's
    state right after construction."""
    first = MultiAgentEnvRunner(config=relay_config())
    fresh = first.get_state(components=["rl_module", "env_runner_carry"])
    second = MultiAgentEnvRunner(config=relay_config())
    yield first, second, fresh
    first.stop()
    second.stop()


# ---------------------------------------------------------------------- reference loops
def test_turn_based__same_episodes_as_plain_python_loop(ttt):
    """Sampled (explore) TicTacToe episodes, cut across calls of several sizes, equal the
    episodes an RLlib-semantics Python loop builds from the same per-agent actions."""
    batches = [ttt.sample(num_timesteps=n, force_reset=(i == 0))
               for i, n in enumerate([5, 12, 30, 9, 14])]
    by_id, finished = whole_episodes(batches)
    assert len(finished) >= 8
    assert any(chunk.env_t_started > 0 for batch in batches for chunk in batch)  # cuts
    env, params = ttt.env, ttt.env_params
    per_env = {b: sorted((e for e in by_id.values() if e.env_index == b and e.is_done),
                         key=lambda e: e.episode_index) for b in range(ttt.num_envs)}
    for b, episodes in per_env.items():
        indices = [e.episode_index for e in episodes]
        assert indices == list(range(indices[0], indices[0] + len(indices)))
        actions = {k: {a: list(sa.actions) for a, sa in e.agent_episodes.items()}
                   for k, e in enumerate(episodes)}
        reference = reference_rollout(
            env, params, lambda k, agent, step, obs: int(actions[k][agent][step]),
            num_episodes=len(episodes))
        for episode, expected in zip(episodes, reference):
            assert_same_episode(episode, expected)
            # Self-play mapping: evaluated on device, the same as on the host.
            mapping_episode = ttt.mapping_episode(b, episode.episode_index)
            for agent in env.agents:
                choice = self_play(agent, mapping_episode)
                assert episode.module_for(agent) == choice.module_id
                assert episode.agent_episodes[agent].module_id == choice.module_id
            assert {episode.module_for(a) for a in env.agents} == {"main", "opponent"}
            # Per-agent returns sum to the env's rewards; winner and loser cancel out.
            env_total = sum(float(np.sum(r)) for r in episode.env_rewards.values())
            assert episode.get_return() == pytest.approx(env_total)
            assert episode.get_return() == pytest.approx(0.0)
    sides = {episode.module_for("player_x") for e in per_env.values() for episode in e}
    assert sides == {"main", "opponent"}  # sides are drawn per episode


def test_turn_based__greedy_modules_match_host_forward_passes(ttt):
    """explore=False: the runner's actions are the argmax of each agent's mapped module,
    evaluated here on the host with the runner's weights."""
    batch = ttt.sample(num_episodes=4, explore=False)
    assert len(batch) == 4
    weights = ttt.get_state()["rl_module"]
    for episode in batch:
        assert episode.env_t_started == 0 and episode.is_done

        def greedy(k, agent, step, obs, episode=episode):
            module_id = episode.module_for(agent)
            out = ttt.module[module_id].forward_inference(weights[module_id],
                                                          {"obs": obs[None]})
            return int(np.argmax(np.asarray(out["action_dist_inputs"])[0]))

        (expected,) = reference_rollout(ttt.env, ttt.env_params, greedy, num_episodes=1)
        assert_same_episode(episode, expected)


def test_rewards_received_while_waiting_accumulate(relay_pair):
    """Relay gives every agent a reward at every env step; a waiting agent's rewards go to
    its last action, rewards before its first action are not its own, and `c` leaves the
    episode alone (its later chunks are dropped)."""
    runner, _, _ = relay_pair
    batches = [runner.sample(num_timesteps=n, force_reset=(i == 0))
               for i, n in enumerate([4, 7, 11])]
    by_id, _ = whole_episodes(batches)
    (episode,) = by_id.values()
    assert len(episode) == 22 and not episode.is_done
    actions = {a: list(sa.actions) for a, sa in episode.agent_episodes.items()}

    def replay(k, agent, step, obs):
        # Actions still pending after the last step are in no chunk yet; they cannot
        # change what was completed by then.
        taken = actions[agent]
        return int(taken[step]) if step < len(taken) else 0

    (expected,) = reference_rollout(runner.env, runner.env_params, replay, num_env_steps=22)
    assert_same_episode(episode, expected, check_done=False)
    c = episode.agent_episodes["c"]
    assert int(np.argmax(episode.acted["c"])) == 1  # c's first observation came after step 0
    assert c.get_return() < float(np.sum(episode.env_rewards["c"]))  # step 0 is not c's


# ---------------------------------------------------------------------- count_steps_by
def test_env_steps__sample_10_then_200(relay_pair):
    """Spec §10 (MAER): sample(10) gives Σlen 10; the next sample(200) gives Σlen 200 and
    Σenv_t 210; an episode-mode call resets env_t_started to 0."""
    runner, _, _ = relay_pair
    first = runner.sample(num_timesteps=10, force_reset=True)
    assert sum(len(e) for e in first) == 10
    second = runner.sample(num_timesteps=200)
    assert sum(len(e) for e in second) == 200
    assert sum(e.env_t for e in second) == 210
    (chunk,) = second
    assert chunk.env_t_started == 10 and chunk.id_ == first[0].id_
    for agent, sa in chunk.agent_episodes.items():
        before = first[0].agent_episodes[agent]
        assert sa.t_started == before.t
        np.testing.assert_array_equal(sa.observations[0], before.observations[-1])
        # One step of lookback: the predecessor's last step.
        np.testing.assert_array_equal(sa.lookback_actions, before.actions[-1:])
        np.testing.assert_array_equal(sa.lookback_observations, before.observations[-2:-1])
        np.testing.assert_allclose(sa.lookback_rewards, before.rewards[-1:])
        sa.validate()
    episode_batch = runner.sample(num_episodes=1)
    assert [e.env_t_started for e in episode_batch] == [0]
    assert len(episode_batch[0]) == 1000 and episode_batch[0].is_truncated


def test_same_seed__same_batches(relay_pair):
    first, second, fresh = relay_pair
    first.set_state(fresh)  # other tests may have sampled with it; `second` is fresh
    a = first.sample(num_timesteps=24, force_reset=True)
    b = second.sample(num_timesteps=24, force_reset=True)
    assert len(a) == len(b) == 1
    for x, y in zip(a, b):
        assert x.id_ == y.id_
        for agent in x.agent_episodes:
            np.testing.assert_array_equal(x.agent_episodes[agent].observations,
                                          y.agent_episodes[agent].observations)
            np.testing.assert_array_equal(x.agent_episodes[agent].actions,
                                          y.agent_episodes[agent].actions)
            np.testing.assert_array_equal(
                x.agent_episodes[agent].extra_model_outputs["action_logp"],
                y.agent_episodes[agent].extra_model_outputs["action_logp"])


def test_agent_steps__counts_completed_agent_steps():
    """count_steps_by="agent_steps": Σ agent_steps() in [n, n + num_envs * num_agents)."""
    runner = MultiAgentEnvRunner(config=relay_config("agent_steps", horizon=7, num_envs=2))
    try:
        batches = [runner.sample()]
        assert 8 * 2 <= batches[0].agent_steps() < 8 * 2 + 2 * 3
        for n in (1, 7, 30, 0):
            batch = runner.sample(num_timesteps=n)
            batches.append(batch)
            assert n <= batch.agent_steps() < n + 2 * 3 or (n == 0 and len(batch) == 0)
            assert batch.agent_steps() == sum(len(sa) for e in batch
                                              for sa in e.agent_episodes.values())
        by_id, finished = whole_episodes(batches)
        assert len(finished) >= 3
        for episode_id in finished:
            episode = by_id[episode_id]
            assert len(episode) == 7 and episode.is_truncated
            # An agent's return: the env's rewards from its first action to its end.
            for agent, sa in episode.agent_episodes.items():
                acted = np.flatnonzero(episode.acted[agent])
                end = acted[-1] + 1 if sa.is_terminated else len(episode)
                own = float(np.sum(episode.env_rewards[agent][acted[0]:end]))
                assert sa.get_return() == pytest.approx(own, rel=1e-5)
        metrics = runner.get_metrics()
        sampled = sum(metrics["num_agent_steps_sampled"].values())
        assert sampled == metrics["num_module_steps_sampled"]["shared"]
        assert sampled >= 16 + 1 + 7 + 30
    finally:
        runner.stop()


def test_agent_steps__rllib_four_agents_four_envs():
    """RLlib's test: 4 agents, 4 envs, fragment 20, agent_steps -> 4 episodes with
    agent_steps() == 20 each (all agents act every step)."""
    config = (RunnerConfig().environment("MultiAgentCartPole-v1", env_config={"num_agents": 4})
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=20)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .multi_agent(policies={"p0", "p1"}, count_steps_by="agent_steps",
                           policy_mapping_fn=lambda aid, ep: "p0" if aid == "agent_0" else "p1")
              .debugging(seed=1))
    runner = MultiAgentEnvRunner(config=config)
    try:
        batch = runner.sample()
        assert len(batch) == 4 and [e.agent_steps() for e in batch] == [20] * 4
        assert [len(e) for e in batch] == [5] * 4
        for episode in batch:
            assert {episode.module_for(a) for a in ("agent_1", "agent_2", "agent_3")} == {"p1"}
        more = runner.sample(num_timesteps=400)
        by_id, finished = whole_episodes([batch, more])
        assert finished
        for episode_id in finished:
            episode = by_id[episode_id]
            # CartPole pays 1 per step to each standing pole: per-agent returns are the
            # env's rewards, and each agent's length is its own pole's lifetime.
            for agent, sa in episode.agent_episodes.items():
                assert sa.get_return() == pytest.approx(float(np.sum(episode.env_rewards[agent])))
                assert len(sa) == int(np.sum(episode.acted[agent])) and sa.is_terminated
            assert max(len(sa) for sa in episode.agent_episodes.values()) == len(episode)
        # Per-module device arrays: every masked entry is one agent step.
        modules = more.module_batches()
        assert set(modules) == {"p0", "p1"} and modules["p1"].agent_ids == (
            "agent_1", "agent_2", "agent_3")
        counted = {m: int(np.sum(np.asarray(mb.mask))) for m, mb in modules.items()}
        assert counted["p0"] == sum(len(e.agent_episodes["agent_0"]) for e in more
                                    if "agent_0" in e.agent_episodes)
        assert sum(counted.values()) == more.agent_steps()
        p1 = modules["p1"]
        rewards = np.asarray(p1.rewards)[np.asarray(p1.mask)]
        assert rewards.shape == (counted["p1"],) and np.all(rewards == 1.0)
        assert np.asarray(p1.obs).shape[2:] == (3, 4)
    finally:
        runner.stop()


# ---------------------------------------------------------------------- compile once
def test_compile_once_over_many_sizes(ttt):
    for explore in (True, False):
        ttt.sample(num_timesteps=3, explore=explore).module_batch_chunks()
        ttt.sample(num_episodes=1, explore=explore)
    ttt.get_metrics()
    with count_compiles() as compiles:
        for n in (1, 2, 7, 13, 25, 40):
            batch = ttt.sample(num_timesteps=n)
            len(batch)
            batch.module_batch_chunks()
        for k in (1, 3):
            ttt.sample(num_episodes=k, explore=False)
        ttt.get_metrics()
    assert compiles == []


# ---------------------------------------------------------------------- metrics
def test_metrics__general_agent_and_module_keys(ttt):
    ttt.get_metrics()
    batch = ttt.sample(num_timesteps=40, force_reset=True)
    metrics = ttt.get_metrics()
    finished = [e for e in batch if e.is_done]
    assert metrics["num_episodes"] == len(finished) > 3
    assert metrics["num_env_steps_sampled"] == 40
    agent_steps = metrics["num_agent_steps_sampled"]
    assert set(agent_steps) == {"player_x", "player_o"}
    assert sum(agent_steps.values()) == batch.agent_steps()
    assert sum(metrics["num_module_steps_sampled"].values()) == batch.agent_steps()
    for agent in agent_steps:
        assert agent_steps[agent] == sum(len(e.agent_episodes[agent]) for e in batch
                                         if agent in e.agent_episodes)
        assert metrics["num_agent_steps_sampled_lifetime"][agent] >= agent_steps[agent]
    # Window of 3: the last three episodes to finish, in (step, sub-env) order.
    ends = []
    for b in range(ttt.num_envs):
        step = 0
        for episode in (e for e in batch if e.env_index == b):
            step += len(episode)
            if episode.is_done:
                ends.append((step, b, episode))
    last = [e for _, _, e in sorted(ends, key=lambda x: (x[0], x[1]))[-3:]]
    assert metrics["episode_len_mean"] == pytest.approx(np.mean([len(e) for e in last]))
    assert metrics["episode_return_mean"] == pytest.approx(0.0)
    for agent in ("player_x", "player_o"):
        expected = np.mean([e.agent_episodes[agent].get_return() for e in last])
        assert metrics["agent_episode_return_mean"][agent] == pytest.approx(expected)
    for module_id in ("main", "opponent"):
        expected = np.mean([sum(sa.get_return() for sa in e.agent_episodes.values()
                                if sa.module_id == module_id) for e in last])
        assert metrics["module_episode_return_mean"][module_id] == pytest.approx(expected)
    assert ttt.get_metrics()["num_agent_steps_sampled"] == {"player_x": 0, "player_o": 0}


# ---------------------------------------------------------------------- state
def test_state__round_trip_reproduces_next_sample(ttt):
    ttt.sample(num_timesteps=5)
    state = ttt.get_state(components=["rl_module", "env_runner_carry"])
    assert set(state["rl_module"]) == {"main", "opponent"}
    first = ttt.sample(num_timesteps=14)
    ttt.set_state(state)
    second = ttt.sample(num_timesteps=14)
    assert [e.id_ for e in first] == [e.id_ for e in second]
    for x, y in zip(first, second):
        for agent, sa in x.agent_episodes.items():
            np.testing.assert_array_equal(sa.actions, y.agent_episodes[agent].actions)
            np.testing.assert_array_equal(sa.lookback_actions,
                                          y.agent_episodes[agent].lookback_actions)


def test_state__weights_per_module_and_seq_no(ttt):
    weights = ttt.get_state()["rl_module"]
    zeroed = {"main": {k: {n: np.zeros_like(v) for n, v in layer.items()}
                       for k, layer in weights["main"]["pi"].items()}}
    ttt.set_state({"rl_module": {"main": {"pi": zeroed["main"]}}, "weights_seq_no": 5})
    state = ttt.get_state()
    assert state["weights_seq_no"] == 5
    assert all(np.all(v == 0) for layer in state["rl_module"]["main"]["pi"].values()
               for v in layer.values())
    np.testing.assert_array_equal(  # the other module is unchanged
        state["rl_module"]["opponent"]["pi"]["Dense_0"]["kernel"],
        weights["opponent"]["pi"]["Dense_0"]["kernel"])
    ttt.set_state({"rl_module": weights, "weights_seq_no": 4})  # older: ignored
    assert ttt.get_state()["weights_seq_no"] == 5
    with pytest.raises(StateStructureError, match="module ids"):
        ttt.set_state({"rl_module": {"nobody": weights["main"]}})
    ttt.set_state({"rl_module": weights, "weights_seq_no": 0})  # 0: always applied
    np.testing.assert_array_equal(ttt.get_state()["rl_module"]["main"]["pi"]["Dense_0"]["kernel"],
                                  weights["main"]["pi"]["Dense_0"]["kernel"])
    assert len(ttt.sample(num_timesteps=4)) > 0


def test_spaces_health_and_sample_get_state_and_metrics(ttt):
    spaces = ttt.get_spaces()
    assert {"main", "opponent", "__env__", "__env_single__"} <= set(spaces)
    assert spaces["main"][1].n == 9 and spaces["__env_single__"][0]["player_o"].shape == (9,)
    ttt.assert_healthy()
    batch, state, metrics = ttt.sample_get_state_and_metrics()
    assert "rl_module" not in state and "num_env_steps_sampled" in metrics
    assert sum(len(e) for e in batch) == 6 * 2
    assert ttt.module.is_trainable("main") and not ttt.module.is_trainable("opponent")


# ---------------------------------------------------------------------- errors
def test_runner_class_for_and_non_multi_agent_config():
    single = RunnerConfig().environment("CartPole-v1")
    assert jaxrunner.runner_class_for(single) is SingleAgentEnvRunner
    assert jaxrunner.runner_class_for(ttt_config()) is MultiAgentEnvRunner
    assert jaxrunner.runner_class_for(
        RunnerConfig().multi_agent(policies={"shared"})) is MultiAgentEnvRunner

    class Custom(MultiAgentEnvRunner):
        pass

    assert jaxrunner.runner_class_for(ttt_config(env_runner_cls=Custom)) is Custom
    with pytest.raises(ValueError, match=r"config.multi_agent\(policies="):
        MultiAgentEnvRunner(config=RunnerConfig().environment("CartPole-v1"))
    # A multi-agent env without .multi_agent(): every agent maps to "default_policy".
    runner = MultiAgentEnvRunner(config=RunnerConfig().environment("TicTacToe-v0").env_runners(
        num_envs_per_env_runner=2, rollout_fragment_length=4))
    batch = runner.sample()
    assert runner.module.module_ids == ("default_policy",)
    assert {e.module_for(a) for e in batch for a in e.agent_episodes} == {"default_policy"}


def test_unknown_module_ids_and_untraceable_mappings_fail_before_compiling():
    with count_compiles() as compiles:
        for mapping, error in (
            (lambda aid, ep: "nobody", UnknownModuleError),
            (lambda aid, ep: ep.choose(ep.coin(), "main", "nobody"), UnknownModuleError),
            (lambda aid, ep: ep.random_module(["main", "ghost"]), UnknownModuleError),
            (lambda aid, ep: "main" if ep.index % 2 else "opponent", TypeError),
            (lambda aid, ep: 3, TypeError),
        ):
            config = ttt_config().multi_agent(policy_mapping_fn=mapping)
            with pytest.raises(error):
                MultiAgentEnvRunner(config=config)
    assert not [c for c in compiles if "scan" in c or "chunk" in c]
    with pytest.raises(ValueError, match="count_steps_by"):
        ttt_config().multi_agent(count_steps_by="episodes")


def test_bad_reconfiguration_leaves_the_runner_working(ttt):
    ttt.sample(num_timesteps=2)
    ttt.config.multi_agent(policy_mapping_fn=lambda aid, ep: "nobody")
    with pytest.raises(UnknownModuleError):
        ttt.make_module()
    ttt.config.multi_agent(policy_mapping_fn=self_play)
    object.__setattr__(ttt.config, "count_steps_by", "episodes")  # bypasses validation
    with pytest.raises(ValueError, match="count_steps_by"):
        ttt.sample(num_timesteps=2)
    object.__setattr__(ttt.config, "count_steps_by", "env_steps")
    agents = ttt.env.agents
    ttt.env.agents = ("player_x",)
    try:
        with pytest.raises(ValueError, match="changed its agents"):
            ttt.sample(num_timesteps=2)
    finally:
        ttt.env.agents = agents
    with count_compiles() as compiles:
        assert sum(len(e) for e in ttt.sample(num_timesteps=4)) == 4
    assert compiles == []


def test_env_agents_must_be_fixed_at_construction():
    class Growing(Relay):
        def agents_to_act(self, state, params):
            return {**super().agents_to_act(state, params), "d": state.c_done}

    config = relay_config().environment(lambda ctx: (Growing(), Growing().default_params))
    with pytest.raises(ValueError, match="agents_to_act"):
        MultiAgentEnvRunner(config=config)


def test_local_runner_without_env_has_modules_from_given_spaces():
    """A group's local runner (worker_index=0 next to remote runners) builds no env: its
    modules come from the spaces it is given, and sampling says why it cannot."""
    import gymnasium as gym

    box, cells = gym.spaces.Box(-1.0, 1.0, (9,), np.float32), gym.spaces.Discrete(9)
    config = ttt_config(num_env_runners=2)
    runner = MultiAgentEnvRunner(config=config, worker_index=0,
                                 spaces={"main": (box, cells), "opponent": (box, cells)})
    assert runner.env is None and set(runner.module) == {"main", "opponent"}
    assert set(runner.get_state()["rl_module"]) == {"main", "opponent"}
    assert runner.get_metrics()["num_env_steps_sampled"] == 0
    with pytest.raises(ValueError, match="no env"):
        runner.sample()
    with pytest.raises(AssertionError):
        runner.assert_healthy()


def test_jaxmarl_mpe_through_the_runner():
    pytest.importorskip("jaxmarl")
    config = (RunnerConfig().environment("jaxmarl/MPE_simple_spread_v3")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=30)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .multi_agent(policies={"shared"}).debugging(seed=0))
    runner = MultiAgentEnvRunner(config=config)
    try:
        batch = runner.sample()
        assert sum(len(e) for e in batch) == 60
        finished = [e for e in batch if e.is_done]
        assert len(finished) == 2
        for episode in finished:  # MPE ends on its step limit: truncated, 3 agents x 26 steps
            assert episode.is_truncated and len(episode) == 26 and episode.agent_steps() == 78
        metrics = runner.get_metrics()
        assert set(metrics["agent_episode_return_mean"]) == {"agent_0", "agent_1", "agent_2"}
    finally:
        runner.stop()
