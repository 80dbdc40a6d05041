"""EnvRunnerGroup pieces that need no Ray instance: the `num_env_runners=0` group, batch
pickling, metric merging, actor options and the fault policy of the actor manager."""

from __future__ import annotations

import pickle

import jax
import numpy as np
import pytest
import ray
from ray.exceptions import ActorDiedError, RayTaskError

import jaxrunner
from jaxrunner import EnvRunnerGroup, StateStructureError
from jaxrunner.distributed import actor_manager
from jaxrunner.distributed.actor_manager import (
    EnvRunnerFailedError,
    FaultPolicy,
    FaultTolerantActorManager,
    RunnerSlot,
)
from jaxrunner.distributed.metrics import GroupCounters, aggregate, merge_windows
from jaxrunner.distributed.sample_args import check_sample_args
from jaxrunner.distributed.remote_runner import RunnerNotRestoredError, actor_options

from distributed_helpers import forcing_action


def small_config(**env_runners) -> jaxrunner.RunnerConfig:
    return (jaxrunner.RunnerConfig()
            .environment("CartPole-v1")
            .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=16, **env_runners)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))


@pytest.fixture(scope="module")
def local_group():
    group = EnvRunnerGroup(config=small_config(num_env_runners=0))
    yield group
    group.stop()


def test_group_without_remote_runners__runs_without_ray(local_group):
    assert not ray.is_initialized()
    local_group.get_metrics()  # start counting from here
    batches = local_group.sample(num_timesteps=100)
    assert len(batches) == 1 and batches[0].env_steps >= 100
    assert local_group.local_env_runner.worker_index == 0
    finished = [ep for ep in batches[0] if ep.is_done]
    metrics = local_group.get_metrics()
    assert metrics["num_env_steps_sampled"] == batches[0].env_steps
    assert metrics["num_episodes"] == len(finished)
    assert metrics["fault_tolerance"]["num_remote_env_runners"] == 0
    info = local_group.get_node_info()
    assert list(info) == [0] and info[0]["node_id"] is None
    assert not ray.is_initialized()


def test_group_without_remote_runners__sync_weights_changes_actions(local_group):
    weights = local_group.local_env_runner.get_state(components="rl_module")["rl_module"]
    for action in (0, 1):
        seq = local_group.sync_weights(forcing_action(weights, action))
        batch = local_group.sample(num_timesteps=40)[0]
        assert batch.weights_seq_no == seq
        assert all(np.all(ep.actions == action) for ep in batch)
    assert local_group.foreach_env_runner("weights_seq_no") == [seq]
    assert local_group.weights_seq_no == seq


def test_group__bad_input_is_a_clear_error(local_group):
    with pytest.raises(TypeError, match="RunnerConfig"):
        EnvRunnerGroup(config={"env": "CartPole-v1"})
    with pytest.raises(ValueError, match="CartPole-v1"):
        EnvRunnerGroup(config=small_config().environment("CartPol-v1"))
    with pytest.raises(ValueError, match="No env is configured"):
        EnvRunnerGroup(config=jaxrunner.RunnerConfig())
    with pytest.raises(TypeError, match="EnvRunner subclass"):
        EnvRunnerGroup(config=small_config(env_runner_cls=dict))
    with pytest.raises(TypeError, match="actor_options"):
        EnvRunnerGroup(config=small_config(), actor_options=[("num_cpus", 1)])
    with pytest.raises(AttributeError, match="get_metrics"):
        local_group.foreach_env_runner("get_metric")
    with pytest.raises(ValueError, match="timeout_seconds"):
        local_group.sample(timeout_seconds=-1)
    with pytest.raises(ValueError, match="weights_seq_no"):
        local_group.sync_weights(weights_seq_no=-3)
    with pytest.raises(ValueError, match="unknown remote worker ids"):
        local_group.sync_weights(to_worker_indices=[1])
    with pytest.raises(StateStructureError):
        local_group.sync_weights({"pi": {"Dense_0": {"kernel": np.zeros((3, 3))}}})
    with pytest.raises(jaxrunner.SampleArgumentError):
        local_group.sample(num_timesteps=10, num_episodes=1)
    # Nothing above left the group unusable.
    assert local_group.sample(num_timesteps=8)[0].env_steps >= 8
    assert not ray.is_initialized()


