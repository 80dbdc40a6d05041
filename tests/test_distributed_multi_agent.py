"""An EnvRunnerGroup of MultiAgentEnvRunners on a local Ray instance: 2 remote runners on
MultiAgentCartPole-v1 (2 agents mapped to modules p0 and p1). Parallel sample(), a weight
sync of one module, metrics per agent and per module pooled over both runners' episodes,
a bad sample() argument stopped in the driver, and a killed runner restarted with its
worker_index and state. The tests share one group and run in file order."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import ray

import distributed_helpers as helpers
from jaxrunner import EnvRunnerGroup, MultiAgentEnvRunner, SampleArgumentError
from jaxrunner.distributed import init_ray
from multi_agent_helpers import whole_episodes

pytestmark = pytest.mark.ray

AGENTS = ("agent_0", "agent_1")
MODULE_OF = {"agent_0": "p0", "agent_1": "p1"}


@pytest.fixture(scope="module")
def group():
    init_ray(num_cpus=2, include_dashboard=False)  # ray.init without JAX's fork warning
    group = None
    try:
        config = (helpers.multi_agent_config(2)
                  .reporting(metrics_num_episodes_for_smoothing=2000)
                  .fault_tolerance(restart_failed_env_runners=True,
                                   delay_between_env_runner_restarts_s=0.0,
                                   env_runner_health_probe_timeout_s=120.0,
                                   env_runner_restore_timeout_s=120.0))
        group = EnvRunnerGroup(config=config, actor_options=helpers.actor_options())
        yield group
    finally:
        if group is not None:
            group.stop()
        ray.shutdown()


def remote_weights(group) -> dict[int, dict]:
    """`{worker_index: (weights_seq_no, {module_id: weights})}` from each remote runner."""
    states = group.foreach_env_runner(
        lambda r: (r.worker_index, r.get_state(components="rl_module")),
        local_env_runner=False)
    return {i: (state["weights_seq_no"], state["rl_module"]) for i, state in states}


def pooled(finished) -> dict:
    """The group metrics' episode statistics computed from whole finished episodes."""
    returns = np.array([e.get_return() for e in finished])
    lengths = np.array([len(e) for e in finished])
    agent = {a: np.mean([e.agent_episodes[a].get_return() for e in finished
                         if a in e.agent_episodes]) for a in AGENTS}
    module = {m: np.mean([sum(sa.get_return() for a, sa in e.agent_episodes.items()
                              if e.module_for(a) == m) for e in finished]) for m in ("p0", "p1")}
    return {"returns": returns, "lengths": lengths, "agent": agent, "module": module}


def agent_actions(batch) -> dict[str, np.ndarray]:
    """`{agent_id: every action it took in the batch}` (chunks where an agent had no step,
    e.g. after its pole fell, have no episode for it)."""
    return {a: np.concatenate([np.asarray(e.agent_episodes[a].actions).reshape(-1)
                               for e in batch if a in e.agent_episodes] or [np.zeros(0)])
            for a in AGENTS}


def count_agent_steps(batches) -> dict[str, int]:
    """`{agent_id: agent steps}` in the episode chunks of `batches`."""
    return {a: sum(len(e.agent_episodes[a]) for batch in batches for e in batch
                   if a in e.agent_episodes) for a in AGENTS}


