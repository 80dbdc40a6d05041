"""Helpers shared by the Ray tests of `jaxrunner.distributed` (not a test module).

This module is pickled by value, so Ray workers can use `ProbedRunner` and the connector
factory without importing anything from `tests/`.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
import threading
import time
from typing import Any

import jax
import numpy as np
import ray.cloudpickle

import jaxrunner
from jaxrunner.connectors.env_to_module import MeanStdFilter

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Restarted runners load their compiled rollout from here instead of recompiling: the
#: test run's cache (tests/conftest.py), else one of their own.
COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.environ.get(
        "JAX_COMPILATION_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), "jaxrunner-distributed-tests-xla-cache")),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def actor_options(**env_vars: str) -> dict[str, Any]:
    return {"runtime_env": {"env_vars": {**COMPILE_CACHE_ENV, **env_vars}}}


def small_config(num_env_runners: int, **env_runners: Any) -> jaxrunner.RunnerConfig:
    """CartPole, 2 sub-envs, a 16-unit MLP, fractional CPUs so groups fit a 2-CPU Ray."""
    env_runners.setdefault("num_cpus_per_env_runner", 0.5)
    # A loaded 2-core machine can take over RLlib's 60 s default to compile a runner's
    # first sample(); tests of late results pass their own short timeout_seconds.
    env_runners.setdefault("sample_timeout_s", 600.0)
    return (jaxrunner.RunnerConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=2,
                         rollout_fragment_length=16, env_runner_cls=ProbedRunner,
                         **env_runners)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))


def mean_std_connector(env, spaces, device=None):
    return [MeanStdFilter(spaces["__env_single__"][0])]


class ProbedRunner(jaxrunner.SingleAgentEnvRunner):
    """A SingleAgentEnvRunner whose `sample()` can be slowed down, is timed, and announces
    itself with a file `sampling-<worker_index>-<pid>` in `$JAXRUNNER_TEST_MARKER_DIR`."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.sample_delay_s = 0.0
        self.sample_intervals: list[tuple[float, float]] = []

    def sample(self, **kwargs: Any):
        start = time.time()
        marker_dir = os.environ.get("JAXRUNNER_TEST_MARKER_DIR")
        if marker_dir and self.worker_index:
            path = os.path.join(marker_dir, f"sampling-{self.worker_index}-{os.getpid()}")
            with open(path, "w") as f:
                f.write(str(start))
        if self.sample_delay_s:
            time.sleep(self.sample_delay_s)
        batch = super().sample(**kwargs)
        self.sample_intervals.append((start, time.time()))
        return batch


def forcing_action(weights: dict, action: int) -> dict:
    """`weights` with the policy head zeroed and biased so that `action` is the greedy
    action and has probability ~1 - 2e-9 when sampled."""
    weights = jax.tree.map(np.array, weights)
    head = weights["pi"][max(weights["pi"], key=lambda name: int(name.split("_")[-1]))]
    head["kernel"][:] = 0.0
    head["bias"][:] = -10.0
    head["bias"][action] = 10.0
    return weights


def params_of(runner) -> dict:
    return runner.get_state(components="rl_module")["rl_module"]


def assert_same_tree(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def check_batch(batch, action: int | None = None, seq: int | None = None) -> None:
    """Every episode validates, is finite, and (if given) took `action` with weights `seq`."""
    assert batch.is_on_host
    assert len(batch) > 0
    for episode in batch:
        episode.validate()
        assert np.all(np.isfinite(episode.observations))
        assert np.all(np.isfinite(episode.rewards))
        if action is not None:
            assert np.all(episode.actions == action), episode.actions
    if seq is not None:
        assert batch.weights_seq_no == seq


def whole_episodes(batches) -> dict[str, tuple[float, int, bool]]:
    """`{id: (return, length, finished)}` over successive batches of one runner whose
    episodes all started inside them."""
    out: dict[str, tuple[float, int, bool]] = {}
    for batch in batches:
        for chunk in batch:
            ret, length, _ = out.get(chunk.id_, (0.0, 0, False))
            assert chunk.t_started == length, "a chunk that does not continue its episode"
            out[chunk.id_] = (ret + chunk.get_return(), length + len(chunk), chunk.is_done)
    return out


def kill_mid_sample(group, target: int, marker_dir, num_timesteps: int = 64):
    """Runs `group.sample()` and SIGKILLs runner `target`'s process while it is inside
    `sample()`. Returns `(killed pid, batches)`."""
    pid = group.get_node_info()[target]["pid"]
    marker = marker_dir / f"sampling-{target}-{pid}"
    marker.unlink(missing_ok=True)
    group.foreach_env_runner(lambda r: setattr(r, "sample_delay_s", 1.0),
                             remote_worker_ids=[target], local_env_runner=False)
    killed = threading.Event()

    def killer():
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.005)
        if marker.exists():
            time.sleep(random.uniform(0.0, 0.5))
            os.kill(pid, signal.SIGKILL)
            killed.set()

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        batches = group.sample(num_timesteps=num_timesteps)
    finally:
        thread.join()
    assert killed.is_set(), "the runner never started sampling"
    return pid, batches


def agent_0_to_p0(agent_id, episode) -> str:
    """policy_mapping_fn of the multi-agent group tests: agent_0 -> "p0", others -> "p1"."""
    return "p0" if agent_id == "agent_0" else "p1"


def multi_agent_config(num_env_runners: int, **env_runners: Any) -> jaxrunner.RunnerConfig:
    """MultiAgentCartPole-v1 from the registry with 2 agents mapped to modules p0 and p1,
    2 sub-envs, 16-unit MLPs, fractional CPUs so a group fits a 2-CPU Ray."""
    env_runners.setdefault("num_cpus_per_env_runner", 0.5)
    env_runners.setdefault("sample_timeout_s", 600.0)
    return (jaxrunner.RunnerConfig()
            .environment("MultiAgentCartPole-v1", env_config={"num_agents": 2})
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=2,
                         rollout_fragment_length=16, **env_runners)
            .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=agent_0_to_p0)
            .rl_module(model_config={"fcnet_hiddens": [16]})
            .debugging(seed=0))
