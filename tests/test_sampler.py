"""The pure sampler (`jaxrunner.Sampler`): the runner's rollout inside the user's own jit
(single- and multi-agent).

Pinned: a fused loop of `sample()` calls equals the same number of `runner.sample()` calls
(trajectories and `get_metrics()`, bit for bit for a seed) through the state round trip;
nothing recompiles when only values change; `lax.scan` and `jax.vmap` over seeds, params
and env params; the host reduction to RLlib's keys (per seed under vmap); clear errors.

The runner has device callbacks (`config.callbacks(...)`): their custom keys come out of
the fused calls as `runner.get_metrics()` reports them (every reduction: max and mean
over windows, windowed sums, lifetime sums, since-last sums), per call and per seed and
iteration, and the round trip carries their state, ring and sums."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.metrics import reduce_sample_metrics

from conftest import all_eqns, assert_trees_equal, host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS, T, CALLS = 3, 12, 4
# Wall-clock keys: the fused loop has no host clock.
WALL_CLOCK = {"sample", "time_between_sampling", "num_env_steps_sampled_lifetime_throughput",
              "episode_duration_sec_mean"}


def comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in WALL_CLOCK}


def same_to_rounding(got: np.ndarray, want: np.ndarray) -> None:
    """Floats equal to float32 rounding, everything else exactly."""
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


# Device callbacks: per episode the max |cart position| and the length.
def cb_start(view):
    return {"max_x": jnp.zeros((), jnp.float32), "steps": jnp.zeros((), jnp.int32)}


def cb_step(state, view):
    return {"max_x": jnp.maximum(state["max_x"], jnp.abs(view.obs[0])),
            "steps": state["steps"] + 1}


def cb_end(state, view):
    return {"max_abs_x": state["max_x"], "max_x_mean3": state["max_x"],
            "max_x_sum": state["max_x"], "len_sum": state["steps"],
            "terminated": view.terminated, "len_last2": state["steps"]}


CUSTOM = {"max_abs_x": "max",  # over the episode window (5)
          "max_x_mean3": jaxrunner.MetricSpec("mean", window=3),
          "max_x_sum": "sum",  # lifetime sum of non-integer values
          "len_sum": "sum",  # lifetime sum of integers
          "terminated": jaxrunner.MetricSpec("sum", clear_on_reduce=True),
          "len_last2": {"reduce": "sum", "window": 2}}
CUSTOM_NAMES = tuple(sorted(CUSTOM))
INTEGER_VALUED = ("len_sum", "terminated", "len_last2")


def custom(metrics: dict) -> dict:
    return {k: metrics[k] for k in CUSTOM_NAMES if k in metrics}


@pytest.fixture(scope="module")
def runner():
    config = (make_config(num_envs=NUM_ENVS, fragment=T, hiddens=(8,),
                          episode_lookback_horizon=2)
              .reporting(metrics_num_episodes_for_smoothing=5)
              .callbacks(on_episode_start=cb_start, on_episode_step=cb_step,
                         on_episode_end=cb_end, custom_metrics=CUSTOM))
    return jaxrunner.SingleAgentEnvRunner(config=config)


@pytest.fixture(scope="module")
def runner_calls(runner):
    """CALLS runner.sample() calls from the runner's fresh state, then get_metrics(); and
    the same calls with get_metrics() after each (per_call)."""
    start = runner.get_state(components="all")
    trajs = [jax.device_get(runner.sample(num_timesteps=NUM_ENVS * T).trajectory())
             for _ in range(CALLS)]
    metrics = runner.get_metrics()
    after = runner.get_state(components="all")
    runner.set_state(start)
    per_call = []
    for _ in range(CALLS):
        runner.sample(num_timesteps=NUM_ENVS * T)
        per_call.append(runner.get_metrics())
    runner.set_state(start)
    return start, trajs, metrics, after, per_call


@pytest.mark.default_codegen
def test_fused_calls__equal_runner_calls_bit_for_bit(runner, runner_calls):
    start, trajs, runner_metrics, after, per_call = runner_calls
    sampler = runner.sampler
    assert tuple(sampler.custom_metrics) == CUSTOM_NAMES
    assert sampler.custom_metrics["max_x_mean3"].window == 3
    assert sampler.custom_metrics["max_abs_x"].window == 5  # the episode window
    # The runner saw every kind of custom value: episodes ended, some terminated.
    assert set(custom(runner_metrics)) == set(CUSTOM_NAMES)
    assert runner_metrics["terminated"] >= 1
    assert (sampler.num_envs, sampler.num_steps) == (NUM_ENVS, T)
    state = sampler.from_runner_state(start)
    # A fresh runner's carry is the sampler's init from its default key.
    fresh = sampler.init(sampler.default_key)
    jax.tree.map(np.testing.assert_array_equal, host_tree(fresh), host_tree(state))
    params = runner.get_state()["rl_module"]
    fused = []
    for expected in per_call:
        state, traj, metrics = sampler.sample_jit(state, params)
        fused.append(jax.device_get(traj))
        # Each call's custom keys: what get_metrics() after each runner call reports.
        assert custom(sampler.reduce_metrics(metrics)) == custom(expected)
    for ours, theirs in zip(fused, trajs):
        jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    with pytest.raises(ValueError, match="custom_metrics=sampler.custom_metrics"):
        reduce_sample_metrics(metrics)
    # The fused metrics reduce to what the runner reports.
    reduced = sampler.reduce_metrics(metrics)
    assert reduced["num_env_steps_sampled"] == NUM_ENVS * T  # one call's worth
    assert reduced["num_env_steps_sampled_lifetime"] == CALLS * NUM_ENVS * T
    for key in ("episode_return_mean", "episode_len_max", "num_episodes_lifetime",
                "num_env_steps_discarded_lifetime"):
        assert reduced[key] == runner_metrics[key], key
    for name in CUSTOM_NAMES:  # since-last sums: the call's (one report per fused call)
        if name != "terminated":
            assert reduced[name] == runner_metrics[name], name
    # The state loads into the runner: same metrics as the runner's own calls (the custom
    # keys included: the since-last sum covers the CALLS calls), same carry.
    runner.set_state(sampler.to_runner_state(state))
    assert comparable(runner.get_metrics()) == comparable(runner_metrics)
    got = runner.get_state(components="env_runner_carry")["env_runner_carry"]
    jax.tree.map(np.testing.assert_array_equal, (got["carry"], got["lookback"]),
                 (after["env_runner_carry"]["carry"], after["env_runner_carry"]["lookback"]))
    # ... and comes back out: the next fused call equals the runner's next sample().
    back = sampler.from_runner_state(runner.get_state(components="all"))
    _, traj, metrics = sampler.sample_jit(back, params, num_steps=5)
    expected = jax.device_get(runner.sample(num_timesteps=NUM_ENVS * 5).trajectory())
    assert custom(sampler.reduce_metrics(metrics)) == custom(runner.get_metrics())
    traj = jax.device_get(traj)
    assert int(traj.valid.sum()) == 5
    np.testing.assert_array_equal(traj.actions[:5], expected.actions[:5])
    np.testing.assert_array_equal(traj.rewards[:5], expected.rewards[:5])
    runner.set_state(start)


def test_sample__compiles_once_for_any_values(runner, compile_counter):
    sampler = runner.sampler
    params = sampler.params
    state = sampler.init(jax.random.key(1))
    state, _, _ = sampler.sample_jit(state, params, num_steps=3)  # warm-up
    shifted = jax.tree.map(lambda x: np.asarray(x) + np.float32(0.1), params)
    compile_counter.reset()
    for steps, p in ((T, shifted), (1, params), (7, shifted)):
        state, traj, _ = sampler.sample_jit(state, p, num_steps=steps)
        assert int(np.asarray(traj.valid).sum()) == steps
    assert compile_counter.count == 0, compile_counter.messages


def test_nothing_sampled__is_what_a_call_of_zero_steps_reports(runner):
    """`SampleMetrics.nothing_sampled()` (the rows of a fused loop's iterations after it
    stopped) equals the metrics of a following `sample(num_steps=0)` call: the same ring
    and lifetime counters, no steps or episodes of its own."""
    sampler = runner.sampler
    state = sampler.init(jax.random.key(4))
    for _ in range(3):  # some episodes end (sub-envs of 16 steps a call)
        state, _, metrics = sampler.sample_jit(state, sampler.params)
    _, _, zero = sampler.sample_jit(state, sampler.params, num_steps=0)
    assert int(metrics.num_env_steps) > 0
    assert int(metrics.registers.window_size) > 0, "no episode ended: nothing compared"
    jax.tree.map(np.testing.assert_array_equal, host_tree(metrics.nothing_sampled()),
                 host_tree(zero))
    reduced = sampler.reduce_metrics(metrics.nothing_sampled())
    assert reduced["num_env_steps_sampled"] == 0 and reduced["num_episodes"] == 0
    assert reduced["episode_return_mean"] == sampler.reduce_metrics(metrics)[
        "episode_return_mean"]
    np.testing.assert_allclose(float(metrics.registers.return_mean()),
                               reduced["episode_return_mean"], rtol=1e-6)


def test_scan_and_vmap__over_seeds_params_and_env_params(runner, runner_calls):
    start, per_call = runner_calls[0], runner_calls[-1]
    sampler = runner.sampler
    seeds = 2
    params = jax.tree.map(lambda x: jnp.stack([x, x * 0.5]), sampler.params)
    env_params = jax.tree.map(lambda x: jnp.stack([x, x]), sampler.env_params)
    env_params = env_params.replace(max_steps_in_episode=jnp.asarray([500, 6]))

    def train(key, params, env_params):
        state = sampler.init(key, params, env_params)

        def body(state, _):
            state, traj, metrics = sampler.sample(state, params, env_params)
            return state, (traj.truncated, metrics)

        return jax.lax.scan(body, state, None, length=2)

    keys = jnp.stack([sampler.default_key, jax.random.key(7)])
    state, (truncated, metrics) = jax.jit(jax.vmap(train))(keys, params, env_params)
    assert truncated.shape == (seeds, 2, T, NUM_ENVS)
    truncated = np.asarray(truncated)
    assert truncated[1].any() and not truncated[0].any()  # env params per seed
    reduced = sampler.reduce_metrics(metrics)  # per seed and iteration
    assert reduced["num_env_steps_sampled"].shape == (seeds, 2)
    np.testing.assert_array_equal(reduced["num_env_steps_sampled_lifetime"],
                                  [[T * NUM_ENVS, 2 * T * NUM_ENVS]] * seeds)
    assert reduced["num_episodes_lifetime"][1, -1] >= 2 * NUM_ENVS
    assert reduced["episode_len_max"][1, -1] == 6
    # The last iteration's keys per seed equal one state's reduction.
    one = jax.tree.map(lambda x: x[1, -1], metrics)
    assert sampler.reduce_metrics(one)["episode_len_mean"] == reduced["episode_len_mean"][1, -1]
    with pytest.raises(ValueError, match="one state"):
        sampler.to_runner_state(state)
    assert sampler.to_runner_state(jax.tree.map(lambda x: x[0], state))[
        "num_env_steps_sampled_lifetime"] == 2 * T * NUM_ENVS
    # Custom keys per seed and iteration: seed 0 is the runner's own start and params.
    custom_stack = sampler.reduce_metrics(metrics)
    for name in CUSTOM_NAMES:
        assert custom_stack[name].shape == (seeds, 2), name
        expected = np.asarray([m.get(name, np.nan) for m in per_call[:2]])
        if name in INTEGER_VALUED:  # episode boundaries and lengths: exact
            np.testing.assert_array_equal(custom_stack[name][0], expected, err_msg=name)
        else:
            # XLA compiles the vmapped scan as another program than the runner's chunk:
            # CartPole's float32 physics may round differently (1 ulp) in it, so the cart
            # positions these metrics read agree to float32 precision. The reduction is
            # exact (the single-call test and `one` below).
            np.testing.assert_allclose(custom_stack[name][0], expected, rtol=1e-6,
                                       err_msg=name)
    one = sampler.reduce_metrics(jax.tree.map(lambda x: x[1, -1], metrics))
    assert custom(one) == {k: float(custom_stack[k][1, -1]) for k in CUSTOM_NAMES
                           if not np.isnan(custom_stack[k][1, -1])}
    assert custom_stack["len_sum"][1, -1] > 0
    # Seed 1's state, handed to the runner, reports that seed's lifetime sums.
    runner.set_state(sampler.to_runner_state(jax.tree.map(lambda x: x[1], state)))
    got = runner.get_metrics()
    assert got["len_sum"] == custom_stack["len_sum"][1, -1]
    assert got["max_x_sum"] == custom_stack["max_x_sum"][1, -1]
    assert got["terminated"] == np.nansum(custom_stack["terminated"][1])
    runner.set_state(start)


def test_custom_lifetime_sums__keep_float64_precision_on_the_device():
    """The device pair `(hi, lo)` keeps sums a float32 accumulator rounds away: exact
    while the sum fits in 48 bits (as float64 is), else within 2**-48 per addition."""
    from jaxrunner.sampler import _add_exact

    def total(values):
        def body(pair, x):
            return _add_exact(*pair, x), None

        zero = jnp.zeros((1,), jnp.float32)
        (hi, lo), _ = jax.lax.scan(body, (zero, zero), values[:, None])
        return hi, lo

    total = jax.jit(total)

    def host_sum(values):  # the runner's float64 host sum of float32 chunk sums
        out = 0.0
        for v in values:
            out += float(v)
        return out

    # Multiples of 1/8 summing to ~2**33: 36 bits, exact both ways; float32 is not.
    exact = np.float32([2.0**24, 1.0, 0.125, 0.375, 2.0**20 + 0.5, 7.25, 3.0]).repeat(60)
    hi, lo = total(jnp.asarray(exact))
    assert float(hi[0]) + float(lo[0]) == host_sum(exact)
    assert float(np.cumsum(exact, dtype=np.float32)[-1]) != host_sum(exact)
    # Arbitrary floats: off by far less than float32's 2**-24.
    values = np.random.default_rng(0).uniform(0, 2.0**20, 400).astype(np.float32)
    hi, lo = total(jnp.asarray(values))
    error = abs(float(hi[0]) + float(lo[0]) - host_sum(values))
    assert error <= len(values) * 2.0**-48 * host_sum(values)


def test_bad_input__raises_clear_errors(runner):
    sampler = runner.sampler
    state = sampler.init(jax.random.key(0))
    with pytest.raises(TypeError, match="Python bools"):
        sampler.sample(state, sampler.params, explore=jnp.asarray(True))
    with pytest.raises(jaxrunner.StateStructureError, match="env_runner_carry"):
        sampler.from_runner_state(runner.get_state())
    with pytest.raises(ValueError, match="mode must be one of"):
        sampler.chunk_fns("greedy")
    # Runners without a JAX env have no sampler.
    host = jaxrunner.SingleAgentEnvRunner(config=make_config("gymnasium:CartPole-v1"))
    with pytest.raises(ValueError, match="stepped on the host; a pure sampler needs a JAX env"):
        host.sampler
    host.stop()
    local = jaxrunner.SingleAgentEnvRunner(config=make_config(num_env_runners=2),
                                           worker_index=0)
    with pytest.raises(ValueError, match="has no env"):
        local.sampler


def test_mismatched_input__names_what_differs_then_sampling_works():
    """A state of a sampler with other sub-envs, params of another module, another env's
    params, a missing params argument, a key that is no key and a step count outside
    `[0, T]` each raise, at trace time at the latest, a clear error that names what
    differs, vmapped inside a jit too; the sampler then samples as before. A
    `jax.random.PRNGKey` (raw key data) starts the same state as the typed key."""
    sampler = jaxrunner.make_sampler(make_config(num_envs=2, fragment=4))
    other = jaxrunner.make_sampler(make_config(num_envs=3, fragment=4))
    wide = jaxrunner.make_sampler(make_config(num_envs=2, fragment=4, hiddens=(32,)))
    state = sampler.init(jax.random.key(0))
    reference = jax.device_get(jax.jit(sampler.sample)(state, sampler.params)[1])

    with pytest.raises(TypeError, match="key must be a typed jax.random.key"):
        sampler.init(0)
    with pytest.raises(TypeError, match="needs the module's inference params"):
        sampler.sample(state, None)
    with pytest.raises(TypeError, match="state must be a SamplerState"):
        sampler.sample({"carry": state.carry}, sampler.params)
    with pytest.raises(jaxrunner.StateStructureError,
                       match=r"the state does not fit .*expected shape \(2,\), got \(3,\)"):
        jax.jit(sampler.sample)(other.init(jax.random.key(0)), sampler.params)
    with pytest.raises(jaxrunner.StateStructureError, match=r"the state does not fit"):
        jax.jit(jax.vmap(lambda s: sampler.sample(s, sampler.params)))(
            jax.vmap(other.init)(jax.random.split(jax.random.key(0), 2)))
    with pytest.raises(jaxrunner.StateStructureError,
                       match=r"params does not fit .*\['Dense_0'\]\['kernel'\]: "
                             r"expected shape \(4, 16\), got \(4, 32\)"):
        jax.jit(sampler.sample)(state, wide.params)
    with pytest.raises(jaxrunner.StateStructureError,
                       match=r"env_runner_carry does not fit .*expected shape \(2,\), got \(3,\)"):
        sampler.from_runner_state(other.runner.get_state(components="all"))
    pendulum = jaxrunner.make_sampler(make_config("Pendulum-v1", num_envs=2, fragment=4))
    with pytest.raises(jaxrunner.StateStructureError,
                       match=r"env_params does not fit .*'CartPole-v1'"):
        jax.jit(sampler.sample)(state, sampler.params, pendulum.env_params)
    for steps in (5, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"num_steps must be an int in \[0, 4\]"):
            sampler.sample_jit(state, sampler.params, num_steps=steps)
        with pytest.raises(ValueError, match=r"num_steps must be an int in \[0, 4\]"):
            sampler.sample(state, sampler.params, num_steps=steps)
    with pytest.raises(TypeError, match="takes the SampleMetrics that Sampler.sample returns"):
        reduce_sample_metrics({"num_env_steps": 4})

    raw = sampler.init(jax.random.PRNGKey(0))
    assert jax.dtypes.issubdtype(raw.carry.key.dtype, jax.dtypes.prng_key)
    assert_trees_equal(host_tree(raw), host_tree(state), "a PRNGKey's state")
    again = jax.device_get(jax.jit(sampler.sample)(state, sampler.params)[1])
    assert_trees_equal(again, reference, "the trajectory after the errors")


def _ma_start(view):
    return {"steps": jnp.zeros((), jnp.int32)}


def _ma_step(state, view):
    return {"steps": state["steps"] + view.acting["player_x"].astype(jnp.int32)}


def _ma_end(state, view):
    return {"x_moves": state["steps"], "x_reward": view.reward["player_x"]}


def test_multi_agent_fused_calls__equal_runner_calls():
    """With device callbacks: their custom keys come out of the fused calls too."""
    config = (jaxrunner.RunnerConfig().environment("TicTacToe-v0")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=6,
                           max_chunk_length=6)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .multi_agent(policies={"main", "opponent"},
                           policy_mapping_fn=lambda agent, episode: (
                               "main" if agent == "player_x" else "opponent"))
              .debugging(seed=3)
              .callbacks(on_episode_start=_ma_start, on_episode_step=_ma_step,
                         on_episode_end=_ma_end,
                         custom_metrics={"x_moves": "max", "x_reward": "sum"}))
    runner = jaxrunner.MultiAgentEnvRunner(config=config)
    start = runner.get_state(components="all")
    for _ in range(3):
        runner.sample(num_timesteps=12)
    expected = comparable(runner.get_metrics())
    runner.set_state(start)
    sampler = runner.sampler
    assert sampler.agent_ids == ("player_x", "player_o")
    state = sampler.from_runner_state(start)
    for _ in range(3):
        state, traj, metrics = sampler.sample_jit(state, sampler.params)
    reduced = sampler.reduce_metrics(metrics)
    assert reduced["num_env_steps_sampled_lifetime"] == 36
    assert "x_moves" in expected  # an episode ended
    for name in ("x_moves", "x_reward"):
        assert reduced[name] == expected[name], name
    assert reduced["num_agent_steps_sampled_lifetime"] == expected[
        "num_agent_steps_sampled_lifetime"]
    runner.set_state(sampler.to_runner_state(state))
    assert comparable(runner.get_metrics()) == expected


def test_vmapped_sample__members_that_stop_early_match_their_own_unbatched_calls():
    """Under `jax.vmap` the chunk runs one loop for all members (`core.chunk.vmap_members`):
    a member whose final-observation store fills stops there, as its own loop would, while
    the others go on. Member 1 ends an episode every 2 steps in a store of one row per
    sub-env, so its chunks stop early; member 0's run on. Each member's states,
    trajectories and metrics equal its own unbatched calls (discrete parts exactly)."""
    config = make_config(num_envs=NUM_ENVS, fragment=T, final_obs_slots_per_env=1)
    sampler = jaxrunner.make_sampler(config)
    env_params = jax.tree.map(lambda x: jnp.stack([x, x]), sampler.env_params)
    env_params = env_params.replace(max_steps_in_episode=jnp.asarray([500, 2]))
    keys = jnp.stack([sampler.default_key, jax.random.key(3)])
    params = sampler.params

    def calls(key, env_params):
        state = sampler.init(key, params, env_params)
        outs = []
        for _ in range(2):
            state, traj, metrics = sampler.sample(state, params, env_params)
            outs.append((traj, metrics))
        return state, outs

    batched = host_tree(jax.jit(jax.vmap(calls))(keys, env_params))
    valid = np.stack([traj.valid for traj, _ in batched[1]])  # (call, member, T)
    assert valid[:, 1].sum() < valid[:, 0].sum(), valid  # member 1 stopped early
    assert valid[:, 1].sum() > 0

    one = jax.jit(calls)
    for member in range(2):
        alone = host_tree(one(keys[member], jax.tree.map(lambda x: x[member], env_params)))
        jax.tree.map(same_to_rounding, jax.tree.map(lambda x: x[member], batched), alone)

    # One loop for both members: the chunk's while loop tests a () bool, where a loop
    # JAX batched itself would test one per member (and select its whole carry per step).
    state = jax.vmap(sampler.init, in_axes=(0, None, 0))(keys, params, env_params)
    traced = jax.make_jaxpr(jax.vmap(lambda s, e: sampler.sample(s, params, e)[:2]))(
        state, env_params)
    conditions = [tuple(v.aval.shape for v in eqn.params["cond_jaxpr"].jaxpr.outvars)
                  for eqn in all_eqns(traced.jaxpr) if eqn.primitive.name == "while"]
    assert conditions and all(shapes == ((),) for shapes in conditions), conditions


def test_nested_vmaps__seeds_by_env_params_match_one_flat_vmap():
    """`vmap` over seeds inside `vmap` over env params (a seed x hyperparameter grid, as
    research loops write it) gives each grid member the values a flat `vmap` over the same
    members gives: states, trajectories and metrics (discrete parts exactly). Members
    stop at different steps (a small final-observation store, episode limits of 500 and
    2), so the inner axis's shared loop and the outer axis's batched one both freeze
    members mid-chunk."""
    config = make_config(num_envs=NUM_ENVS, fragment=T, final_obs_slots_per_env=1)
    sampler = jaxrunner.make_sampler(config)
    params = sampler.params
    env_params = jax.tree.map(lambda x: jnp.stack([x, x]), sampler.env_params)
    env_params = env_params.replace(max_steps_in_episode=jnp.asarray([500, 2]))
    keys = jax.vmap(jax.random.key)(jnp.arange(4)).reshape(2, 2)  # (env params, seed)

    def calls(key, env_params):
        state = sampler.init(key, params, env_params)
        outs = []
        for _ in range(2):
            state, traj, metrics = sampler.sample(state, params, env_params)
            outs.append((traj, metrics))
        return state, outs

    nested = host_tree(jax.jit(jax.vmap(jax.vmap(calls, in_axes=(0, None))))(
        keys, env_params))
    flat_env_params = jax.tree.map(lambda x: jnp.repeat(x, 2, axis=0), env_params)
    flat = host_tree(jax.jit(jax.vmap(calls))(keys.reshape(4), flat_env_params))
    valid = np.stack([traj.valid for traj, _ in flat[1]])  # (call, member, T)
    assert valid[:, 2:].sum() < valid[:, :2].sum(), valid  # members stop at different steps

    jax.tree.map(lambda n, f: same_to_rounding(n.reshape(f.shape), f), nested, flat)


def test_same_batching_as__keeps_values_and_batches_constants_like_its_reference():
    """`core.chunk.same_batching_as`: the same values; under `vmap` a leaf of constants
    comes out batched when an integer or key leaf of the reference is batched (a mapped
    output then cannot be returned with `out_axes=None`), and stays unbatched when the
    reference is not."""
    from jaxrunner.core.chunk import same_batching_as

    tree = {"zeros": jnp.zeros(3), "count": jnp.int32(7), "flag": jnp.bool_(True)}
    same = same_batching_as(tree, jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, same, tree)
    keys = jax.vmap(jax.random.key)(jnp.arange(4))
    batched = jax.vmap(lambda k: same_batching_as(tree, k))(keys)
    assert batched["zeros"].shape == (4, 3) and batched["count"].shape == (4,)
    np.testing.assert_array_equal(batched["count"], 7)
    with pytest.raises(ValueError, match="out_axes"):
        jax.vmap(lambda k: same_batching_as(tree, k)["zeros"], out_axes=None)(keys)
    unbatched = jax.vmap(lambda k, like: same_batching_as(tree, like)["zeros"],
                         in_axes=(0, None), out_axes=None)(keys, jnp.int32(1))
    np.testing.assert_array_equal(unbatched, np.zeros(3))
    # Without it, a constant under vmap is unbatched: returnable with out_axes=None.
    jax.vmap(lambda k: tree["zeros"], out_axes=None)(keys)


@pytest.mark.parametrize("batched_from_start", [True, False])
def test_vmapped_fused_loop__batches_each_loop_body_once(monkeypatch, batched_from_start):
    """Under `jax.vmap` JAX batches a loop's body once more for every carried value that
    starts unbatched (a constant) and turns batched. With `core.chunk.BATCHED_FROM_START`
    the fused PPO's state and the chunk's loop carry start batched, so each large loop
    body (the iteration scan, the chunk's steps) is batched once; without it several
    times (the second case shows the count sees it). The values are the same either way:
    discrete parts exactly, floats to rounding (the two programs are batched in another
    order, and XLA may fuse them differently; for the fused PPO of
    `benchmarks/time_to_solve.py` the optimised programs were identical)."""
    from jax._src.interpreters import batching

    from jaxrunner.core import chunk
    from jaxrunner.learners import PPOConfig, PPOLearner

    monkeypatch.setattr(chunk, "BATCHED_FROM_START", batched_from_start)
    calls: dict[int, int] = {}
    batch_jaxpr = batching.batch_jaxpr

    def counted(closed_jaxpr, *args, **kwargs):
        if len(closed_jaxpr.jaxpr.eqns) >= 100:
            calls[id(closed_jaxpr.jaxpr)] = calls.get(id(closed_jaxpr.jaxpr), 0) + 1
        return batch_jaxpr(closed_jaxpr, *args, **kwargs)

    monkeypatch.setattr(batching, "batch_jaxpr", counted)
    sampler = jaxrunner.make_sampler(make_config(num_envs=NUM_ENVS, fragment=T))
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=1))
    train = learner.make_train(sampler, 2)
    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    out = host_tree(jax.jit(jax.vmap(train))(keys))
    assert len(calls) >= 2, calls  # the iteration scan's body and the chunk's loop body
    if batched_from_start:
        assert set(calls.values()) == {1}, calls
    else:
        assert max(calls.values()) > 1, calls
    monkeypatch.setattr(chunk, "BATCHED_FROM_START", not batched_from_start)
    other = host_tree(jax.jit(jax.vmap(learner.make_train(sampler, 2)))(keys))
    jax.tree.map(same_to_rounding, out, other)


def test_vmapped_sample_in_a_while_loop__traces_the_vmapped_chunk_once():
    """JAX batches a `while_loop`'s body pass by pass until it knows which carried values
    are batched: here the sampler's counters start as constants (unbatched) and become
    batched after a call. `vmap_members` traces the vmapped chunk once for all passes
    (plus `custom_vmap`'s own unbatched trace): a fused loop over 8 seeds traced it four
    times before, a second of lowering for CartPole. The loop's results equal each
    seed's own unbatched loop."""
    config = make_config(num_envs=NUM_ENVS, fragment=T)
    sampler = jaxrunner.make_sampler(config)
    fns = sampler.chunk_fns("explore")
    traces = []

    def counted_chunk(*args):
        traces.append(len(traces))
        return fns.chunk(*args)

    sampler._fns["explore"] = fns._replace(chunk=counted_chunk)
    params = sampler.params

    def train(key):
        def body(loop):
            state, calls = loop
            state, _, _ = sampler.sample(state, params)
            return state, calls + 1

        return jax.lax.while_loop(lambda loop: loop[1] < CALLS, body,
                                  (sampler.init(key, params), jnp.zeros((), jnp.int32)))[0]

    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    batched = host_tree(jax.jit(jax.vmap(train))(keys))
    assert len(traces) == 2, traces  # the unbatched trace and one vmapped trace
    for member in range(2):
        alone = host_tree(jax.jit(train)(keys[member]))
        assert int(alone.counters.vector_steps) == CALLS * T
        np.testing.assert_array_equal(batched.counters.vector_steps[member],
                                      alone.counters.vector_steps)
        np.testing.assert_array_equal(batched.carry.episode_count[member],
                                      alone.carry.episode_count)
        np.testing.assert_allclose(batched.carry.obs[member], alone.carry.obs,
                                   rtol=1e-5, atol=1e-6)


def _count_chunk_step_traces(monkeypatch) -> list:
    """Records each Python trace of CartPole's `step_env` made by the chunk's vector step
    (`one_step`; the env-analysis traces of the step are not counted)."""
    import traceback

    from gymnax.environments.classic_control.cartpole import CartPole

    traces, original = [], CartPole.step_env

    def counted(self, *args, **kwargs):
        stack = traceback.extract_stack()
        if (any(frame.name == "one_step" for frame in stack)
                and not any(frame.filename.endswith("dependence.py") for frame in stack)):
            traces.append(len(traces))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CartPole, "step_env", counted)
    return traces


def _run_fused_loop(seeds: int) -> Any:
    """CALLS samples in a `scan` after `init`, in one jit (vmapped over `seeds` seeds; 0:
    one seed, no vmap), of a sampler built now (it reads `core.chunk`'s `SHARE_*_TRACE`
    switches when first traced); its final state and per-call reward sums on the host."""
    sampler = jaxrunner.make_sampler(make_config(num_envs=NUM_ENVS, fragment=T))
    keys = jax.vmap(jax.random.key)(jnp.arange(max(seeds, 1)))

    def train(key):
        def body(state, _):
            state, traj, _ = sampler.sample(state, sampler.params)
            return state, traj.rewards.sum()
        return jax.lax.scan(body, sampler.init(key), None, length=CALLS)

    program = jax.jit(jax.vmap(train)) if seeds else jax.jit(train)
    return host_tree(program(keys if seeds else keys[0]))


@pytest.mark.parametrize("seeds", [0, 2])
def test_fused_loop__traces_the_env_step_once_for_init_and_chunk(monkeypatch, seeds):
    """`init` (its lookback's shapes) and the chunk's loop body share one trace of the
    vector step: a fused loop's program traced CartPole's step twice before (three times
    vmapped over seeds), once now. The loop's values equal those of the loop traced the
    old way (`SHARE_STEP_TRACE = False`), bit for bit."""
    import jaxrunner.core.chunk as chunk_module

    traces = _count_chunk_step_traces(monkeypatch)
    shared = _run_fused_loop(seeds)
    assert len(traces) == 1, traces

    # The same loop with the body tracing the step itself traces it twice, to the same
    # values.
    monkeypatch.setattr(chunk_module, "SHARE_STEP_TRACE", False)
    traces.clear()
    traced = _run_fused_loop(seeds)
    # once for the shapes, once in the body; vmapped, once more in `custom_vmap`'s
    # unbatched trace of the chunk
    assert len(traces) == (3 if seeds else 2), traces
    jax.tree.map(np.testing.assert_array_equal, shared, traced)


def test_vmapped_fused_loop__traces_the_chunks_finish_once(monkeypatch):
    """Under `jax.vmap` the chunk is traced twice (`custom_vmap`'s own unbatched trace,
    then the batched one); the batched trace evaluates the first trace of the chunk's
    finish (decode, metric ring, lookback roll) instead of running its Python again. The
    loop's values equal those of the loop traced the old way (`SHARE_FINISH_TRACE =
    False`), bit for bit."""
    import jaxrunner.core.chunk as chunk_module

    finishes, original = [], chunk_module.finish_chunk

    def counted(*args, **kwargs):
        finishes.append(len(finishes))
        return original(*args, **kwargs)

    monkeypatch.setattr(chunk_module, "finish_chunk", counted)
    shared = _run_fused_loop(2)
    assert len(finishes) == 1, finishes
    monkeypatch.setattr(chunk_module, "SHARE_FINISH_TRACE", False)
    finishes.clear()
    traced = _run_fused_loop(2)
    assert len(finishes) == 2, finishes
    jax.tree.map(np.testing.assert_array_equal, shared, traced)


def test_runner_first_sample__traces_the_env_step_once_in_the_chunk(monkeypatch):
    """A runner's first `sample()` builds its zero lookback from the step's shapes, traced
    under the runner's Threefry lowering, and its chunk's body reuses that trace: one trace
    of CartPole's step in `one_step` (two before)."""
    traces = _count_chunk_step_traces(monkeypatch)
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=NUM_ENVS, fragment=T))
    runner.sample()
    runner.sample()
    assert len(traces) == 1, traces


def test_multi_agent_sampler__builds_its_params_on_first_read(compile_counter):
    """A multi-agent runner's module params are built on their first read, as a
    single-agent one's (tests/test_ppo_fused.py): its sampler builds without compiling
    the modules' init, and the params read later are those of a runner read at once."""
    def config():
        return (jaxrunner.RunnerConfig().environment("TicTacToe-v0")
                .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
                .rl_module(model_config={"fcnet_hiddens": [8]})
                .multi_agent(policies={"main", "opponent"},
                             policy_mapping_fn=lambda agent, episode: (
                                 "main" if agent == "player_x" else "opponent"))
                .debugging(seed=5))

    sampler = jaxrunner.make_sampler(config())
    assert not [m for m in compile_counter.messages if m.startswith("Compiling jit(init)")]
    runner = jaxrunner.MultiAgentEnvRunner(config=config())
    early = runner.get_state(components="rl_module")["rl_module"]
    assert_trees_equal(sampler.params, early, "multi-agent params")
    runner.stop()
