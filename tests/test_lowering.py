"""The unrolled Threefry-2x32 lowering (`jaxrunner.lowering`): the same random bits as
JAX's default lowering, no loop in the compiled program, JAX's own lowering back outside
the context, and jaxrunner's programs compiled with it."""

from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

import jaxrunner
from jaxrunner import lowering

from conftest import host_tree

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="the lowering differs from JAX's on CPU only")


def _random_program():
    """A fresh function (so no earlier lowering of it is cached) drawing from most of
    `jax.random`: splits, fold-ins, uniform/normal/integer draws, categorical, a
    permutation, vmapped over keys and not."""
    def draws(key):
        k1, k2 = jax.random.split(key)
        keys = jax.random.split(k2, 7)
        return (jax.random.key_data(keys), jax.random.uniform(k1, (3, 5)),
                jax.random.normal(k2, (4,)),
                jax.vmap(lambda k: jax.random.categorical(k, jnp.arange(3.0)))(keys),
                jax.random.key_data(jax.random.fold_in(key, 7)),
                jax.random.bits(k1, (9,), jnp.uint8), jax.random.permutation(k1, 10),
                jax.random.randint(k2, (2, 2), 0, 100),
                jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys))
    return draws


def _threefry_loops(compiled_text: str) -> list[str]:
    return [name for name in re.findall(r'while\(.*?op_name="([^"]*)"', compiled_text)
            if "threefry" in name or "_uniform" in name or "_gumbel" in name
            or "_normal" in name]


# Tests of the unrolled lowering itself: with a jaxlib newer than the releases it was
# checked with it is off by design (see `jaxrunner.lowering`), and these do not apply.
# The CI's jaxlib (0.10) runs them; `test_unrolled_hash__only_with_the_jaxlib_releases_it_
# was_checked_with` pins which jaxlib gets which.
needs_unrolled = pytest.mark.skipif(
    not lowering.UNROLLED_THREEFRY_AVAILABLE,
    reason="this jaxlib keeps JAX's own Threefry lowering (jaxrunner.lowering)")


def test_unrolled_hash__equals_jax_threefry_2x32_on_random_words():
    words = np.random.default_rng(0).integers(0, 2**32, size=(6, 33), dtype=np.uint32)
    key = jnp.asarray(words[:2, 0])
    expected = threefry_2x32(key, jnp.asarray(words[2:4].reshape(-1)))
    got = jnp.concatenate(lowering.threefry2x32_unrolled(
        key[0], key[1], jnp.asarray(words[2]), jnp.asarray(words[3])))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    # Broadcast key words (one per count) as the batched primitive passes them.
    got = lowering.threefry2x32_unrolled(*(jnp.asarray(w) for w in words[:4]))
    for i in range(words.shape[1]):
        one = threefry_2x32(jnp.asarray(words[:2, i]), jnp.asarray(words[2:4, i]))
        np.testing.assert_array_equal(np.asarray([got[0][i], got[1][i]]), np.asarray(one))


@needs_unrolled
def test_jit__same_random_values_as_jax_default_without_a_loop():
    unrolled, default = lowering.jit(_random_program()), jax.jit(_random_program())
    key = jax.random.key(0)
    assert _threefry_loops(unrolled.lower(key).compile().as_text()) == []
    assert _threefry_loops(default.lower(key).compile().as_text())  # JAX's own: loops
    for seed in range(8):
        key = jax.random.key(seed)
        for got, want in zip(unrolled(key), default(key)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@needs_unrolled
def test_jit_trace__lowers_with_the_unrolled_hash_too():
    """`lowering.jit(f).trace(x).lower()` (JAX's staged API) gets the unrolled lowering
    as `lower` does, not JAX's own, though the lowering happens after `trace` returns."""
    unrolled = lowering.jit(_random_program())
    key = jax.random.key(0)
    traced = unrolled.trace(key)
    assert traced.jaxpr is not None  # the traced program's own attributes
    assert _threefry_loops(traced.lower().compile().as_text()) == []
    assert _threefry_loops(jax.jit(_random_program()).trace(key).lower().compile()
                           .as_text())  # JAX's own: loops


@needs_unrolled
def test_context__restores_jax_lowering_after_nesting_errors_and_threads():
    with lowering.unrolled_threefry():
        with lowering.unrolled_threefry():
            pass
        inner = jax.jit(_random_program()).lower(jax.random.key(0)).compile().as_text()
        assert _threefry_loops(inner) == []  # still inside the outer context
    with pytest.raises(ZeroDivisionError):
        with lowering.unrolled_threefry():
            1 / 0

    def enter_and_leave():
        for _ in range(50):
            with lowering.unrolled_threefry():
                pass

    threads = [threading.Thread(target=enter_and_leave) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = jax.jit(_random_program()).lower(jax.random.key(0)).compile().as_text()
    assert _threefry_loops(after), "JAX's default lowering was not restored"


@needs_unrolled
def test_runner_programs__compiled_with_the_unrolled_hash():
    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8)
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    runner.sample()
    fns = runner.sampler.jitted("explore")
    assert isinstance(fns["chunk"], lowering.UnrolledRngJit)
    lowered = fns["chunk"].lower(runner._carry, runner._lookback, runner._params,
                                 runner.env_params, np.int32(8), np.int32(1), np.int32(1),
                                 np.int32(0))
    assert _threefry_loops(lowered.compile().as_text()) == []


def _single_agent_config():
    return jaxrunner.RunnerConfig().environment("CartPole-v1")


def _multi_agent_config():
    return (jaxrunner.RunnerConfig()
            .environment("MultiAgentCartPole-v1", env_config={"num_agents": 2})
            .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda agent_id, episode: (
                "p0" if agent_id == "agent_0" else "p1")))


