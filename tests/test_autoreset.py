"""Auto-reset strategies give the same episode semantics: "gymnax" (reset every step,
select) and "partial" (a few resets per step, fallback to all when many episodes end)."""

import functools

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.testing.envs import FlakyEnv


def _runner(mode, num_envs=64, ratio=16, seed=0):
    config = (jr.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=100,
                           autoreset_mode=mode, partial_reset_ratio=ratio)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .debugging(seed=seed))
    return jr.SingleAgentEnvRunner(config=config)


def _episodes(runner, calls=4):
    out = []
    for _ in range(calls):
        out.extend(runner.sample(random_actions=True))
    return out


@pytest.mark.parametrize("ratio", [16, 64])  # 64: R = 1 reset per step, fallback often
def test_partial__episodes_valid_and_every_start_state_fresh(ratio):
    episodes = _episodes(_runner("partial", ratio=ratio))
    starts = [e.observations[0] for e in episodes if e.t_started == 0]
    assert len(starts) > 200
    assert len({s.tobytes() for s in starts}) == len(starts), "two episodes share a start"
    for episode in episodes:
        episode.validate()
        assert episode.get_return() == len(episode)  # CartPole: reward 1 per step
        assert np.all(np.abs(episode.observations[0]) <= 0.05 + 1e-6) or episode.t_started > 0


def test_partial__same_episode_statistics_as_gymnax():
    lengths = {}
    for mode in ("gymnax", "partial"):
        runner = _runner(mode, num_envs=256)
        for _ in range(4):
            runner.sample(random_actions=True)
        metrics = runner.get_metrics()
        lengths[mode] = (metrics["episode_len_mean"], metrics["num_episodes"])
    (gymnax_len, n1), (partial_len, n2) = lengths["gymnax"], lengths["partial"]
    assert n1 > 3000 and n2 > 3000
    # Random-action CartPole episodes last about 22 steps; the sampling error of the mean
    # over the last 100 episodes is about 1.2 steps.
    assert abs(gymnax_len - partial_len) < 6.0


def test_partial__deterministic_for_a_seed():
    a = jax.device_get(_runner("partial").sample(random_actions=True).trajectory())
    b = jax.device_get(_runner("partial").sample(random_actions=True).trajectory())
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.terminated, b.terminated)


def test_partial__env_with_own_step_is_a_clear_error():
    inner, _ = gymnax.make("CartPole-v1")
    config = (jr.RunnerConfig().environment(FlakyEnv(inner))
              .env_runners(autoreset_mode="partial"))
    with pytest.raises(ValueError, match="autoreset_mode='gymnax'"):
        jr.SingleAgentEnvRunner(config=config)


def test_autoreset_mode__validated_in_config():
    with pytest.raises(ValueError, match="autoreset_mode"):
        jr.RunnerConfig().env_runners(autoreset_mode="cheap")


def _multi_agent_runner(mode, num_envs=64, ratio=16):
    config = (jr.RunnerConfig().environment("MultiAgentCartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=100,
                           autoreset_mode=mode, partial_reset_ratio=ratio)
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda a, e: "p0" if a == "agent_0" else "p1")
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .debugging(seed=0))
    return jr.MultiAgentEnvRunner(config=config)


@pytest.mark.parametrize("ratio", [16, 64])
def test_partial__multi_agent_episodes_valid_and_every_start_state_fresh(ratio):
    """The same auto-reset module serves the multi-agent layout (its env's step_env)."""
    runner = _multi_agent_runner("partial", ratio=ratio)
    episodes = []
    for _ in range(3):
        episodes.extend(runner.sample(random_actions=True))
    starts = [np.concatenate([np.asarray(e.agent_episodes[a].observations[0])
                              for a in ("agent_0", "agent_1")])
              for e in episodes if e.env_t_started == 0]
    assert len(starts) > 100
    assert len({s.tobytes() for s in starts}) == len(starts), "two episodes share a start"
    for episode in episodes:
        episode.validate()
        if episode.env_t_started == 0:
            for agent in episode.agent_episodes.values():
                assert np.all(np.abs(np.asarray(agent.observations[0])) <= 0.05 + 1e-6)


