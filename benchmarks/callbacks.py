"""Cost of device callbacks (issue 16, "Speed"): `sample()` of gymnax CartPole-v1 at 4096
sub-envs with the 64x64 MLP, with and without a configured callback holding one scalar of
state (the largest |cart position| of each episode, reduced by max), in one process.
Target: the callback costs <= 3 % (ratio with/without >= 0.97).

Sides are timed in alternating rounds (`jaxrunner.benchmarking.compare`); the ratio is the
median of per-round throughput ratios. The machine's load average is recorded: on a
shared machine wall times are noisy.

    python benchmarks/callbacks.py [--num-envs 4096] [--steps 128] [--rounds 12]
                                   [--output benchmarks/results/callbacks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax.numpy as jnp  # noqa: E402

from jaxrunner.benchmarking import compare, machine_info  # noqa: E402
from jaxrunner.config import RunnerConfig  # noqa: E402
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402


def max_abs_x_callbacks() -> dict:
    return dict(on_episode_start=lambda start: jnp.zeros((), jnp.float32),
                on_episode_step=lambda s, step: jnp.maximum(s, jnp.abs(step.obs[0])),
                on_episode_end=lambda s, step: {"max_abs_x": s},
                custom_metrics={"max_abs_x": "max"})


def make_side(num_envs: int, steps: int, callbacks: dict | None):
    config = (RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=steps)
              .rl_module(model_config={"fcnet_hiddens": [64, 64]})
              .debugging(seed=0))
    if callbacks:
        config.callbacks(**callbacks)
    runner = SingleAgentEnvRunner(config=config)
    start = time.perf_counter()
    runner.sample()
    runner.get_metrics()
    first_s = time.perf_counter() - start

    def run():
        runner.sample()

    return runner, run, first_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "callbacks.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    plain, run_plain, plain_first = make_side(args.num_envs, args.steps, None)
    with_cb, run_cb, cb_first = make_side(args.num_envs, args.steps, max_abs_x_callbacks())
    steps = args.num_envs * args.steps
    result = compare({"no_callbacks": run_plain, "one_scalar_callback": run_cb}, steps,
                     rounds=args.rounds, calls_per_round=2, reference="no_callbacks")
    metrics = with_cb.get_metrics()
    ratio = result["ratio_to_no_callbacks"]["one_scalar_callback"]
    out = {
        "benchmark": "device callback cost (issue 16)",
        "env": "CartPole-v1", "num_envs": args.num_envs, "vector_steps_per_call": args.steps,
        "env_steps_per_call": steps, "rounds": args.rounds,
        "steps_per_s": result["steps_per_s"],
        "median_steps_per_s": result["median_steps_per_s"],
        "ratio_with_to_without": ratio,
        "cost_percent": 100.0 * (1.0 - ratio),
        "target": "cost <= 3 % (ratio >= 0.97)",
        "target_met": ratio >= 0.97,
        "first_sample_s": {"no_callbacks": plain_first, "one_scalar_callback": cb_first},
        "max_abs_x_metric": metrics.get("max_abs_x"),
        "seconds_per_call": result["_timings"],
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared 2-core machine: other processes ran during the measurement",
        "machine": machine_info(),
    }
    plain.stop()
    with_cb.stop()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as file:
        json.dump(out, file, indent=1)
    print(json.dumps({k: out[k] for k in ("ratio_with_to_without", "cost_percent",
                                          "target_met", "steps_per_s", "loadavg_after")},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
