"""RunnerConfig: RLlib's names and defaults, validation at set time, copy/freeze."""

from __future__ import annotations

import inspect
import pickle

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner
from jaxrunner.config import SETTINGS, NotProvided
from jaxrunner.modules.rl_module import DEFAULT_MLP_MODEL_CONFIG_KEYS

pytestmark = pytest.mark.usefixtures("fast_compiles")

# RLlib AlgorithmConfig defaults (reference spec §8).
RLLIB_DEFAULTS = {
    "env": None,
    "env_config": {},
    "normalize_actions": True,
    "clip_actions": False,
    "disable_env_checking": False,
    "env_runner_cls": None,
    "num_env_runners": 0,
    "create_env_on_local_worker": False,
    "gym_env_vectorize_mode": "sync",  # RLlib's AlgorithmConfig defaults
    "remote_worker_envs": False,
    "num_envs_per_env_runner": 1,
    "num_cpus_per_env_runner": 1,
    "num_gpus_per_env_runner": 0,
    "sample_timeout_s": 60.0,
    "max_requests_in_flight_per_env_runner": 1,
    "env_to_module_connector": None,
    "module_to_env_connector": None,
    "add_default_connectors_to_env_to_module_pipeline": True,
    "add_default_connectors_to_module_to_env_pipeline": True,
    "episode_lookback_horizon": 1,
    "merge_env_runner_states": "training_only",
    "broadcast_env_runner_states": True,
    "rollout_fragment_length": 200,
    "batch_mode": "truncate_episodes",
    "explore": True,
    "episodes_to_numpy": True,
    "policies": {"default_policy"},
    "policies_to_train": None,
    "count_steps_by": "env_steps",
    "restart_failed_env_runners": True,
    "ignore_env_runner_failures": False,
    "max_num_env_runner_restarts": 1000,
    "delay_between_env_runner_restarts_s": 60.0,
    "restart_failed_sub_environments": False,
    "num_consecutive_env_runner_failures_tolerance": 100,
    "env_runner_health_probe_timeout_s": 30.0,
    "env_runner_restore_timeout_s": 1800.0,
    "metrics_num_episodes_for_smoothing": 100,
    "seed": None,
    "in_evaluation": False,
}


def test_config__rllib_defaults():
    config = jaxrunner.RunnerConfig()
    actual = {name: getattr(config, name) for name in RLLIB_DEFAULTS}
    assert actual == RLLIB_DEFAULTS
    assert config.to_dict()["rollout_fragment_length"] == 200


def test_config__defaults_are_not_shared_between_instances():
    a, b = jaxrunner.RunnerConfig(), jaxrunner.RunnerConfig()
    a.env_config["x"] = 1
    a.policies.add("other")
    assert b.env_config == {}
    assert b.policies == {"default_policy"}


def test_config__builders_chain_and_set_values():
    config = (jaxrunner.RunnerConfig()
              .environment("CartPole-v1", env_config={"a": 1})
              .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=16,
                           batch_mode="complete_episodes", explore=False)
              .reporting(metrics_num_episodes_for_smoothing=7)
              .debugging(seed=3))
    assert (config.env, config.env_config, config.num_envs_per_env_runner,
            config.rollout_fragment_length, config.batch_mode, config.explore,
            config.metrics_num_episodes_for_smoothing, config.seed) == (
        "CartPole-v1", {"a": 1}, 8, 16, "complete_episodes", False, 7, 3)


