"""Bad inputs (DESIGN.md "Errors users get"): an informative exception, and nothing broken.

The bad arguments of `sample()` itself (both sizes, negative sizes, wrong types, and that
they compile nothing) are part of the sample contract: tests/test_sample_contract.py.

Each test checks that the message says what was wrong and what to do, and that sampling
still works afterwards (the runner the error came from, or the shared runner and a runner
built from the corrected config).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole

import jaxrunner
from jaxrunner import RLModuleSpec, StateStructureError

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 2


@pytest.fixture(scope="module")
def runner():
    return jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=NUM_ENVS, fragment=4))


def still_samples(runner, previous=None):
    batch = runner.sample(num_timesteps=NUM_ENVS * 2)
    assert sum(len(e) for e in batch) == NUM_ENVS * 2
    if previous is not None:  # episodes cut before the error continue after it
        ongoing = {e.id_: e.t for e in previous if not e.is_done}
        continued = {e.id_: e.t_started for e in batch if e.t_started > 0}
        assert continued == ongoing
    return batch


def test_errors__unknown_env_id(runner, compile_counter):
    config = make_config("CartPole-v0")
    with pytest.raises(ValueError) as info:
        jaxrunner.SingleAgentEnvRunner(config=config)
    message = str(info.value)
    assert "'CartPole-v0'" in message and "'CartPole-v1'" in message
    assert "register_env" in message
    assert compile_counter.count == 0, "the error should come before any compilation"
    fixed = jaxrunner.SingleAgentEnvRunner(config=config.environment("CartPole-v1"))
    fixed.assert_healthy()
    still_samples(runner)


@pytest.mark.parametrize("value", [0, -2])
def test_errors__num_envs_per_env_runner_below_one(runner, value):
    config = make_config(num_envs=NUM_ENVS)
    with pytest.raises(ValueError) as info:
        config.env_runners(num_envs_per_env_runner=value)
    message = str(info.value)
    assert "num_envs_per_env_runner" in message and ">= 1" in message
    assert str(value) in message
    assert config.num_envs_per_env_runner == NUM_ENVS  # the config is unchanged and usable
    jaxrunner.SingleAgentEnvRunner(config=config).assert_healthy()
    still_samples(runner)


def test_errors__unknown_config_key(runner):
    config = make_config()
    with pytest.raises(AttributeError) as info:
        config.num_env_per_env_runner = 4
    assert "'num_env_per_env_runner'" in str(info.value)
    assert "'num_envs_per_env_runner'" in str(info.value)
    with pytest.raises(AttributeError, match="'rollout_fragment_length'"):
        config.update_from_dict({"rollout_fragment_len": 10})
    jaxrunner.SingleAgentEnvRunner(config=config).assert_healthy()
    still_samples(runner)


def test_errors__set_state_wrong_structure(runner):
    before = runner.sample(num_timesteps=NUM_ENVS)
    good = runner.get_state(components="rl_module")["rl_module"]
    bad = jax.tree.map(lambda x: np.zeros(np.shape(x) + (1,), np.float32), good)
    with pytest.raises(StateStructureError) as info:
        runner.set_state({"rl_module": bad})
    message = str(info.value)
    assert "shape" in message and "expected" in message and "get_state" in message
    with pytest.raises(StateStructureError, match="missing"):
        runner.set_state({"rl_module": {"pi": {}}})
    still_samples(runner, before)
    for a, b in zip(jax.tree.leaves(runner.get_state(components="rl_module")["rl_module"]),
                    jax.tree.leaves(good)):
        np.testing.assert_array_equal(a, b)


class LinearModule(jaxrunner.RLModule):
    """A hand-written module: one linear layer with `model_config["out_dim"]` outputs."""

    def init(self, key):
        in_dim = int(np.prod(self.observation_space.shape))
        out_dim = self.model_config["out_dim"]
        return {"w": 0.01 * jax.random.normal(key, (in_dim, out_dim), jnp.float32)}

    def _forward(self, params, batch):
        obs = batch["obs"].reshape(batch["obs"].shape[0], -1).astype(jnp.float32)
        return {"action_dist_inputs": obs @ params["w"]}


def test_errors__module_output_does_not_fit_action_space(runner):
    config = make_config(num_envs=NUM_ENVS, fragment=4).rl_module(
        rl_module_spec=RLModuleSpec(module_class=LinearModule, model_config={"out_dim": 3}))
    with pytest.raises(ValueError) as info:
        jaxrunner.SingleAgentEnvRunner(config=config)
    message = str(info.value)
    assert "LinearModule" in message and "action_dist_inputs" in message
    assert "Discrete(2)" in message and f"({NUM_ENVS}, 3)" in message
    assert f"({NUM_ENVS}, 2)" in message
    still_samples(runner)
    # The same module with the right output size builds and samples.
    config.rl_module(rl_module_spec=RLModuleSpec(module_class=LinearModule,
                                                 model_config={"out_dim": 2}))
    fixed = jaxrunner.SingleAgentEnvRunner(config=config)
    batch = fixed.sample(num_timesteps=NUM_ENVS * 3)
    assert sum(len(e) for e in batch) == NUM_ENVS * 3
    assert all(e.extra_model_outputs["action_dist_inputs"].shape[-1] == 2 for e in batch)


class PythonIfCartPole(CartPole):
    def step_env(self, key, state, action, params):
        if action > 0:  # Python control flow on a traced value
            action = 1
        return super().step_env(key, state, action, params)


def test_errors__env_step_not_jittable(runner, compile_counter):
    with pytest.raises(TypeError) as info:
        jaxrunner.SingleAgentEnvRunner(config=make_config(PythonIfCartPole()))
    message = str(info.value)
    assert "cannot be traced" in message and "jnp.where" in message
    assert compile_counter.count == 0
    still_samples(runner)
