"""jaxrunner as the env runner of an RLlib algorithm (`jaxrunner.rllib.JaxEnvRunner`).

Fast tests build runners in-process (no Ray): logits equivalence of the Flax translation
of RLlib's default PPO module, config translation, weight sync and `weights_seq_no`,
episode cut semantics, metric structures, state, and the unsupported-setup errors. The
slow tests start a 2-CPU Ray instance and train RLlib's PPO (and run APPO) with
`JaxEnvRunner` as the algorithm's env runner.
"""

from __future__ import annotations

import copy
import math
import os
import time

import pytest

pytest.importorskip("ray.rllib")
torch = pytest.importorskip("torch")

import gymnasium as gym  # noqa: E402
from gymnax.environments.classic_control import cartpole  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (  # noqa: E402
    DefaultPPOTorchRLModule,
)
from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModuleSpec as RLlibModuleSpec  # noqa: E402
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger  # noqa: E402

import jaxrunner  # noqa: E402
from jaxrunner.rllib import (  # noqa: E402
    JaxEnvRunner,
    RLlibPPOModule,
    UnsupportedRLlibSetupError,
    flax_params_to_torch_state,
    torch_state_to_flax_params,
)
from jaxrunner.rllib.config import TuneEnvCreator, rllib_model_config  # noqa: E402

OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)

# (action space, model_config): the layouts RLlib's default PPO module can take.
LAYOUTS = {
    "default-discrete": (DISCRETE, {}),
    "shared-relu-discrete": (DISCRETE, {"vf_share_layers": True, "fcnet_activation": "relu",
                                        "fcnet_hiddens": [64, 32]}),
    "layernorm-head-discrete": (DISCRETE, {
        "fcnet_hiddens": [16, 8, 4], "fcnet_activation": "ELU", "fcnet_use_layernorm": True,
        "head_fcnet_hiddens": [7], "head_fcnet_activation": "swish",
        "head_fcnet_use_layernorm": True}),
    "default-box": (BOX, {"fcnet_hiddens": [32, 32]}),
    "clip-box": (BOX, {"fcnet_hiddens": [8], "log_std_clip_param": 0.5}),
    "free-log-std-box": (BOX, {"free_log_std": True, "fcnet_hiddens": [8],
                               "fcnet_activation": "GELU"}),
}


def torch_module(algo_config, obs_space, act_space, *, inference_only, seed=0):
    """RLlib's module for the spaces, with weights moved away from their init (by half
    their spread, as training does; LayerNorm gains and the free log-std by 0.5)."""
    torch.manual_seed(seed)
    module = algo_config.get_rl_module_spec(
        spaces={"default_policy": (obs_space, act_space)},
        inference_only=inference_only).build()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            spread = float(param.std()) if param.numel() > 1 else 0.0
            param.add_(0.5 * (spread or 1.0) * torch.randn(param.shape, generator=generator))
    return module


def torch_logits(module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = module.forward_inference({"obs": torch.from_numpy(np.asarray(obs))})
    return out["action_dist_inputs"].numpy()


def torch_logp(module, logits: np.ndarray, actions: np.ndarray) -> np.ndarray:
    dist = module.get_inference_action_dist_cls().from_logits(torch.from_numpy(logits))
    return dist.logp(torch.from_numpy(np.asarray(actions))).numpy()


def small_ppo_config(**env_runners):
    return (PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4,
                         rollout_fragment_length=25, **env_runners)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))


@pytest.fixture(scope="module")
def runner():
    """One sampling runner (its rollout compiles once) shared by the contract tests."""
    runner = JaxEnvRunner(config=small_ppo_config())
    yield runner
    runner.stop()


