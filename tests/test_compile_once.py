"""After the first call of a configuration, `sample(n)` for any `n` (and `get_metrics()`)
compiles nothing at all (DESIGN.md "Compilation").

Checked on one CartPole runner over many sizes, and on a small runner of every env id
jaxrunner ships (every gymnax id and every built-in registered name, as `jaxrunner envs`
lists them): an env whose reset state differs in type from its step state (a weakly typed
leaf, say) recompiles on the second `sample()`, and only a run of that env shows it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxrunner
from jaxrunner.envs import EnvContext, gymnax_env_ids, make_jax_env, registered_env_names
from jaxrunner.envs.multi_agent import MultiAgentEnv

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 3

# Every env id `jaxrunner envs` lists, less those that cannot be built on this machine
# (they download data when created; each raises the documented error, tested below).
# Registered names are split by the env each creator builds (creating one compiles nothing).
REGISTERED = {name: make_jax_env(name, EnvContext())[0] for name in registered_env_names()}
MULTI_AGENT_IDS = sorted(n for n, env in REGISTERED.items() if isinstance(env, MultiAgentEnv))
SINGLE_AGENT_IDS = gymnax_env_ids(runnable_only=True) + sorted(
    n for n, env in REGISTERED.items() if not isinstance(env, MultiAgentEnv))
DOWNLOADING_GYMNAX_IDS = sorted(set(gymnax_env_ids(runnable_only=False))
                                - set(gymnax_env_ids(runnable_only=True)))

# Small and short: 4 sub-envs, fragment 8, so most sizes below span several chunks.
ENV_NUM_ENVS = 4
ENV_FRAGMENT = 8
ENV_TIMESTEP_SIZES = (1, 3, 4, 7, 13, 40)


def test_compile_once__counter_sees_compilations(compile_counter):
    """The counter is live: a fresh jitted function compiles once, then never again."""
    fresh = jax.jit(lambda x: x * 3 + 1)
    fresh(jnp.arange(5))
    assert compile_counter.count >= 1
    compile_counter.reset()
    fresh(jnp.arange(5))
    assert compile_counter.count == 0


def _assert_compiles_only_at_first_calls(runner, compile_counter, *, label: str, num_envs: int,
                                         fragment: int, timestep_sizes, episode_sizes) -> None:
    """Samples `runner` (fresh) and asserts that only its first timestep-mode call and its
    first episode-mode call compile anything: every other size, the default size, zero,
    a switch back from episode to timestep mode and `get_metrics()` compile nothing.

    The first timestep call is followed directly by other timestep sizes, so an env whose
    carry changes type after one chunk (a weakly typed reset leaf) shows up here.
    """

    def assert_no_compiles(when: str) -> None:
        assert compile_counter.count == 0, (
            f"{label}: {compile_counter.count} compilation(s) {when}:\n"
            + "\n".join(compile_counter.messages))

    def timestep_calls(sizes) -> int:
        steps = 0
        for n in sizes:
            batch = runner.sample(num_timesteps=n)
            # Reading the host views is part of the normal use and must not compile either.
            assert sum(len(episode) for episode in batch) == batch.env_steps
            assert n <= batch.env_steps <= n + num_envs - 1
            steps += batch.num_vector_steps
        return steps

    runner.sample(num_timesteps=num_envs)
    runner.get_metrics()
    assert compile_counter.count > 0  # the first call compiled: the counter is listening
    compile_counter.reset()
    vector_steps = timestep_calls(timestep_sizes)
    assert_no_compiles("in timestep mode after the first sample()")

    first_episodes = runner.sample(num_episodes=1)  # episode mode's first call may compile
    assert len(first_episodes) == 1
    vector_steps += first_episodes.num_vector_steps
    compile_counter.reset()
    for k in episode_sizes:
        batch = runner.sample(num_episodes=k)
        assert len(batch) == k and all(episode.is_done for episode in batch)
        vector_steps += batch.num_vector_steps
    vector_steps += timestep_calls(timestep_sizes[:3])  # back to timestep mode
    default = runner.sample()  # the default size: rollout_fragment_length per sub-env
    assert default.num_vector_steps == fragment
    assert sum(len(episode) for episode in default) == fragment * num_envs
    vector_steps += default.num_vector_steps
    empty = runner.sample(num_timesteps=0)
    assert empty.env_steps == 0 and empty.num_vector_steps == 0
    metrics = runner.get_metrics()
    # Every step since the first call's get_metrics(): the default size and the steps of
    # episodes still running when an episode-mode call ended included.
    assert metrics["num_env_steps_sampled"] == vector_steps * num_envs
    assert_no_compiles("after the first timestep-mode and episode-mode calls")


def test_compile_once__any_n_after_warm_up(compile_counter):
    fragment = 8
    runner = jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=NUM_ENVS, fragment=fragment, max_chunk_length=4))
    _assert_compiles_only_at_first_calls(
        runner, compile_counter, label="CartPole-v1", num_envs=NUM_ENVS, fragment=fragment,
        timestep_sizes=(1, 2, 3, 4, 7, 12, 13, 25, 40, 61, 100), episode_sizes=(2, 3, 5, 8))


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS + MULTI_AGENT_IDS)
def test_compile_once__every_registered_env(env_id, compile_counter):
    """Every env `jaxrunner envs` lists, in the runner class its kind picks (a multi-agent
    env without `.multi_agent()` gets one `default_policy` module)."""
    config = make_config(env_id, num_envs=ENV_NUM_ENVS, fragment=ENV_FRAGMENT)
    runner = jaxrunner.runner_class_for(config)(config=config)
    expected = (jaxrunner.MultiAgentEnvRunner if env_id in MULTI_AGENT_IDS
                else jaxrunner.SingleAgentEnvRunner)
    assert type(runner) is expected
    try:
        _assert_compiles_only_at_first_calls(
            runner, compile_counter, label=env_id, num_envs=ENV_NUM_ENVS, fragment=ENV_FRAGMENT,
            timestep_sizes=ENV_TIMESTEP_SIZES, episode_sizes=(1, 2))
    finally:
        runner.stop()


@pytest.mark.parametrize("env_id", DOWNLOADING_GYMNAX_IDS)
def test_compile_once__env_that_downloads_data_is_a_clear_error(env_id, compile_counter):
    with pytest.raises(ValueError) as info:
        jaxrunner.SingleAgentEnvRunner(config=make_config(env_id, num_envs=ENV_NUM_ENVS))
    message = str(info.value)
    assert repr(env_id) in message and "download" in message
    assert "register_env" in message  # the way out: a creator that reads a local file
    assert compile_counter.count == 0, "the error should come before any compilation"
