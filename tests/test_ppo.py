"""The reference PPO learner: GAE against a plain-Python loop (CleanRL's habit), the
clipped loss, weight pushes, device-only updates, and a short CartPole training run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.learners import PPOConfig, PPOLearner, clipped_surrogate_loss, compute_gae


# ---------------------------------------------------------------------- GAE
def reference_gae(rewards, values, final_values, terminated, truncated, valid, gamma, lam):
    """A plain loop over sub-envs and time, one explicit case per kind of step."""
    num_steps, num_envs = rewards.shape
    valid = np.broadcast_to(valid if valid.ndim == 2 else valid[:, None], rewards.shape)
    advantages = np.zeros((num_steps, num_envs))
    for b in range(num_envs):
        running = 0.0
        for t in reversed(range(num_steps)):
            if not valid[t, b]:
                running = 0.0
                continue
            next_taken = t + 1 < num_steps and valid[t + 1, b]
            if terminated[t, b]:  # the episode ended for real: nothing after it
                next_value, carry_on = 0.0, 0.0
            elif truncated[t, b]:  # cut by a time limit: bootstrap from its final obs
                next_value, carry_on = final_values[t, b], 0.0
            elif not next_taken:  # cut by the end of the chunk: bootstrap likewise
                next_value, carry_on = final_values[t, b], 0.0
            else:  # the same episode goes on in the next row
                next_value, carry_on = values[t + 1, b], 1.0
            delta = rewards[t, b] + gamma * next_value - values[t, b]
            running = delta + gamma * lam * carry_on * running
            advantages[t, b] = running
    targets = np.where(valid, advantages + values, 0.0)
    return advantages, targets


def _gae(*arrays, gamma=0.99, lam=0.95):
    adv, targets = jax.jit(compute_gae, static_argnames=("gamma", "gae_lambda"))(
        *map(jnp.asarray, arrays), gamma=gamma, gae_lambda=lam)
    return np.asarray(adv), np.asarray(targets)


def test_gae__matches_python_loop_with_terminations_truncations_and_cuts():
    rng = np.random.default_rng(0)
    num_steps, num_envs = 37, 6
    rewards = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    final_values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    terminated = rng.random((num_steps, num_envs)) < 0.08
    truncated = (rng.random((num_steps, num_envs)) < 0.08) & ~terminated
    terminated[-1, 0] = True  # ends on the last row in each way, and not at all (others)
    truncated[-1, 1] = True
    failed = rng.random((num_steps, num_envs)) < 0.05  # per sub-env gaps (failed steps)
    for valid in (np.ones(num_steps, bool), np.arange(num_steps) < 29,
                  (np.arange(num_steps) < 29)[:, None] & ~failed):
        got_adv, got_targets = _gae(rewards, values, final_values, terminated, truncated,
                                    valid)
        want_adv, want_targets = reference_gae(rewards, values, final_values, terminated,
                                               truncated, valid, 0.99, 0.95)
        np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_targets, want_targets, rtol=1e-5, atol=1e-5)
        mask = np.broadcast_to(valid if valid.ndim == 2 else valid[:, None], rewards.shape)
        assert np.all(got_adv[~mask] == 0.0)


def test_gae__one_env_by_hand():
    # Steps: 0 (goes on), 1 (truncated), 2 (goes on), 3 (terminated), 4 (cut at chunk end).
    rewards = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]], np.float32)
    values = np.array([[10.0], [20.0], [30.0], [40.0], [50.0]], np.float32)
    final_values = np.array([[-1.0], [100.0], [-1.0], [-1.0], [500.0]], np.float32)
    terminated = np.array([[0], [0], [0], [1], [0]], bool)
    truncated = np.array([[0], [1], [0], [0], [0]], bool)
    gamma, lam = 0.5, 0.5
    adv, _ = _gae(rewards, values, final_values, terminated, truncated, np.ones(5, bool),
                  gamma=gamma, lam=lam)
    d4 = 5 + gamma * 500 - 50  # bootstrap from the final obs of the last step
    d3 = 4 - 40  # terminated: no bootstrap, nothing flows back from step 4
    d2 = 3 + gamma * 40 - 30
    d1 = 2 + gamma * 100 - 20  # truncated: bootstrap from its final obs, not values[2]
    d0 = 1 + gamma * 20 - 10
    want = [d0 + gamma * lam * d1, d1, d2 + gamma * lam * d3, d3, d4]
    np.testing.assert_allclose(adv[:, 0], want, rtol=1e-6)


def test_clipped_surrogate_loss__clips_only_in_the_advantage_direction():
    log_ratio = jnp.log(jnp.array([0.5, 1.0, 1.5, 0.5, 1.5]))
    adv = jnp.array([1.0, 1.0, 1.0, -1.0, -1.0])
    got = np.asarray(clipped_surrogate_loss(log_ratio, adv, 0.2))
    # ratio 0.5, A>0: min(0.5, 0.8) = 0.5; ratio 1.5, A>0: min(1.5, 1.2) = 1.2;
    # ratio 0.5, A<0: min(-0.5, -0.8) = -0.8; ratio 1.5, A<0: min(-1.5, -1.2) = -1.5.
    np.testing.assert_allclose(got, [-0.5, -1.0, -1.2, 0.8, 1.5], rtol=1e-6)


# ---------------------------------------------------------------------- with a runner
def _runner(env="CartPole-v1", num_envs=8, fragment=64, seed=0):
    config = (jaxrunner.RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .debugging(seed=seed))
    return jaxrunner.SingleAgentEnvRunner(config=config)


@pytest.fixture(scope="module")
def runner_and_learner():
    """One CartPole runner and learner for the contract tests (compiled once)."""
    runner = _runner()
    learner = PPOLearner.from_runner(runner, PPOConfig(num_minibatches=2, num_epochs=1))
    learner.update(runner.sample())  # compiles sample() and update()
    yield runner, learner
    runner.stop()


def test_trajectory__next_obs_within_an_episode_is_the_final_obs(runner_and_learner):
    # The GAE's "next value" rule relies on this runner contract.
    runner, _ = runner_and_learner
    traj = jax.device_get(runner.sample().trajectory())
    goes_on = ~(traj.terminated | traj.truncated)[:-1] & traj.valid[1:, None]
    assert goes_on.sum() > 0
    np.testing.assert_array_equal(traj.final_obs[:-1][goes_on], traj.obs[1:][goes_on])


def test_final_values__from_the_store_rows_equal_the_critic_on_dense_final_obs(
        runner_and_learner):
    # The update runs the critic only on the final-observation store's rows and reads
    # V(obs[t + 1]) from the values it has; that must be V(final_obs[t]) wherever a step
    # was taken, episode ends and the chunk's last step included.
    runner, learner = runner_and_learner
    traj = runner.sample().trajectory()
    num_steps, num_envs = traj.rewards.shape
    assert traj.final_obs_store.index.shape[0] < num_steps * num_envs  # not the dense path
    ends = np.asarray(traj.terminated | traj.truncated)
    assert ends.sum() > 0
    flat = lambda x: x.reshape((num_steps * num_envs,) + x.shape[2:])  # noqa: E731
    params = learner.state.params
    values = learner._values(params, jax.tree.map(flat, traj.obs)).reshape(num_steps, num_envs)
    dense = learner._values(params, jax.tree.map(flat, traj.final_obs)
                            ).reshape(num_steps, num_envs)
    from_store = jax.jit(learner._final_values)(params, traj, values)
    taken = np.asarray(traj.valid)[:, None] & ~np.asarray(traj.failed)
    np.testing.assert_allclose(np.asarray(from_store)[taken], np.asarray(dense)[taken],
                               rtol=1e-6, atol=1e-6)
    # Where an episode ended, the value is the ended episode's, not the next one's start.
    assert not np.allclose(np.asarray(from_store)[:-1][ends[:-1]],
                           np.asarray(values)[1:][ends[:-1]])


def test_push_weights__runner_samples_with_the_learner_policy(runner_and_learner):
    runner, learner = runner_and_learner
    learner.update(runner.sample())
    before = runner.weights_seq_no
    seq = learner.push_weights(runner)
    assert seq == runner.weights_seq_no > before
    batch = runner.sample()
    assert batch.weights_seq_no == seq
    traj = batch.trajectory()
    obs = traj.obs.reshape(-1, traj.obs.shape[-1])
    out = learner.module.forward_train(learner.params, {"obs": obs})
    logp = learner.module.action_dist(out["action_dist_inputs"]).logp(traj.actions.reshape(-1))
    np.testing.assert_allclose(np.asarray(logp),
                               np.asarray(traj.extra_model_outputs["action_logp"]).reshape(-1),
                               rtol=1e-5, atol=1e-5)
    assert learner.push_weights(runner) == seq + 1 == runner.weights_seq_no


def test_update__reads_device_arrays_without_host_transfer(runner_and_learner):
    runner, learner = runner_and_learner
    batch = runner.sample()
    before = jax.device_get(learner.params)
    with jax.transfer_guard("disallow"):
        stats = learner.update(batch)
    stats = jax.device_get(stats)
    assert set(stats) >= {"policy_loss", "vf_loss", "entropy", "approx_kl", "clip_fraction"}
    assert all(np.isfinite(v) for v in stats.values())
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), before,
                           jax.device_get(learner.params))
    assert any(jax.tree.leaves(changed))


def test_update__rejects_an_inference_only_module(runner_and_learner):
    runner, _ = runner_and_learner
    with pytest.raises(ValueError, match="value head"):
        PPOLearner(runner.module)


def test_update__continuous_actions_and_multi_chunk_batches():
    config = (jaxrunner.RunnerConfig().environment("Pendulum-v1")
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=50,
                           max_chunk_length=32)  # 2 chunks, the second one 18/32 valid
              .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=1))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    learner = PPOLearner.from_runner(runner, PPOConfig(num_minibatches=4, num_epochs=2,
                                                       reward_scale=0.1))
    batch = runner.sample()
    assert len(batch.chunks) == 2
    stats = jax.device_get(learner.update(batch))
    assert all(np.isfinite(v) for v in stats.values())
    assert stats["entropy"] > 0  # a Gaussian over one action dimension


def test_from_runner__refuses_connectors_that_change_the_observations():
    from jaxrunner.connectors import MeanStdFilter

    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=8,
                           env_to_module_connector=lambda env, spaces: [
                               MeanStdFilter(spaces["__env_single__"][0])])
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    with pytest.raises(ValueError, match="env-to-module connectors"):
        PPOLearner.from_runner(runner)
    runner.stop()


def test_train__cartpole_return_improves():
    runner = _runner(seed=3)
    learner = PPOLearner.from_runner(runner, PPOConfig(learning_rate=1e-3, seed=3))
    history = learner.train(runner, num_iterations=40)
    first = next(row["episode_return_mean"] for row in history
                 if row["episode_return_mean"] is not None)
    last = history[-1]["episode_return_mean"]
    assert len(history) == 40 and history[-1]["env_steps"] == 40 * 8 * 64
    assert first < 35 and last > 2 * first, (first, last)


# ---------------------------------------------------------------------- train() visibility
UPDATE_STATS = ("total_loss", "policy_loss", "vf_loss", "entropy", "approx_kl",
                "clip_fraction", "vf_explained_var")


def test_train__history_has_update_stats_counter_continues_and_progress_prints(capsys):
    runner = _runner(num_envs=4, fragment=16)
    learner = PPOLearner.from_runner(runner, PPOConfig(num_minibatches=2, num_epochs=1))
    first = learner.train(runner, num_iterations=2, log_interval_s=0.0)
    second = learner.train(runner, num_iterations=3, verbose=False)
    assert [row["iteration"] for row in first] == [0, 1]
    assert [row["iteration"] for row in second] == [2, 3, 4]  # continues across calls
    assert learner.iteration == 5 and learner.history == first + second
    assert [row["env_steps"] for row in first + second] == [64 * i for i in range(1, 6)]
    for row in first + second:
        for name in UPDATE_STATS:
            assert isinstance(row[name], float) and np.isfinite(row[name]), (name, row)
        assert row["entropy"] > 0 and 0.0 <= row["clip_fraction"] <= 1.0
        assert row["approx_kl"] >= -1e-6
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert [line.split()[1] for line in lines] == ["0", "1"]  # verbose=False printed nothing
    assert "entropy" in lines[0] and "kl" in lines[0] and "clip" in lines[0]
    runner.stop()


def test_train__time_budget_stops_the_call():
    runner = _runner(num_envs=4, fragment=16)
    learner = PPOLearner.from_runner(runner, PPOConfig(num_minibatches=2, num_epochs=1))
    # Any iteration takes longer than a microsecond: the budget ends the call after one.
    history = learner.train(runner, num_iterations=50, time_budget_s=1e-6, verbose=False)
    assert len(history) == 1
    # Without num_iterations the budget alone decides.
    history = learner.train(runner, time_budget_s=1e-6, verbose=False)
    assert [row["iteration"] for row in history] == [1]
    with pytest.raises(ValueError, match="num_iterations"):
        learner.train(runner)
    with pytest.raises(ValueError, match="time_budget_s"):
        learner.train(runner, time_budget_s=0)
    runner.stop()


def test_update__joins_batches_of_several_runners_along_the_sub_env_axis(runner_and_learner):
    """A group's `sample()` gives one batch per runner; each runner's final-observation
    store indexes its own `(T, B)` positions, so the joined trajectory must carry the
    dense final observations of every runner side by side."""
    runner, learner = runner_and_learner
    first, second = runner.sample(), runner.sample()
    from jaxrunner.learners.ppo import _as_trajectory

    joined = _as_trajectory([first, second])
    expected = [np.asarray(b.trajectory().final_obs) for b in (first, second)]
    np.testing.assert_array_equal(np.asarray(joined.final_obs),
                                  np.concatenate(expected, axis=1))
    stats = jax.device_get(learner.update([first, second]))
    assert all(np.isfinite(float(v)) for v in stats.values())


def test_train__the_runner_never_builds_params_the_learner_replaces(compile_counter):
    """`train(runner, ...)` pushes the learner's weights before its first sample, so the
    initial params of a runner built with `params_on_first_read=True` are never built:
    one module init compiles (the learner's), not two."""
    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8)
              .rl_module(model_config={"fcnet_hiddens": [8]}))
    runner = jaxrunner.SingleAgentEnvRunner(config=config, params_on_first_read=True)
    learner = PPOLearner.from_runner(runner, PPOConfig(num_epochs=1, num_minibatches=1))
    learner.train(runner, num_iterations=1, verbose=False)
    inits = [m for m in compile_counter.messages if m.startswith("Compiling jit(init)")]
    assert len(inits) == 1, inits
    jax.tree.map(np.testing.assert_array_equal,
                 jax.device_get(runner.get_state(components="rl_module")["rl_module"]),
                 jax.device_get(runner.module.params_for_inference(learner.params)))
    runner.stop()
