"""The reference PPO's fused loop (`PPOLearner.make_train`) computes what its runner-driven
loop (`PPOLearner.train(runner, ...)`) computes, for the same seed, config and start.

What is exact and what is not, and why. The runner's `sample()` and the fused loop's
`sampler.sample()` are the same compiled chunk: their trajectories are bit for bit equal
(tests/test_sampler.py), and `update_fn` jitted alone gives bit for bit the same update on
either. The fused loop, though, is one XLA program: the chunk and the update are compiled inside
it (a `lax.scan` over iterations), and XLA chooses buffer layouts and fusions per
program, so float reductions, dot products and the env's float physics may round
differently from the runner's chunk and the update compiled alone (an
`optimization_barrier` between sampling and update does not change that: it stops fusion,
not layout choices). They are not the same program, so bit-for-bit equality is not a
property of the design. Hence:

* exact: every iteration's episodes (lifetime steps, `episode_return_mean`) and, after
  the last iteration, every discrete part of the sampler carry (RNG keys, episode ids
  and lengths, step and episode counters, the metric ring's lengths, returns and
  counts, the lookback's actions) and the learner's shuffling key;
* to float32 rounding: observations and env states, the update's statistics per
  iteration and the trained params.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.learners import PPOConfig, PPOLearner

from conftest import host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

ITERATIONS = 3


def test_fused_train__equals_the_runner_driven_train():
    config = make_config(num_envs=4, fragment=16, hiddens=(8,), seed=2)
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    learner = PPOLearner.from_runner(runner, PPOConfig(num_epochs=2, num_minibatches=2,
                                                       seed=2))
    start = learner.fused_state(runner)  # before any iteration: the same start for both
    rows = learner.train(runner, num_iterations=ITERATIONS, verbose=False)
    driven_params = jax.device_get(learner.params)
    driven_carry = runner.get_state(components="env_runner_carry")["env_runner_carry"]

    sampler = runner.sampler
    train = learner.make_train(sampler, ITERATIONS)
    final, stats, metrics = jax.jit(train.run)(start)
    reduced = sampler.reduce_metrics(metrics)
    stats = jax.device_get(stats)

    # Exact: the episodes of every iteration ...
    np.testing.assert_array_equal(reduced["num_env_steps_sampled_lifetime"],
                                  [row["env_steps"] for row in rows])
    np.testing.assert_array_equal(
        reduced["episode_return_mean"],
        [np.nan if row["episode_return_mean"] is None else row["episode_return_mean"]
         for row in rows])
    assert np.isfinite(reduced["episode_return_mean"][-1])
    # ... and the sampler's whole carry after the last one (its discrete parts exactly).
    fused_carry = sampler.to_runner_state(final.sampler)["env_runner_carry"]

    def same(fused, driven):
        if np.issubdtype(np.asarray(fused).dtype, np.floating):
            np.testing.assert_allclose(fused, driven, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(fused, driven)

    for name in ("carry", "lookback"):
        jax.tree.map(same, host_tree(fused_carry[name]), host_tree(driven_carry[name]))
    ring = fused_carry["carry"].metrics
    assert int(ring.episodes) >= 4  # episodes ended, so the ring was compared too
    np.testing.assert_array_equal(ring.window_len, driven_carry["carry"].metrics.window_len)
    np.testing.assert_array_equal(ring.window_return,
                                  driven_carry["carry"].metrics.window_return)
    np.testing.assert_array_equal(jax.random.key_data(final.learner.key),
                                  jax.random.key_data(learner.state.key))
    # To float32 rounding: the updates.
    for i, row in enumerate(rows):
        for name, values in stats.items():
            np.testing.assert_allclose(values[i], row[name], rtol=1e-4, atol=1e-6,
                                       err_msg=f"iteration {i}: {name}")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 jax.device_get(final.learner.params), driven_params)
    runner.stop()


def test_fused_train__either_rng_lowering_gives_the_same_episodes():
    """The unrolled hash and JAX's lowering draw the same random values: the same episodes,
    ring and keys; a lowering name it does not know is refused before anything compiles."""
    config = make_config(num_envs=4, fragment=16, hiddens=(8,), seed=3)
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=2,
                                                         seed=3))
    with pytest.raises(ValueError, match="rng_lowering must be one of"):
        learner.fused_train(sampler, ITERATIONS, rng_lowering="fast")
    runs = {name: learner.fused_train(sampler, ITERATIONS, seeds=2, rng_lowering=name)
            for name in ("unrolled", "jax")}
    unrolled, default = runs["unrolled"], runs["jax"]
    for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime",
                "episode_len_mean"):
        np.testing.assert_array_equal(unrolled["metrics"][key], default["metrics"][key])
    rings = [run["state"].sampler.carry.metrics for run in (unrolled, default)]
    assert int(np.sum(rings[0].episodes)) >= 2  # episodes ended, so the rings were compared
    np.testing.assert_array_equal(rings[0].window_len, rings[1].window_len)
    np.testing.assert_array_equal(jax.random.key_data(unrolled["state"].learner.key),
                                  jax.random.key_data(default["state"].learner.key))


def test_fused_train_to_a_target__each_seed_stops_where_its_mean_first_reaches_it():
    """With `target_return`, each vmapped seed runs the iterations of the fixed-length loop
    up to the first whose `episode_return_mean` reaches the target (the same episodes and,
    to float32 rounding, the same statistics), then stops: its later rows are NaN
    statistics and iterations that sampled nothing, and its final state is the one after
    its last iteration. A target never reached runs every iteration."""
    iterations = 8
    config = make_config(num_envs=4, fragment=16, hiddens=(8,), seed=5)
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=2,
                                                         learning_rate=1e-3, seed=5))
    full = learner.fused_train(sampler, iterations, seeds=3)
    means = np.asarray(full["metrics"]["episode_return_mean"])  # (3, iterations)
    assert full["iterations_run"] == [iterations] * 3
    # A target halfway between two of the means: no mean lies within rounding of it.
    values = np.unique(means[np.isfinite(means)])
    assert values.size >= 4, values
    middle = values.size // 2
    target = float((values[middle - 1] + values[middle]) / 2)
    expected = [next((i + 1 for i in range(iterations) if means[s, i] >= target),
                     iterations) for s in range(3)]
    assert min(expected) < iterations  # some seed stops early

    run = learner.fused_train(sampler, iterations, seeds=3, target_return=target)
    assert run["iterations_run"] == expected
    metrics, stats = run["metrics"], run["stats"]
    for s, ran in enumerate(expected):
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime",
                    "episode_return_mean", "num_env_steps_sampled"):
            np.testing.assert_array_equal(metrics[key][s, :ran], full["metrics"][key][s, :ran])
        for name, rows in stats.items():
            np.testing.assert_allclose(rows[s, :ran], full["stats"][name][s, :ran],
                                       rtol=1e-5, atol=1e-6)
            assert np.isnan(rows[s, ran:]).all(), name
        # The iterations it did not run sampled nothing; its ring and counters stay.
        assert (metrics["num_env_steps_sampled"][s, ran:] == 0).all()
        assert (metrics["num_episodes"][s, ran:] == 0).all()
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime",
                    "episode_return_mean"):
            assert (metrics[key][s, ran:] == metrics[key][s, ran - 1]).all(), key
        lifetime = int(np.asarray(run["state"].sampler.counters.env_steps_lo)[s])
        assert lifetime == ran * 16 * 4
        if ran < iterations:
            assert metrics["episode_return_mean"][s, ran - 1] >= target
            assert (metrics["episode_return_mean"][s, :ran - 1] < target).all() or ran == 1
    # The device's float32 mean, which decides, is the host's float64 mean to rounding.
    ring = jax.tree.map(lambda x: x[0], run["state"].sampler.carry.metrics)
    np.testing.assert_allclose(float(ring.return_mean()),
                               metrics["episode_return_mean"][0, -1], rtol=1e-6)
    never = learner.fused_train(sampler, iterations, seeds=3, target_return=1e9)
    assert never["iterations_run"] == [iterations] * 3
    np.testing.assert_array_equal(never["metrics"]["episode_return_mean"], means)


def test_fused_train_to_a_target__traces_the_iteration_once(monkeypatch):
    """The loop to a target takes its buffers' shapes from the same trace as its body
    (`core.chunk.TracedOnce`): the update is traced once, as in the fixed-length loop."""
    config = make_config(num_envs=2, fragment=8, hiddens=(8,), seed=1)
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=2))
    traces = []
    update_fn = learner.update_fn

    def counted(*args, **kwargs):
        traces.append(1)
        return update_fn(*args, **kwargs)

    monkeypatch.setattr(learner, "update_fn", counted)
    for target in (None, 100.0):
        traces.clear()
        train = learner.make_train(sampler, 4, target_return=target)
        jax.jit(jax.vmap(train)).trace(jax.random.split(jax.random.key(0), 2))
        assert len(traces) == 1, target


def test_fused_train__refuses_a_learner_of_another_sampler_and_bad_seeds(compile_counter):
    """A learner built for another env or model config (or for a multi-agent sampler),
    seeds that are neither a count nor a list of ints and more minibatches than steps in an
    iteration are refused before anything compiles, with what differs; the learner then
    trains on its own sampler."""
    config = make_config(num_envs=2, fragment=8, hiddens=(8,), seed=1)
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=2))
    pendulum = jaxrunner.make_sampler(make_config("Pendulum-v1", num_envs=2, fragment=8,
                                                  hiddens=(8,)))
    wider = jaxrunner.make_sampler(make_config(num_envs=2, fragment=8, hiddens=(16,)))
    compile_counter.reset()
    with pytest.raises(jaxrunner.StateStructureError,
                       match=r"acting params does not fit .*expected shape \(3, 8\), got "
                             r"\(4, 8\).*PPOLearner.from_sampler\(sampler\)"):
        learner.fused_train(pendulum, 1)
    with pytest.raises(jaxrunner.StateStructureError, match=r"expected shape \(16,\), got \(8,\)"):
        learner.make_train(wider, 1)
    tictactoe = jaxrunner.make_sampler(
        jaxrunner.RunnerConfig().environment("TicTacToe-v0")
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=6, max_chunk_length=6)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .multi_agent(policies={"main"}, policy_mapping_fn=lambda agent, episode: "main"))
    with pytest.raises(ValueError, match=r"one single-agent module, but MultiAgentEnvRunner "
                                         r"has the modules \['main'\]"):
        PPOLearner.from_sampler(tictactoe)
    for seeds in (2.5, ["a"], [1, True], None):
        with pytest.raises(TypeError, match="seeds must be a number of seeds"):
            learner.fused_train(sampler, 1, seeds=seeds)
    with pytest.raises(ValueError, match="at least one seed"):
        learner.fused_train(sampler, 1, seeds=[])
    too_many = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=1, num_minibatches=32))
    with pytest.raises(ValueError, match=r"num_minibatches \(32\) is larger than the batch "
                                         r"of 16 steps"):
        too_many.fused_train(sampler, 1)
    for target in (float("nan"), float("inf"), "475", True):
        with pytest.raises(ValueError, match="target_return must be a finite number"):
            learner.fused_train(sampler, 1, target_return=target)
    assert compile_counter.count == 0, compile_counter.messages
    run = learner.fused_train(sampler, 1, seeds=(1, np.int64(2)))
    assert run["seeds"] == [1, 2]
    assert run["metrics"]["num_env_steps_sampled_lifetime"].tolist() == [[16], [16]]


def test_fused_train_build__compiles_neither_module_init_until_their_params_are_read(
        compile_counter):
    """`make_sampler` + `PPOLearner.from_sampler` + `make_train` build a fused train
    without compiling the acting module's or the learner's init (the train initialises
    its own params inside its program): about 2 s of a fresh process's 6 s to the first
    update of a CartPole PPO on the 2-core CPU. Reading the runner's params or the
    learner's state builds them then, with the values of an early read."""
    def build():
        sampler = jaxrunner.make_sampler(make_config(num_envs=2, fragment=8, seed=4))
        learner = PPOLearner.from_sampler(sampler, PPOConfig(seed=4))
        return sampler, learner

    sampler, learner = build()
    learner.make_train(sampler, 2)
    # Neither is built yet (building either compiles its `jit(init)`).
    assert not [m for m in compile_counter.messages if m.startswith("Compiling jit(init)")]
    late = host_tree((learner.state, sampler.params))
    assert len([m for m in compile_counter.messages
                if m.startswith("Compiling jit(init)")]) == 2
    # An early read (as the runner-driven loop makes) gives the same values.
    early_sampler, early_learner = build()
    early = host_tree((early_learner.state, early_sampler.params))
    jax.tree.map(np.testing.assert_array_equal, late, early)
    # A runner built directly builds its params at construction (its first `sample()`
    # does not pay for them), with the same values.
    compile_counter.reset()
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=2, fragment=8, seed=4))
    assert len([m for m in compile_counter.messages
                if m.startswith("Compiling jit(init)")]) == 1
    jax.tree.map(np.testing.assert_array_equal,
                 host_tree(runner.get_state(components="rl_module")["rl_module"]), late[1])
    runner.stop()


