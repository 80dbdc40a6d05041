"""Connector pipelines inside the compiled rollout: flattening, mean-std filter (merge =
union statistics), frame stacking across cuts, previous action/reward, action clipping,
and the errors of bad pipelines."""

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.connectors import (ConnectorV2, FrameStacking, MeanStdFilter,
                                  NormalizeAndClipActions, PrevActionsPrevRewards)
from jaxrunner.modules.rl_module import LinenRLModule
from jaxrunner.testing import DictObsEnv, MultiDiscreteEnv, TargetEnv


class LinearModule(LinenRLModule):
    """action_dist_inputs = obs @ kernel + bias (so tests can recompute them on the host)."""

    def make_network(self):
        return nn.Dense(self.action_dist_input_dim)


def _config(env="CartPole-v1", num_envs=4, fragment=7, **runner_kwargs):
    return (jr.RunnerConfig().environment(env)
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment,
                         **runner_kwargs)
            .rl_module(model_config={"fcnet_hiddens": [8]})
            .debugging(seed=0))


def _linear_outputs(runner, inputs):
    params = runner.get_state()["rl_module"]
    return np.asarray(inputs, np.float64) @ params["kernel"] + params["bias"]


def test_flatten__dict_observations_reach_the_module_flat():
    runner = jr.SingleAgentEnvRunner(config=_config(DictObsEnv()))
    module_space = runner.get_spaces()["default_policy"][0]
    assert module_space.shape == (2 + 3,)
    batch = runner.sample(num_timesteps=40)
    episode = batch[0]
    episode.validate()
    assert set(episode.observations) == {"position", "phase"}
    assert episode.observations["position"].shape == (len(episode) + 1, 2)
    assert runner.sample(num_episodes=2).env_steps > 0


def test_flatten__dict_observations_without_default_connectors_is_a_clear_error():
    config = _config(DictObsEnv(), add_default_connectors_to_env_to_module_pipeline=False)
    with pytest.raises(ValueError, match="FlattenObservations"):
        jr.SingleAgentEnvRunner(config=config)


def test_multidiscrete__actions_in_range_explore_and_random():
    runner = jr.SingleAgentEnvRunner(config=_config(MultiDiscreteEnv()))
    for random_actions in (False, True):
        batch = runner.sample(num_timesteps=40, random_actions=random_actions)
        actions = np.concatenate([e.actions for e in batch])
        assert actions.shape[1:] == (2,)
        assert actions.min() >= 0 and np.all(actions.max(0) <= [2, 1])
        rewards = np.concatenate([e.rewards for e in batch])
        np.testing.assert_array_equal(rewards, actions.sum(-1))
        if not random_actions:
            logp = np.concatenate([e.extra_model_outputs["action_logp"] for e in batch])
            assert np.all(logp <= 0) and np.all(np.isfinite(logp))


def test_normalize_and_clip__env_receives_in_bound_actions():
    runner = jr.SingleAgentEnvRunner(config=_config(TargetEnv(), num_envs=16))
    params = runner.get_state()["rl_module"]
    # A policy far out of bounds: the module's actions exceed [-1, 1] by a lot.
    params = jax.tree.map(np.zeros_like, params)
    params["pi"]["Dense_1"]["bias"] = np.array([50.0, 2.0], np.float32)
    runner.set_state({"rl_module": params})
    batch = runner.sample(num_timesteps=160)
    received = np.concatenate([e.observations[1:, 1] for e in batch])
    recorded = np.concatenate([e.actions[:, 0] for e in batch])
    assert recorded.max() > 10.0  # the episode keeps the unclipped action
    assert received.min() >= -2.0 and received.max() <= 2.0
    expected = np.clip(-2.0 + (recorded + 1.0) * 4.0 / 2.0, -2.0, 2.0)
    np.testing.assert_allclose(received, expected, rtol=1e-6)


def test_clip_actions__without_normalization():
    config = _config(TargetEnv(), num_envs=4).environment(normalize_actions=False,
                                                          clip_actions=True)
    runner = jr.SingleAgentEnvRunner(config=config)
    batch = runner.sample(num_timesteps=40)
    received = np.concatenate([e.observations[1:, 1] for e in batch])
    recorded = np.concatenate([e.actions[:, 0] for e in batch])
    np.testing.assert_allclose(received, np.clip(recorded, -2.0, 2.0), rtol=1e-6)


def _filter_config(seed):
    config = _config(num_envs=4, fragment=10,
                     env_to_module_connector=lambda env, spaces, device: MeanStdFilter(
                         spaces["__env_single__"][0]))
    return config.debugging(seed=seed)