def test_partial__multi_agent_same_episode_statistics_as_gymnax():
    lengths = {}
    for mode in ("gymnax", "partial"):
        runner = _multi_agent_runner(mode, num_envs=128)
        for _ in range(3):
            runner.sample(random_actions=True)
        metrics = runner.get_metrics()
        lengths[mode] = (metrics["episode_len_mean"], metrics["num_episodes"])
    (gymnax_len, n1), (partial_len, n2) = lengths["gymnax"], lengths["partial"]
    assert n1 > 800 and n2 > 800
    # An episode lasts until both random-action poles fell (about 30 steps); the mean over
    # the last 100 episodes has a sampling error of about 1.5 steps.
    assert abs(gymnax_len - partial_len) < 7.5


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"])
def test_auto_step_with_keys__is_gymnax_step_with_the_keys_it_splits(env_id):
    """The chunk steps a gymnax env with both of its keys from its own split: every output
    equals gymnax's `step(key)` with `(step key, reset key) = split(key)`, at steps that
    end an episode and at steps that do not."""
    from jaxrunner.core.autoreset import gymnax_step_fns

    env, params = gymnax.make(env_id)
    with_keys = gymnax_step_fns(env).auto_step_with_keys
    assert with_keys is not None
    space = env.action_space(params)
    key = jax.random.key(0)
    _, state = env.reset(key, params)
    ends = 0
    # Op by op (no jit): two compiled programs may round a fused float op differently.
    with jax.disable_jit():
        for _ in range(240):
            key, step_key, action_key = jax.random.split(key, 3)
            action = space.sample(action_key)
            expected = env.step(step_key, state, action, params)
            got = with_keys(*jax.random.split(step_key), state, action, params)
            assert jax.tree.structure(got) == jax.tree.structure(expected)
            jax.tree.map(np.testing.assert_array_equal, got, expected)
            state = expected[1]
            ends += int(expected[3] | expected[4])
            if ends and not (expected[3] | expected[4]):  # a step after an end: done
                break
    assert ends >= 1, "the test needs an episode end"


def test_auto_step_with_keys__only_for_envs_that_keep_the_base_step():
    """An env that overrides `step` keeps its own step (one key per sub-env); jaxrunner's
    multi-agent envs are stepped with their keys given, gymnax envs too."""
    from gymnax.environments.classic_control.cartpole import CartPole

    from jaxrunner.core.autoreset import gymnax_step_fns, make_env_step
    from jaxrunner.core.multi_agent_rollout import multi_agent_step_fns
    from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole

    class OwnStep(CartPole):
        def step(self, key, state, action, params=None):
            return super().step(key, state, action, params)

    assert gymnax_step_fns(OwnStep()).auto_step_with_keys is None
    assert make_env_step(gymnax_step_fns(OwnStep()), 8, "gymnax", 16).num_keys == 8
    assert make_env_step(gymnax_step_fns(CartPole()), 8, "gymnax", 16).num_keys == 16
    assert make_env_step(gymnax_step_fns(CartPole()), 32, "partial", 16).num_keys == 32 + 2 + 1
    assert multi_agent_step_fns(MultiAgentCartPole()).auto_step_with_keys is not None


def test_step_reads_key__deterministic_steps_get_no_step_keys():
    """An env whose step without reset never reads its key (CartPole, the multi-agent
    CartPole) is given no per-sub-env step keys: "gymnax" draws only the `B` reset keys,
    "partial" only the `R + 1`; an env whose step reads its key (Acrobot's torque noise,
    Catch's ball) keeps them. The schedule itself is pinned by test_reference_loop."""
    from jaxrunner.core.autoreset import gymnax_step_fns, make_env_step, step_reads_key
    from jaxrunner.core.multi_agent_rollout import multi_agent_step_fns
    from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole

    key = jax.random.key(0)

    def reads(fns, env, params, actions):
        _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, 4), params)
        return step_reads_key(fns, key, states, actions, params)

    for env_id, expected in (("CartPole-v1", False), ("Acrobot-v1", True),
                             ("Catch-bsuite", True)):
        env, params = gymnax.make(env_id)
        actions = jnp.zeros((4,), jnp.int32)
        assert reads(gymnax_step_fns(env), env, params, actions) is expected, env_id
    ma_env = MultiAgentCartPole()
    ma_actions = {a: jnp.zeros((4,), jnp.int32) for a in ma_env.agents}
    assert not reads(multi_agent_step_fns(ma_env), ma_env, ma_env.default_params, ma_actions)
    cartpole = gymnax_step_fns(gymnax.make("CartPole-v1")[0])
    assert make_env_step(cartpole, 8, "gymnax", 16, step_keys=False).num_keys == 8
    assert make_env_step(cartpole, 32, "partial", 16, step_keys=False).num_keys == 2 + 1


def _random_splits(jaxpr) -> int:
    """`random_split` equations in a jaxpr and every jaxpr nested in its equations."""
    from jax.extend import core as jcore

    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == "random_split"
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(inner, jcore.ClosedJaxpr):
                    total += _random_splits(inner.jaxpr)
                elif isinstance(inner, jcore.Jaxpr):
                    total += _random_splits(inner)
    return total