# (builder, kwargs, exception type, words the message must contain)
BAD_VALUES = [
    ("env_runners", {"num_envs_per_env_runner": 0}, ValueError, ["num_envs_per_env_runner", "1"]),
    ("env_runners", {"num_envs_per_env_runner": -3}, ValueError, ["num_envs_per_env_runner"]),
    ("env_runners", {"num_envs_per_env_runner": 2.0}, TypeError, ["num_envs_per_env_runner", "int"]),
    ("env_runners", {"num_envs_per_env_runner": True}, TypeError, ["num_envs_per_env_runner"]),
    ("env_runners", {"rollout_fragment_length": 0}, ValueError, ["rollout_fragment_length"]),
    ("env_runners", {"rollout_fragment_length": "full"}, TypeError, ["rollout_fragment_length"]),
    ("env_runners", {"batch_mode": "truncate"}, ValueError, ["batch_mode", "truncate_episodes"]),
    ("env_runners", {"explore": "yes"}, TypeError, ["explore"]),
    ("env_runners", {"episode_lookback_horizon": -1}, ValueError, ["episode_lookback_horizon"]),
    ("env_runners", {"num_env_runners": -1}, ValueError, ["num_env_runners"]),
    ("env_runners", {"num_gpus_per_env_runner": -0.5}, ValueError, ["num_gpus_per_env_runner"]),
    ("env_runners", {"merge_env_runner_states": "always"}, ValueError,
     ["merge_env_runner_states"]),
    ("env_runners", {"max_chunk_length": 0}, ValueError, ["max_chunk_length"]),
    ("env_runners", {"env_to_module_connector": 5}, TypeError, ["env_to_module_connector"]),
    ("environment", {"env": 3}, TypeError, ["env", "int"]),
    ("environment", {"env_config": [("a", 1)]}, TypeError, ["env_config", "dict"]),
    ("environment", {"clip_actions": 1}, TypeError, ["clip_actions"]),
    ("multi_agent", {"count_steps_by": "steps"}, ValueError, ["count_steps_by", "env_steps"]),
    ("multi_agent", {"policies": set()}, ValueError, ["policies"]),
    ("multi_agent", {"policies": "default_policy"}, TypeError, ["policies"]),
    ("fault_tolerance", {"restart_failed_sub_environments": 1}, TypeError,
     ["restart_failed_sub_environments"]),
    ("fault_tolerance", {"max_num_env_runner_restarts": -1}, ValueError,
     ["max_num_env_runner_restarts"]),
    ("reporting", {"metrics_num_episodes_for_smoothing": 0}, ValueError,
     ["metrics_num_episodes_for_smoothing"]),
    ("debugging", {"seed": -1}, ValueError, ["seed"]),
    ("debugging", {"seed": 1.5}, TypeError, ["seed"]),
    ("rl_module", {"model_config": {"fcnet_hiddens": [0]}}, ValueError, ["fcnet_hiddens"]),
    ("rl_module", {"model_config": {"fcnet_hiddens": 64}}, ValueError, ["fcnet_hiddens"]),
    ("rl_module", {"model_config": {"fcnet_activation": "sigmoidal"}}, ValueError,
     ["fcnet_activation"]),
    ("training", {"train_batch_size_per_learner": 0}, ValueError,
     ["train_batch_size_per_learner"]),
    ("env_runners", {"merge_env_runner_states": 1}, ValueError, ["merge_env_runner_states"]),
    ("env_runners", {"sample_timeout_s": float("nan")}, ValueError, ["sample_timeout_s"]),
    ("env_runners", {"num_envs_per_env_runner": np.float64(2.0)}, TypeError,
     ["num_envs_per_env_runner", "int", "float64"]),
    ("env_runners", {"num_envs_per_env_runner": np.bool_(True)}, TypeError,
     ["num_envs_per_env_runner", "int"]),
    ("env_runners", {"num_cpus_per_env_runner": np.bool_(True)}, TypeError,
     ["num_cpus_per_env_runner", "number"]),
    ("debugging", {"seed": np.int64(-1)}, ValueError, ["seed"]),
    ("rl_module", {"model_config": {"fcnet_hiddens": [8, np.float32(4)]}}, ValueError,
     ["fcnet_hiddens"]),
    ("rl_module", {"model_config": [("fcnet_hiddens", [8])]}, TypeError, ["model_config"]),
    ("rl_module", {"rl_module_spec": 5}, TypeError, ["rl_module_spec", "RLModuleSpec"]),
    ("rl_module", {"rl_module_spec": {"p0": 5}}, TypeError, ["rl_module_spec", "p0"]),
    ("multi_agent", {"policies": {"p0": 5}}, TypeError, ["policies", "p0", "RLModuleSpec"]),
    ("multi_agent", {"policies": {"p0", 3}}, TypeError, ["policies", "3"]),
    ("multi_agent", {"policy_mapping_fn": "p0"}, TypeError, ["policy_mapping_fn"]),
]