def test_group__of_multi_agent_runners_takes_jaxmarl_ids():
    pytest.importorskip("jaxmarl")
    config = (jaxrunner.RunnerConfig().environment("jaxmarl/MPE_simple_spread_v3")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=30)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .multi_agent(policies={"shared"}).debugging(seed=0))
    with EnvRunnerGroup(config=config) as group:
        assert isinstance(group.local_env_runner, jaxrunner.MultiAgentEnvRunner)
        (batch,) = group.sample()
        assert sum(len(e) for e in batch) == 60
        metrics = group.get_metrics()
        assert set(metrics["agent_episode_return_mean"]) == {"agent_0", "agent_1", "agent_2"}
        assert metrics["module_episode_return_mean"].keys() == {"shared"}
        assert metrics["num_module_steps_sampled_lifetime"] == {
            "shared": sum(e.agent_steps() for e in batch)}


def test_group__stop_is_idempotent():
    group = EnvRunnerGroup(config=small_config())
    group.stop()
    group.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        group.sample()


def test_episode_batch__pickles_as_host_numpy_with_every_array_once():
    runner = jaxrunner.SingleAgentEnvRunner(config=small_config())
    batch = runner.sample(num_timesteps=300)
    assert not batch.is_on_host
    episodes = [(ep.id_, ep.observations.copy(), ep.actions.copy(), ep.get_return())
                for ep in batch]  # builds the host views, which must not be pickled
    host = batch.to_numpy()
    assert host.is_on_host and host.to_numpy() is host
    array_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(host._fields())
                      if isinstance(leaf, np.ndarray))
    buffers = []
    data = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    out_of_band = sum(memoryview(b).nbytes for b in buffers)
    # Every array travels out of band exactly once (no second copy, no episode views).
    assert array_bytes <= out_of_band <= array_bytes + 1024
    assert len(data) < 16_384
    restored = pickle.loads(data, buffers=buffers)
    assert restored.is_on_host and restored.env_steps == batch.env_steps
    assert len(restored) == len(episodes)
    for ep, (id_, obs, actions, ret) in zip(restored, episodes):
        ep.validate()
        assert ep.id_ == id_ and ep.get_return() == ret
        np.testing.assert_array_equal(ep.observations, obs)
        np.testing.assert_array_equal(ep.actions, actions)


def test_aggregate__episode_means_over_all_runners_episodes():
    window_a = {"episode_return": np.array([10.0, 20.0, 30.0]),
                "episode_len": np.array([10, 20, 30]),
                "episode_duration_sec": np.array([1.0, 2.0, 3.0])}
    window_b = {"episode_return": np.array([100.0]), "episode_len": np.array([5]),
                "episode_duration_sec": np.array([0.5])}
    metrics_a = {"num_env_steps_sampled": 64, "num_episodes": 3, "sample": 1.0,
                 "num_env_steps_discarded": 2, "weights_seq_no": 4,
                 "num_agent_steps_sampled": {"default_agent": 64}}
    metrics_b = {"num_env_steps_sampled": 32, "num_episodes": 1, "sample": 3.0,
                 "num_env_steps_discarded": 0, "weights_seq_no": 3,
                 "num_agent_steps_sampled": {"default_agent": 32}}
    counters = GroupCounters()
    out = aggregate([(metrics_a, window_a), (metrics_b, window_b)], counters)
    assert out["episode_return_mean"] == pytest.approx(160.0 / 4)  # not (20 + 100) / 2
    assert out["episode_len_mean"] == pytest.approx(65 / 4)
    assert (out["episode_return_min"], out["episode_return_max"]) == (10.0, 100.0)
    assert (out["episode_len_min"], out["episode_len_max"]) == (5, 30)
    assert out["episode_duration_sec_mean"] == pytest.approx(6.5 / 4)
    assert out["num_env_steps_sampled"] == 96 and out["num_episodes"] == 4
    assert out["num_agent_steps_sampled"] == {"default_agent": 96}
    assert out["sample"] == pytest.approx(2.0) and out["weights_seq_no"] == 4
    again = aggregate([(metrics_a, window_a)], counters)
    assert again["num_env_steps_sampled_lifetime"] == 160
    assert again["num_episodes_lifetime"] == 7
    assert again["num_env_steps_discarded_lifetime"] == 4
    empty = aggregate([({"num_env_steps_sampled": 0, "num_episodes": 0},
                        {k: v[:0] for k, v in window_b.items()})], GroupCounters())
    assert "episode_return_mean" not in empty


