"""Scaling of `EnvRunnerGroup` sampling over remote runners, and the cost of `sync_weights`.

    python benchmarks/scaling.py [--max-runners 2] [--num-envs 256] [--rounds 8]
                                 [--output benchmarks/results/scaling.json]

Throughput: one group with `--max-runners` remote runners (1 CPU each). Each round
samples with 1, 2, ... of them at once (the others idle), in alternating order, and once
with a runner in the driver process (no Ray), so all cases see the same machine load.
Efficiency for N runners = aggregate steps/s of N / (N x steps/s of 1), median over rounds.
Each runner also reports the CPU seconds its sample took, so the JSON separates what the
machine gave (`median_cpu_share_per_runner`: cores each runner got while sampling) from
what the runners did with it (`efficiency_per_cpu_second`: steps per CPU second of N
runners against one; 1.0 means no overhead from running side by side).

Weight sync: a group of 2 runners with a ~1M-parameter policy (`fcnet_hiddens` [1024,
1024]); `sync_weights()` timed end to end (until both runners applied the weights) and
without waiting (what the driver pays), next to a bare `ray.put` of the same weights.

Ray starts worker processes with niceness 15, which on a machine shared with other work
starves the runners against the driver; runners here get niceness 0 (the driver's) unless
`--ray-worker-niceness`.

Target (issue 5): efficiency >= 0.85 while runners <= cores. On a shared machine, read
the recorded load average with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

import jaxrunner  # noqa: E402
from jaxrunner import EnvRunnerGroup  # noqa: E402


def make_config(num_runners: int, num_envs: int, fragment: int, hiddens: list[int]):
    return (jaxrunner.RunnerConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=num_runners, num_envs_per_env_runner=num_envs,
                         rollout_fragment_length=fragment, num_cpus_per_env_runner=1,
                         sample_timeout_s=None)
            .rl_module(model_config={"fcnet_hiddens": hiddens})
            .debugging(seed=0))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def timed_sample(runner):
    """Runs in the runner's process: its batch (host numpy, as `sample()` would ship it)
    with the wall and CPU seconds the sample took there."""
    wall, cpu = time.perf_counter(), time.process_time()
    batch = runner.sample().to_numpy()
    return batch, time.perf_counter() - wall, time.process_time() - cpu


def actor_options(args) -> dict | None:
    if args.ray_worker_niceness:
        return None
    # Ray starts worker processes with niceness 15; on a machine shared with other work
    # that starves the runners against the driver (niceness 0). Give them equal footing.
    return {"runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}}


def measure_throughput(args) -> dict:
    config = make_config(args.max_runners, args.num_envs, args.fragment, args.hiddens)
    group = EnvRunnerGroup(config=config, actor_options=actor_options(args))
    local_config = make_config(0, args.num_envs, args.fragment, args.hiddens)
    local = jaxrunner.SingleAgentEnvRunner(config=local_config)
    counts = list(range(1, args.max_runners + 1))
    cases = [f"{n}_runners" for n in counts]
    steps_per_s = {case: [] for case in cases + ["in_process"]}
    cpu_share = {case: [] for case in cases + ["in_process"]}  # cores each runner got
    steps_per_cpu_s = {case: [] for case in cases + ["in_process"]}
    try:
        for _ in range(2):  # compile and warm up everything
            group.foreach_env_runner(timed_sample, local_env_runner=False)
            timed_sample(local)
        for round_index in range(args.rounds):
            order = counts if round_index % 2 == 0 else counts[::-1]
            for n in order:
                ids = list(range(1, n + 1))
                out, seconds = timed(lambda: group.foreach_env_runner(
                    timed_sample, local_env_runner=False, remote_worker_ids=ids))
                assert len(out) == n
                steps = sum(batch.env_steps for batch, _, _ in out)
                cpu = sum(c for _, _, c in out)
                steps_per_s[f"{n}_runners"].append(steps / seconds)
                cpu_share[f"{n}_runners"].append(cpu / (n * seconds))
                steps_per_cpu_s[f"{n}_runners"].append(steps / cpu)
            (batch, wall, cpu), seconds = timed(lambda: timed_sample(local))
            steps_per_s["in_process"].append(batch.env_steps / seconds)
            cpu_share["in_process"].append(cpu / seconds)
            steps_per_cpu_s["in_process"].append(batch.env_steps / cpu)
    finally:
        group.stop()
        local.stop()
    one = steps_per_s["1_runners"]
    median = lambda values: statistics.median(values)  # noqa: E731
    return {
        "median_steps_per_s": {k: median(v) for k, v in steps_per_s.items()},
        "scaling_efficiency": {
            case: median([agg / (n * single) for agg, single in zip(steps_per_s[case], one)])
            for n, case in zip(counts, cases)},
        "median_cpu_share_per_runner": {k: median(v) for k, v in cpu_share.items()},
        "median_steps_per_cpu_s": {k: median(v) for k, v in steps_per_cpu_s.items()},
        "efficiency_per_cpu_second": {
            case: median([a / b for a, b in zip(steps_per_cpu_s[case],
                                                 steps_per_cpu_s["1_runners"])])
            for case in cases},
        "ray_overhead_1_runner_vs_in_process": median(
            [r / p for r, p in zip(one, steps_per_s["in_process"])]),
        "steps_per_s_by_round": steps_per_s,
    }


def measure_sync(args) -> dict:
    hiddens = [1024, 1024]
    config = make_config(2, 4, 16, hiddens)
    group = EnvRunnerGroup(config=config, actor_options=actor_options(args))
    try:
        weights = group.local_env_runner.get_state(components="rl_module")["rl_module"]
        num_params = int(sum(np.size(x) for x in jax.tree.leaves(weights)))
        num_bytes = int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(weights)))
        group.sync_weights(weights, timeout_seconds=None)  # warm up
        full, driver, put = [], [], []
        for _ in range(args.sync_rounds):
            _, seconds = timed(lambda: group.sync_weights(weights, timeout_seconds=None))
            full.append(seconds)
            _, seconds = timed(lambda: group.sync_weights(weights))
            driver.append(seconds)
            group.foreach_env_runner("weights_seq_no", local_env_runner=False)  # drain
            _, seconds = timed(lambda: ray.put({"rl_module": weights}))
            put.append(seconds)
    finally:
        group.stop()
    return {
        "policy": f"mlp{hiddens}",
        "num_params": num_params,
        "bytes": num_bytes,
        "num_remote_runners": 2,
        "median_s": {"sync_weights_until_applied": statistics.median(full),
                     "sync_weights_no_wait": statistics.median(driver),
                     "ray_put_only": statistics.median(put)},
        "min_s": {"sync_weights_until_applied": min(full),
                  "sync_weights_no_wait": min(driver), "ray_put_only": min(put)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-runners", type=int, default=2)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--fragment", type=int, default=256)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sync-rounds", type=int, default=10)
    parser.add_argument("--ray-worker-niceness", action="store_true",
                        help="keep Ray's default niceness (15) for the runner processes")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "scaling.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    ray.init(num_cpus=args.max_runners, include_dashboard=False)
    try:
        throughput = measure_throughput(args)
        sync = measure_sync(args)
    finally:
        ray.shutdown()
    result = {
        "benchmark": "scaling",
        "env": "CartPole-v1",
        "policy": f"mlp{args.hiddens} explore",
        "num_envs_per_runner": args.num_envs,
        "steps_per_sample_call": args.num_envs * args.fragment,
        "rounds": args.rounds,
        "runner_process_niceness": "Ray default (15)" if args.ray_worker_niceness else 0,
        "machine": {"cpu_count": os.cpu_count(), "jax": jax.__version__, "ray": ray.__version__,
                    "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "throughput": throughput,
        "sync_weights": sync,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({"throughput": throughput["median_steps_per_s"],
                      "efficiency": throughput["scaling_efficiency"],
                      "sync_weights_s": sync["median_s"], "load": result["machine"]},
                     indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
