"""Env-to-module and module-to-env connectors of the multi-agent runner: one pipeline per
agent whose state advances only at the agent's own turns.

Pinned against plain numpy / Python replays of the returned episodes: per-agent
`MeanStdFilter` statistics of turn-based TicTacToe (the agents alternate; the filter sees
the agent's replayed frame stacks of [observation, previous action, previous reward]) and
of MultiAgentCartPole (raw observations; an agent that terminated stops acting), what the
module sees, the merge of two runners' states, the state round trip (in memory and
through a checkpoint), compile-once, the build-time errors, and that the single-agent
vector step traces the same program as before contexts had masks.
"""

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.connectors import (ConnectorV2, FrameStacking, MeanStdFilter,
                                  PrevActionsPrevRewards)
from jaxrunner.modules.rl_module import LinenRLModule
from conftest import assert_trees_equal

E2M = "env_to_module_connector"


class LinearModule(LinenRLModule):
    """action_dist_inputs = obs @ kernel + bias (tests recompute them on the host)."""

    def make_network(self):
        return nn.Dense(self.action_dist_input_dim)


def _config(env, factory, *, seed=0, num_envs=8, fragment=6, linear=False, **multi_agent):
    config = (jr.RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment,
                           env_to_module_connector=factory, episode_lookback_horizon=3)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .debugging(seed=seed))
    if multi_agent:
        config.multi_agent(**multi_agent)
    if linear:
        config.rl_module(rl_module_spec=jr.RLModuleSpec(LinearModule))
    return config


FRAMES = 3
FEATURES = 9 + 9 + 1  # TicTacToe board, previous action one-hot, previous reward


def _filter_factory(env, spaces, device):
    return MeanStdFilter(multi_agent=True)  # RLlib's spelling; no space given


def _stack_factory(env, spaces, device):
    return [PrevActionsPrevRewards(multi_agent=True),
            FrameStacking(num_frames=FRAMES, multi_agent=True), MeanStdFilter(multi_agent=True)]


def _zero_filter_state(agents, size):
    zeros = (np.zeros((), np.float32), np.zeros(size, np.float32), np.zeros(size, np.float32))
    return {E2M: {"MeanStdFilter": {a: {"base": zeros, "delta": zeros} for a in agents}}}


def _raw_observations(steps):
    """`(len, 9)`: the observations an agent chunk's steps were acted on."""
    return np.asarray(steps.observations, np.float64)[:len(steps)]


def _stacked_features(steps):
    """`(len, FRAMES * FEATURES)`: a plain-Python replay of what the agent's pipeline
    feeds the filter at each of its steps: the last FRAMES frames of [observation,
    previous action one-hot, previous reward] of the agent's own steps (zeros before its
    first step of the episode), from the chunk and its lookback."""
    obs = np.concatenate([steps.lookback_observations, steps.observations])
    actions = np.concatenate([steps.lookback_actions, steps.actions])
    rewards = np.concatenate([steps.lookback_rewards, steps.rewards])
    offset = len(steps.lookback_actions)

    def frame(j):  # agent step j of the chunk (negative: in the lookback)
        k = steps.t_started + j  # ... of the episode
        if k < 0:
            return np.zeros(FEATURES)
        if k == 0:
            return np.concatenate([obs[offset + j], np.zeros(10)])
        return np.concatenate([obs[offset + j], np.eye(9)[actions[offset + j - 1]],
                               [rewards[offset + j - 1]]])

    return np.array([np.concatenate([frame(i - f) for f in range(FRAMES - 1, -1, -1)])
                     for i in range(len(steps))]).reshape(len(steps), FRAMES * FEATURES)


def _hangs(episode, agent):
    """The agent's first step in this chunk was acted on in an earlier call: its first
    completion here comes before its first action here (or it does not act here)."""
    if episode.env_t_started == 0:
        return False
    acted = np.flatnonzero(episode.acted[agent])
    completed = np.flatnonzero(episode.completed[agent])
    return len(completed) > 0 and (len(acted) == 0 or completed[0] < acted[0])


