"""EnvRunnerGroup with 2 remote runners on a local 2-CPU Ray instance (one instance for
the module, shut down at its end).

A group without restarts: metrics merged exactly, parallel sampling, weight sync, node
reports, object-ref batches, foreach and async calls, connector state sync, sample
timeouts, and (last) `ignore_env_runner_failures` carrying on after a runner is killed.
Concurrency and lateness are shown by the order of events and by gates the test opens
(a `CallLog` actor), never by measured durations or by sleeping past a timeout.

A group with restarts: runner processes SIGKILLed in the middle of `sample()` come back
with the same `worker_index` and the group's current weights, connector states and
lifetime counter before they sample again; no returned batch is corrupted."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np
import pytest
import ray
import ray.cloudpickle

import distributed_helpers as helpers
from jaxrunner import EnvRunnerGroup

pytestmark = pytest.mark.ray

# The functions and the actor class below run in the runner processes, which cannot import
# this test module: Ray sends them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GATE_TIMEOUT_S = 120.0  # only a guard against hanging: a passing run never waits it out


@ray.remote(num_cpus=0)
class CallLog:
    """Events in the order they reach this actor, barriers and gates.

    Runners report `("start", worker_index)` and `("finish", worker_index)` around calls;
    the test opens gates (`open`, recorded as `("open", name)`) that runners wait at. Each
    wait gives up after `timeout_s` and returns False, so a broken run fails instead of
    hanging.
    """

    def __init__(self):
        self.events: list[tuple] = []
        self._gates: dict[str, asyncio.Event] = {}
        self._arrived: dict[str, int] = {}

    def _gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    async def record(self, event: tuple) -> None:
        self.events.append(event)

    async def open(self, name: str) -> None:
        self.events.append(("open", name))
        self._gate(name).set()

    async def wait(self, name: str, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._gate(name).wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def arrive(self, name: str, event: tuple, parties: int, timeout_s: float) -> bool:
        """Records `event`, then waits until `parties` callers have arrived at `name`."""
        self.events.append(event)
        self._arrived[name] = self._arrived.get(name, 0) + 1
        if self._arrived[name] >= parties:
            self._gate(name).set()
        return await self.wait(name, timeout_s)

    async def get_events(self) -> list[tuple]:
        return list(self.events)


def instrument_sample(runner, log, *, barrier: int = 0, gate: str | None = None) -> None:
    """Makes `runner.sample()` report to `log`: `("start", i)` when it is called (after
    waiting for `barrier` runners to be inside `sample()` too, or for the test to open
    `gate`), `("finish", i)` when the sample is done. A wait that timed out is recorded
    as `("gave up waiting", i)`."""
    inner = type(runner).sample.__get__(runner)
    index = runner.worker_index

    def sample(**kwargs):
        if barrier:
            waited = ray.get(log.arrive.remote("barrier", ("start", index), barrier,
                                               GATE_TIMEOUT_S))
        else:
            ray.get(log.record.remote(("start", index)))
            waited = gate is None or ray.get(log.wait.remote(gate, GATE_TIMEOUT_S))
        if not waited:
            ray.get(log.record.remote(("gave up waiting", index)))
        batch = inner(**kwargs)
        ray.get(log.record.remote(("finish", index)))
        return batch

    runner.sample = sample


def restore_sample(runner) -> None:
    runner.__dict__.pop("sample", None)


def wait_at(log, gate: str) -> bool:
    return ray.get(log.wait.remote(gate, GATE_TIMEOUT_S))


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sampling-markers")


@pytest.fixture(scope="module")
def group(ray_instance, marker_dir):
    # No restarts, failures ignored: the last test kills a runner and the group carries on.
    config = (helpers.small_config(2, env_to_module_connector=helpers.mean_std_connector)
              .reporting(metrics_num_episodes_for_smoothing=2000)
              .fault_tolerance(restart_failed_env_runners=False,
                               ignore_env_runner_failures=True))
    group = EnvRunnerGroup(config=config, actor_options=helpers.actor_options(
        JAXRUNNER_TEST_MARKER_DIR=str(marker_dir)))
    yield group
    group.stop()


def test_get_metrics__means_over_all_episodes_of_all_runners(group):
    # Must see every episode the runners ever finished: runs on the fresh group.
    lifetimes = group.foreach_env_runner(lambda r: r.get_state(components=[])[
        "num_env_steps_sampled_lifetime"], local_env_runner=False)
    assert lifetimes == [0, 0], "this test needs the module's group fresh: run it first"
    per_runner = {1: [], 2: []}
    for worker_index, batch in zip((1, 2), group.sample(num_timesteps=200)):
        per_runner[worker_index].append(batch)
    # Runner 1 samples more, so the runners' windows hold different numbers of episodes.
    per_runner[1] += group.foreach_env_runner("sample", kwargs={"num_timesteps": 300},
                                              remote_worker_ids=[1], local_env_runner=False)
    metrics = group.get_metrics()

    episodes = {i: [(r, n) for r, n, done in helpers.whole_episodes(b).values() if done]
                for i, b in per_runner.items()}
    everything = episodes[1] + episodes[2]
    returns = np.array([r for r, _ in everything])
    lengths = np.array([n for _, n in everything])
    assert len(episodes[1]) != len(episodes[2])
    assert metrics["num_episodes"] == len(everything)
    assert metrics["num_env_steps_sampled"] == sum(
        b.env_steps for batches in per_runner.values() for b in batches) == 2 * 200 + 300
    assert metrics["episode_return_mean"] == pytest.approx(returns.mean(), rel=1e-6)
    assert metrics["episode_len_mean"] == pytest.approx(lengths.mean(), rel=1e-6)
    assert metrics["episode_return_min"] == returns.min()
    assert metrics["episode_return_max"] == returns.max()
    assert (metrics["episode_len_min"], metrics["episode_len_max"]) == (lengths.min(),
                                                                        lengths.max())
    mean_of_means = np.mean([np.mean([r for r, _ in eps]) for eps in episodes.values()])
    assert metrics["episode_return_mean"] != pytest.approx(mean_of_means, rel=1e-9)
    assert metrics["episode_duration_sec_mean"] > 0
    assert metrics["num_env_steps_sampled_lifetime"] == 700
    assert metrics["fault_tolerance"]["num_healthy_workers"] == 2
    again = group.get_metrics()  # windows persist, per-call counters restart
    assert again["episode_return_mean"] == metrics["episode_return_mean"]
    assert again["num_env_steps_sampled"] == 0 and again["num_episodes"] == 0
    assert again["num_env_steps_sampled_lifetime"] == 700


def test_sample__runners_sample_at_the_same_time(group):
    # Each runner waits inside sample() until both are inside it: a group that called its
    # runners one after the other would leave the first waiting alone.
    log = CallLog.remote()
    group.foreach_env_runner(instrument_sample, kwargs={"log": log, "barrier": 2},
                             local_env_runner=False)
    try:
        batches = group.sample(num_timesteps=32)
    finally:
        group.foreach_env_runner(restore_sample, local_env_runner=False)
    assert len(batches) == 2
    for batch in batches:
        helpers.check_batch(batch)
        assert batch.env_steps == 32
    # Different runners: different episode ids.
    assert not {e.id_ for e in batches[0]} & {e.id_ for e in batches[1]}
    events = ray.get(log.get_events.remote())
    assert sorted(events[:2]) == [("start", 1), ("start", 2)], events
    assert sorted(events[2:]) == [("finish", 1), ("finish", 2)], (
        f"both runners must be inside sample() before either finishes: {events}")


def test_sync_weights__one_put_and_visible_in_the_next_batch(group, monkeypatch):
    base = helpers.params_of(group.local_env_runner)
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    for action in (1, 0, 1):
        seq = group.sync_weights(helpers.forcing_action(base, action))  # no waiting
        batches = group.sample(num_timesteps=40)
        assert len(batches) == 2
        for batch in batches:
            helpers.check_batch(batch, action=action, seq=seq)
    assert len(puts) == 3  # one object per sync, whatever the number of runners
    # Only runner 2, from a learner-like source, with an explicit seq.

    class Learner:  # full params: the value net is not sent to the runners
        def get_state(self, components):
            return {"rl_module": {**helpers.forcing_action(base, 0),
                                  "vf": {"Dense_0": {"kernel": np.zeros((4, 16))}}}}

    seq = group.sync_weights(from_worker_or_learner_group=Learner(), to_worker_indices=[2],
                             weights_seq_no=group.weights_seq_no + 10, timeout_seconds=None)
    first, second = group.sample(num_timesteps=40)
    helpers.check_batch(first, action=1, seq=seq - 10)
    helpers.check_batch(second, action=0, seq=seq)
    assert group.foreach_env_runner("weights_seq_no") == [seq, seq - 10, seq]
    # Runner 1 catches up from runner 2's weights.
    group.sync_weights(from_worker_or_learner_group=2, timeout_seconds=None)
    for batch in group.sample(num_timesteps=40):
        helpers.check_batch(batch, action=0)


def test_get_node_info__where_each_runner_runs_and_its_jax_setup(group):
    info = group.get_node_info()
    assert sorted(info) == [0, 1, 2]
    node = ray.get_runtime_context().get_node_id()
    pids = {info[i]["pid"] for i in info}
    assert len(pids) == 3
    for worker_index in (1, 2):
        assert info[worker_index]["worker_index"] == worker_index
        assert info[worker_index]["node_id"] == node
        # Set before JAX was imported in the actor: JAX read them at import.
        assert info[worker_index]["jax_platforms"] == "cpu"
        assert info[worker_index]["jax_backend"] == "cpu"
        assert info[worker_index]["xla_python_client_preallocate"] == "false"
        assert info[worker_index]["restarted"] is False
    assert group.foreach_env_runner("worker_index") == [0, 1, 2]
    assert group.foreach_env_runner("num_workers") == [2, 2, 2]
    assert group.local_env_runner.env is None  # remote runners exist: no local env


def test_sample_get_state_and_metrics__batch_by_reference(group):
    group.get_metrics()  # the runners' per-call counters start from zero
    results = group.foreach_env_runner("sample_get_state_and_metrics", local_env_runner=False)
    assert len(results) == 2
    refs = []
    for ref, state, metrics in results:
        assert isinstance(ref, ray.ObjectRef)
        assert "rl_module" not in state and "env_to_module_connector" in state
        assert metrics["num_env_steps_sampled"] == 32  # rollout_fragment_length 16 x 2 envs
        refs.append(ref)
    # Another process (here runner 2's, standing in for a learner) fetches both batches;
    # the driver never does. The references travel inside a dict, so Ray does not resolve
    # them on the way.
    fetch = lambda r, refs: [(b.env_steps, b.is_on_host, len(b))  # noqa: E731
                             for b in ray.get(refs)]
    (fetched,) = group.foreach_env_runner(fetch, kwargs={"refs": refs}, remote_worker_ids=[2],
                                          local_env_runner=False)
    assert len(fetched) == 2
    for env_steps, on_host, num_episodes in fetched:
        assert env_steps == 32 and on_host and num_episodes > 0
    local = group.local_env_runner
    with pytest.raises(ValueError, match="no env"):
        local.sample()


def test_foreach_async__in_flight_limit_tags_and_timeouts(group):
    log = CallLog.remote()
    gated = lambda r: (wait_at(log, "slow"), r.worker_index)[1]  # noqa: E731
    assert group.foreach_env_runner_async(gated, tag="slow") == 2
    assert group.foreach_env_runner_async(gated, tag="slow") == 0  # 1 in flight per runner
    assert group.num_in_flight_async_reqs() == 2
    assert group.fetch_ready_async_reqs(tags="other", timeout_seconds=0.5) == []
    # Nothing is ready while the calls wait at the closed gate.
    assert group.fetch_ready_async_reqs(tags=["slow"], timeout_seconds=0.5) == []
    assert group.num_in_flight_async_reqs() == 2
    ray.get(log.open.remote("slow"))
    ready = []
    deadline = time.time() + 120
    while len(ready) < 2 and time.time() < deadline:
        ready += group.fetch_ready_async_reqs(tags=["slow"], timeout_seconds=5.0)
    assert sorted(ready) == [(1, 1), (2, 2)]
    assert group.num_in_flight_async_reqs() == 0
    assert group.foreach_env_runner_async("ping", remote_worker_ids=[2]) == 1
    assert group.fetch_ready_async_reqs(timeout_seconds=30.0) == [(2, "pong")]
    # Late results are dropped and counted; the runners stay healthy. The calls cannot
    # finish before the timeout: they wait at a gate opened only afterwards.
    dropped = group.num_env_runners_dropped_lifetime()
    late = group.foreach_env_runner(lambda r: (wait_at(log, "late"), r.worker_index)[1],
                                    local_env_runner=False, timeout_seconds=0.2)
    assert late == []
    assert group.num_env_runners_dropped_lifetime() == dropped + 2
    ray.get(log.open.remote("late"))
    assert group.healthy_env_runner_ids() == [1, 2]
    refs = group.foreach_env_runner("worker_index", local_env_runner=False,
                                    return_obj_refs=True)
    assert ray.get(refs) == [1, 2]


def test_sync_env_runner_states__merged_connector_states_and_lifetime(group):
    group.sample(num_timesteps=64)
    get = lambda r: r.get_state(components=["env_to_module_connector"])  # noqa: E731
    before = group.foreach_env_runner(get, local_env_runner=False)
    counts = []
    for state in before:
        filter_state = state["env_to_module_connector"]["MeanStdFilter"]
        counts.append((float(filter_state["base"][0]), float(filter_state["delta"][0])))
    group.get_metrics()
    lifetime = group.get_metrics()["num_env_steps_sampled_lifetime"]
    group.sync_env_runner_states()
    after = group.foreach_env_runner(get, local_env_runner=False)
    merged_count = counts[0][0] + counts[0][1] + counts[1][1]  # same base, both deltas
    assert counts[0][0] == counts[1][0]
    for state in after:
        filter_state = state["env_to_module_connector"]["MeanStdFilter"]
        assert float(filter_state["base"][0]) == merged_count
        assert float(filter_state["delta"][0]) == 0.0
        assert state["num_env_steps_sampled_lifetime"] == lifetime
    np.testing.assert_array_equal(
        after[0]["env_to_module_connector"]["MeanStdFilter"]["base"][1],
        after[1]["env_to_module_connector"]["MeanStdFilter"]["base"][1])
    assert group.local_env_runner.num_env_steps_sampled_lifetime == lifetime


def test_sample__late_results_are_dropped_and_counted(group):
    # Runner 2's sample() waits at a gate that opens only after the group gave up on it.
    log = CallLog.remote()
    group.foreach_env_runner(instrument_sample, kwargs={"log": log, "gate": "late sample"},
                             remote_worker_ids=[2], local_env_runner=False)
    before = group.get_metrics()["fault_tolerance"]
    try:
        batches = group.sample(num_timesteps=32, timeout_seconds=5.0)
        assert len(batches) == 1 and batches[0].env_steps == 32
    finally:
        ray.get(log.open.remote("late sample"))
    deadline = time.time() + 120
    while True:
        stats = group.get_metrics()["fault_tolerance"]
        if stats["num_env_steps_dropped_lifetime"] > before["num_env_steps_dropped_lifetime"]:
            break
        assert time.time() < deadline, "the late batch never arrived"
        time.sleep(0.5)
    group.foreach_env_runner(restore_sample, remote_worker_ids=[2], local_env_runner=False)
    # The dropped batch is the one that finished after the gate opened.
    assert ray.get(log.get_events.remote()) == [("start", 2), ("open", "late sample"),
                                                ("finish", 2)]
    assert stats["num_env_runner_sample_timeouts"] == before["num_env_runner_sample_timeouts"] + 1
    assert stats["num_env_steps_dropped_lifetime"] == before[
        "num_env_steps_dropped_lifetime"] + 32
    assert stats["num_healthy_workers"] == 2
    assert len(group.sample(num_timesteps=32)) == 2


@pytest.fixture(scope="module")
def restarting_group(ray_instance, marker_dir):
    config = (helpers.small_config(2, env_to_module_connector=helpers.mean_std_connector)
              .fault_tolerance(restart_failed_env_runners=True,
                               delay_between_env_runner_restarts_s=0.0,
                               env_runner_health_probe_timeout_s=120.0,
                               env_runner_restore_timeout_s=120.0))
    group = EnvRunnerGroup(config=config, actor_options=helpers.actor_options(
        JAXRUNNER_TEST_MARKER_DIR=str(marker_dir)))
    yield group
    group.stop()


def connector_part(state):
    return state["env_to_module_connector"]["MeanStdFilter"]


@pytest.mark.parametrize("kills", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_sigkill_mid_sample__runner_restored_before_it_samples_again(restarting_group,
                                                                      marker_dir, kills):
    group = restarting_group
    base = helpers.params_of(group.local_env_runner)
    restarts_before = group.num_remote_worker_restarts()
    get = lambda r: (r.worker_index, r.get_state(  # noqa: E731
        components=["rl_module", "env_to_module_connector"]))
    for k in range(kills):
        action, target = k % 2, 1 + k % 2
        other = 3 - target
        weights = helpers.forcing_action(base, action)
        seq = group.sync_weights(weights)
        group.get_metrics()
        group.sync_env_runner_states()
        (_, expected), = group.foreach_env_runner(get, remote_worker_ids=[other],
                                                  local_env_runner=False)
        assert float(connector_part(expected)["delta"][0]) == 0.0

        old_pid, batches = helpers.kill_mid_sample(group, target, marker_dir)
        # The survivor's batch is whole; the killed runner's is not returned.
        assert len(batches) == 1
        helpers.check_batch(batches[0], action=action, seq=seq)
        assert group.healthy_env_runner_ids() == [other]

        restored = group.probe_unhealthy_env_runners()
        assert restored == [target]
        # Before it samples again: same index, current weights, connector state, counter.
        info = group.get_node_info()[target]
        assert info["pid"] != old_pid and info["restarted"] is True
        (worker_index, state), = group.foreach_env_runner(get, remote_worker_ids=[target],
                                                          local_env_runner=False)
        assert worker_index == target
        assert state["weights_seq_no"] == seq
        helpers.assert_same_tree(state["rl_module"], weights)
        for part in ("base", "delta"):
            helpers.assert_same_tree(connector_part(state)[part],
                                     connector_part(expected)[part])
        assert state["num_env_steps_sampled_lifetime"] == expected[
            "num_env_steps_sampled_lifetime"]

        batches = group.sample(num_timesteps=64)
        assert len(batches) == 2
        for batch in batches:
            helpers.check_batch(batch, action=action, seq=seq)
            assert batch.env_steps == 64
        stats = group.get_metrics()["fault_tolerance"]
        assert stats["num_healthy_workers"] == 2
        assert stats["num_remote_worker_restarts"] == restarts_before + k + 1
    assert group.foreach_env_runner("worker_index") == [0, 1, 2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_no_restarts__ignore_failures_carries_on_with_the_healthy(group, marker_dir):
    # Runs last: it kills runner 2 of the module's group for good.
    survivor_pid = group.get_node_info()[1]["pid"]
    failures = group.get_metrics()["fault_tolerance"]["num_env_runner_failures"]
    try:
        _, batches = helpers.kill_mid_sample(group, 2, marker_dir)
        assert len(batches) == 1
        helpers.check_batch(batches[0])
        for _ in range(2):  # carries on with runner 1
            batches = group.sample(num_timesteps=32)
            assert len(batches) == 1 and batches[0].env_steps == 32
        assert group.probe_unhealthy_env_runners() == []
        assert group.healthy_env_runner_ids() == [1]
        stats = group.get_metrics()["fault_tolerance"]
        assert stats["num_healthy_workers"] == 1 and stats["num_env_runners_lost"] == 1
        assert stats["num_env_runner_failures"] == failures + 1
        assert stats["num_remote_worker_restarts"] == 0
    finally:
        group.stop()
        group.stop()
    deadline = time.time() + 30
    while _alive(survivor_pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(survivor_pid), "stop() left a runner process running"