def _ma_window(returns, agents: dict, modules: dict) -> dict:
    returns = np.asarray(returns, np.float64)
    return {"episode_return": returns, "episode_len": np.full(len(returns), 10),
            "episode_duration_sec": np.full(len(returns), 0.1),
            "agent_episode_return": {k: np.asarray(v, np.float64) for k, v in agents.items()},
            "module_episode_return": {k: np.asarray(v, np.float64)
                                      for k, v in modules.items()}}


def test_aggregate__per_agent_and_per_module_means_pool_all_runners_episodes():
    # Runner a: 3 episodes of a0 (p0), 1 of a1 (p1); runner b: 1 of a0, none of a1, and
    # an agent a2 (also p1) only it has. Means are over pooled episodes.
    window_a = _ma_window([3.0, 6.0, 9.0], {"a0": [1.0, 2.0, 3.0], "a1": [2.0]},
                          {"p0": [1.0, 2.0, 3.0], "p1": [2.0]})
    window_b = _ma_window([40.0], {"a0": [10.0], "a1": [], "a2": [30.0]},
                          {"p0": [10.0], "p1": [30.0]})
    metrics_a = {"num_env_steps_sampled": 30, "num_episodes": 3,
                 "num_agent_steps_sampled": {"a0": 30, "a1": 12},
                 "num_module_steps_sampled": {"p0": 30, "p1": 12}}
    metrics_b = {"num_env_steps_sampled": 10, "num_episodes": 1,
                 "num_agent_steps_sampled": {"a0": 10, "a1": 0, "a2": 10},
                 "num_module_steps_sampled": {"p0": 10, "p1": 10}}
    counters = GroupCounters()
    out = aggregate([(metrics_a, window_a), (metrics_b, window_b)], counters)
    assert out["agent_episode_return_mean"] == pytest.approx(
        {"a0": 16.0 / 4, "a1": 2.0, "a2": 30.0})  # not ((2 + 10) / 2) for a0
    assert out["module_episode_return_mean"] == pytest.approx({"p0": 16.0 / 4, "p1": 16.0})
    assert out["episode_return_mean"] == pytest.approx(58.0 / 4)
    assert out["num_agent_steps_sampled"] == {"a0": 40, "a1": 12, "a2": 10}
    assert out["num_module_steps_sampled"] == {"p0": 40, "p1": 22}
    assert out["num_agent_steps_sampled_lifetime"] == {"a0": 40, "a1": 12, "a2": 10}
    again = aggregate([(metrics_b, window_b)], counters)  # lifetime counters add up
    assert again["num_agent_steps_sampled_lifetime"] == {"a0": 50, "a1": 12, "a2": 20}
    assert again["num_module_steps_sampled_lifetime"] == {"p0": 50, "p1": 32}
    assert again["agent_episode_return_mean"] == pytest.approx({"a0": 10.0, "a2": 30.0})
    # No episode at all: no per-id means (as a runner reports it), counters still there.
    empty = _ma_window([], {"a0": []}, {"p0": []})
    none = aggregate([({"num_env_steps_sampled": 0, "num_episodes": 0,
                        "num_agent_steps_sampled": {"a0": 0}}, empty)], GroupCounters())
    assert "agent_episode_return_mean" not in none
    assert "module_episode_return_mean" not in none
    assert none["num_agent_steps_sampled"] == {"a0": 0}


