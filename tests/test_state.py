"""`get_state()` / `set_state()`: weights_seq_no, weight formats, structure errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner import RLModuleSpec, StateStructureError

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 2
HIDDENS = (16,)


@pytest.fixture(scope="module")
def runner():
    return jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=NUM_ENVS, fragment=4, hiddens=HIDDENS))


def weights(runner):
    return runner.get_state(components="rl_module")["rl_module"]


def shifted(tree, delta: float):
    return jax.tree.map(lambda x: np.asarray(x) + np.float32(delta), tree)


def assert_weights(runner, expected):
    got = weights(runner)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


def assert_samples_with(runner, params):
    """The runner acts with `params`: its logits are the module's forward pass on them."""
    batch = runner.sample(num_timesteps=NUM_ENVS * 2)
    traj = jax.device_get(batch.trajectory())
    steps = int(traj.valid.sum())
    obs = np.asarray(traj.obs[:steps]).reshape(steps * NUM_ENVS, -1)
    expected = runner.module.forward_exploration(
        jax.tree.map(np.asarray, params), {"obs": obs})["action_dist_inputs"]
    np.testing.assert_allclose(
        np.asarray(traj.extra_model_outputs["action_dist_inputs"][:steps]).reshape(
            steps * NUM_ENVS, -1), np.asarray(expected), rtol=1e-4, atol=1e-5)


def test_state__weights_seq_no_rule(runner):
    base = weights(runner)
    start_seq = runner.weights_seq_no

    newer = shifted(base, 0.5)
    runner.set_state({"rl_module": newer, "weights_seq_no": start_seq + 5})
    assert runner.weights_seq_no == start_seq + 5
    assert runner.get_state()["weights_seq_no"] == start_seq + 5
    assert_weights(runner, newer)
    assert_samples_with(runner, newer)

    for stale_seq in (start_seq + 5, start_seq + 4, 1):  # equal or older: ignored
        runner.set_state({"rl_module": shifted(base, 9.0), "weights_seq_no": stale_seq})
        assert_weights(runner, newer)
        assert runner.weights_seq_no == start_seq + 5

    zero = shifted(base, -0.25)  # seq 0 always applies and keeps the seq number
    runner.set_state({"rl_module": zero, "weights_seq_no": 0})
    assert_weights(runner, zero)
    assert runner.weights_seq_no == start_seq + 5
    runner.set_state({"rl_module": base})  # no seq at all counts as 0
    assert_weights(runner, base)

    newest = shifted(base, 0.125)
    runner.set_state({"rl_module": newest, "weights_seq_no": start_seq + 6})
    assert_weights(runner, newest)
    assert runner.weights_seq_no == start_seq + 6
    assert runner.get_metrics()["weights_seq_no"] == start_seq + 6
    runner.set_state({"rl_module": base, "weights_seq_no": 0})


def test_state__weights_wrapped_in_default_policy(runner):
    base = weights(runner)
    wrapped = {"default_policy": shifted(base, 0.75)}
    runner.set_state({"rl_module": wrapped, "weights_seq_no": 0})
    assert_weights(runner, wrapped["default_policy"])
    runner.set_state({"rl_module": base, "weights_seq_no": 0})


def test_state__full_module_weights_load_into_inference_module(runner):
    obs_space, act_space = runner.get_spaces()["default_policy"]
    full = RLModuleSpec(observation_space=obs_space, action_space=act_space,
                        model_config={"fcnet_hiddens": list(HIDDENS),
                                      "fcnet_activation": "tanh"},
                        inference_only=False).build()
    full_params = jax.tree.map(np.asarray, full.init(jax.random.key(42)))
    assert "vf" in full_params
    assert "vf" not in weights(runner)
    runner.set_state({"rl_module": full_params, "weights_seq_no": 0})
    assert_weights(runner, {k: v for k, v in full_params.items() if k != "vf"})
    assert_samples_with(runner, weights(runner))


def _bad_weights(base):
    wrong_shape = jax.tree.map(np.asarray, base)
    leaves, treedef = jax.tree.flatten(wrong_shape)
    leaves[0] = np.zeros(leaves[0].shape + (2,), leaves[0].dtype)
    missing = {k: v for k, v in base.items()}
    first_layer = next(iter(missing["pi"]))
    missing["pi"] = {k: v for k, v in missing["pi"].items() if k != first_layer}
    return {
        "wrong shape": jax.tree.unflatten(treedef, leaves),
        "missing layer": missing,
        "unknown module key": {"policy_net": base["pi"]},
        "not a dict": [np.zeros(3)],
    }


@pytest.mark.parametrize("case", ["wrong shape", "missing layer", "unknown module key",
                                  "not a dict"])
