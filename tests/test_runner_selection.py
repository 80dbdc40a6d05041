"""`runner_class_for` follows the env's kind; a runner of the wrong kind says what to use."""

from __future__ import annotations

import gymnasium as gym
import gymnax
import pytest

import jaxrunner
from jaxrunner.envs import registry as registry_module
from jaxrunner.envs.kind import MULTI_AGENT, SINGLE_AGENT, check_env_kind, env_kind_of
from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole
from jaxrunner.envs.tic_tac_toe import TicTacToe
from jaxrunner.runners.selection import env_kind, runner_class_for


@pytest.fixture
def isolated_registry(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))


def _config(env):
    return jaxrunner.RunnerConfig().environment(env).env_runners(num_envs_per_env_runner=2)


@pytest.mark.parametrize("env", ["MultiAgentCartPole-v1", "TicTacToe-v0", "jaxmarl/MPE_simple_v3"])
def test_selection__multi_agent_names_get_the_multi_agent_runner(env):
    config = _config(env)
    assert not config.is_multi_agent  # no .multi_agent() call
    assert env_kind(config) == MULTI_AGENT
    assert runner_class_for(config) is jaxrunner.MultiAgentEnvRunner


def test_selection__multi_agent_instances_and_creators(isolated_registry):
    calls = []

    def creator(ctx):
        calls.append(dict(ctx))
        return MultiAgentCartPole(num_agents=int(ctx.get("num_agents", 2)))

    assert runner_class_for(_config(TicTacToe())) is jaxrunner.MultiAgentEnvRunner
    config = _config(creator).environment(env_config={"num_agents": 3})
    assert runner_class_for(config) is jaxrunner.MultiAgentEnvRunner
    assert calls == [{"num_agents": 3}]  # the creator saw the env_config
    jaxrunner.register_env("my-ma", lambda ctx: (TicTacToe(), None))
    assert runner_class_for(_config("my-ma")) is jaxrunner.MultiAgentEnvRunner


@pytest.mark.parametrize("env", ["CartPole-v1", "gymnasium:CartPole-v1", "NoSuchEnv-v0"])
def test_selection__single_agent_names_get_the_single_agent_runner(env):
    assert env_kind(_config(env)) == SINGLE_AGENT
    assert runner_class_for(_config(env)) is jaxrunner.SingleAgentEnvRunner


def test_selection__single_agent_creators_and_failing_creators(isolated_registry):
    closed = []

    class ClosingCartPole(gym.Wrapper):
        def close(self):
            closed.append(True)
            super().close()

    assert runner_class_for(_config(lambda ctx: gymnax.make("Acrobot-v1"))) is (
        jaxrunner.SingleAgentEnvRunner)
    host = _config(lambda ctx: ClosingCartPole(gym.make("CartPole-v1")))
    assert runner_class_for(host) is jaxrunner.SingleAgentEnvRunner
    assert closed == [True]  # the probed gymnasium env is closed again

    def broken(ctx):
        raise ConnectionError("simulator down")

    # The runner reports (or retries) the creator's error; the choice does not raise.
    assert runner_class_for(_config(broken)) is jaxrunner.SingleAgentEnvRunner


def test_selection__explicit_settings_win():
    class MyRunner(jaxrunner.SingleAgentEnvRunner):
        pass

    config = _config("TicTacToe-v0").env_runners(env_runner_cls=MyRunner)
    assert runner_class_for(config) is MyRunner
    config = _config("CartPole-v1").multi_agent(policies={"a", "b"},
                                                policy_mapping_fn=lambda aid, ep: "a")
    assert runner_class_for(config) is jaxrunner.MultiAgentEnvRunner


@pytest.mark.parametrize("env", ["TicTacToe-v0", "MultiAgentCartPole-v1"])
def test_selection__single_agent_runner_on_a_multi_agent_env_says_what_to_call(env):
    with pytest.raises(TypeError) as info:
        jaxrunner.SingleAgentEnvRunner(config=_config(env))
    message = str(info.value)
    assert "multi-agent env" in message
    assert "MultiAgentEnvRunner" in message and "runner_class_for" in message
    assert "cannot be traced" not in message and "lax.cond" not in message


def test_selection__check_env_kind_both_ways():
    cartpole, _ = gymnax.make("CartPole-v1")
    assert env_kind_of(cartpole) == SINGLE_AGENT
    assert env_kind_of((TicTacToe(), None)) == MULTI_AGENT
    check_env_kind(cartpole, SINGLE_AGENT)
    check_env_kind(TicTacToe(), MULTI_AGENT)
    with pytest.raises(TypeError, match=r"'TicTacToe-v0'.*MultiAgentEnvRunner"):
        check_env_kind(TicTacToe(), SINGLE_AGENT, "TicTacToe-v0")
    with pytest.raises(TypeError, match=r"single-agent env.*SingleAgentEnvRunner"):
        check_env_kind(cartpole, MULTI_AGENT)
    with pytest.raises(ValueError, match="runner_kind"):
        check_env_kind(cartpole, "both")