# ---------------------------------------------------------------------- weights / logits
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_flax_module__same_logits_and_logp_as_torch_module(name):
    act_space, model_config = LAYOUTS[name]
    config = PPOConfig().rl_module(model_config=model_config)
    learner_module = torch_module(config, OBS, act_space, inference_only=False)
    module = RLlibPPOModule(OBS, act_space, rllib_model_config(config))
    # The full learner state (value function, critic encoder) is what a checkpoint holds;
    # the translation keeps what acting needs.
    params = torch_state_to_flax_params(learner_module.get_state(), module.layout)
    obs = np.random.default_rng(0).normal(scale=3.0, size=(256, 5)).astype(np.float32)

    expected = torch_logits(learner_module, obs)
    got = np.asarray(module.forward_inference(jax.tree.map(jax.numpy.asarray, params),
                                              {"obs": obs})["action_dist_inputs"])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    if name == "clip-box":  # the log-std clamp is active for some rows
        assert np.isclose(np.abs(expected[:, 2:]), 0.5).any()

    dist = learner_module.get_inference_action_dist_cls().from_logits(
        torch.from_numpy(expected))
    actions = dist.sample().numpy()
    # Same distribution formulas (on the same inputs: a Gaussian's log-prob amplifies
    # 1e-6 input differences by (a - mean) / std**2).
    np.testing.assert_allclose(np.asarray(module.action_dist(expected).logp(actions)),
                               torch_logp(learner_module, expected, actions),
                               rtol=1e-5, atol=1e-5)

    # Flax -> torch gives back exactly the inference-only state RLlib sends to runners.
    back = flax_params_to_torch_state(params, module.layout)
    sent = learner_module.get_state(inference_only=True)
    assert set(back) == set(sent)
    for key in sent:
        np.testing.assert_array_equal(back[key], np.asarray(sent[key]), err_msg=key)


def test_runner__samples_with_the_learners_weights(runner):
    """End to end: the logits and log-probs recorded in sampled episodes are those of the
    learner's torch module on the recorded observations."""
    config = small_ppo_config()
    learner_module = torch_module(config, *runner.get_spaces()["default_policy"],
                                  inference_only=False, seed=3)
    runner.set_state({"rl_module": {"default_policy": learner_module.get_state()},
                      "weights_seq_no": 1})
    assert runner.get_state()["weights_seq_no"] == 1
    episodes = runner.sample(num_timesteps=100)
    assert sum(len(e) for e in episodes) == 100
    for episode in episodes:
        obs = episode.get_observations(slice(0, len(episode)))
        logits = episode.get_extra_model_outputs("action_dist_inputs")
        np.testing.assert_allclose(logits, torch_logits(learner_module, obs), rtol=0,
                                   atol=1e-5)
        np.testing.assert_allclose(
            episode.get_extra_model_outputs("action_logp"),
            torch_logp(learner_module, logits, episode.get_actions()), rtol=0, atol=1e-5)
        np.testing.assert_array_equal(episode.get_extra_model_outputs("weights_seq_no"), 1)
    # get_state() reports the torch weights, as RLlib's runner does.
    reported = runner.get_state()["rl_module"]
    for key, value in learner_module.get_state(inference_only=True).items():
        np.testing.assert_array_equal(np.asarray(reported[key]), np.asarray(value))


def test_set_state__respects_weights_seq_no_and_rejects_other_layouts():
    config = small_ppo_config()
    runner = JaxEnvRunner(config=config)  # no sampling: nothing compiles
    obs_space, act_space = runner.get_spaces()["default_policy"]
    state_a = torch_module(config, obs_space, act_space, inference_only=True, seed=1
                           ).get_state()
    state_b = torch_module(config, obs_space, act_space, inference_only=True, seed=2
                           ).get_state()

    def current():
        return flax_params_to_torch_state(runner.flax_params, runner.layout)

    def assert_is(state):
        for key, value in state.items():
            np.testing.assert_array_equal(current()[key], value, err_msg=key)

    runner.set_state({"rl_module": state_a, "weights_seq_no": 3})
    assert_is(state_a)
    runner.set_state({"rl_module": state_b, "weights_seq_no": 2})  # older: ignored
    assert_is(state_a)
    assert runner.get_state()["weights_seq_no"] == 3
    runner.set_state({"rl_module": {"default_policy": state_b}, "weights_seq_no": 0})
    assert_is(state_b)  # 0 forces the update ...
    assert runner.get_state()["weights_seq_no"] == 3  # ... and keeps the version
    runner.set_state({"num_env_steps_sampled_lifetime": 1234})
    assert runner.get_state()["num_env_steps_sampled_lifetime"] == 1234

    other = torch_module(PPOConfig().rl_module(model_config={"fcnet_hiddens": [8]}),
                         obs_space, act_space, inference_only=True).get_state()
    with pytest.raises(UnsupportedRLlibSetupError, match="wrong shapes"):
        runner.set_state({"rl_module": other, "weights_seq_no": 9})
    assert_is(state_b)
    assert runner.get_state()["weights_seq_no"] == 3

    # make_module() after a model-config change rebuilds both networks for the new
    # layout; the Flax policy starts from the new torch module's weights.
    runner.config.rl_module(model_config={"fcnet_hiddens": [8], "fcnet_activation": "relu"})
    runner.make_module()
    assert [op.features for op in runner.layout.encoder_ops if hasattr(op, "features")] == [8]
    assert_is(runner.module.get_state(inference_only=True))
    assert current()["encoder.actor_encoder.net.mlp.0.weight"].shape == (8, 4)
    runner.stop()