def test_chunk__gymnax_step_splits_no_key_of_its_own():
    """The compiled sample of a base-step gymnax env traces one key split fewer than the
    same env behind an overridden `step` (which splits its key per sub-env itself): the
    chunk gives the step and reset keys from its own split."""
    from gymnax.environments.classic_control.cartpole import CartPole

    class OwnStep(CartPole):
        def step(self, key, state, action, params=None):
            return super().step(key, state, action, params)

    def splits(env):
        sampler = jr.make_sampler(jr.RunnerConfig().environment(env).env_runners(
            num_envs_per_env_runner=4, rollout_fragment_length=8))
        state = jax.eval_shape(sampler.init, sampler.default_key)
        return _random_splits(jax.make_jaxpr(sampler.sample)(state, sampler.params).jaxpr)

    assert splits(OwnStep()) == splits(CartPole()) + 1


@pytest.mark.default_codegen
@pytest.mark.parametrize("separated", ["separate_resets", "separate_outputs",
                                       "separate_draws"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"])
def test_separate__same_steps_and_the_separated_part_in_its_own_kernel(env_id, separated):
    """With `separate_resets` every sub-env's reset is drawn in a kernel of its own, with
    `separate_outputs` the observation, reward and flags of its step are computed in one
    (a conditional in the compiled CPU program), with `separate_draws` (beside
    `separate_resets`) so are the reset's random draws (more conditionals), and the
    vector step gives the same observations, states, rewards and flags bit for bit, over
    steps that end episodes."""
    from jaxrunner import lowering
    from jaxrunner.core.autoreset import gymnax_step_fns, make_env_step

    env, params = gymnax.make(env_id)
    fns = gymnax_step_fns(env)
    assert fns.takes_reset_gate and fns.takes_outputs_gate
    num_envs, space = 32, env.action_space(params)
    from jaxrunner.core.autoreset import STEP_OUTPUTS

    separating = {"separate_resets": True, "separate_outputs": STEP_OUTPUTS,
                  "separate_draws": True}[separated]
    base = {"separate_resets": True} if separated == "separate_draws" else {}
    steps = {flag: make_env_step(fns, num_envs, "gymnax", 1, **base,
                                 **{separated: separating if flag else type(separating)()})
             for flag in (False, True)}

    def rollout(step, key, states):
        def body(states, key):
            key_act, key_step = jax.random.split(key)
            actions = jax.vmap(space.sample)(jax.random.split(key_act, num_envs))
            keys = jax.random.split(key_step, step.num_keys)
            obs, states, reward, terminated, truncated, info = step.step(keys, states,
                                                                         actions, params)
            return states, (obs, reward, terminated, truncated, info["final_observation"])
        return jax.lax.scan(body, states, jax.random.split(key, 300))

    _, states = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), num_envs), params)
    results, programs = {}, {}
    for flag, step in steps.items():
        jitted = lowering.jit(functools.partial(rollout, step), unrolled=True)
        programs[flag] = jitted.lower(jax.random.key(2), states).compile().as_text()
        results[flag] = jitted(jax.random.key(2), states)
    conditionals = {flag: program.count("conditional(") for flag, program in programs.items()}
    assert conditionals[True] > conditionals[False] == (1 if base else 0)
    jax.tree.map(np.testing.assert_array_equal, results[True], results[False])
    terminated, truncated = results[True][1][2], results[True][1][3]
    assert int(jnp.sum(terminated | truncated)) >= num_envs, "the test needs episode ends"


@pytest.mark.parametrize("env_id, separated", [
    ("Pendulum-v1", ("obs",)), ("Acrobot-v1", ("obs", "reward", "terminated")),
    ("CartPole-v1", ()), ("MountainCar-v0", ()), ("Breakout-MinAtar", ())])
def test_step_outputs_to_separate__those_needing_a_transcendental_beyond_the_state(
        env_id, separated):
    """The default computes a step's output apart where it needs a transcendental function
    that the next state does not (Pendulum's observation, Acrobot's observation, reward
    and termination: cos/sin of the new angles); not where it is the state's fields and
    compares (CartPole, MountainCar) or a grid of compares and scatters
    (Breakout-MinAtar)."""
    from jaxrunner.core.autoreset import (gymnax_step_fns, outputs_work,
                                          step_outputs_to_separate)
    from jaxrunner.core.dependence import primitives_only_for

    env, params = gymnax.make(env_id)
    key = jax.random.key(0)
    _, state = env.reset_env(key, params)
    action = env.action_space(params).sample(key)
    batched = lambda tree: jax.tree.map(lambda x: jnp.asarray(x)[None], tree)  # noqa: E731
    fns = gymnax_step_fns(env)
    args = (fns, key, batched(state), batched(action), params)
    assert step_outputs_to_separate(*args) == separated
    work = outputs_work(*args)
    assert ({"sin", "cos"} <= work["obs"]) is ("obs" in separated)
    everything = primitives_only_for(fns.step_no_reset, lambda out: out[0], lambda out: (),
                                     key, state, action, params)
    assert work["obs"] < everything  # the next state's own work is left out