@pytest.mark.parametrize("builder, kwargs, error, words", BAD_VALUES,
                         ids=[f"{b}-{next(iter(k))}-{e.__name__}" for b, k, e, _ in BAD_VALUES])
def test_config__setter_validates_at_once(builder, kwargs, error, words):
    config = jaxrunner.RunnerConfig()
    before = config.to_dict()
    with pytest.raises(error) as info:
        getattr(config, builder)(**kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} missing from {message!r}"
    # A rejected call changes nothing.
    assert config.to_dict() == before


def test_config__rejected_call_changes_no_other_setting_of_the_same_call():
    config = jaxrunner.RunnerConfig()
    with pytest.raises(ValueError):
        config.env_runners(rollout_fragment_length=50, num_envs_per_env_runner=0)
    assert config.rollout_fragment_length == 200
    assert config.num_envs_per_env_runner == 1


def test_config__attribute_assignment_is_validated():
    config = jaxrunner.RunnerConfig()
    with pytest.raises(ValueError, match="num_envs_per_env_runner"):
        config.num_envs_per_env_runner = 0
    config.num_envs_per_env_runner = 4
    assert config.num_envs_per_env_runner == 4
    with pytest.raises(ValueError, match="batch_mode"):
        config.batch_mode = "whole"


def test_config__auto_fragment_length_is_accepted():
    config = jaxrunner.RunnerConfig().env_runners(rollout_fragment_length="auto")
    assert config.rollout_fragment_length == "auto"


@pytest.mark.parametrize("misspelled, expected", [
    ("num_envs_per_runner", "num_envs_per_env_runner"),
    ("rollout_fragment_lenght", "rollout_fragment_length"),
    ("batchmode", "batch_mode"),
])
def test_config__unknown_attribute_get_names_close_match(misspelled, expected):
    config = jaxrunner.RunnerConfig()
    with pytest.raises(AttributeError) as info:
        getattr(config, misspelled)
    assert misspelled in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("misspelled, expected", [
    ("num_envs_per_runner", "num_envs_per_env_runner"),
    ("episode_lookback_horizn", "episode_lookback_horizon"),
])
def test_config__unknown_attribute_set_names_close_match(misspelled, expected):
    config = jaxrunner.RunnerConfig()
    with pytest.raises(AttributeError) as info:
        setattr(config, misspelled, 4)
    assert misspelled in str(info.value) and expected in str(info.value)
    assert not hasattr(config, misspelled)


def test_config__update_from_dict_unknown_key_names_close_match():
    config = jaxrunner.RunnerConfig()
    with pytest.raises(AttributeError) as info:
        config.update_from_dict({"rollout_fragment_lenght": 5})
    assert "rollout_fragment_length" in str(info.value)


def test_config__update_from_dict_validates_and_sets():
    config = jaxrunner.RunnerConfig().update_from_dict(
        {"num_envs_per_env_runner": 3, "seed": 5, "metrics_num_episodes_for_smoothing": 9,
         "restart_failed_sub_environments": True})
    assert (config.num_envs_per_env_runner, config.seed,
            config.metrics_num_episodes_for_smoothing,
            config.restart_failed_sub_environments) == (3, 5, 9, True)
    with pytest.raises(ValueError, match="num_envs_per_env_runner"):
        config.update_from_dict({"num_envs_per_env_runner": 0})
    assert config.num_envs_per_env_runner == 3


def test_config__copy_is_independent():
    original = (jaxrunner.RunnerConfig().environment("CartPole-v1", env_config={"a": [1]})
                .rl_module(model_config={"fcnet_hiddens": [8]}))
    clone = original.copy()
    clone.env_config["a"].append(2)
    clone.env_config["b"] = 3
    clone.model_config["fcnet_hiddens"].append(4)
    clone.env_runners(num_envs_per_env_runner=9)
    clone.policies.add("other")
    assert original.env_config == {"a": [1]}
    assert original.model_config == {"fcnet_hiddens": [8]}
    assert original.num_envs_per_env_runner == 1
    assert original.policies == {"default_policy"}
    assert clone.num_envs_per_env_runner == 9