# ---------------------------------------------------------------------- episodes
def test_sample__episode_chunks_follow_rllib_cut_semantics(runner):
    num_envs = runner.num_envs
    first = runner.sample(num_timesteps=30)
    second = runner.sample(num_timesteps=30)
    for episodes in (first, second):
        assert 30 <= sum(len(e) for e in episodes) < 30 + num_envs
        assert len({e.id_ for e in episodes}) == len(episodes)
        for episode in episodes:
            episode.validate()
            assert episode.is_numpy
            # RLlib's learner connectors suffix ids with "_<i>" unless one is present.
            assert "_" not in episode.id_
            assert episode.get_observations().dtype == np.float32
            assert episode.get_actions().dtype == np.int64
            assert episode.get_extra_model_outputs("action_logp").shape == (len(episode),)
            assert episode.get_extra_model_outputs("action_dist_inputs").shape == (
                len(episode), 2)
    # Per sub-env (ids end with the sub-env in 5 hex digits, then an 8-digit episode
    # counter): every episode but the call's last is done, and the last is cut (not done,
    # continued by the next call) unless it ended at the call's last step.
    by_env: dict[str, list] = {}
    for episode in first:
        by_env.setdefault(episode.id_[-13:-8], []).append(episode)
    assert len(by_env) == num_envs
    cut = {}
    for parts in by_env.values():
        parts.sort(key=lambda e: e.id_[-8:])
        assert all(e.is_done for e in parts[:-1])
        if not parts[-1].is_done:
            cut[parts[-1].id_] = parts[-1]
    assert cut, "the first call should have cut a running episode"
    continued = [e for e in second if e.id_ in cut]
    assert len(continued) == len(cut)
    assert all(e.t_started == 0 for e in second if e.id_ not in cut)
    for successor in continued:
        predecessor = cut[successor.id_]
        assert successor.t_started == predecessor.t
        np.testing.assert_array_equal(successor.get_observations(0),
                                      predecessor.get_observations(-1))
        # One step of lookback (episode_lookback_horizon=1): the predecessor's last step.
        np.testing.assert_array_equal(
            successor.get_observations(-1, neg_index_as_lookback=True),
            predecessor.get_observations(-2))
        assert successor.get_actions(-1, neg_index_as_lookback=True) == (
            predecessor.get_actions(-1))
        joined = copy.deepcopy(predecessor)
        joined.concat_episode(copy.deepcopy(successor))
        assert len(joined) == len(predecessor) + len(successor)
        assert joined.get_return() == pytest.approx(
            predecessor.get_return() + successor.get_return())

    episodes = runner.sample(num_episodes=3)
    assert len(episodes) == 3
    assert all(e.is_done and e.t_started == 0 for e in episodes)
    # CartPole pays 1 per step.
    assert all(e.get_return() == pytest.approx(len(e)) for e in episodes)


