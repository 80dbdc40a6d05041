"""RunnerConfig: RLlib's names and defaults, validation at set time, copy/freeze."""

from __future__ import annotations

import pytest

import jaxrunner

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
