"""After the first call of a configuration, `sample(n)` for any `n` (and `get_metrics()`)
compiles nothing at all (DESIGN.md "Compilation"), and every env jaxrunner ships samples
valid episodes.

Checked on one CartPole runner over many sizes, and on a small runner of every env id
jaxrunner ships (every gymnax id and every built-in registered name, as `jaxrunner envs`
lists them): an env whose reset state differs in type from its step state (a weakly typed
leaf, say) recompiles on the second `sample()`, and only a run of that env shows it. The
same runs are the smoke matrix of every env: each batch's episodes are valid, their
observations and actions lie in the runner's spaces, cut episodes continue, and the actions
a Box-action env receives lie inside its bounds (one runner per env serves both checks).
"""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import environment as gymnax_environment
from gymnax.environments import spaces as gymnax_spaces

import jaxrunner
from jaxrunner.envs import EnvContext, gymnax_env_ids, make_jax_env, registered_env_names
from jaxrunner.envs import registry as registry_module
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
                                         fragment: int, timestep_sizes, episode_sizes,
                                         check_batch=None) -> None:
    """Samples `runner` (fresh) and asserts that only its first timestep-mode call and its
    first episode-mode call compile anything: every other size, the default size, zero,
    a switch back from episode to timestep mode and `get_metrics()` compile nothing.

    The first timestep call is followed directly by other timestep sizes, so an env whose
    carry changes type after one chunk (a weakly typed reset leaf) shows up here.
    `check_batch(batch, episode_mode)`, when given, is called on every batch (its checks
    run between calls, so they must compile nothing either).
    """
    check = check_batch or (lambda batch, episode_mode: None)

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
            check(batch, False)
            steps += batch.num_vector_steps
        return steps

    check(runner.sample(num_timesteps=num_envs), False)
    runner.get_metrics()
    assert compile_counter.count > 0  # the first call compiled: the counter is listening
    compile_counter.reset()
    vector_steps = timestep_calls(timestep_sizes)
    assert_no_compiles("in timestep mode after the first sample()")

    first_episodes = runner.sample(num_episodes=1)  # episode mode's first call may compile
    assert len(first_episodes) == 1
    check(first_episodes, True)
    vector_steps += first_episodes.num_vector_steps
    compile_counter.reset()
    for k in episode_sizes:
        batch = runner.sample(num_episodes=k)
        assert len(batch) == k and all(episode.is_done for episode in batch)
        check(batch, True)
        vector_steps += batch.num_vector_steps
    vector_steps += timestep_calls(timestep_sizes[:3])  # back to timestep mode
    default = runner.sample()  # the default size: rollout_fragment_length per sub-env
    assert default.num_vector_steps == fragment
    assert sum(len(episode) for episode in default) == fragment * num_envs
    check(default, False)
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


class RecordActions(gymnax_environment.Environment):
    """Delegates to a gymnax env and records (host side) every action the env receives."""

    def __init__(self, inner, sink: list):
        super().__init__()
        self.inner = inner
        self.sink = sink

    @property
    def default_params(self):
        return self.inner.default_params

    @property
    def name(self):
        return self.inner.name

    def step_env(self, key, state, action, params):
        jax.debug.callback(lambda a: self.sink.append(np.asarray(a)), action)
        return self.inner.step_env(key, state, action, params)

    def reset_env(self, key, params):
        return self.inner.reset_env(key, params)

    def is_truncated(self, state, params):
        return self.inner.is_truncated(state, params)

    def observation_space(self, params):
        return self.inner.observation_space(params)

    def action_space(self, params):
        return self.inner.action_space(params)


# gymnax envs whose observations leave the space they declare (gymnax's bugs, not the
# runner's): for these only shapes and finiteness are checked.
GYMNAX_OBS_OUTSIDE_DECLARED_SPACE = {
    "Catch-bsuite": "float32 observations, declared int32",
    "MemoryChain-bsuite": "an entry reaches -1, declared low 0",
    "MetaMaze-misc": "the reward entry reaches 10, declared high 1",
    "GaussianBandit-misc": "the previous-reward entry goes negative, declared low 0",
}


def _in_space(space: gym.spaces.Space, x: np.ndarray, strict: bool) -> bool:
    """`space.contains` with float round-off allowed at the bounds (UmbrellaChain-bsuite
    emits -1.5e-8 for a declared low of 0) and same-kind dtype casts (int32
    observations in a float32 Box)."""
    x = np.asarray(x)
    if isinstance(space, gym.spaces.Discrete):
        return (np.issubdtype(x.dtype, np.integer) and x.shape == ()
                and space.start <= int(x) < space.start + space.n)
    assert isinstance(space, gym.spaces.Box), space
    if x.shape != space.shape or not np.all(np.isfinite(x)):
        return False
    if not strict:
        return True
    low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
    value = x.astype(np.float64)
    return (np.can_cast(x.dtype, space.dtype, "same_kind")
            and bool(np.all(value >= low - 1e-6 * (1.0 + np.abs(low))))
            and bool(np.all(value <= high + 1e-6 * (1.0 + np.abs(high)))))