def test_mean_std_filter__merged_state_is_the_union_of_samples():
    runners = [jr.SingleAgentEnvRunner(config=_filter_config(seed)) for seed in (0, 1)]
    seen = []
    for runner in runners:
        for _ in range(3):
            traj = jax.device_get(runner.sample().trajectory())
            seen.append(np.asarray(traj.obs[traj.valid]).reshape(-1, 4))
    states = [r.get_state(components="env_to_module_connector") for r in runners]
    merged = runners[0].merge_connector_states(states)["env_to_module_connector"]
    count, mean, var = MeanStdFilter.statistics(merged["MeanStdFilter"])
    union = np.concatenate(seen).astype(np.float64)
    assert count == len(union)
    np.testing.assert_allclose(mean, union.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(var, union.var(0), rtol=1e-3)
    # Broadcasting the merged state and merging again does not double count.
    for runner in runners:
        runner.set_state({"env_to_module_connector": merged})
    again = runners[0].merge_connector_states(
        [r.get_state(components="env_to_module_connector") for r in runners])
    assert MeanStdFilter.statistics(again["env_to_module_connector"]["MeanStdFilter"])[0] == count


def test_mean_std_filter__normalizes_what_the_module_sees():
    config = _filter_config(0).rl_module(rl_module_spec=jr.RLModuleSpec(LinearModule))
    runner = jr.SingleAgentEnvRunner(config=config)
    runner.sample()
    saved = runner.get_state(components="env_to_module_connector")
    _, mean, var = MeanStdFilter.statistics(saved["env_to_module_connector"]["MeanStdFilter"])
    batch = runner.sample(num_timesteps=4, explore=False)  # one vector step
    traj = jax.device_get(batch.trajectory())
    obs = np.asarray(traj.obs[0], np.float64)
    state_after = runner.get_state(components="env_to_module_connector")
    n, mean, var = MeanStdFilter.statistics(
        state_after["env_to_module_connector"]["MeanStdFilter"])
    normed = np.clip((obs - mean) / (np.sqrt(var) + 1e-8), -10, 10)
    np.testing.assert_allclose(traj.extra_model_outputs["action_dist_inputs"][0],
                               _linear_outputs(runner, normed), rtol=1e-3, atol=1e-4)


def test_mean_std_filter__wrong_state_shape_is_an_error_and_runner_still_works():
    runner = jr.SingleAgentEnvRunner(config=_filter_config(0))
    runner.sample()
    bad = {"MeanStdFilter": {"base": (np.float32(1), np.zeros(3), np.zeros(3)),
                             "delta": (np.float32(0), np.zeros(3), np.zeros(3))}}
    with pytest.raises(jr.StateStructureError, match=r"expected \(\), \(4,\), \(4,\)"):
        runner.set_state({"env_to_module_connector": bad})
    with pytest.raises(jr.StateStructureError, match="NoSuchConnector"):
        runner.set_state({"env_to_module_connector": {"NoSuchConnector": {}}})
    assert runner.sample(num_timesteps=8).env_steps == 8


def test_frame_stacking__module_inputs_equal_lookback_stacks_across_cuts():
    frames = 3
    config = (_config(num_envs=3, fragment=5, episode_lookback_horizon=frames - 1,
                      env_to_module_connector=lambda env, spaces, device: FrameStacking(
                          spaces["__env_single__"][0], frames))
              .rl_module(rl_module_spec=jr.RLModuleSpec(LinearModule)))
    runner = jr.SingleAgentEnvRunner(config=config)
    stacker = FrameStacking(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), frames)
    assert runner.get_spaces()["default_policy"][0].shape == (12,)
    cut_chunks = 0
    for _ in range(8):  # many calls: episodes are cut and continue with lookback
        batch = runner.sample(num_timesteps=6, explore=False)
        for episode in batch:
            cut_chunks += episode.t_started > 0
            stacked = stacker.stack_episode(episode)[:-1]
            np.testing.assert_allclose(episode.extra_model_outputs["action_dist_inputs"],
                                       _linear_outputs(runner, stacked), rtol=1e-4, atol=1e-5)
    assert cut_chunks > 0


def test_prev_actions_prev_rewards__appended_and_reset_at_episode_start():
    def factory(env, spaces, device):
        obs_space, act_space = spaces["__env_single__"]
        return PrevActionsPrevRewards(obs_space, act_space)

    config = (_config(num_envs=3, fragment=6, env_to_module_connector=factory)
              .rl_module(rl_module_spec=jr.RLModuleSpec(LinearModule)))
    runner = jr.SingleAgentEnvRunner(config=config)
    assert runner.get_spaces()["default_policy"][0].shape == (4 + 2 + 1,)
    for _ in range(4):
        for episode in runner.sample(num_timesteps=9, explore=False):
            actions = np.concatenate([episode.lookback_actions, episode.actions])
            rewards = np.concatenate([episode.lookback_rewards, episode.rewards])
            offset = len(episode.lookback_actions)
            inputs = []
            for i in range(len(episode)):
                if episode.t_started + i == 0:
                    prev_a, prev_r = np.zeros(2), 0.0
                else:
                    prev_a = np.eye(2)[actions[offset + i - 1]]
                    prev_r = rewards[offset + i - 1]
                inputs.append(np.concatenate([episode.observations[i], prev_a, [prev_r]]))
            np.testing.assert_allclose(episode.extra_model_outputs["action_dist_inputs"],
                                       _linear_outputs(runner, np.array(inputs)),
                                       rtol=1e-4, atol=1e-5)