# ---------------------------------------------------------------------- metrics
def test_get_metrics__rllib_structures_and_whole_episode_values(runner):
    runner.get_metrics()  # start from a clean slate
    chunks = runner.sample(num_timesteps=200, force_reset=True)
    chunks += runner.sample(num_timesteps=200)
    metrics = runner.get_metrics()

    by_id = {}
    for chunk in chunks:  # whole episodes: every chunk of each finished episode was seen
        by_id.setdefault(chunk.id_, []).append(chunk)
    finished = [parts for parts in by_id.values() if parts[-1].is_done]
    assert finished
    lengths = [sum(len(c) for c in parts) for parts in finished]
    returns = [sum(c.get_return() for c in parts) for parts in finished]

    # Aggregate as the Algorithm does (root logger, key "env_runners").
    root = MetricsLogger(root=True)
    root.aggregate([metrics], key="env_runners")
    peek = root.peek("env_runners")
    assert peek["num_env_steps_sampled"] == sum(len(c) for c in chunks) == 400
    assert peek["num_episodes"] == len(finished)
    assert peek["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert peek["episode_len_max"] == max(lengths)
    assert peek["episode_len_min"] == min(lengths)
    assert peek["module_episode_return_mean"]["default_policy"] == pytest.approx(
        np.mean(returns))
    assert peek["num_agent_steps_sampled"]["default_agent"] == 400
    assert peek["weights_seq_no"] == runner.get_state()["weights_seq_no"]

    # Same keys, reduce methods and windows as RLlib's own runner (which also reports
    # per-step env/module/connector timers that a fused compiled step does not have).
    reference = SingleAgentEnvRunner(config=small_ppo_config())
    reference.sample()
    reference.sample()
    expected = reference.get_metrics()
    reference.stop()
    per_step_timers = {"env_reset_timer", "env_step_timer", "rlmodule_inference_timer",
                       "env_to_module_connector", "module_to_env_connector",
                       "env_to_module_sum_episodes_length_in",
                       "env_to_module_sum_episodes_length_out"}

    def flat(tree):
        import tree as dm_tree

        return {"/".join(map(str, path)): (type(value).__name__,
                                          getattr(value, "_window", None))
                for path, value in dm_tree.flatten_with_path(tree)}

    ours = flat(metrics)
    theirs = {k: v for k, v in flat(expected).items()
              if k.split("/")[0] not in per_step_timers}
    assert ours == theirs


# ---------------------------------------------------------------------- state & group API
def test_local_runner_state_restores_a_remote_runner(runner, tmp_path):
    config = small_ppo_config().env_runners(num_env_runners=1)
    local = JaxEnvRunner(config=config, worker_index=0, spaces=runner.get_spaces())
    assert local.env is None
    with pytest.raises(ValueError, match="doesn't have an env"):
        local.sample()
    local.set_state(runner.get_state())  # what sync_weights does to the local runner
    state = local.get_state()
    assert set(state) == {"num_env_steps_sampled_lifetime", "rl_module", "weights_seq_no",
                          "env_to_module_connector", "module_to_env_connector"}
    assert "rl_module" not in local.get_state(not_components="rl_module")

    # Algorithm.restore_env_runners: a restarted remote runner gets the local state.
    restarted = JaxEnvRunner(config=config, worker_index=1)
    restarted.assert_healthy()
    restarted.set_state(state)
    for key, value in runner.flax_params["encoder"]["layers_0"].items():
        np.testing.assert_array_equal(restarted.flax_params["encoder"]["layers_0"][key],
                                      value)
    assert restarted.get_state()["weights_seq_no"] == runner.get_state()["weights_seq_no"]

    # Checkpointable: save and rebuild from the directory.
    restarted.save_to_path(tmp_path)
    rebuilt = JaxEnvRunner.from_checkpoint(tmp_path)
    for key, value in restarted.get_state()["rl_module"].items():
        np.testing.assert_array_equal(np.asarray(rebuilt.get_state()["rl_module"][key]),
                                      np.asarray(value))

    assert restarted.ping() == "pong"
    assert restarted.apply(lambda w, x: (w.worker_index, x + 1), 1) == (1, 2)
    assert set(restarted.get_spaces()) == {"__env__", "__env_single__", "default_policy"}
    restarted.stop()
    restarted.stop()  # idempotent
    with pytest.raises(AssertionError, match="not healthy"):
        restarted.assert_healthy()
    for r in (local, rebuilt):
        r.stop()


def test_make_env__rebuilds_the_rollout_and_keeps_the_weights():
    created = []

    class Callbacks(RLlibCallback):
        def on_environment_created(self, *, env_runner, metrics_logger, env, env_context,
                                   **kwargs):
            created.append((type(env).__name__, env_context.worker_index))

    config = small_ppo_config().callbacks(Callbacks)
    runner = JaxEnvRunner(config=config)
    assert created == [("CartPole", None)]
    weights = torch_module(config, *runner.get_spaces()["default_policy"],
                           inference_only=True, seed=5).get_state()
    runner.set_state({"rl_module": weights, "weights_seq_no": 2})
    runner.sample(num_timesteps=8)
    runner.make_env()
    assert created == [("CartPole", None)] * 2
    for key, value in weights.items():
        np.testing.assert_array_equal(runner.get_state()["rl_module"][key], value)
        np.testing.assert_array_equal(
            flax_params_to_torch_state(runner.flax_params, runner.layout)[key], value)
    episodes = runner.sample(num_timesteps=8)
    assert all(e.t_started == 0 for e in episodes)  # fresh episodes in the new env
    assert all(e.get_extra_model_outputs("weights_seq_no")[0] == 2 for e in episodes)
    runner.stop()


class _FlakyCartPole(cartpole.CartPole):
    """gymnax CartPole whose reward is NaN on about 1 step in 20: a sub-env failure for
    jaxrunner's `check_finite`."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        failed = jax.random.uniform(jax.random.fold_in(key, 7)) < 0.05
        return obs, state, jax.numpy.where(failed, jax.numpy.nan, reward), done, info


def _flaky_cartpole(env_context):
    env = _FlakyCartPole()
    return env, env.default_params


def test_sub_env_failures__recreated_and_counted_under_rllibs_key():
    config = (small_ppo_config().environment(_flaky_cartpole)
              .fault_tolerance(restart_failed_sub_environments=True))
    runner = JaxEnvRunner(config=config)
    episodes = runner.sample(num_timesteps=200)
    assert sum(len(e) for e in episodes) >= 200  # the failed episodes' steps are topped up
    assert all(np.isfinite(e.get_rewards()).all() for e in episodes)
    root = MetricsLogger(root=True)
    root.aggregate([runner.get_metrics()], key="env_runners")
    assert root.peek(("env_runners", "num_env_step_failures")) > 0
    assert root.peek(("env_runners", "num_env_steps_sampled")) == sum(len(e) for e in episodes)
    # Whole-episode metrics under failures: an episode's earlier chunks are kept until it
    # finishes (its reported length is all its chunks), and a discarded episode's chunks
    # never reach another episode's values.
    later = [runner.sample(num_timesteps=200) for _ in range(3)]
    later_metrics = MetricsLogger(root=True)
    later_metrics.aggregate([runner.get_metrics()], key="env_runners")
    peek = later_metrics.peek("env_runners")
    by_id = {}
    for chunk in [c for call in [episodes] + later for c in call]:
        by_id.setdefault(chunk.id_, []).append(chunk)
    finished_later = [parts for parts in by_id.values()
                      if parts[-1].is_done and any(parts[-1] is c for call in later for c in call)]
    assert finished_later and any(len(parts) > 1 for parts in finished_later)
    lengths = [sum(len(c) for c in parts) for parts in finished_later]
    returns = [sum(c.get_return() for c in parts) for parts in finished_later]
    assert all(parts[0].t_started == 0 for parts in finished_later)
    assert peek["num_episodes"] == len(finished_later)
    assert peek["episode_len_max"] == max(lengths)
    assert peek["episode_len_min"] == min(lengths)
    assert peek["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert peek["num_env_step_failures"] > 0
    runner.stop()

    strict = JaxEnvRunner(config=small_ppo_config().environment(_flaky_cartpole))
    with pytest.raises(RuntimeError, match="restart_failed_sub_environments"):
        strict.sample(num_timesteps=200)
    strict.stop()


# ---------------------------------------------------------------------- config translation
def test_from_rllib__copies_the_shared_settings():
    config = (PPOConfig()
              .environment("Pendulum-v1", clip_actions=True, normalize_actions=False)
              .env_runners(num_env_runners=4, num_envs_per_env_runner=3,
                           rollout_fragment_length="auto", batch_mode="truncate_episodes",
                           episode_lookback_horizon=2, explore=False,
                           sample_timeout_s=12.5)
              .training(train_batch_size_per_learner=2500)
              .fault_tolerance(restart_failed_sub_environments=True,
                               max_num_env_runner_restarts=7)
              .reporting(metrics_num_episodes_for_smoothing=40)
              .rl_module(model_config={"fcnet_hiddens": [64, 64],
                                       "fcnet_activation": "ReLU"})
              .debugging(seed=11))
    translated = jaxrunner.RunnerConfig.from_rllib(config, max_chunk_length=64)
    assert isinstance(translated, jaxrunner.RunnerConfig)
    assert translated.env == "Pendulum-v1"
    for name in ("num_env_runners", "num_envs_per_env_runner", "batch_mode",
                 "episode_lookback_horizon", "explore", "sample_timeout_s",
                 "restart_failed_sub_environments", "max_num_env_runner_restarts",
                 "metrics_num_episodes_for_smoothing", "seed", "clip_actions",
                 "normalize_actions", "train_batch_size_per_learner"):
        assert getattr(translated, name) == getattr(config, name), name
    assert translated.max_chunk_length == 64
    assert translated.model_config == {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"}
    spec = translated.rl_module_spec
    assert spec.module_class is RLlibPPOModule
    assert spec.model_config["vf_share_layers"] is False  # PPO's auto-include
    assert spec.model_config["log_std_clip_param"] == 20.0  # DefaultModelConfig default
    # "auto" fragments: the same per-runner split as RLlib (2500 over 4 x 3 sub-envs).
    assert [translated.get_rollout_fragment_length(i) for i in range(1, 5)] == [
        config.get_rollout_fragment_length(i) for i in range(1, 5)] == [209, 209, 208, 208]
    # Evaluation configs keep their seed offset flag.
    assert jaxrunner.RunnerConfig.from_rllib(
        config.get_evaluation_config_object()).in_evaluation is True


def test_from_rllib__resolves_registered_jax_envs():
    import gymnax
    from ray.tune.registry import register_env

    register_env("jaxrunner-test-acrobot", lambda ctx: gymnax.make("Acrobot-v1"))
    translated = jaxrunner.RunnerConfig.from_rllib(
        PPOConfig().environment("jaxrunner-test-acrobot"))
    assert isinstance(translated.env, TuneEnvCreator)
    env, _ = translated.env(jaxrunner.EnvContext({}))
    assert type(env).__name__ == "Acrobot"

    jaxrunner.register_env("jaxrunner-test-pendulum", lambda ctx: gymnax.make("Pendulum-v1"))
    assert jaxrunner.RunnerConfig.from_rllib(
        PPOConfig().environment("jaxrunner-test-pendulum")).env == "jaxrunner-test-pendulum"


# ---------------------------------------------------------------------- unsupported setups
class _CustomModule(DefaultPPOTorchRLModule):
    pass


class _StepCallbacks(RLlibCallback):
    def on_episode_step(self, **kwargs):
        pass


UNSUPPORTED = {
    "gymnasium-only env": (lambda: PPOConfig().environment("LunarLander-v3"),
                           "not a JAX env"),
    "custom torch module": (
        lambda: PPOConfig().environment("CartPole-v1").rl_module(
            rl_module_spec=RLlibModuleSpec(module_class=_CustomModule)),
        "_CustomModule"),
    "lstm": (lambda: PPOConfig().environment("CartPole-v1").rl_module(
        model_config={"use_lstm": True}), "use_lstm"),
    "unknown activation": (lambda: PPOConfig().environment("CartPole-v1").rl_module(
        model_config={"fcnet_activation": "Softplus"}), "Softplus"),
    "multi-agent": (lambda: PPOConfig().environment("CartPole-v1").multi_agent(
        policies={"p0", "p1"}, policy_mapping_fn=lambda aid, ep, **kw: "p0"),
        "Multi-agent"),
    "custom connector": (lambda: PPOConfig().environment("CartPole-v1").env_runners(
        env_to_module_connector=lambda env, spaces, device: []), "env_to_module_connector"),
    "per-step callback": (lambda: PPOConfig().environment("CartPole-v1").callbacks(
        _StepCallbacks), "on_episode_step"),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_setups__clear_error(name):
    make, match = UNSUPPORTED[name]
    with pytest.raises(UnsupportedRLlibSetupError, match=match) as info:
        jaxrunner.RunnerConfig.from_rllib(make())
    assert "JaxEnvRunner supports" in str(info.value)
    with pytest.raises(UnsupportedRLlibSetupError, match=match):
        JaxEnvRunner(config=make().env_runners(num_env_runners=0))


def test_unsupported_observation_space__clear_error():
    # MinAtar observations are images: RLlib would build a CNN encoder.
    config = PPOConfig().environment("Breakout-MinAtar").env_runners(num_env_runners=0)
    with pytest.raises(UnsupportedRLlibSetupError, match="CNN encoder"):
        JaxEnvRunner(config=config)


# ---------------------------------------------------------------------- RLlib algorithms
@pytest.fixture(scope="module")
def ray_cpus(request):
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    request.addfinalizer(ray.shutdown)
    return 2


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.filterwarnings("ignore:os.fork")
def test_ppo_with_jax_env_runner__learns_cartpole_and_survives_a_runner_restart(ray_cpus):
    """RLlib PPO, 1 remote JaxEnvRunner on gymnax CartPole-v1: smoothed return >= 150
    within 30 iterations (2000 steps each; about 7 on this seed); then the runner's
    process dies, RLlib restarts it and restores its state, and training goes on."""
    import ray

    config = (PPOConfig()
              .environment("CartPole-v1")
              .env_runners(env_runner_cls=JaxEnvRunner, num_env_runners=1,
                           num_envs_per_env_runner=8, sample_timeout_s=300.0)
              .fault_tolerance(restart_failed_env_runners=True)
              .training(lr=0.001, num_epochs=8, minibatch_size=250, vf_loss_coeff=0.01,
                        train_batch_size_per_learner=2000)
              .rl_module(model_config={"fcnet_hiddens": [32], "vf_share_layers": True})
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        returns = []
        for _ in range(30):
            result = algo.train()
            returns.append(result["env_runners"]["episode_return_mean"])
            if returns[-1] >= 150:
                break
        assert returns[-1] >= 150, returns
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] == 2000 * len(returns)
        assert result["learners"]["default_policy"]["num_module_steps_trained"] > 0

        # Kill the remote runner's process; RLlib's actor manager marks it unhealthy,
        # Ray restarts it with the same worker_index, and the Algorithm restores it from
        # the local runner's state before the next training step.
        algo.env_runner_group.foreach_env_runner(lambda w: os._exit(1),
                                                 local_env_runner=False)
        assert algo.env_runner_group.num_healthy_remote_workers() == 0
        lifetime = result["env_runners"]["num_env_steps_sampled_lifetime"]
        deadline = time.monotonic() + 240  # the new process imports JAX and recompiles
        while time.monotonic() < deadline:
            result = algo.train()  # probes, restores, then samples once healthy
            if result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0) > lifetime:
                break
        assert algo.env_runner_group.num_healthy_remote_workers() == 1
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > lifetime
        remote = algo.env_runner_group.foreach_env_runner(
            lambda w: (w.worker_index, w.get_state()), local_env_runner=False)[0]
        local = algo.env_runner_group.local_env_runner.get_state()
        assert remote[0] == 1
        assert remote[1]["weights_seq_no"] == local["weights_seq_no"] > 0
        for key, value in local["rl_module"].items():
            np.testing.assert_array_equal(np.asarray(remote[1]["rl_module"][key]),
                                          np.asarray(value))
    finally:
        algo.stop()
    assert ray.is_initialized()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.filterwarnings("ignore:os.fork")
def test_appo_with_jax_env_runner__samples_and_trains(ray_cpus):
    """APPO (asynchronous: `sample_get_state_and_metrics`, EnvRunnerStateServer weight
    pulls, a learner actor) runs with JaxEnvRunner."""
    from ray.rllib.algorithms.appo import APPOConfig

    config = (APPOConfig()
              .environment("CartPole-v1")
              .env_runners(env_runner_cls=JaxEnvRunner, num_env_runners=1,
                           num_envs_per_env_runner=8)
              .training(train_batch_size_per_learner=500)
              .reporting(min_time_s_per_iteration=5)
              .rl_module(model_config={"fcnet_hiddens": [32], "vf_share_layers": True})
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        trained = sampled = 0
        for _ in range(24):
            result = algo.train()
            sampled = result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0)
            trained = result.get("learners", {}).get("default_policy", {}).get(
                "num_module_steps_trained_lifetime", 0)
            if sampled > 0 and trained > 0 and "episode_return_mean" in result.get(
                    "env_runners", {}):
                break
        assert sampled > 0 and trained > 0, result.keys()
        assert math.isfinite(result["env_runners"]["episode_return_mean"])
        # The runner pulled the learner's weights from the state server.
        seq = algo.env_runner_group.foreach_env_runner(
            lambda w: w.get_state()["weights_seq_no"], local_env_runner=False)
        assert seq and seq[0] > 0
    finally:
        algo.stop()