def _acted_rows(batches, agent, rows):
    """`rows(agent chunk)` of the steps `agent` acted on during the calls that returned
    `batches[:-1]`, read from the returned episodes only: every agent step of those
    calls' chunks, except a first step hanging from before the first call, plus the
    steps hanging at the start of the last call (acted on before it, completed in it)."""
    out = []
    for call, batch in enumerate(batches):
        for episode in batch:
            steps = episode.agent_episodes.get(agent)
            if steps is None:
                continue
            values, hangs = rows(steps), _hangs(episode, agent)
            if call == len(batches) - 1:
                out.append(values[:1] if hangs else values[:0])
            else:
                out.append(values[1:] if call == 0 and hangs else values)
    return np.concatenate(out)


def _assert_statistics(saved, rows):
    count, mean, var = MeanStdFilter.statistics(saved)
    assert count == len(rows) > 0
    np.testing.assert_allclose(mean, rows.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(var, rows.var(0), rtol=1e-3, atol=1e-5)


def _sample_window(runner, sizes):
    """Samples `sizes`, then one more call; returns (batches, filter state after the
    calls of `sizes`)."""
    batches = [runner.sample(num_timesteps=n) for n in sizes]
    saved = runner.get_state(components=E2M)[E2M]["MeanStdFilter"]
    batches.append(runner.sample(num_timesteps=8))
    return batches, saved


@pytest.fixture(scope="module")
def tictactoes():
    """Two TicTacToe runners (seeds 0 and 1; X and O alternate), one linear module per
    player, pipeline [PrevActionsPrevRewards, FrameStacking(3), MeanStdFilter]."""
    runners = [jr.MultiAgentEnvRunner(config=_config(
        "TicTacToe-v0", _stack_factory, seed=seed, linear=True, policies={"x", "o"},
        policy_mapping_fn=lambda agent, episode: "x" if agent == "player_x" else "o"))
        for seed in (0, 1)]
    yield runners
    for runner in runners:
        runner.stop()


@pytest.fixture(scope="module")
def cartpole():
    """MultiAgentCartPole (2 agents that terminate alone, one module), a MeanStdFilter."""
    runner = jr.MultiAgentEnvRunner(config=_config("MultiAgentCartPole-v1", _filter_factory))
    yield runner
    runner.stop()


def test_turn_based_pipeline_state_follows_each_agents_own_turns(tictactoes):
    """Per agent, the filter's statistics are those of the replayed stacked frames of the
    agent's own steps (the other player's turns in between change nothing), and the
    module sees them normalised with those statistics."""
    runner = tictactoes[0]
    agents = runner.agent_ids
    width = FRAMES * FEATURES
    assert runner.get_spaces()["x"][0] == gym.spaces.Box(-10.0, 10.0, (width,), np.float32)
    runner.set_state(_zero_filter_state(agents, (width,)))
    batches, saved = _sample_window(runner, (16, 40, 24))
    assert set(saved) == set(agents)
    counts, checked = {}, 0
    for agent in agents:
        rows = _acted_rows(batches, agent, _stacked_features)
        _assert_statistics(saved[agent], rows)
        counts[agent] = len(rows)
        # The steps hanging into the last call were acted on at the last vector step of
        # the one before: normalised with the statistics `saved` holds.
        params = runner.get_state()["rl_module"]["x" if agent == "player_x" else "o"]
        _, mean, var = MeanStdFilter.statistics(saved[agent])
        for episode in batches[-1]:
            steps = episode.agent_episodes.get(agent)
            if steps is None or not _hangs(episode, agent):
                continue
            normed = np.clip((_stacked_features(steps)[0] - mean) / (np.sqrt(var) + 1e-8),
                             -10, 10)
            np.testing.assert_allclose(
                steps.extra_model_outputs["action_dist_inputs"][0],
                normed @ np.asarray(params["kernel"], np.float64) + params["bias"],
                rtol=1e-3, atol=1e-4)
            checked += 1
    # Exactly one player acts per env step: X's turns and O's turns add up to the steps.
    assert counts["player_x"] + counts["player_o"] == 16 + 40 + 24
    assert counts["player_x"] >= counts["player_o"] > 0  # X opens every game
    assert checked > 0


def test_mean_std_filter__agents_that_terminated_stop_updating_their_statistics(cartpole):
    runner = cartpole
    assert runner.get_spaces()["default_policy"][0].shape == (4,)
    runner.set_state(_zero_filter_state(runner.agent_ids, (4,)))
    batches, saved = _sample_window(runner, (80, 160))
    env_steps = sum(batch.env_steps for batch in batches[:-1])
    for agent in runner.agent_ids:
        rows = _acted_rows(batches, agent, _raw_observations)
        _assert_statistics(saved[agent], rows)
        # An agent that terminated waits for the others: it acts on fewer env steps.
        assert len(rows) < env_steps


def test_mean_std_filter__merge_of_two_runners_is_the_pooled_statistics(tictactoes):
    windows, states = [], []
    width = FRAMES * FEATURES
    for runner in tictactoes:
        runner.set_state(_zero_filter_state(runner.agent_ids, (width,)))
        batches, saved = _sample_window(runner, (16, 24))
        windows.append(batches)
        states.append({E2M: {"MeanStdFilter": saved}})
    merged = tictactoes[0].merge_connector_states(states)[E2M]["MeanStdFilter"]
    for agent in tictactoes[0].agent_ids:
        pooled = np.concatenate([_acted_rows(b, agent, _stacked_features) for b in windows])
        _assert_statistics(merged[agent], pooled)
    # Broadcasting the merged state and merging again does not count anything twice.
    broadcast = {E2M: {"MeanStdFilter": merged}}
    for runner in tictactoes:
        runner.set_state(broadcast)
    again = tictactoes[0].merge_connector_states(
        [r.get_state(components=E2M) for r in tictactoes])[E2M]["MeanStdFilter"]
    for agent in tictactoes[0].agent_ids:
        assert (MeanStdFilter.statistics(again[agent])[0]
                == MeanStdFilter.statistics(merged[agent])[0])


def test_state_round_trip_and_checkpoint_reproduce_the_next_sample(tictactoes, tmp_path):
    runner = tictactoes[0]
    runner.sample(num_timesteps=20)
    state = runner.get_state(components="all")
    assert set(state[E2M]["MeanStdFilter"]) == set(runner.agent_ids)
    path = runner.save_to_path(tmp_path / "ckpt")
    first = runner.sample(num_timesteps=30)
    after = runner.get_state(components=E2M)
    for restore in (lambda: runner.set_state(state), lambda: runner.restore_from_path(path)):
        restore()
        again = runner.sample(num_timesteps=30)
        assert_trees_equal(first.trajectory(), again.trajectory(), "trajectory")
        assert_trees_equal(after, runner.get_state(components=E2M), "connector state")


def test_sizes_compile_nothing_after_warm_up(tictactoes, compile_counter):
    runner = tictactoes[0]
    runner.sample(num_timesteps=8)
    runner.get_state(components=E2M)
    compile_counter.reset()
    for size in (1, 9, 33, 70):
        runner.sample(num_timesteps=size)
    runner.get_state(components=E2M)
    assert compile_counter.count == 0


def test_set_state_for_an_unknown_agent_is_a_clear_error_and_the_runner_still_works(
        tictactoes):
    runner = tictactoes[0]
    good = runner.get_state(components=E2M)[E2M]["MeanStdFilter"]["player_x"]
    with pytest.raises(jr.StateStructureError, match="agent 'player_z'"):
        runner.set_state({E2M: {"MeanStdFilter": {"player_z": good}}})
    with pytest.raises(jr.StateStructureError, match="NoSuchPiece"):
        runner.set_state({E2M: {"NoSuchPiece": {"player_x": {}}}})
    assert runner.sample(num_timesteps=8).env_steps >= 8


class _WidensPerCopy(ConnectorV2):
    """Appends one more zero column in every copy bound (agents' copies then disagree)."""

    bound = 0

    def bind_input_observation_space(self, space):
        super().bind_input_observation_space(space)
        type(self).bound += 1
        self.extra = type(self).bound

    def recompute_observation_space(self, space):
        return gym.spaces.Box(-np.inf, np.inf, (space.shape[0] + self.extra,), np.float32)

    def __call__(self, state, obs, ctx):
        return state, jnp.concatenate([obs, jnp.zeros((obs.shape[0], self.extra))], axis=-1)


class _DropsBatchAxis(ConnectorV2):
    def __call__(self, state, obs, ctx):
        return state, obs[0]


@pytest.mark.parametrize("factory, error, match", [
    (lambda env, spaces, device: _WidensPerCopy(), ValueError,
     "connector pipelines produce different observation spaces"),
    (lambda env, spaces, device: _DropsBatchAxis(), ValueError,
     r"of agent 'player_x' turns a batch of 8 .* keep the leading batch axis"),
    (lambda env, spaces, device: "not a connector", TypeError, "ConnectorV2"),
    (lambda env, spaces, device: MeanStdFilter(gym.spaces.Discrete(3)), ValueError, "Box"),
])
def test_bad_pipelines_are_clear_errors_when_the_runner_is_built(factory, error, match):
    with pytest.raises(error, match=match):
        jr.MultiAgentEnvRunner(config=_config("TicTacToe-v0", factory))


# ---------------------------------------------------------------------- the single-agent program
def _combine(a, b):
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    safe = jnp.maximum(n, 1.0)
    delta = mean_b - mean_a
    return n, mean_a + delta * (n_b / safe), m2_a + m2_b + delta * delta * (n_a * n_b / safe)


class _ReferenceMeanStd(MeanStdFilter):
    """MeanStdFilter as written before contexts had a mask."""

    def __call__(self, state, obs, ctx):
        obs = jnp.asarray(obs, jnp.float32)
        mean_b = jnp.mean(obs, axis=0)
        m2_b = jnp.sum((obs - mean_b) ** 2, axis=0)
        state = {"base": state["base"], "delta": _combine(
            state["delta"], (jnp.asarray(obs.shape[0], jnp.float32), mean_b, m2_b))}
        n, mean, m2 = _combine(state["base"], state["delta"])
        std = jnp.sqrt(m2 / jnp.maximum(n, 1.0))
        return state, jnp.clip((obs - mean) / (std + self.epsilon), -self.clip, self.clip)


class _ReferenceFrameStacking(FrameStacking):
    """FrameStacking as written before contexts had a mask."""

    def __call__(self, stacked, obs, ctx):
        obs = jnp.asarray(obs, self.dtype)
        keep = (~ctx.is_first).reshape((-1,) + (1,) * (stacked.ndim - 1))
        older = stacked[..., self.frame_shape[-1]:] * keep.astype(stacked.dtype)
        stacked = jnp.concatenate([older, obs], axis=-1)
        return stacked, stacked


def test_single_agent_vector_step_traces_the_program_it_traced_before_masks():
    """Without a mask (the single-agent runner) the pieces trace exactly the unmasked
    program: the jaxpr of one vector step equals that with the pre-mask pieces."""
    jaxprs = []
    for pieces in ([MeanStdFilter(), PrevActionsPrevRewards(), FrameStacking(num_frames=2)],
                   [_ReferenceMeanStd(), PrevActionsPrevRewards(),
                    _ReferenceFrameStacking(num_frames=2)]):
        config = (jr.RunnerConfig().environment("CartPole-v1")
                  .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=4,
                               env_to_module_connector=lambda env, spaces, device, p=pieces: p)
                  .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
        runner = jr.SingleAgentEnvRunner(config=config)
        fns = runner.sampler.chunk_fns("explore")
        params = runner.get_state(components="rl_module")["rl_module"]
        carry = jax.eval_shape(fns.init_carry, jax.random.key(0), params, runner.env_params)
        jaxprs.append(str(jax.make_jaxpr(fns.vector_step)(carry, params, runner.env_params)))
        runner.stop()
    assert jaxprs[0] == jaxprs[1]