def test_make_env_step__unknown_output_names_are_a_clear_error():
    from jaxrunner.core.autoreset import gymnax_step_fns, make_env_step

    env, _ = gymnax.make("Pendulum-v1")
    with pytest.raises(ValueError, match="separate_outputs takes names of"):
        make_env_step(gymnax_step_fns(env), 4, "gymnax", 1, separate_outputs=("obs", "obz"))


def test_primitives_only_for__nested_jaxprs_and_untraceable_functions():
    """Primitives inside a nested jit count; work shared with the other outputs does not;
    a function that cannot be traced alone gives None."""
    from jaxrunner.core.dependence import primitives_only_for

    def fn(x):
        shared = x * 2.0
        return jax.jit(jnp.exp)(shared), shared + 1.0

    only_first = primitives_only_for(fn, lambda out: out[0], lambda out: out[1], jnp.ones(3))
    assert "exp" in only_first and "mul" not in only_first
    assert "add" in primitives_only_for(fn, lambda out: out[1], lambda out: out[0],
                                        jnp.ones(3))
    assert primitives_only_for(lambda x: float(x), lambda out: out, lambda out: (),
                               jnp.ones(())) is None


@pytest.mark.parametrize("env_id, keyed_leaves, separated", [
    ("CartPole-v1", 5, True), ("Acrobot-v1", 5, True), ("Breakout-MinAtar", 4, False),
    ("Pendulum-v1", 3, False), ("Asterix-MinAtar", 0, False)])
def test_reset_spreads_its_draw__few_bytes_in_many_keyed_leaves(env_id, keyed_leaves,
                                                                 separated):
    """The default separates a reset where at least 4 of its output leaves read its key
    and they hold at most 256 bytes (CartPole: the observation and 4 state fields, 32
    bytes; Breakout-MinAtar's 4 include a 1,600-byte observation; Asterix's reset reads no
    key)."""
    from jaxrunner.core.autoreset import gymnax_step_fns, reset_spreads_its_draw
    from jaxrunner.core.dependence import outputs_reading_first

    env, params = gymnax.make(env_id)
    key = jax.random.key(0)
    assert len(outputs_reading_first(env.reset_env, key, params)) == keyed_leaves
    assert reset_spreads_its_draw(gymnax_step_fns(env), key, params) is separated


def test_reset_spreads_its_draw__a_reset_that_keeps_a_key_in_its_state():
    """Suite envs (Navix, Jumanji, Craftax, ...) keep a typed key in their state: it is
    counted as one keyed leaf of 8 bytes, without an error."""
    from jaxrunner.core.autoreset import EnvStepFns, reset_spreads_its_draw

    def reset(key, params):
        key, draw = jax.random.split(key)
        x = jax.random.uniform(draw, (2,))
        return x, {"key": key, "x0": x[0], "x1": x[1]}

    fns = EnvStepFns(auto_step=None, reset=reset, step_no_reset=None, episode_done=None)
    assert reset_spreads_its_draw(fns, jax.random.key(0), None) is True
    assert reset_spreads_its_draw(fns._replace(reset=lambda k, p: reset(k, p)[:1] + (
        {"key": reset(k, p)[1]["key"]},)), jax.random.key(0), None) is False