def test_config__freeze_makes_read_only_and_copy_unfreezes():
    config = jaxrunner.RunnerConfig().env_runners(num_envs_per_env_runner=2).freeze()
    assert config.is_frozen
    with pytest.raises(RuntimeError, match="frozen"):
        config.env_runners(num_envs_per_env_runner=3)
    with pytest.raises(RuntimeError, match="frozen"):
        config.num_envs_per_env_runner = 3
    with pytest.raises(RuntimeError, match="frozen"):
        config.update_from_dict({"seed": 1})
    assert config.num_envs_per_env_runner == 2  # reading still works
    editable = config.copy()
    assert not editable.is_frozen
    editable.env_runners(num_envs_per_env_runner=3)
    assert editable.num_envs_per_env_runner == 3
    assert config.num_envs_per_env_runner == 2
    assert config.copy(copy_frozen=True).is_frozen


def test_config__runner_keeps_its_own_unfrozen_copy(cartpole_config):
    config = cartpole_config().freeze()
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    assert not runner.config.is_frozen
    assert runner.config is not config
    runner.config.env_runners(explore=False)
    assert config.explore is True


@pytest.mark.parametrize("policies, expected", [
    ({"default_policy"}, False),
    ({"default_policy", "other"}, True),
    ({"p0"}, True),
    (["a", "b"], True),
])
def test_config__is_multi_agent(policies, expected):
    config = jaxrunner.RunnerConfig().multi_agent(policies=policies)
    assert config.is_multi_agent is expected
    assert jaxrunner.RunnerConfig().is_multi_agent is False


def test_config__rollout_fragment_length_auto_spec_example():
    # Spec §8: 4 runners x 3 envs, train batch 2500 -> runners 1-2: 209, runners 3-4: 208.
    config = (jaxrunner.RunnerConfig()
              .env_runners(num_env_runners=4, num_envs_per_env_runner=3,
                           rollout_fragment_length="auto")
              .training(train_batch_size_per_learner=2500))
    assert [config.get_rollout_fragment_length(i) for i in (1, 2, 3, 4)] == [209, 209, 208, 208]


def test_config__rollout_fragment_length_auto_divisible_and_fixed():
    config = (jaxrunner.RunnerConfig()
              .env_runners(num_env_runners=2, num_envs_per_env_runner=4,
                           rollout_fragment_length="auto")
              .training(train_batch_size_per_learner=4000, num_learners=2))
    # 4000 * 2 learners / (4 envs * 2 runners) = 1000 exactly, for every runner.
    assert {config.get_rollout_fragment_length(i) for i in (0, 1, 2)} == {1000}
    config.env_runners(rollout_fragment_length=33)
    assert config.get_rollout_fragment_length(5) == 33
    # No remote runners: the local runner takes the whole batch.
    local = (jaxrunner.RunnerConfig()
             .env_runners(num_envs_per_env_runner=8, rollout_fragment_length="auto")
             .training(train_batch_size_per_learner=4000))
    assert local.get_rollout_fragment_length(0) == 500


@pytest.mark.parametrize("smoothing, runners, window", [
    (100, 0, 100), (100, 1, 100), (100, 3, 34), (10, 4, 3), (1, 5, 1), (10, 0, 10),
])
def test_config__metrics_window_rule(smoothing, runners, window):
    config = (jaxrunner.RunnerConfig()
              .env_runners(num_env_runners=runners)
              .reporting(metrics_num_episodes_for_smoothing=smoothing))
    assert config.metrics_window == window