class _DropsBatchAxis(ConnectorV2):
    def __call__(self, state, obs, ctx):
        return state, obs[0]


def test_connector_that_changes_the_batch_shape_is_a_clear_error():
    config = _config(env_to_module_connector=lambda env, spaces, device: _DropsBatchAxis())
    with pytest.raises(ValueError, match="keep the leading batch axis"):
        jr.SingleAgentEnvRunner(config=config)
    # A fresh, valid runner works afterwards.
    assert jr.SingleAgentEnvRunner(config=_config()).sample(num_timesteps=4).env_steps == 4


def test_connector_factory_returning_a_non_connector_is_a_clear_error():
    config = _config(env_to_module_connector=lambda env, spaces, device: "not a connector")
    with pytest.raises(TypeError, match="ConnectorV2"):
        jr.SingleAgentEnvRunner(config=config)


def test_module_to_env_user_connector_runs_before_clipping():
    class Double(ConnectorV2):
        def __call__(self, state, actions, ctx):
            return state, actions * 2.0

    config = _config(TargetEnv(), module_to_env_connector=lambda env, spaces: Double())
    config.environment(normalize_actions=False, clip_actions=True)
    runner = jr.SingleAgentEnvRunner(config=config)
    batch = runner.sample(num_timesteps=40)
    received = np.concatenate([e.observations[1:, 1] for e in batch])
    recorded = np.concatenate([e.actions[:, 0] for e in batch])
    np.testing.assert_allclose(received, np.clip(2.0 * recorded, -2.0, 2.0), rtol=1e-6)


def test_normalize_and_clip_actions__unit():
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    piece = NormalizeAndClipActions(space, normalize_actions=True, clip_actions=False,
                                    env_dtype=jnp.float32)
    _, out = piece((), jnp.array([[-1.0, 1.0], [0.0, 0.0], [5.0, -5.0]]), None)
    np.testing.assert_allclose(out, [[-2.0, 10.0], [0.0, 5.0], [2.0, 0.0]])


# ---------------------------------------------------------------------- spaces from the pipeline
def test_pieces_without_spaces_get_them_from_the_pipeline():
    """RLlib style: no piece is given a space; each gets the one it receives (after the
    default FlattenObservations of the Dict env and the pieces before it), and the
    samples equal those of the same pieces built with explicit spaces."""
    seen = {}

    def implicit(env, spaces, device):
        seen.update(spaces)
        return [MeanStdFilter(), PrevActionsPrevRewards(), FrameStacking(num_frames=2)]

    def explicit(env, spaces, device):
        act_space = spaces["__env_single__"][1]
        flat = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
        return [MeanStdFilter(flat),
                PrevActionsPrevRewards(gym.spaces.Box(-10, 10, (5,), np.float32), act_space),
                FrameStacking(gym.spaces.Box(-np.inf, np.inf, (8,), np.float32), 2)]

    batches = []
    for factory in (implicit, explicit):
        config = _config(DictObsEnv(), env_to_module_connector=factory).rl_module(
            rl_module_spec=jr.RLModuleSpec(LinearModule))
        runner = jr.SingleAgentEnvRunner(config=config)
        # Dict (2 + 3 one-hot) -> flat 5 -> + previous action (2) and reward (1) -> x 2 frames
        assert runner.get_spaces()["default_policy"][0].shape == (16,)
        batches.append(jax.device_get(runner.sample(num_timesteps=40).trajectory()))
    assert isinstance(seen["__env_single__"][0], gym.spaces.Dict)  # the env's own spaces
    implicit_traj, explicit_traj = batches
    np.testing.assert_array_equal(implicit_traj.actions, explicit_traj.actions)
    np.testing.assert_array_equal(
        implicit_traj.extra_model_outputs["action_dist_inputs"],
        explicit_traj.extra_model_outputs["action_dist_inputs"])


def test_pieces_without_spaces_outside_a_pipeline_say_how_to_get_them():
    with pytest.raises(ValueError, match="connector pipeline"):
        MeanStdFilter().init_state(2)
    with pytest.raises(ValueError, match="action space"):
        PrevActionsPrevRewards().recompute_observation_space(gym.spaces.Box(-1, 1, (3,)))
    with pytest.raises(TypeError, match=r"FrameStacking\(num_frames=4\)"):
        FrameStacking(4)
    # A pipeline built by hand binds like the runner's.
    from jaxrunner.connectors import ConnectorPipeline

    pipeline = ConnectorPipeline([MeanStdFilter(), FrameStacking(num_frames=3)])
    out = pipeline.recompute_observation_space(gym.spaces.Box(-1, 1, (4,), np.float32))
    assert out.shape == (12,)
    state = pipeline.init_state(2)
    assert state[0]["base"][1].shape == (4,) and state[1].shape == (2, 12)
    with pytest.raises(ValueError, match="Box"):
        ConnectorPipeline([MeanStdFilter()]).recompute_observation_space(
            gym.spaces.Discrete(3))