def test_group__multi_agent_runners_sample_in_parallel_and_report_pooled_metrics(group):
    # Must see every episode the runners ever finished: runs first, on the fresh group.
    lifetimes = group.foreach_env_runner(lambda r: r.num_env_steps_sampled_lifetime,
                                         local_env_runner=False)
    assert lifetimes == [0, 0], "this test needs the module's group fresh: run it first"
    assert isinstance(group.local_env_runner, MultiAgentEnvRunner)
    assert group.foreach_env_runner(lambda r: type(r).__name__) == ["MultiAgentEnvRunner"] * 3

    per_runner = {1: [], 2: []}
    for _ in range(2):
        batches = group.sample(num_timesteps=96)
        assert len(batches) == 2  # one call, both runners
        for worker_index, batch in zip((1, 2), batches):
            assert batch.env_steps == 96
            for episode in batch:
                episode.validate()
                for agent in episode.agent_ids:
                    assert episode.module_for(agent) == MODULE_OF[agent]
            per_runner[worker_index].append(batch)
    # Runner 1 samples more, so the runners' windows hold different numbers of episodes.
    per_runner[1] += group.foreach_env_runner("sample", kwargs={"num_timesteps": 160},
                                              remote_worker_ids=[1], local_env_runner=False)
    # The runners' own windows, read before the group's get_metrics() (which reads them).
    windows = dict(zip((1, 2), group.foreach_env_runner("get_metrics_window",
                                                        local_env_runner=False)))
    metrics = group.get_metrics()

    finished = {}
    for worker_index, batches in per_runner.items():
        by_id, done = whole_episodes(batches)
        finished[worker_index] = [by_id[i] for i in done]
    everything = finished[1] + finished[2]
    assert len(finished[1]) != len(finished[2]) and len(finished[2]) > 0
    expected = pooled(everything)
    assert metrics["num_episodes"] == len(everything)
    assert metrics["num_env_steps_sampled"] == 2 * 2 * 96 + 160
    assert metrics["episode_return_mean"] == pytest.approx(expected["returns"].mean(), rel=1e-6)
    assert metrics["episode_len_mean"] == pytest.approx(expected["lengths"].mean(), rel=1e-6)
    assert set(metrics["agent_episode_return_mean"]) == set(AGENTS)
    assert set(metrics["module_episode_return_mean"]) == {"p0", "p1"}
    for agent in AGENTS:
        assert metrics["agent_episode_return_mean"][agent] == pytest.approx(
            expected["agent"][agent], rel=1e-6)
        # The same, from the runners' own per-agent windows pooled.
        pooled_window = np.concatenate([windows[i]["agent_episode_return"][agent]
                                        for i in (1, 2)])
        assert len(pooled_window) == len(everything)
        assert metrics["agent_episode_return_mean"][agent] == pytest.approx(
            pooled_window.mean(), rel=1e-9)
    for module_id in ("p0", "p1"):
        assert metrics["module_episode_return_mean"][module_id] == pytest.approx(
            expected["module"][module_id], rel=1e-6)
        pooled_window = np.concatenate([windows[i]["module_episode_return"][module_id]
                                        for i in (1, 2)])
        assert metrics["module_episode_return_mean"][module_id] == pytest.approx(
            pooled_window.mean(), rel=1e-9)
    # Pooled, not a mean of the two runners' means.
    mean_of_means = np.mean([np.mean(windows[i]["agent_episode_return"]["agent_0"])
                             for i in (1, 2)])
    pooled_mean = metrics["agent_episode_return_mean"]["agent_0"]
    assert pooled_mean != pytest.approx(mean_of_means, rel=1e-9)
    # Counters: the agent steps in the returned episodes, each agent to its own module.
    agent_steps = count_agent_steps([b for batches in per_runner.values() for b in batches])
    assert metrics["num_agent_steps_sampled"] == agent_steps
    assert metrics["num_module_steps_sampled"] == {MODULE_OF[a]: n
                                                   for a, n in agent_steps.items()}
    assert metrics["num_agent_steps_sampled_lifetime"] == agent_steps
    more = count_agent_steps(group.sample(num_timesteps=32))
    again = group.get_metrics()
    assert again["num_agent_steps_sampled"] == more
    # Lifetime counters add over calls.
    assert again["num_agent_steps_sampled_lifetime"] == {a: agent_steps[a] + more[a]
                                                         for a in AGENTS}
    assert again["num_module_steps_sampled_lifetime"] == {
        MODULE_OF[a]: agent_steps[a] + more[a] for a in AGENTS}
    assert again["num_env_steps_sampled_lifetime"] == 2 * 2 * 96 + 160 + 64


