"""A fresh runner's first `sample()` computes its first carry in a thread while it traces
and compiles the chunk (`CompiledRunner._init_beside_chunk_compile`): the same carry and
batches as computing the carry first, each program compiled once, errors raised in the
caller, and the serial path wherever the overlap does not apply."""

from __future__ import annotations

import gymnax
import pytest

import jaxrunner

from conftest import assert_trees_equal, host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def _serial(runner):
    """`runner` with the overlap switched off: the carry first, then the chunk."""
    runner._init_beside_chunk_compile = lambda fns: None
    return runner


def _carry_of(runner):
    return host_tree(runner.get_state(components=["env_runner_carry"])["env_runner_carry"])


def _batches(runner, calls=3):
    out = []
    for _ in range(calls):
        batch = runner.sample(num_timesteps=15)
        out.append((host_tree(batch.chunks), [(e.id_, e.t_started, len(e)) for e in batch]))
    return out


def _compiles_of(counter, name):
    return [m for m in counter.messages if m.startswith(f"Compiling jit({name})")]


def test_first_sample__same_batches_and_state_as_the_serial_path(compile_counter):
    config = make_config(num_envs=3, fragment=5, seed=7)
    overlapped = jaxrunner.SingleAgentEnvRunner(config=config)
    compile_counter.reset()
    first = overlapped.sample(num_timesteps=15)
    assert overlapped.sampler.jitted("explore").get("chunk_compiled")  # the overlap ran
    # The chunk and the carry's init each compiled once, the chunk before its first call.
    assert len(_compiles_of(compile_counter, "chunk")) == 1, compile_counter.messages
    assert len(_compiles_of(compile_counter, "init_carry")) == 1, compile_counter.messages
    compile_counter.reset()
    rest = _batches(overlapped, calls=2)
    assert compile_counter.count == 0, compile_counter.messages

    serial = _serial(jaxrunner.SingleAgentEnvRunner(config=config))
    expected = _batches(serial)
    assert not serial.sampler.jitted("explore").get("chunk_compiled")
    assert_trees_equal(expected[0][0], host_tree(first.chunks), "first batch")
    assert expected[0][1] == [(e.id_, e.t_started, len(e)) for e in first]
    for (want, want_eps), (got, got_eps) in zip(expected[1:], rest):
        assert_trees_equal(want, got, "later batch")
        assert want_eps == got_eps
    assert_trees_equal(_carry_of(serial),
                       _carry_of(overlapped), "carry")


def test_first_sample__random_actions_and_episodes_mode_match_the_serial_path():
    config = make_config(num_envs=2, fragment=6, seed=3)
    for kwargs in ({"random_actions": True, "num_timesteps": 12}, {"num_episodes": 3}):
        got = jaxrunner.SingleAgentEnvRunner(config=config).sample(**kwargs)
        want = _serial(jaxrunner.SingleAgentEnvRunner(config=config)).sample(**kwargs)
        assert_trees_equal(host_tree(want.chunks), host_tree(got.chunks), str(kwargs))


class _BreakableReset(gymnax.environments.environment.Environment):
    """CartPole whose reset raises while it is traced once `broken` is set (after the
    runner checked the env at construction)."""

    def __init__(self):
        super().__init__()
        self._inner, _ = gymnax.make("CartPole-v1")
        self.broken = False

    @property
    def default_params(self):
        return self._inner.default_params

    def reset(self, key, params=None):
        if self.broken:
            raise ValueError("reset is broken on purpose")
        return self._inner.reset(key, params)

    def step(self, key, state, action, params=None):
        return self._inner.step(key, state, action, params)

    def observation_space(self, params):
        return self._inner.observation_space(params)

    def action_space(self, params):
        return self._inner.action_space(params)


def test_first_sample__an_init_error_reaches_the_caller_and_the_runner_recovers():
    env = _BreakableReset()
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(env=lambda ctx: env))
    env.broken = True
    with pytest.raises(ValueError, match="reset is broken on purpose"):
        runner.sample()
    env.broken = False  # after the error the runner works once its env does: from a
    got = runner.sample(num_timesteps=4)  # fresh carry, as a runner that never failed
    want = jaxrunner.SingleAgentEnvRunner(config=make_config(env=lambda ctx: env)).sample(
        num_timesteps=4)
    assert_trees_equal(host_tree(want.chunks), host_tree(got.chunks), "batch after the error")


def test_first_sample__overlap_skipped_once_a_carry_exists():
    """A runner given a carry by `set_state` samples on from it (no fresh init)."""
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=2, fragment=4))
    source = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=2, fragment=4))
    source.sample()
    runner.set_state(source.get_state(components="all"))
    calls = []
    original = runner._init_beside_chunk_compile
    runner._init_beside_chunk_compile = lambda fns: calls.append(original(fns))
    got = runner.sample(num_timesteps=6)
    want = source.sample(num_timesteps=6)
    assert calls == [None]
    assert not runner.sampler.jitted("explore").get("chunk_compiled")
    assert_trees_equal(host_tree(want.chunks), host_tree(got.chunks), "batch after set_state")
    assert_trees_equal(_carry_of(source), _carry_of(runner), "carry")
