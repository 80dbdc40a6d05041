"""Cost of device callbacks (issue 16, "Speed"): `sample()` of gymnax CartPole-v1 at 4096
sub-envs with the 64x64 MLP, with and without a configured callback holding one scalar of
state (the largest |cart position| of each episode, reduced by max), in one process.
Target: the callback costs <= 3 % (ratio with/without >= 0.97).

Sides are timed in alternating rounds (`jaxrunner.benchmarking.compare`); the ratio is the
median of per-round throughput ratios. A third side, a second runner without callbacks
built the same way (`control`), measures the noise floor: its ratio to the first is what
the measurement reads for two identical programs. The kernel counts of both compiled
programs (step-loop fusions, copies, buffer writes) are recorded too. The machine's load average is recorded:
on a shared machine wall times are noisy. `XLA_FLAGS` is recorded: the callback's cost
depends on XLA:CPU's scheduler (see docs/callbacks.md "Speed"), e.g.
`XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`.

    python benchmarks/callbacks.py [--num-envs 4096] [--steps 128] [--rounds 20]
                                   [--calls-per-round 4]
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


def chunk_kernels(num_envs: int, steps: int, callbacks: dict | None) -> dict:
    """Kernel counts of the compiled sample program (`benchmarks/chunk_lean.kernel_counts`:
    the step loop's fusions, copies and buffer writes), with or without the callbacks."""
    import jax

    from chunk_lean import kernel_counts
    from jaxrunner.sampler import make_sampler

    config = _config(num_envs, steps, callbacks).env_runners(max_chunk_length=steps)
    sampler = make_sampler(config)
    state = jax.jit(sampler.init)(sampler.default_key)
    lowered = jax.jit(lambda s, p: sampler.sample(s, p)).lower(state, sampler.params)
    return kernel_counts(lowered.compile().as_text())


def earlier_runs(path: str) -> list:
    """The runs already in `path` (its `earlier_runs` and the run it holds, newest last),
    kept beside the new one."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        previous = json.load(file)
    runs = previous.pop("earlier_runs", [])
    return runs + [previous]


def _config(num_envs: int, steps: int, callbacks: dict | None) -> RunnerConfig:
    config = (RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=steps)
              .rl_module(model_config={"fcnet_hiddens": [64, 64]})
              .debugging(seed=0))
    if callbacks:
        config.callbacks(**callbacks)
    return config


def make_side(num_envs: int, steps: int, callbacks: dict | None):
    runner = SingleAgentEnvRunner(config=_config(num_envs, steps, callbacks))
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
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls-per-round", type=int, default=4)
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "callbacks.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    plain, run_plain, plain_first = make_side(args.num_envs, args.steps, None)
    with_cb, run_cb, cb_first = make_side(args.num_envs, args.steps, max_abs_x_callbacks())
    control, run_control, _ = make_side(args.num_envs, args.steps, None)
    steps = args.num_envs * args.steps
    result = compare({"no_callbacks": run_plain, "one_scalar_callback": run_cb,
                      "control": run_control}, steps, rounds=args.rounds,
                     calls_per_round=args.calls_per_round, reference="no_callbacks")
    metrics = with_cb.get_metrics()
    ratio = result["ratio_to_no_callbacks"]["one_scalar_callback"]
    control_ratio = result["ratio_to_no_callbacks"]["control"]
    load_after = os.getloadavg()
    out = {
        "benchmark": "device callback cost (issue 16)",
        "env": "CartPole-v1", "num_envs": args.num_envs, "vector_steps_per_call": args.steps,
        "env_steps_per_call": steps, "rounds": args.rounds,
        "steps_per_s": result["steps_per_s"],
        "median_steps_per_s": result["median_steps_per_s"],
        "ratio_with_to_without": ratio,
        "cost_percent": 100.0 * (1.0 - ratio),
        "control_ratio": control_ratio,
        "control_note": "a second runner without callbacks against the first: the "
                        "ratio two identical programs read in this run (noise floor)",
        "target": "cost <= 3 % (ratio >= 0.97)",
        "target_met": ratio >= 0.97,
        "first_sample_s": {"no_callbacks": plain_first, "one_scalar_callback": cb_first},
        "max_abs_x_metric": metrics.get("max_abs_x"),
        "seconds_per_call": result["_timings"],
        "loadavg_before": load_before, "loadavg_after": load_after,
        "note": (f"2-core machine, load average {load_before[0]:.1f} before and "
                 f"{load_after[0]:.1f} after (1-minute)"),
        "machine": machine_info(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "kernel_counts": {
            "no_callbacks": chunk_kernels(args.num_envs, args.steps, None),
            "one_scalar_callback": chunk_kernels(args.num_envs, args.steps,
                                                 max_abs_x_callbacks())},
    }
    for runner in (plain, with_cb, control):
        runner.stop()
    out["earlier_runs"] = earlier_runs(args.output)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as file:
        json.dump(out, file, indent=1)
    print(json.dumps({k: out[k] for k in ("ratio_with_to_without", "cost_percent",
                                          "control_ratio",
                                          "target_met", "steps_per_s", "loadavg_after")},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
