"""Experiment logs (TensorBoard events + JSON lines, `jaxrunner sample --logdir`) and
RLlib's two Ray metrics counters of an env runner."""

from __future__ import annotations

import numpy as np
import pytest

import jaxrunner
from jaxrunner import cli
from jaxrunner.distributed import metrics as dmetrics
from jaxrunner.metrics.experiment_log import (ExperimentLog, flatten, read_event_scalars,
                                              read_jsonl)

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def test_experiment_log_round_trip(tmp_path):
    with ExperimentLog(tmp_path) as log:
        for step in (10, 20):
            log.log({"episode_return_mean": step / 2, "nested": {"a": 1, "b": True},
                     "skipped": None, "name": "x", "numpy": {"flag": np.bool_(True),
                                                             "count": np.int64(step)}},
                    step=step)
    rows = read_jsonl(tmp_path)
    assert [r["step"] for r in rows] == [10, 20]
    assert rows[1]["episode_return_mean"] == 10.0 and rows[1]["nested"] == {"a": 1, "b": True}
    assert rows[1]["numpy"] == {"flag": True, "count": 20}  # numpy scalars as JSON values
    scalars = read_event_scalars(tmp_path)
    assert scalars["episode_return_mean"] == [(10, 5.0), (20, 10.0)]
    assert scalars["nested/b"] == [(10, 1.0), (20, 1.0)]
    assert scalars["numpy/flag"] == [(10, 1.0), (20, 1.0)]
    assert scalars["numpy/count"] == [(10, 10.0), (20, 20.0)]
    assert "skipped" not in scalars and "name" not in scalars
    assert flatten({"a": {"b": {"c": 2}}}) == {"a/b/c": 2.0}