def test_fused_train_build__folds_no_key_outside_a_program(monkeypatch):
    """Building a fused train computes no `jax.random.fold_in` eagerly (each eager one
    compiled a program of its own: 0.05-0.1 s of a fresh process): the init key is folded
    inside the init's program, and `sampler.default_key` when first read. Both keys are
    the ones a directly built runner uses."""
    eager, fold_in = [], jax.random.fold_in

    def recording(key, data):
        if not isinstance(key, jax.core.Tracer):
            eager.append(data)
        return fold_in(key, data)

    monkeypatch.setattr(jax.random, "fold_in", recording)
    config = make_config(num_envs=2, fragment=8, seed=4)
    sampler = jaxrunner.make_sampler(config)
    PPOLearner.from_sampler(sampler, PPOConfig(seed=4)).make_train(sampler, 2)
    assert eager == []
    monkeypatch.setattr(jax.random, "fold_in", fold_in)
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    base = jax.random.key(config.seed)  # a local runner's key: the config's seed
    np.testing.assert_array_equal(jax.random.key_data(sampler.default_key),
                                  jax.random.key_data(jax.random.fold_in(base, 2)))
    jax.tree.map(np.testing.assert_array_equal, host_tree(sampler.params), host_tree(
        runner.get_state(components="rl_module")["rl_module"]))
    runner.stop()