def test_state__wrong_weights_raise_and_keep_old_ones(runner, case):
    base = weights(runner)
    lifetime = runner.get_state()["num_env_steps_sampled_lifetime"]
    seq = runner.weights_seq_no
    bad = _bad_weights(base)[case]
    with pytest.raises(StateStructureError) as info:
        runner.set_state({"rl_module": bad, "weights_seq_no": seq + 1,
                          "num_env_steps_sampled_lifetime": lifetime + 1000})
    assert "rl_module" in str(info.value) or "weights" in str(info.value)
    assert isinstance(info.value, ValueError)
    # Nothing of the rejected state was applied.
    assert_weights(runner, base)
    assert runner.weights_seq_no == seq
    assert runner.get_state()["num_env_steps_sampled_lifetime"] == lifetime
    assert_samples_with(runner, base)


def test_state__unknown_keys_raise(runner):
    base = weights(runner)
    with pytest.raises(StateStructureError, match="rl_modul"):
        runner.set_state({"rl_modul": base})
    with pytest.raises(StateStructureError):
        runner.set_state(["not", "a", "dict"])
    assert_samples_with(runner, base)


def test_state__component_selection(runner):
    always = "num_env_steps_sampled_lifetime"
    default = runner.get_state()
    assert set(default) == {always, "rl_module", "weights_seq_no",
                            "env_to_module_connector", "module_to_env_connector"}
    assert set(runner.get_state(components="rl_module")) == {always, "rl_module",
                                                            "weights_seq_no"}
    assert set(runner.get_state(components=["rl_module"], not_components="rl_module")) == {
        always}
    without = runner.get_state(not_components="rl_module")
    assert "rl_module" not in without and "weights_seq_no" not in without
    assert always in without
    carry = runner.get_state(components=["env_runner_carry"])
    assert set(carry) == {always, "env_runner_carry"}
    for state in (default, carry):
        for leaf in jax.tree.leaves(state):
            assert not isinstance(leaf, jax.Array), "get_state must return host data"
    with pytest.raises(ValueError, match="rl_modules"):
        runner.get_state(components="rl_modules")
    # A get_state of every default component round-trips.
    runner.set_state(default)
    assert_weights(runner, default["rl_module"])


def test_state__sample_get_state_and_metrics(runner):
    runner.get_metrics()
    batch, state, metrics = runner.sample_get_state_and_metrics()
    assert isinstance(batch, jaxrunner.EpisodeBatch)
    assert sum(len(e) for e in batch) == 4 * NUM_ENVS  # fragment x num_envs
    assert "rl_module" not in state and "weights_seq_no" not in state
    assert state["num_env_steps_sampled_lifetime"] == metrics[
        "num_env_steps_sampled_lifetime"]
    assert metrics["num_env_steps_sampled"] == 4 * NUM_ENVS


def test_set_state__nan_weights_are_refused_and_change_nothing(runner):
    before = weights(runner)
    bad = jax.tree.map(np.array, before)
    leaf_path, first = jax.tree_util.tree_leaves_with_path(bad)[0]
    first.reshape(-1)[0] = np.nan
    with pytest.raises(ValueError, match=r"set_state: rl_module weights.*(NaN|nan|finite)"):
        runner.set_state({"rl_module": bad, "weights_seq_no": 0})
    assert_weights(runner, before)
    assert_samples_with(runner, before)


def test_set_state__multi_agent_nan_weights_are_refused():
    config = (jaxrunner.RunnerConfig().environment("MultiAgentCartPole-v1")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda a, e: "p0" if a == "agent_0" else "p1")
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
    runner = jaxrunner.MultiAgentEnvRunner(config=config)
    state = runner.get_state(components="rl_module")
    p1 = jax.tree.map(lambda x: np.full_like(np.asarray(x), np.inf), state["rl_module"]["p1"])
    with pytest.raises(ValueError, match="rl_module weights"):
        runner.set_state({"rl_module": {"p1": p1}})
    after = runner.get_state(components="rl_module")["rl_module"]
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, state["rl_module"], after)))
    runner.sample()


def test_get_state_all__one_call_copies_the_runner_exactly():
    """`components="all"` holds weights, connector states and the carry: a fresh runner
    given it samples exactly what the original samples next (the carry alone would not:
    the fresh runner's weights and filter statistics differ)."""
    from jaxrunner.connectors.env_to_module import MeanStdFilter

    def build(seed):
        config = (make_config(num_envs=NUM_ENVS, fragment=4, hiddens=HIDDENS)
                  .env_runners(env_to_module_connector=lambda env: [MeanStdFilter()])
                  .debugging(seed=seed))
        return jaxrunner.SingleAgentEnvRunner(config=config)

    original, copy = build(0), build(1)
    for _ in range(3):
        original.sample()
    state = original.get_state(components="all")
    assert set(state) >= {"rl_module", "env_to_module_connector", "module_to_env_connector",
                          "env_runner_carry"}
    carry_only = build(1)
    carry_only.set_state({"env_runner_carry": state["env_runner_carry"]})
    copy.set_state(state)
    expected = jax.device_get(original.sample().trajectory())
    got = jax.device_get(copy.sample().trajectory())
    jax.tree.map(np.testing.assert_array_equal, expected, got)
    partial = jax.device_get(carry_only.sample().trajectory())
    assert not np.array_equal(partial.extra_model_outputs["action_dist_inputs"],
                              expected.extra_model_outputs["action_dist_inputs"])
