"""A runner shards its sub-envs over all local devices (Mesh + NamedSharding): same
actions and episode boundaries as the single-device run for the same seed. Runs in a
subprocess with 4 forced CPU devices (XLA flags must be set before JAX starts)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    import jaxrunner as jr
    assert len(jax.devices()) == 4, jax.devices()

    def run(shard):
        cfg = (jr.RunnerConfig().environment("CartPole-v1")
               .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=20,
                            shard_envs_across_devices=shard)
               .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=3))
        runner = jr.SingleAgentEnvRunner(config=cfg)
        trajs, lengths = [], []
        for n in (160, 50, 400):
            batch = runner.sample(num_timesteps=n)
            trajs.append(jax.device_get(batch.trajectory()))
            lengths.append(sorted((e.id_, len(e)) for e in batch))
        runner.set_state(runner.get_state())  # weights round trip keeps the placement
        batch = runner.sample(num_timesteps=80)
        sharding = batch.chunks[0].obs.sharding
        return trajs, lengths, runner.get_metrics(), sharding

    sharded, sharded_lengths, ms, sharding = run(True)
    single, single_lengths, m1, _ = run(False)
    assert "env" in str(sharding), sharding
    for a, b in zip(sharded, single):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.terminated, b.terminated)
        np.testing.assert_array_equal(a.truncated, b.truncated)
        np.testing.assert_array_equal(a.valid, b.valid)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
                     a, b)
    assert sharded_lengths == single_lengths
    assert ms["num_episodes"] == m1["num_episodes"]
    assert ms["episode_len_mean"] == m1["episode_len_mean"]
    print("OK")
""")


MULTI_AGENT_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    import jaxrunner as jr
    assert len(jax.devices()) == 4, jax.devices()

    def run(shard):
        cfg = (jr.RunnerConfig().environment("MultiAgentCartPole-v1")
               .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=20,
                            shard_envs_across_devices=shard)
               .multi_agent(policies={"p0", "p1"},
                            policy_mapping_fn=lambda a, e: "p0" if a == "agent_0" else "p1")
               .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=3))
        runner = jr.MultiAgentEnvRunner(config=cfg)
        trajs, episodes = [], []
        for n in (160, 50, 400):
            batch = runner.sample(num_timesteps=n)
            trajs.append(jax.device_get(batch.trajectory()))
            episodes.append(sorted((e.id_, len(e), e.agent_steps()) for e in batch))
        sharding = batch.chunks[0].completed.sharding
        return trajs, episodes, runner.get_metrics(), sharding

    sharded, sharded_episodes, ms, sharding = run(True)
    single, single_episodes, m1, _ = run(False)
    assert "env" in str(sharding), sharding
    for a, b in zip(sharded, single):
        for name in ("actions", "completed", "all_terminated", "all_truncated", "valid"):
            jax.tree.map(np.testing.assert_array_equal, getattr(a, name), getattr(b, name))
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
                     a, b)
    assert sharded_episodes == single_episodes
    assert ms["num_episodes"] == m1["num_episodes"]
    assert ms["agent_episode_return_mean"] == m1["agent_episode_return_mean"]
    print("OK")
""")


def test_sharded_multi_agent_runner__matches_single_device_run():
    result = subprocess.run([sys.executable, "-c", MULTI_AGENT_SCRIPT], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK" in result.stdout


def test_sharded_runner__matches_single_device_run():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK" in result.stdout