@pytest.mark.parametrize("base_config", [_single_agent_config, _multi_agent_config],
                         ids=["single_agent", "multi_agent"])
def test_large_rollouts__compile_with_jax_own_lowering(base_config, monkeypatch):
    """Above `UNROLL_MAX_ENVS` sub-envs (the largest size measured faster unrolled) plain
    jit, for single- and multi-agent samplers alike; the limit is lowered here so that
    both sides stay small."""
    monkeypatch.setattr(lowering, "UNROLL_MAX_ENVS", 8)

    def sampler_of(num_envs):
        return jaxrunner.make_sampler(
            base_config()
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=4)
            .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))

    small, large = sampler_of(lowering.UNROLL_MAX_ENVS), sampler_of(lowering.UNROLL_MAX_ENVS + 1)
    assert small.multi_agent == (base_config is _multi_agent_config)
    assert small.unrolled_rng and not large.unrolled_rng
    assert isinstance(small.jitted("random")["chunk"], lowering.UnrolledRngJit)
    assert not isinstance(large.jitted("random")["chunk"], lowering.UnrolledRngJit)


@needs_unrolled
def test_one_key_over_many_counts__keeps_jax_loop_and_values():
    """The split of one key into many keys stays JAX's loop (unrolled, XLA recomputes it
    in every per-key hash consuming its keys); short splits and per-key draws unroll."""
    many = lowering.ROLLED_ONE_KEY_MIN_COUNTS

    def splits(key):
        keys = jax.random.split(key, many)  # one key, `many` counts: a loop
        draws = jax.vmap(lambda k: jax.random.uniform(k, (4,)))(keys)  # per key: unrolled
        return jax.random.key_data(keys), draws, jax.random.key_data(
            jax.random.split(key, many - 1))  # below the limit: unrolled

    loops = _threefry_loops(lowering.jit(splits).lower(jax.random.key(0)).compile()
                            .as_text())
    assert len(loops) == 1 and "split" in loops[0], loops
    for got, want in zip(lowering.jit(splits)(jax.random.key(3)),
                         jax.jit(splits)(jax.random.key(3))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_unrolled_hash__only_with_the_jaxlib_releases_it_was_checked_with():
    """jaxlib 0.11's XLA:CPU did not finish compiling the unrolled hash (see the
    `jaxrunner.lowering` docstring): newer releases keep JAX's own lowering."""
    import jaxlib.version

    assert lowering.unrolled_threefry_supported("0.10.2")
    assert lowering.unrolled_threefry_supported("0.6.0")
    assert not lowering.unrolled_threefry_supported("0.11.2")
    assert not lowering.unrolled_threefry_supported("1.0.0")
    assert lowering.UNROLLED_THREEFRY_AVAILABLE == lowering.unrolled_threefry_supported(
        jaxlib.version.__version__)


def test_unroll_for_training__several_seeds_of_few_sub_envs_only():
    assert not lowering.unroll_for_training(16, 1)  # one seed: JAX's lowering compiles faster
    assert lowering.unroll_for_training(16, lowering.FUSED_UNROLL_MIN_SEEDS)
    assert lowering.unroll_for_training(16, 8)
    assert not lowering.unroll_for_training(lowering.UNROLL_MAX_ENVS, 2)  # too many in all
    assert lowering.choose_unrolled("auto", True) and not lowering.choose_unrolled("auto",
                                                                                  False)
    assert lowering.choose_unrolled("unrolled", False)
    assert not lowering.choose_unrolled("jax", True)
    with pytest.raises(ValueError, match="'jax' keeps JAX's own lowering"):
        lowering.choose_unrolled("default", True)


@pytest.mark.default_codegen
@needs_unrolled
def test_separate_resets__only_in_programs_lowered_with_the_unrolled_hash():
    """CartPole's resets are drawn in a branch of their own (`separate_reset`) where the
    chunk is lowered with the unrolled hash (the runner's programs); traced with JAX's
    lowering (a fused one-seed training loop) the same chunk has no such branch, and both
    give the same steps."""
    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8)
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    runner.sample()
    args = (runner._carry, runner._lookback, runner._params, runner.env_params, np.int32(8),
            np.int32(1 << 30), np.int32(1 << 30), np.int32(0))
    unrolled = runner.sampler.jitted("explore")["chunk"]
    chunk = runner.sampler.chunk_fns("explore").chunk
    default = jax.jit(lambda *a: chunk(*a))  # a new function: JAX's trace cache is per function
    assert not lowering.unrolled_threefry_active()
    with lowering.unrolled_threefry():
        assert lowering.unrolled_threefry_active() == lowering.UNROLLED_THREEFRY_AVAILABLE
    counts = [text.count(" conditional(") for text in (
        unrolled.lower(*args).compile().as_text(), default.lower(*args).compile().as_text())]
    assert counts[0] == counts[1] + 1, counts
    want = jax.device_get(host_tree(default(*args)))
    got = unrolled(*args)  # the runner's chunk takes its carry's buffers: after `default`
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 host_tree(got[2]), want[2])
    runner.stop()