# ---------------------------------------------------------------------- generated from the rows
# Every setting's documented default: RLlib's (above) plus RunnerConfig's own and the
# settings whose RLlib default the spec does not list.
DOCUMENTED_DEFAULTS = {
    **RLLIB_DEFAULTS,
    "policy_mapping_fn": None,
    "train_batch_size_per_learner": 4000,
    "num_learners": 0,
    "max_chunk_length": 256,
    "autoreset_mode": "gymnax",
    "shard_envs_across_devices": True,
    "partial_reset_ratio": 16,
    "final_obs_slots_per_env": "auto",
    "steps_per_loop_check": "auto",
    "record_action_dist_inputs": True,
    "check_finite": True,
    "num_consecutive_sub_env_failures_tolerance": 100,
    "model_config": {},
    "rl_module_spec": None,
    # callbacks() (docs/callbacks.md)
    "on_environment_created": None, "on_episode_start": None, "on_episode_step": None,
    "on_episode_end": None, "on_sample_end": None, "custom_metrics": {},
}
BUILDERS = ("environment", "env_runners", "training", "fault_tolerance", "multi_agent",
            "rl_module", "reporting", "debugging", "evaluation", "callbacks")


def _settings_of(builder):
    return [name for name, setting in SETTINGS.items() if setting.builder == builder]


def test_config__every_setting_has_its_documented_default():
    config = jaxrunner.RunnerConfig()
    assert set(SETTINGS) == set(DOCUMENTED_DEFAULTS)
    assert {name: s.default for name, s in SETTINGS.items()} == DOCUMENTED_DEFAULTS
    assert config.to_dict() == DOCUMENTED_DEFAULTS
    assert repr(config) == "RunnerConfig({})"
    # The defaults pass their own checks.
    assert jaxrunner.RunnerConfig().update_from_dict(config.to_dict()).to_dict() == (
        DOCUMENTED_DEFAULTS)


@pytest.mark.parametrize("builder", BUILDERS)
def test_config__builder_signature_and_doc_list_its_settings(builder):
    method = getattr(jaxrunner.RunnerConfig, builder)
    names = _settings_of(builder)
    assert names, builder
    params = inspect.signature(method).parameters
    assert list(params) == ["self", *names]
    for name in names:
        param = params[name]
        assert param.default is NotProvided
        assert param.kind is (inspect.Parameter.POSITIONAL_OR_KEYWORD if name == "env"
                              else inspect.Parameter.KEYWORD_ONLY)
        assert f"{name}: " in method.__doc__
        assert f"Default: {DOCUMENTED_DEFAULTS[name]!r}." in " ".join(method.__doc__.split())
    # Bound methods show the same keywords, without self.
    assert list(inspect.signature(getattr(jaxrunner.RunnerConfig(), builder)).parameters) == (
        names)


@pytest.mark.parametrize("builder", BUILDERS)
def test_config__every_builder_rejects_an_unknown_keyword_with_the_close_match(builder):
    config = jaxrunner.RunnerConfig()
    before = config.to_dict()
    name = _settings_of(builder)[0]
    misspelt = name[:-2] + name[-1] + name[-2]  # last two letters swapped
    with pytest.raises(TypeError) as info:
        getattr(config, builder)(**{misspelt: DOCUMENTED_DEFAULTS[name]})
    message = str(info.value)
    assert f"{builder}()" in message and repr(misspelt) in message and repr(name) in message
    assert config.to_dict() == before


def test_config__builder_given_another_builders_setting_names_that_builder():
    config = jaxrunner.RunnerConfig()
    with pytest.raises(TypeError, match=r"config\.debugging\(seed=\.\.\.\)"):
        config.env_runners(seed=3)
    with pytest.raises(TypeError, match=r"config\.debugging\(seed=\.\.\.\)"):
        config.env_runners(sed=3)  # a near miss of another builder's setting
    with pytest.raises(TypeError, match="positionally"):
        config.env_runners(4)
    with pytest.raises(TypeError, match="both"):
        config.environment("CartPole-v1", env="Pendulum-v1")
    assert config.seed is None and config.env is None