def test_merge_windows__single_agent_windows_have_no_per_id_entries():
    window = {"episode_return": np.array([1.0]), "episode_len": np.array([2]),
              "episode_duration_sec": np.array([0.5])}
    merged = merge_windows([window, window])
    assert set(merged) == {"episode_return", "episode_len", "episode_duration_sec"}
    np.testing.assert_array_equal(merged["episode_len"], [2, 2])
    out = aggregate([({"num_env_steps_sampled": 4, "num_episodes": 1,
                       "num_agent_steps_sampled": {"default_agent": 4},
                       "num_module_steps_sampled": {"default_policy": 4}}, window)],
                    GroupCounters())
    assert out["agent_episode_return_mean"] == {"default_agent": 1.0}
    assert out["module_episode_return_mean"] == {"default_policy": 1.0}
    assert out["num_agent_steps_sampled_lifetime"] == {"default_agent": 4}
    assert out["num_module_steps_sampled_lifetime"] == {"default_policy": 4}


BAD_SAMPLE_ARGS = [
    dict(num_timesteps=8, num_episodes=1),
    dict(num_timesteps=-1),
    dict(num_episodes=2.0),
    dict(num_timesteps=True),
    dict(num_timesteps=8, explore="yes"),
    dict(num_timesteps=8, random_actions=1),
    dict(num_timesteps=8, force_reset=None),
]


@pytest.mark.parametrize("kwargs", BAD_SAMPLE_ARGS)
def test_check_sample_args__same_error_as_the_runner(local_group, kwargs):
    with pytest.raises(jaxrunner.SampleArgumentError) as in_driver:
        check_sample_args(**kwargs)
    with pytest.raises(jaxrunner.SampleArgumentError) as in_runner:
        local_group.local_env_runner.sample(**kwargs)
    assert str(in_driver.value) == str(in_runner.value)
    assert isinstance(in_driver.value, ValueError) and isinstance(in_driver.value, AssertionError)


def test_check_sample_args__accepts_what_the_runner_accepts():
    for kwargs in (dict(), dict(num_timesteps=0), dict(num_episodes=np.int64(3)),
                   dict(num_timesteps=5, explore=False, random_actions=True,
                        force_reset=True)):
        assert check_sample_args(**kwargs) is None


def test_actor_options__jax_platform_memory_flags_and_restarts(monkeypatch):
    # Without a compilation cache in the driver (the test run has one: tests/conftest.py).
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        monkeypatch.delenv(name, raising=False)
    options = actor_options(small_config(num_cpus_per_env_runner=2))
    assert options["num_cpus"] == 2 and options["num_gpus"] == 0
    assert options["runtime_env"]["env_vars"] == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": "cpu"}
    assert options["max_restarts"] == 1000 and options["max_task_retries"] == 0
    gpu = actor_options(small_config(num_gpus_per_env_runner=0.5),
                        {"runtime_env": {"env_vars": {"JAX_COMPILATION_CACHE_DIR": "/c"}},
                         "scheduling_strategy": "DEFAULT"})
    assert gpu["runtime_env"]["env_vars"]["JAX_PLATFORMS"] == "cuda"
    assert gpu["runtime_env"]["env_vars"]["JAX_COMPILATION_CACHE_DIR"] == "/c"
    assert gpu["scheduling_strategy"] == "DEFAULT" and gpu["num_gpus"] == 0.5
    off = actor_options(small_config().fault_tolerance(restart_failed_env_runners=False))
    assert off["max_restarts"] == 0