def test_cli_sample_logdir(tmp_path, capsys):
    logdir = tmp_path / "run"
    code = cli.main(["sample", "--env", "CartPole-v1", "--num-envs", "4", "--fragment", "16",
                     "--timesteps", "192", "--hiddens", "8", "--json", "--logdir",
                     str(logdir)])
    assert code == 0
    rows = read_jsonl(logdir)
    assert [r["step"] for r in rows] == [64, 128, 192]
    assert [r["num_env_steps_sampled_lifetime"] for r in rows] == [64, 128, 192]
    scalars = read_event_scalars(logdir)
    assert [s for s, _ in scalars["num_env_steps_sampled"]] == [64, 128, 192]
    assert all(v == 64.0 for _, v in scalars["num_env_steps_sampled"])
    (tmp_path / "file").write_text("x")
    assert cli.main(["sample", "--logdir", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


class _FakeCounter:
    """Stands in for `ray.util.metrics.Counter`: records what the runner books."""

    made: list = []

    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys, self.tags, self.total = name, tuple(tag_keys), {}, 0
        _FakeCounter.made.append(self)

    def set_default_tags(self, tags):
        self.tags = dict(tags)

    def inc(self, value=1.0, tags=None):
        assert value > 0
        self.total += value


def test_ray_counters_with_rllib_names_and_tag(monkeypatch):
    """Without Ray initialised there are no counters; with it, both counters count
    `env.step()` calls (vector steps) and env steps sampled, tagged rllib=<class>."""
    import ray
    import ray.util.metrics

    monkeypatch.setattr(ray.util.metrics, "Counter", _FakeCounter)
    _FakeCounter.made = []
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=3, fragment=5))
    runner.sample()
    assert not ray.is_initialized() and _FakeCounter.made == []  # no Ray: no counters
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    runner.sample()
    runner.sample(num_timesteps=7)
    metrics = runner.get_metrics()
    made = {c.name: c for c in _FakeCounter.made}
    assert set(made) == {dmetrics.TRY_ENV_STEP_COUNTER, dmetrics.ENV_STEPS_SAMPLED_COUNTER}
    assert all(c.tags == {"rllib": "SingleAgentEnvRunner"} and c.tag_keys == ("rllib",)
               for c in made.values())
    assert made[dmetrics.TRY_ENV_STEP_COUNTER].total == 5 + 3
    assert made[dmetrics.ENV_STEPS_SAMPLED_COUNTER].total == 15 + 9
    assert metrics["num_env_steps_sampled_lifetime"] == 15 + 15 + 9
    runner.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exported_counters(port: int) -> dict[tuple[str, str], float]:
    """Ray's Prometheus export on `port`, summed over worker processes:
    `{(counter name, rllib tag): value}` for RLlib's two env runner counters."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    totals: dict[tuple[str, str], float] = {}
    names = {f"ray_{name}": name for name in (dmetrics.TRY_ENV_STEP_COUNTER,
                                              dmetrics.ENV_STEPS_SAMPLED_COUNTER)}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            name = names.get(sample.name.removesuffix("_total"))
            if name is not None and sample.name.endswith("_total"):
                key = (name, sample.labels.get("rllib"))
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


@pytest.mark.ray
def test_ray_counters_in_rays_prometheus_export(monkeypatch):
    """In a real local Ray instance, runners in the driver (single- and multi-agent) and in
    a group's actor increment RLlib's two counters; Ray's metrics agent exports them to
    Prometheus (`ray_<name>_total{rllib=<runner class>}`) with the runners' lifetime counts."""
    import time

    import ray
    import ray._private.utils

    import distributed_helpers as helpers
    from jaxrunner.distributed.env_runner_group import init_ray

    assert ray._private.utils.get_dashboard_dependency_error() is None, (
        "Ray's metrics agent needs ray[default] (the dev extra installs it)")
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "500")  # default 10 s
    port = _free_port()
    init_ray(num_cpus=2, include_dashboard=False, _metrics_export_port=port)
    try:
        single = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=2, fragment=4))
        for _ in range(3):
            single.sample()
        multi = jaxrunner.MultiAgentEnvRunner(config=(
            make_config("MultiAgentCartPole-v1", num_envs=2, fragment=5)
            .environment("MultiAgentCartPole-v1", env_config={"num_agents": 2})))
        multi.sample()
        multi.sample(num_timesteps=7)
        group = jaxrunner.EnvRunnerGroup(
            config=make_config(num_envs=3, fragment=6, num_env_runners=1,
                               num_cpus_per_env_runner=0.5, sample_timeout_s=600.0),
            actor_options=helpers.actor_options())
        group.sample()
        group.sample()
        remote_steps = group.get_metrics()["num_env_steps_sampled_lifetime"]
        assert remote_steps == 2 * 3 * 6
        local_steps = single.get_metrics()["num_env_steps_sampled_lifetime"]
        multi_steps = multi.get_metrics()["num_env_steps_sampled_lifetime"]
        expected = {
            (dmetrics.TRY_ENV_STEP_COUNTER, "SingleAgentEnvRunner"): 3 * 4 + 2 * 6,
            (dmetrics.ENV_STEPS_SAMPLED_COUNTER, "SingleAgentEnvRunner"):
                local_steps + remote_steps,
            (dmetrics.TRY_ENV_STEP_COUNTER, "MultiAgentEnvRunner"): 5 + 4,
            (dmetrics.ENV_STEPS_SAMPLED_COUNTER, "MultiAgentEnvRunner"): multi_steps,
        }
        assert local_steps == 24 and multi_steps == 10 + 8
        deadline = time.monotonic() + 60.0
        exported = _exported_counters(port)
        while exported != expected and time.monotonic() < deadline:
            time.sleep(0.5)
            exported = _exported_counters(port)
        assert exported == expected
        group.stop()
        single.stop()
        multi.stop()
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_group_of_remote_runners_merges_custom_metrics():
    """Remote runners (Ray actors) run the device callbacks; the group's custom metrics are
    the pooled reductions of the runners' windows and its lifetime sums the episodes."""
    import jax.numpy as jnp
    import numpy as np
    import ray

    import distributed_helpers as helpers

    config = helpers.small_config(2).callbacks(
        on_episode_start=lambda start: jnp.zeros((), jnp.float32),
        on_episode_step=lambda s, step: jnp.maximum(s, jnp.abs(step.obs[0])),
        on_episode_end=lambda s, step: {"max_abs_x": s, "one": jnp.float32(1.0)},
        custom_metrics={"max_abs_x": "max", "one": "sum"})
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        group = jaxrunner.EnvRunnerGroup(config=config)
        for _ in range(3):
            group.sample()
        metrics = group.get_metrics()
        windows = group.foreach_env_runner(lambda runner: runner.get_metrics_window(),
                                           local_env_runner=False)
        pooled = np.concatenate([w["custom_metrics"]["max_abs_x"]["values"] for w in windows
                                 if w is not None and w.get("custom_metrics")])
        assert metrics["num_episodes_lifetime"] > 0
        assert metrics["one"] == metrics["num_episodes_lifetime"]
        assert metrics["max_abs_x"] == pytest.approx(pooled.max())
        group.stop()
    finally:
        ray.shutdown()
