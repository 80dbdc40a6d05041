"""EnvRunnerGroup on a 3-node Ray cluster (`ray.cluster_utils.Cluster`, 1 CPU per node,
all on this machine): runners spread over nodes, the group reports where each runs, and
after a node is removed its runner is restarted on another node and sampling continues."""

from __future__ import annotations

import warnings

import pytest
import ray
from ray.cluster_utils import Cluster

import distributed_helpers as helpers
from jaxrunner import EnvRunnerGroup
from jaxrunner.fork_warning import ignore_subprocess_fork_warning

pytestmark = pytest.mark.ray

_NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}


@pytest.fixture
def cluster():
    # Ray starts each node's processes through subprocess: no JAX fork warning for those
    # (pytest resets the filter `import jaxrunner` installed; see jaxrunner.fork_warning).
    with warnings.catch_warnings():
        ignore_subprocess_fork_warning()
        cluster = Cluster(initialize_head=True,
                          head_node_args={**_NODE, "include_dashboard": False})
        workers = [cluster.add_node(**_NODE) for _ in range(2)]
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_cluster__runners_spread_and_move_off_a_removed_node(cluster):
    cluster, workers = cluster
    config = (helpers.small_config(2, num_cpus_per_env_runner=1)
              .fault_tolerance(restart_failed_env_runners=True,
                               delay_between_env_runner_restarts_s=0.0,
                               env_runner_health_probe_timeout_s=120.0))
    group = EnvRunnerGroup(config=config, actor_options=helpers.actor_options())
    try:
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        assert len(alive) == 3
        info = group.get_node_info()
        nodes = {i: info[i]["node_id"] for i in (1, 2)}
        assert nodes[1] != nodes[2], "the runners were not spread over nodes"
        assert set(nodes.values()) <= alive
        assert info[0]["node_id"] == cluster.head_node.node_id  # the driver's node
        for batch in group.sample(num_timesteps=32):
            helpers.check_batch(batch)

        # Remove a worker node that hosts a runner.
        victim = next(w for w in workers if w.node_id in nodes.values())
        moved = next(i for i, node in nodes.items() if node == victim.node_id)
        cluster.remove_node(victim)
        batches = group.sample(num_timesteps=32)  # the runner on the removed node fails
        assert 1 <= len(batches) <= 2
        restored = group.probe_unhealthy_env_runners()
        assert moved in restored or moved in group.healthy_env_runner_ids()
        assert group.healthy_env_runner_ids() == [1, 2]
        info = group.get_node_info()
        assert info[moved]["worker_index"] == moved
        assert info[moved]["node_id"] != victim.node_id
        assert info[moved]["node_id"] in {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        batches = group.sample(num_timesteps=32)
        assert len(batches) == 2
        for batch in batches:
            helpers.check_batch(batch, seq=0)
            assert batch.env_steps == 32
        assert group.get_metrics()["fault_tolerance"]["num_remote_worker_restarts"] == 1
    finally:
        group.stop()