def test_actor_options__pass_on_the_drivers_compilation_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert "JAX_COMPILATION_CACHE_DIR" not in actor_options(small_config())[
        "runtime_env"]["env_vars"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    env_vars = actor_options(small_config())["runtime_env"]["env_vars"]
    assert env_vars["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
    assert env_vars["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"


def test_group__gymnasium_ids_are_accepted_and_checked():
    with pytest.raises(ValueError, match="Unknown gymnasium env id 'CartPol-v1'"):
        EnvRunnerGroup(config=small_config().environment("gymnasium:CartPol-v1"))
    group = EnvRunnerGroup(config=small_config().environment("gymnasium:CartPole-v1"))
    try:
        batch = group.sample(num_timesteps=20)[0]
        assert batch.env_steps >= 20
        assert group.get_metrics()["num_env_steps_sampled"] == batch.env_steps
    finally:
        group.stop()


class _FakeActor:
    def __init__(self):
        self.exit_requests = []

    @property
    def exit_after(self):
        actor = self

        class _Method:
            @staticmethod
            def remote(delay):
                actor.exit_requests.append(delay)
        return _Method


def _manager(monkeypatch, **policy):
    killed = []
    monkeypatch.setattr(actor_manager.ray, "kill", lambda actor, no_restart: killed.append(actor))
    defaults = dict(restart=True, ignore=False, max_restarts=1000, restart_delay_s=0.0,
                    consecutive_failures_tolerance=100, max_in_flight=1)
    manager = FaultTolerantActorManager(
        [RunnerSlot(1, _FakeActor()), RunnerSlot(2, _FakeActor())],
        FaultPolicy(**{**defaults, **policy}))
    return manager, killed


def test_fault_policy__no_restart_no_ignore_raises_a_clear_error(monkeypatch):
    manager, killed = _manager(monkeypatch, restart=False)
    manager.book_failure(1, ActorDiedError())
    assert manager.healthy_ids() == [2] and manager.slots[1].dead and len(killed) == 1
    with pytest.raises(EnvRunnerFailedError, match="restart_failed_env_runners=True"):
        manager.raise_booked_errors()


def test_fault_policy__ignore_failures_carries_on_with_the_healthy(monkeypatch):
    manager, _ = _manager(monkeypatch, restart=False, ignore=True)
    manager.book_failure(2, ActorDiedError())
    manager.raise_booked_errors()  # nothing to raise
    assert manager.healthy_ids() == [1] and manager.restorable_ids() == []
    assert manager.num_failures == 1


def test_fault_policy__restarts_until_the_limit(monkeypatch):
    manager, _ = _manager(monkeypatch, max_restarts=1, restart_delay_s=7.0)
    app_error = RayTaskError("sample", "traceback", RuntimeError("env exploded"))
    manager.book_failure(1, app_error)
    assert manager.slots[1].actor.exit_requests == [7.0]  # restart after the delay
    manager.raise_booked_errors()
    assert manager.restorable_ids() == [1]
    manager.mark_restored(1)
    assert manager.healthy_ids() == [1, 2] and manager.num_restarts == 1
    manager.book_failure(1, ActorDiedError())
    with pytest.raises(EnvRunnerFailedError, match="max_num_env_runner_restarts=1"):
        manager.raise_booked_errors()
    assert manager.slots[1].dead


def test_fault_policy__consecutive_failures_tolerance(monkeypatch):
    manager, _ = _manager(monkeypatch, consecutive_failures_tolerance=2)
    for _ in range(2):
        manager.book_failure(2, ActorDiedError())
        manager.raise_booked_errors()
        manager.mark_restored(2)
    manager.book_failure(2, ActorDiedError())
    with pytest.raises(EnvRunnerFailedError, match="3 times in a row"):
        manager.raise_booked_errors()


def test_fault_policy__error_kinds():
    assert actor_manager.classify(ActorDiedError()) == "died"
    assert actor_manager.classify(
        RayTaskError("sample", "tb", jaxrunner.SampleArgumentError("both sizes"))) == "user"
    assert actor_manager.classify(
        RayTaskError("sample", "tb", RunnerNotRestoredError("not yet"))) == "restarted"
    assert actor_manager.classify(RayTaskError("sample", "tb", RuntimeError("x"))) == "app"