def test_config__copy_shares_no_container_and_keeps_every_value():
    spec = jaxrunner.RLModuleSpec(model_config={"fcnet_hiddens": [4]})
    mapping = lambda agent_id, episode: "p0"  # noqa: E731
    original = (jaxrunner.RunnerConfig()
                .multi_agent(policies={"p0": spec, "p1": None}, policy_mapping_fn=mapping)
                .rl_module(rl_module_spec={"p0": spec})
                .env_runners(num_envs_per_env_runner=3))
    clone = original.copy()
    assert clone.to_dict() == original.to_dict() and not clone.is_frozen
    for name, value in original.to_dict().items():
        if isinstance(value, (dict, list, set)):
            assert getattr(clone, name) is not value, name
    assert clone.policies["p0"] is not spec  # copied with its container
    clone.policies["p0"].model_config["fcnet_hiddens"].append(8)
    assert spec.model_config == {"fcnet_hiddens": [4]}
    assert clone.policy_mapping_fn is mapping  # callables are shared, not copied
    clone.env_runners(num_envs_per_env_runner=5)
    assert original.num_envs_per_env_runner == 3


@pytest.mark.parametrize("builder", BUILDERS)
def test_config__frozen_config_refuses_every_builder_and_attribute(builder):
    config = jaxrunner.RunnerConfig().freeze()
    name = _settings_of(builder)[0]
    with pytest.raises(RuntimeError, match="frozen"):
        getattr(config, builder)(**{name: DOCUMENTED_DEFAULTS[name]})
    with pytest.raises(RuntimeError, match="frozen"):
        setattr(config, name, DOCUMENTED_DEFAULTS[name])
    assert config.to_dict() == DOCUMENTED_DEFAULTS
    assert config.copy(copy_frozen=True).is_frozen


def test_config__pickles_with_every_value():
    # Remote runners receive the config through Ray, i.e. pickled.
    config = (jaxrunner.RunnerConfig().environment("CartPole-v1", env_config={"a": 1})
              .env_runners(num_envs_per_env_runner=4).debugging(seed=2).freeze())
    restored = pickle.loads(pickle.dumps(config))
    assert restored.to_dict() == config.to_dict() and restored.is_frozen


# ---------------------------------------------------------------------- numpy scalars
INT_SETTINGS = [name for name in SETTINGS if isinstance(DOCUMENTED_DEFAULTS[name], int)
                and not isinstance(DOCUMENTED_DEFAULTS[name], bool)
                and not name.startswith("num_cpus") and not name.startswith("num_gpus")]


def test_config__int_settings_are_found():
    assert {"num_envs_per_env_runner", "rollout_fragment_length", "max_chunk_length",
            "num_env_runners", "metrics_num_episodes_for_smoothing"} <= set(INT_SETTINGS)


@pytest.mark.parametrize("name", INT_SETTINGS)
def test_config__numpy_integers_are_accepted_where_ints_are(name):
    config = jaxrunner.RunnerConfig()
    getattr(config, SETTINGS[name].builder)(**{name: np.int64(7)})
    assert getattr(config, name) == 7 and type(getattr(config, name)) is int
    config.update_from_dict({name: np.int32(5)})
    assert getattr(config, name) == 5 and type(getattr(config, name)) is int
    for bad in (np.float64(7.0), 7.0, np.bool_(True), True):
        with pytest.raises(TypeError, match=name):
            getattr(config, SETTINGS[name].builder)(**{name: bad})
    assert getattr(config, name) == 5


def test_config__numpy_scalars_elsewhere_become_python_values():
    config = (jaxrunner.RunnerConfig()
              .env_runners(num_gpus_per_env_runner=np.float32(0.5),
                           num_cpus_per_env_runner=np.int64(2), explore=np.bool_(False))
              .debugging(seed=np.uint32(3))
              .rl_module(model_config={"fcnet_hiddens": [np.int64(8), 4]}))
    values = (config.num_gpus_per_env_runner, config.num_cpus_per_env_runner, config.explore,
              config.seed, config.model_config["fcnet_hiddens"])
    assert values == (0.5, 2, False, 3, [8, 4])
    assert [type(v) for v in values[:4]] == [float, int, bool, int]
    assert [type(h) for h in values[4]] == [int, int]


# ---------------------------------------------------------------------- model_config keys
class _ScaledLinear(jaxrunner.RLModule):
    """A custom module reading a model_config key the default module does not know."""

    def init(self, key):
        return {"w": jnp.zeros((4, self.action_dist_input_dim), jnp.float32)}

    def _forward(self, params, batch):
        logits = batch["obs"].reshape(batch["obs"].shape[0], -1) @ params["w"]
        return {"action_dist_inputs": logits + self.model_config["logit_bias"]}