def _check_chunks(batch, obs_space, act_space, strict_obs=True):
    for episode in batch:
        episode.validate()
        assert len(episode) > 0
        for obs in list(episode.observations) + list(episode.lookback_observations):
            assert _in_space(obs_space, obs, strict_obs), (episode, obs_space, obs)
        if isinstance(act_space, gym.spaces.Discrete):
            for action in episode.actions:
                assert act_space.contains(np.asarray(action)), (episode, action)
        else:
            assert episode.actions.shape == (len(episode),) + act_space.shape
            assert np.all(np.isfinite(episode.actions))
        assert np.all(np.isfinite(episode.rewards))


class SingleAgentChecks:
    """`check_batch` of a single-agent runner: every episode valid and inside the spaces;
    an episode cut at the end of one timestep-mode call continues in the next call (same
    id, `t_started` = its previous `t`), unless an episode-mode call (which restarts every
    sub-env) came between; episode-mode episodes start at 0 and last at most the env's
    time limit."""

    def __init__(self, runner, env_id: str, max_steps):
        self.obs_space, self.act_space = runner.get_spaces()["__env_single__"]
        self.strict_obs = env_id not in GYMNAX_OBS_OUTSIDE_DECLARED_SPACE
        self.max_steps = max_steps
        self.previous = None

    def __call__(self, batch, episode_mode: bool) -> None:
        _check_chunks(batch, self.obs_space, self.act_space, self.strict_obs)
        if episode_mode:
            assert all(e.is_done and e.t_started == 0 for e in batch)
            if self.max_steps is not None:
                assert all(0 < len(e) <= self.max_steps for e in batch)
        if self.previous is not None:
            cut = {e.id_: e for e in self.previous if not e.is_done}
            for episode in batch:
                if episode.id_ in cut:
                    assert episode.t_started == cut[episode.id_].t
        self.previous = batch


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS + MULTI_AGENT_IDS)
def test_compile_once__every_registered_env(env_id, compile_counter, monkeypatch):
    """Every env `jaxrunner envs` lists, in the runner class its kind picks (a multi-agent
    env without `.multi_agent()` gets one `default_policy` module), compiles only at its
    first calls; a single-agent env's batches pass `SingleAgentChecks`, and a gymnax env
    with Box actions is wrapped to record the actions it receives (inside its bounds)."""
    env_spec, sent_actions, max_steps = env_id, None, None
    if env_id in gymnax.registered_envs:
        gx_env, gx_params = gymnax.make(env_id)
        max_steps = getattr(gx_params, "max_steps_in_episode", None)
        if isinstance(gx_env.action_space(gx_params), gymnax_spaces.Box):
            monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
            sent_actions = []
            env_spec = f"recorded-{env_id}"
            jaxrunner.register_env(env_spec, lambda ctx: (RecordActions(gx_env, sent_actions),
                                                          gx_params))
    config = make_config(env_spec, num_envs=ENV_NUM_ENVS, fragment=ENV_FRAGMENT, hiddens=(8,))
    runner = jaxrunner.runner_class_for(config)(config=config)
    expected = (jaxrunner.MultiAgentEnvRunner if env_id in MULTI_AGENT_IDS
                else jaxrunner.SingleAgentEnvRunner)
    assert type(runner) is expected
    checks = None if env_id in MULTI_AGENT_IDS else SingleAgentChecks(runner, env_id, max_steps)
    try:
        _assert_compiles_only_at_first_calls(
            runner, compile_counter, label=env_id, num_envs=ENV_NUM_ENVS, fragment=ENV_FRAGMENT,
            timestep_sizes=ENV_TIMESTEP_SIZES, episode_sizes=(1, 2), check_batch=checks)
        if sent_actions is not None:
            jax.effects_barrier()
            act_space = checks.act_space
            sent = np.concatenate([np.reshape(a, (-1,) + act_space.shape) for a in sent_actions])
            assert len(sent) >= sum(ENV_TIMESTEP_SIZES)
            assert np.all(sent >= act_space.low) and np.all(sent <= act_space.high), (
                f"actions sent to {env_id} leave {act_space}: min {sent.min(0)}, "
                f"max {sent.max(0)}")
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
