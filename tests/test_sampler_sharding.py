"""`Sampler.shard`: a sampler state placed over 4 (forced CPU) devices samples the same
trajectory and metrics as the unsharded state through `sample_jit` and inside a user
`jax.jit` + `lax.scan`, and the trajectory stays split over the sub-env axis. Runs in a
subprocess: the device count must be set before JAX starts.

Bit for bit: observations, actions, their log-probabilities, rewards, episode flags and
ids, the final-observation store, the carry, the lookback and every metric. Not bit for
bit: the module's float outputs (`action_dist_inputs`), equal to float32 rounding. Each
device runs the MLP on its B/4 rows, and XLA:CPU picks its dot kernel (and so the order of
the multiply-adds) by shape, so the logits of a (2, 8) x (8, 2) product may differ from
those of the (8, 8) x (8, 2) one in the last bit. (Compiled with XLA's full optimizations
the env's float physics is fused per shape too, and observations then differ by rounding
as well; the script compiles as the other contract tests do, with
`jax_disable_most_optimizations`.)"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    import jaxrunner as jr
    from jaxrunner.metrics import reduce_sample_metrics
    assert len(jax.devices()) == 4, jax.devices()
    jax.config.update("jax_disable_most_optimizations", True)  # faster compiles

    B, T = 8, 6
    cfg = (jr.RunnerConfig().environment("CartPole-v1")
           .env_runners(num_envs_per_env_runner=B, rollout_fragment_length=T,
                        episode_lookback_horizon=2, shard_envs_across_devices=False)
           .rl_module(model_config={"fcnet_hiddens": [8]})
           .reporting(metrics_num_episodes_for_smoothing=4).debugging(seed=5))
    sampler = jr.make_sampler(cfg)
    params = sampler.params
    mesh = Mesh(np.asarray(jax.devices()), ("env",))

    def per_env_sharded(traj):
        # Every leaf with a sub-env axis (axis 1 of (T, B, ...)) is split over "env".
        leaves = [x for x in jax.tree.leaves(traj) if x.ndim >= 2 and x.shape[1] == B]
        assert leaves
        for x in leaves:
            assert len(x.sharding.device_set) == 4, x.sharding
            assert x.addressable_shards[0].data.shape[1] == B // 4, x.sharding

    def host(tree):
        return jax.device_get(jax.tree.map(
            lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(
                x.dtype, jax.dtypes.prng_key) else x, tree))

    def equal(a, b):
        # Bit for bit, but for the module's float outputs (see the test's docstring).
        paths, _ = jax.tree_util.tree_flatten_with_path(host(a))
        for (path, x), y in zip(paths, jax.tree.leaves(host(b)), strict=True):
            name = jax.tree_util.keystr(path)
            if "extra_model_outputs" in name and "action_logp" not in name:
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-8, err_msg=name)
            else:
                np.testing.assert_array_equal(x, y, err_msg=name)

    # 1. sample_jit, three calls (the last one shorter).
    def calls(state):
        out = []
        for steps in (T, T, 4):
            state, traj, metrics = sampler.sample_jit(state, params, num_steps=steps)
            out.append((traj, metrics))
        return state, out

    plain_state, plain = calls(sampler.init(sampler.default_key))
    sharded_start = sampler.shard(sampler.init(sampler.default_key), mesh)
    assert sharded_start.carry.obs.addressable_shards[0].data.shape[0] == B // 4
    sharded_state, sharded = calls(sharded_start)
    for (a, ma), (b, mb) in zip(plain, sharded):
        per_env_sharded(b)
        equal(a, b)
        equal(ma, mb)
        assert reduce_sample_metrics(ma) == reduce_sample_metrics(mb)
    equal(plain_state, sharded_state)
    assert reduce_sample_metrics(plain[-1][1])["num_episodes_lifetime"] >= 1

    # 2. Inside the user's own jit: lax.scan of 2 iterations.
    @jax.jit
    def loop(state, params):
        def body(state, _):
            state, traj, metrics = sampler.sample(state, params)
            return state, (traj, metrics)
        return jax.lax.scan(body, state, None, length=2)

    start = sampler.init(sampler.default_key)
    plain_final, (plain_trajs, plain_metrics) = loop(start, params)
    sharded_final, (trajs, metrics) = loop(sampler.shard(start, mesh), params)
    leaves = [x for x in jax.tree.leaves(trajs) if x.ndim >= 3 and x.shape[2] == B]
    for x in leaves:  # (2, T, B, ...): split over the sub-env axis
        assert x.addressable_shards[0].data.shape[2] == B // 4, x.sharding
    equal(plain_trajs, trajs)
    equal(plain_metrics, metrics)
    equal(plain_final, sharded_final)
    a, b = reduce_sample_metrics(plain_metrics), reduce_sample_metrics(metrics)
    jax.tree.map(np.testing.assert_array_equal, a, b)

    # 3. A mesh without an "env" axis, or one whose size does not divide B, is refused.
    for bad in (Mesh(np.asarray(jax.devices()), ("data",)),
                Mesh(np.asarray(jax.devices()[:3]), ("env",))):
        try:
            sampler.shard(start, bad)
        except ValueError as error:
            assert "axis named 'env' whose size divides the 8 sub-envs" in str(error), error
        else:
            raise AssertionError(f"a mesh {dict(bad.shape)} was accepted")
    print("OK")
""")


def test_sharded_sampler_state__same_samples_bit_for_bit_and_stays_sharded():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "OK" in result.stdout