@pytest.mark.default_codegen
def test_runner__separates_pendulums_step_outputs_by_default_with_the_same_episodes():
    """The runner's default ("auto") computes Pendulum's step observation, reward and
    flags apart (one more conditional in its compiled chunk than with
    `SEPARATE_STEP_OUTPUTS = False`, as many as with True) and all three runners sample
    the same episodes bit for bit, final observations of the 200-step episodes included."""
    from conftest import host_tree, make_config
    from test_sampler import WALL_CLOCK

    from jaxrunner.benchmarking import switched
    from jaxrunner.core import chunk

    results, conditionals = {}, {}
    for flag in (False, True, "auto"):
        with switched(chunk, "SEPARATE_STEP_OUTPUTS", flag):
            runner = jr.SingleAgentEnvRunner(config=make_config("Pendulum-v1", num_envs=4,
                                                                fragment=120))
            episodes = [e for _ in range(2) for e in runner.sample()]
        args = (runner._carry, runner._lookback, runner._params, runner.env_params,
                np.int32(8), np.int32(1 << 30), np.int32(1 << 30), np.int32(0))
        program = runner.sampler.jitted("explore")["chunk"].lower(*args).compile().as_text()
        conditionals[flag] = program.count(" conditional(")
        metrics = {k: v for k, v in runner.get_metrics().items() if k not in WALL_CLOCK}
        results[flag] = ([(e.id_, e.get_observations(), e.get_actions(), e.get_rewards(),
                           e.is_terminated, e.is_truncated) for e in episodes],
                         metrics, host_tree(runner._carry))
        runner.stop()
    assert conditionals[True] == conditionals["auto"] == conditionals[False] + 1, conditionals
    assert any(r[5] for r in results[False][0]), "the test needs a truncated episode"
    for flag in (True, "auto"):
        for want, got in zip(results[False][0], results[flag][0]):
            assert want[0] == got[0] and want[4:] == got[4:]
            for a, b in zip(want[1:4], got[1:4]):
                np.testing.assert_array_equal(a, b)
        assert results[flag][1] == results[False][1]
        jax.tree.map(np.testing.assert_array_equal, results[flag][2], results[False][2])


def test_separate_draws__same_values_each_draw_in_a_conditional_also_in_nested_jits():
    """`separate_draws` keeps a function's values bit for bit (under `vmap`, with draws in
    nested jits, splits and folds, and a `lax.cond` it leaves as it is) and puts the output
    of every hash it computes through a conditional of the compiled CPU program."""
    from jaxrunner import lowering
    from jaxrunner.core.autoreset import always_true, separate_draws

    @jax.jit
    def inner(key):
        return jax.random.normal(jax.random.fold_in(key, 7), (3,))

    def reset(key, scale):
        first, second = jax.random.split(key)
        noise = inner(second)
        pick = jax.lax.cond(scale > 0, lambda x: x * scale, lambda x: -x, noise)
        return {"uniform": jax.random.uniform(first, (4,)) * scale, "normal": pick,
                "count": jnp.int32(3)}

    keys = jax.random.split(jax.random.key(5), 64)

    def run(separate, keys, scale):
        gate = always_true(keys[0])
        fn = separate_draws(reset, gate) if separate else reset
        return jax.vmap(fn, in_axes=(0, None))(keys, scale)

    results, programs = {}, {}
    for flag in (False, True):
        jitted = lowering.jit(functools.partial(run, flag), unrolled=True)
        programs[flag] = jitted.lower(keys, 2.0).compile().as_text()
        results[flag] = jitted(keys, 2.0)
    jax.tree.map(np.testing.assert_array_equal, results[True], results[False])
    assert results[True]["count"].dtype == jnp.int32
    # The split, the fold and the two draws: four conditionals more than the user's own.
    assert (programs[True].count("conditional(") - programs[False].count("conditional(")
            == 4)


@pytest.mark.parametrize("env_id, num_envs, expected", [
    ("CartPole-v1", 16, False), ("CartPole-v1", 2048, True), ("Pendulum-v1", 2048, False)])
def test_chunk__separates_reset_draws_from_the_size_on_where_the_reset_is_separated(
        monkeypatch, env_id, num_envs, expected):
    """The chunk draws a separated reset's random bits apart from
    `SEPARATE_DRAWS_MIN_ENVS` sub-envs on (`chunk.SEPARATE_RESET_DRAWS = "auto"`), and
    only where the reset itself is separated (CartPole's, not Pendulum's)."""
    import jaxrunner
    from jaxrunner import lowering
    from jaxrunner.core import chunk

    seen = []
    original = chunk.make_env_step

    def recording(*args, **kwargs):
        if lowering.unrolled_threefry_active():  # where resets are separated at all
            seen.append(kwargs["separate_resets"] and kwargs["separate_draws"])
        return original(*args, **kwargs)

    monkeypatch.setattr(chunk, "make_env_step", recording)
    sampler = jaxrunner.make_sampler(jaxrunner.RunnerConfig().environment(env_id).env_runners(
        num_envs_per_env_runner=num_envs, rollout_fragment_length=4))
    state = jax.eval_shape(sampler.init, sampler.default_key)
    with lowering.unrolled_threefry():
        jax.eval_shape(sampler.sample, state, sampler.params)
    assert seen == [expected]
