"""Env resolution, EnvContext and error messages (the smoke matrix over every env id is in
tests/test_compile_once.py, on the runners that check compile-once)."""

from __future__ import annotations

import gymnasium as gym
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment as gymnax_environment
from gymnax.environments import spaces as gymnax_spaces
from gymnax.environments.classic_control.cartpole import CartPole

import jaxrunner
from jaxrunner.envs import EnvContext, gymnax_env_ids, make_jax_env, registered_env_names
from jaxrunner.envs import registry as registry_module

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def _same_params(a, b) -> bool:
    return (jax.tree.structure(a) == jax.tree.structure(b)
            and all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


@pytest.fixture
def isolated_registry(monkeypatch):
    """Registrations made by the test disappear afterwards."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))


# ----------------------------------------------------------------------------- resolution
def test_envs__registered_name_wins_over_gymnax_id(isolated_registry):
    jaxrunner.register_env("CartPole-v1", lambda ctx: gymnax.make("Pendulum-v1"))
    env, params, name = make_jax_env("CartPole-v1", EnvContext({}))
    assert isinstance(env.action_space(params), gymnax_spaces.Box)  # Pendulum, not CartPole
    assert name == "CartPole-v1"
    assert "CartPole-v1" in registered_env_names()


def test_envs__registered_name_wins_in_runner(isolated_registry):
    jaxrunner.register_env("CartPole-v1", lambda ctx: gymnax.make("Pendulum-v1"))
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config("CartPole-v1"))
    obs_space, act_space = runner.get_spaces()["__env_single__"]
    assert isinstance(act_space, gym.spaces.Box) and obs_space.shape == (3,)


def test_envs__callable_creator_gets_context_and_may_return_bare_env():
    seen = []

    def creator(ctx):
        seen.append(ctx)
        return gymnax.make("Acrobot-v1")

    env, params, _ = make_jax_env(creator, EnvContext({"k": 1}, worker_index=2))
    assert env.action_space(params).n == 3
    assert isinstance(seen[0], EnvContext) and seen[0]["k"] == 1 and seen[0].worker_index == 2

    bare_env, _ = gymnax.make("MountainCar-v0")
    env, params, _ = make_jax_env(lambda ctx: bare_env, EnvContext({}))
    assert env is bare_env and _same_params(params, bare_env.default_params)


def test_envs__gymnax_instance_uses_default_params():
    instance, _ = gymnax.make("Acrobot-v1")
    env, params, name = make_jax_env(instance, EnvContext({}))
    assert env is instance
    assert _same_params(params, instance.default_params)
    assert isinstance(name, str) and name


def test_envs__gymnax_id():
    env, params, name = make_jax_env("MountainCar-v0", EnvContext({}))
    assert name == "MountainCar-v0"
    assert env.action_space(params).n == 3
    assert type(env).__name__ == type(gymnax.make("MountainCar-v0")[0]).__name__


def test_envs__gymnax_id_with_bad_env_config_is_value_error():
    with pytest.raises(ValueError) as info:
        make_jax_env("CartPole-v1", EnvContext({"no_such_kwarg": 1}))
    assert "env_config" in str(info.value) and "no_such_kwarg" in str(info.value)


def test_envs__register_env_creator_receives_env_context(isolated_registry):
    seen = []

    def creator(ctx):
        seen.append(ctx)
        env, params = gymnax.make("CartPole-v1")
        return env, params.replace(max_steps_in_episode=ctx["max_steps"])

    jaxrunner.register_env("short-cartpole-ctx", creator)
    config = make_config("short-cartpole-ctx").environment(env_config={"max_steps": 7})
    runner = jaxrunner.SingleAgentEnvRunner(config=config, worker_index=3, num_workers=4)
    ctx = seen[-1]
    assert isinstance(ctx, EnvContext)
    assert dict(ctx) == {"max_steps": 7}
    assert ctx.worker_index == 3 and ctx.num_workers == 4
    assert runner.env_params.max_steps_in_episode == 7


def test_envs__register_env_rejects_bad_arguments(isolated_registry):
    with pytest.raises(TypeError, match="callable"):
        jaxrunner.register_env("x", "not a creator")
    with pytest.raises(TypeError, match="name"):
        jaxrunner.register_env("", lambda ctx: gymnax.make("CartPole-v1"))


def test_envs__creator_returning_a_non_env_is_type_error(isolated_registry):
    jaxrunner.register_env("not-an-env", lambda ctx: (object(), None))
    with pytest.raises(TypeError, match="gymnax"):
        make_jax_env("not-an-env", EnvContext({}))


# ----------------------------------------------------------------------------- errors
def test_envs__unknown_id_names_close_matches():
    with pytest.raises(ValueError) as info:
        make_jax_env("CartPole-v0", EnvContext({}))
    assert "CartPole-v0" in str(info.value) and "CartPole-v1" in str(info.value)
    with pytest.raises(ValueError, match="Acrobot-v1"):
        jaxrunner.SingleAgentEnvRunner(config=make_config("Acrobot-v0"))


def test_envs__no_env_is_value_error():
    config = jaxrunner.RunnerConfig().env_runners(num_envs_per_env_runner=2)
    with pytest.raises(ValueError, match="environment"):
        jaxrunner.SingleAgentEnvRunner(config=config)


def test_envs__mnist_bandit_is_a_clear_value_error():
    assert "MNISTBandit-bsuite" not in gymnax_env_ids()
    assert "MNISTBandit-bsuite" in gymnax_env_ids(runnable_only=False)
    with pytest.raises(ValueError) as info:
        make_jax_env("MNISTBandit-bsuite", EnvContext({}))
    message = str(info.value)
    assert "MNISTBandit-bsuite" in message and "download" in message
    assert "register_env" in message


class PythonIfCartPole(CartPole):
    """A CartPole whose step uses Python `if` on a traced action: not jittable."""

    def step_env(self, key, state, action, params):
        if action > 0:  # TracerBoolConversionError under jit
            action = 1
        return super().step_env(key, state, action, params)


def test_envs__python_if_on_traced_value_is_type_error_at_construction(isolated_registry):
    with pytest.raises(TypeError) as info:
        jaxrunner.SingleAgentEnvRunner(config=make_config(PythonIfCartPole()))
    message = str(info.value)
    assert "trace" in message and "lax.cond" in message
    jaxrunner.register_env("python-if", lambda ctx: PythonIfCartPole())
    with pytest.raises(TypeError, match="python-if"):
        jaxrunner.SingleAgentEnvRunner(config=make_config("python-if"))


def test_envs__spaces_are_gymnasium_and_batched():
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config("CartPole-v1", num_envs=3))
    spaces = runner.get_spaces()
    obs_space, act_space = spaces["__env_single__"]
    assert obs_space == gym.spaces.Box(obs_space.low, obs_space.high, (4,), np.float32)
    assert act_space == gym.spaces.Discrete(2)
    assert spaces["__env__"][0].shape == (3, 4)
    assert spaces["__env__"][1] == gym.spaces.MultiDiscrete([2, 2, 2])
    assert spaces["default_policy"] == (obs_space, act_space)


# ----------------------------------------------------------------------------- env_config
def test_envs__gymnax_id_env_config_sets_env_params_fields():
    env, params, _ = make_jax_env("CartPole-v1", EnvContext({"max_steps_in_episode": 7,
                                                             "gravity": 3}))
    default = gymnax.make("CartPole-v1")[1]
    assert params.max_steps_in_episode == 7 and isinstance(params.max_steps_in_episode, int)
    # Same type as the default (a float field stays float: no new program argument types).
    assert params.gravity == 3.0 and isinstance(params.gravity, float)
    assert params.masscart == default.masscart


def test_envs__gymnax_id_env_config_sets_constructor_args_and_fields_together():
    env, params, _ = make_jax_env("Breakout-MinAtar", EnvContext(
        {"use_minimal_action_set": False, "max_steps_in_episode": 50}))
    assert env.num_actions == len(env.full_action_set) != len(env.minimal_action_set)
    assert params.max_steps_in_episode == 50
    assert registry_module.gymnax_env_config_keys("Breakout-MinAtar") == {
        "params": ["max_steps_in_episode"], "constructor": ["use_minimal_action_set"]}


def test_envs__gymnax_id_env_config_unknown_key_names_both_kinds_and_close_match():
    with pytest.raises(ValueError) as info:
        make_jax_env("CartPole-v1", EnvContext({"max_step_in_episode": 5}))
    message = str(info.value)
    assert "'max_step_in_episode'" in message and "Did you mean 'max_steps_in_episode'" in message
    assert "EnvParams" in message and "constructor" in message
    # The runner's error is the same, without advice to switch to gymnasium.
    with pytest.raises(ValueError) as info:
        jaxrunner.SingleAgentEnvRunner(config=make_config("CartPole-v1").environment(
            env_config={"max_step_in_episode": 5}))
    assert "max_steps_in_episode" in str(info.value) and "gymnasium" not in str(info.value)


def test_envs__gymnax_id_env_config_of_the_wrong_type_is_value_error():
    with pytest.raises(ValueError, match=r"max_steps_in_episode.*int"):
        make_jax_env("CartPole-v1", EnvContext({"max_steps_in_episode": 7.5}))


def test_envs__env_config_max_steps_truncates_runner_episodes():
    config = make_config("CartPole-v1", num_envs=2).environment(
        env_config={"max_steps_in_episode": 5})
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    assert runner.env_params.max_steps_in_episode == 5
    batch = runner.sample(num_episodes=4, random_actions=True)
    assert all(len(e) <= 5 for e in batch)
    assert any(e.is_truncated and len(e) == 5 for e in batch)


# ----------------------------------------------------------------------------- creator errors
def test_envs__bug_in_a_creator_is_raised_as_is_not_as_a_retry_hint():
    calls = []

    def creator(ctx):
        calls.append(1)
        return gymnax.make("CartPole-v1", no_such_argument=1)  # TypeError: a bug

    for restart in (False, True):
        calls.clear()
        config = make_config(creator).fault_tolerance(
            restart_failed_sub_environments=restart)
        with pytest.raises(TypeError) as info:
            jaxrunner.SingleAgentEnvRunner(config=config)
        assert "no_such_argument" in str(info.value)
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "creator" in notes and "not retried" in notes
        assert "restart_failed_sub_environments" not in str(info.value) + notes
        assert len(calls) == 1  # never retried


def test_envs__creator_returning_the_env_class_is_a_clear_error(isolated_registry):
    jaxrunner.register_env("a-class", lambda ctx: CartPole)
    with pytest.raises(TypeError, match=r"returned the class CartPole.*CartPole\(\)"):
        jaxrunner.SingleAgentEnvRunner(config=make_config("a-class"))
    with pytest.raises(TypeError, match="returned the class CartPole"):
        make_jax_env(lambda ctx: (CartPole, CartPole().default_params), EnvContext({}))
    # The class itself as config.env is no creator either.
    with pytest.raises(TypeError, match=r"env class CartPole.*config.environment\(CartPole\(\)\)"):
        jaxrunner.SingleAgentEnvRunner(config=make_config(CartPole))


@struct.dataclass
class _NoTimeState:
    x: jax.Array


class NoTimeEnv(gymnax_environment.Environment):
    """A gymnax env whose state has no `time` (gymnax's base step() needs it)."""

    @property
    def default_params(self):
        return gymnax_environment.EnvParams(max_steps_in_episode=10)

    def reset_env(self, key, params):
        return jnp.zeros(2), _NoTimeState(x=jnp.zeros(()))

    def step_env(self, key, state, action, params):
        state = _NoTimeState(x=state.x + 1)
        return jnp.zeros(2), state, jnp.float32(1.0), state.x > 5, {}

    def observation_space(self, params):
        return gymnax_spaces.Box(-1.0, 1.0, (2,))

    def action_space(self, params):
        return gymnax_spaces.Discrete(2)


def test_envs__state_without_time_is_reported_as_such_not_as_tracing():
    with pytest.raises(TypeError) as info:
        jaxrunner.SingleAgentEnvRunner(config=make_config(NoTimeEnv()))
    message = str(info.value)
    assert "no `time` field" in message and "is_truncated" in message
    assert "cannot be traced" not in message and "lax.cond" not in message


@struct.dataclass
class _TimeState:
    x: jax.Array
    time: int


class OldDoneEnv(NoTimeEnv):
    """Old-style gymnax env: `done` includes the time limit."""

    def reset_env(self, key, params):
        return jnp.zeros(2), _TimeState(x=jnp.zeros(()), time=0)

    def step_env(self, key, state, action, params):
        state = _TimeState(x=state.x + 1, time=state.time + 1)
        done = jnp.logical_or(state.x > 100, state.time >= params.max_steps_in_episode)
        return jnp.zeros(2), state, jnp.float32(1.0), done, {}


class NewDoneEnv(OldDoneEnv):
    """The same env with natural termination only (the gymnax 1.0 contract)."""

    def step_env(self, key, state, action, params):
        state = _TimeState(x=state.x + 1, time=state.time + 1)
        return jnp.zeros(2), state, jnp.float32(1.0), state.x > 100, {}


def test_envs__old_style_done_with_the_time_limit_warns_with_the_fix():
    with pytest.warns(registry_module.OldStyleDoneWarning, match="natural termination only"):
        runner = jaxrunner.SingleAgentEnvRunner(config=make_config(OldDoneEnv()))
    # What the warning is about: time-outs come out terminated *and* truncated.
    batch = runner.sample(num_episodes=2, random_actions=True)
    assert all(e.is_terminated and len(e) == 10 for e in batch)


def test_envs__natural_termination_only_does_not_warn():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", registry_module.OldStyleDoneWarning)
        runner = jaxrunner.SingleAgentEnvRunner(config=make_config(NewDoneEnv()))
    batch = runner.sample(num_episodes=2, random_actions=True)
    assert all(e.is_truncated and not e.is_terminated and len(e) == 10 for e in batch)