def test_config__default_module_rejects_unknown_model_config_key_with_close_match():
    config = jaxrunner.RunnerConfig().rl_module(model_config={"fcnet_hiddens": [8]})
    with pytest.raises(ValueError) as info:
        config.rl_module(model_config={"fcnet_hidden": [64, 64]})
    message = str(info.value)
    assert "'fcnet_hidden'" in message and "Did you mean 'fcnet_hiddens'" in message
    for key in DEFAULT_MLP_MODEL_CONFIG_KEYS:
        assert repr(key) in message
    assert config.model_config == {"fcnet_hiddens": [8]}  # unchanged
    with pytest.raises(ValueError, match="'vf_share_layers'"):
        config.model_config = {"fcnet_hiddens": [8], "vf_share_layers": True}
    # Through a spec of the default module, too.
    with pytest.raises(ValueError, match="RLModuleSpec.model_config.*fcnet_activations"):
        config.rl_module(rl_module_spec=jaxrunner.RLModuleSpec(
            model_config={"fcnet_activations": "relu"}))
    with pytest.raises(ValueError, match="fcnet_activation"):
        config.multi_agent(policies={"p0": jaxrunner.RLModuleSpec(
            module_class=jaxrunner.DefaultMLPModule, model_config={"fcnet_activation": "x"})})
    assert config.rl_module_spec is None and config.policies == {"default_policy"}


def test_config__custom_module_gets_any_model_config_keys():
    custom = jaxrunner.RLModuleSpec(module_class=_ScaledLinear)
    # In the same call, after the spec, or through a multi-agent policies spec.
    config = jaxrunner.RunnerConfig().rl_module(model_config={"logit_bias": 1.0},
                                                rl_module_spec=custom)
    config.rl_module(model_config={"logit_bias": 2.0, "fcnet_hiddens": [8]})
    assert config.model_config == {"logit_bias": 2.0, "fcnet_hiddens": [8]}
    multi = (jaxrunner.RunnerConfig()
             .multi_agent(policies={"p0": custom, "p1": None})
             .rl_module(model_config={"logit_bias": 0.5}))
    assert multi.model_config == {"logit_bias": 0.5}
    # Going back to the default module with a key it would ignore is refused.
    with pytest.raises(ValueError, match="logit_bias"):
        config.rl_module(rl_module_spec=None)
    with pytest.raises(ValueError, match="logit_bias"):
        multi.multi_agent(policies={"p0", "p1"})
    assert config.rl_module_spec is custom and multi.policies == {"p0": custom, "p1": None}


def test_config__custom_module_receives_the_config_model_config(cartpole_config):
    config = cartpole_config().rl_module(
        model_config={"logit_bias": 3.0},
        rl_module_spec=jaxrunner.RLModuleSpec(module_class=_ScaledLinear))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    assert runner.module.model_config["logit_bias"] == 3.0
    batch = runner.sample(num_timesteps=4)
    logits = np.concatenate([e.extra_model_outputs["action_dist_inputs"] for e in batch])
    np.testing.assert_allclose(logits, 3.0)


def test_config__default_module_reads_every_known_key():
    # The known keys are exactly what changes DefaultMLPModule: widths and activation.
    obs_space, act_space = gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Discrete(2)
    key, obs = jax.random.key(0), {"obs": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}

    def build(**model_config):
        module = jaxrunner.DefaultMLPModule(obs_space, act_space, model_config)
        params = module.init(key)
        return params, module.forward_inference(params, obs)["action_dist_inputs"]

    assert set(DEFAULT_MLP_MODEL_CONFIG_KEYS) == {"fcnet_hiddens", "fcnet_activation"}
    params, tanh_out = build(fcnet_hiddens=[5], fcnet_activation="tanh")
    assert params["pi"]["Dense_0"]["kernel"].shape == (3, 5)
    _, relu_out = build(fcnet_hiddens=[5], fcnet_activation="relu")
    assert not np.allclose(tanh_out, relu_out)
    default_params, _ = build()
    assert default_params["pi"]["Dense_0"]["kernel"].shape == (3, 256)