def test_runner__a_module_whose_init_needs_concrete_values_gets_the_same_key():
    """A module whose `init` reads a concrete value (Python control flow on an array) is
    initialised eagerly (`init_params`' fallback), from the same folded key as the one
    compiled init: its params are those of the default module of the same config."""
    from jaxrunner.modules.rl_module import DefaultMLPModule, RLModuleSpec

    class ConcreteInit(DefaultMLPModule):
        def init(self, key):
            if float(jnp.sum(jax.random.key_data(key))) < 0:  # never: a concrete read
                raise AssertionError
            return super().init(key)

    compiled = jaxrunner.SingleAgentEnvRunner(config=make_config(seed=4))
    config = make_config(seed=4)
    config.rl_module(rl_module_spec=RLModuleSpec(module_class=ConcreteInit))
    eager = jaxrunner.SingleAgentEnvRunner(config=config)
    # Eager and compiled initialisers agree to rounding; a different key would not.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 host_tree(eager.get_state(components="rl_module")["rl_module"]),
                 host_tree(compiled.get_state(components="rl_module")["rl_module"]))
    eager.stop()
    compiled.stop()


def test_learner__a_module_that_cannot_initialise_fails_at_construction():
    """The learner's state is built on first read, but its shapes are traced at
    construction: a module whose init raises fails there, not at the first update."""
    from jaxrunner.modules.rl_module import DefaultMLPModule, RLModuleSpec

    class BrokenInit(DefaultMLPModule):
        def init(self, key):
            raise ValueError("this module's init is broken")

    sampler = jaxrunner.make_sampler(make_config(num_envs=2, fragment=8))
    spec = RLModuleSpec(module_class=BrokenInit, observation_space=sampler.module
                        .observation_space, action_space=sampler.module.action_space,
                        model_config={"fcnet_hiddens": [8]}, inference_only=False)
    with pytest.raises(ValueError, match="init is broken"):
        PPOLearner(spec.build(), PPOConfig())


def test_deferred__builds_once_on_first_read_and_traces_shapes_at_once(compile_counter):
    """`rl_module.Deferred`: shapes at construction with nothing compiled, the value built
    on the first read only, a `build` that fails under tracing fails at construction, and
    one that needs concrete values is built at once."""
    from jaxrunner.modules.rl_module import Deferred

    calls = []

    def build(x):
        calls.append(x)
        return {"double": x * 2.0}

    x = jnp.ones(3)
    compile_counter.reset()
    held = Deferred(build, x)
    assert held.like["double"].shape == (3,) and not compile_counter.messages
    traced = len(calls)
    np.testing.assert_array_equal(held.value["double"], 2.0)
    np.testing.assert_array_equal(held.value["double"], 2.0)
    assert len(calls) == traced + 1  # built once, on the first read
    assert held.like is held.value

    def broken(x):
        raise ValueError("cannot build")

    with pytest.raises(ValueError, match="cannot build"):
        Deferred(broken, x)

    def concrete(x):
        return x + 1 if float(x[0]) > 0 else x  # Python control flow on a value

    eager = Deferred(concrete, x)
    np.testing.assert_array_equal(eager.like, 2.0)  # built at construction
    assert Deferred.built(5).value == 5