def test_sync_weights__of_one_module_changes_only_that_module_on_the_remotes(group):
    before = remote_weights(group)
    base = helpers.params_of(group.local_env_runner)
    forced = helpers.forcing_action(base["p0"], 1)
    seq = group.sync_weights({"p0": forced})
    after = remote_weights(group)
    for worker_index in (1, 2):
        seq_no, weights = after[worker_index]
        assert seq_no == seq
        helpers.assert_same_tree(weights["p0"], forced)
        helpers.assert_same_tree(weights["p1"], before[worker_index][1]["p1"])
        with pytest.raises(AssertionError):  # p0 did change
            helpers.assert_same_tree(weights["p0"], before[worker_index][1]["p0"])
    for batch in group.sample(num_timesteps=32):
        assert batch.weights_seq_no == seq
        actions = agent_actions(batch)
        assert len(actions["agent_0"]) > 0 and np.all(actions["agent_0"] == 1)
        assert set(np.unique(actions["agent_1"])) == {0, 1}  # p1 still samples both


def test_sample__bad_arguments_raise_in_the_driver_without_a_remote_call(group, monkeypatch):
    calls = []
    for name in ("call", "submit_async", "submit_later"):
        original = getattr(group._manager, name)

        def record(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(group._manager, name, record)
    with pytest.raises(SampleArgumentError, match="not both"):
        group.sample(num_timesteps=8, num_episodes=1)
    with pytest.raises(SampleArgumentError, match="num_episodes must be >= 0"):
        group.sample(num_episodes=-1)
    with pytest.raises(SampleArgumentError, match="explore must be True, False or None"):
        group.sample(num_timesteps=8, explore="yes")
    assert calls == []
    assert len(group.sample(num_timesteps=8)) == 2  # the group is fine afterwards
    assert calls == ["call"]


def test_killed_runner__restarted_with_its_worker_index_and_state(group):
    # Runs last: it kills runner 2 (Ray restarts it).
    seq = group.weights_seq_no
    assert seq > 0, "runs after the weight sync test"
    expected = helpers.params_of(group.local_env_runner)
    group.get_metrics()  # the group learns runner 2's lifetime step count
    (lifetime,) = group.foreach_env_runner(lambda r: r.num_env_steps_sampled_lifetime,
                                           remote_worker_ids=[2], local_env_runner=False)
    assert lifetime > 0
    old_pid = group.get_node_info()[2]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.kill(old_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    batches = group.sample(num_timesteps=32)  # runner 2 fails (or is not restored yet)
    assert len(batches) in (1, 2)
    restored = group.probe_unhealthy_env_runners()
    assert 2 in restored and group.healthy_env_runner_ids() == [1, 2]
    info = group.get_node_info()[2]
    assert info["worker_index"] == 2 and info["pid"] != old_pid and info["restarted"] is True
    seq_no, weights = remote_weights(group)[2]
    assert seq_no == seq
    assert group.foreach_env_runner(lambda r: r.num_env_steps_sampled_lifetime,
                                    remote_worker_ids=[2], local_env_runner=False) == [lifetime]
    for module_id in ("p0", "p1"):  # every module, though the last sync sent p0 only
        helpers.assert_same_tree(weights[module_id], expected[module_id])
    batches = group.sample(num_timesteps=32)
    assert len(batches) == 2
    for batch in batches:
        assert batch.weights_seq_no == seq
        actions = agent_actions(batch)
        assert len(actions["agent_0"]) > 0 and np.all(actions["agent_0"] == 1)
    metrics = group.get_metrics()
    assert metrics["fault_tolerance"]["num_remote_worker_restarts"] == 1
    assert metrics["fault_tolerance"]["num_healthy_workers"] == 2
