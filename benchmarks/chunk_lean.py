"""The single-agent chunk against a bare PureJaxRL-style `lax.scan`: env steps/s and the
kernels of both compiled programs.

    python benchmarks/chunk_lean.py [--num-envs 16 128 1024] [--rounds 10]
                                    [--output benchmarks/results/throughput_chunk_lean.json]

Four sides in alternating rounds in one process (CartPole-v1, 64x64 tanh MLP, sampled
actions, 128 steps a call): the bare scan (`jaxrunner.benchmarking.make_bare_scan`) as a
hand-written scan compiles (JAX's default lowering), the same bare scan compiled with
jaxrunner's unrolled Threefry lowering (`jaxrunner.lowering`; the ratio to it is the
bookkeeping's own cost), the pure sampler's jitted `sample()` (one chunk,
`jaxrunner.make_sampler`) and `runner.sample()`. Targets (against the first): the sampler
>= 0.97 of the bare scan (issue 17); `runner.sample()` >= 0.9 at 16-128 envs and >= 0.95
at >= 1024 (issue 15).

The static part counts, in each program's optimized HLO (`jit(...).lower(...).compile()`),
the instructions of the time loop's body by opcode (fusions, copies, scatters, in-place
buffer writes) and the fusions of the whole program.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxrunner  # noqa: E402
from jaxrunner import lowering  # noqa: E402
from jaxrunner.benchmarking import (bare_scan_fns, compare, machine_info,  # noqa: E402
                                    make_bare_scan)

ENV_ID = "CartPole-v1"
HIDDENS = (64, 64)


def _config(num_envs: int, num_steps: int, **env_runners: Any):
    return (jaxrunner.RunnerConfig().environment(ENV_ID)
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps,
                         max_chunk_length=num_steps, **env_runners)
            .rl_module(model_config={"fcnet_hiddens": list(HIDDENS)})
            .debugging(seed=0))


def make_sampler_side(num_envs: int, num_steps: int, **env_runners: Any):
    """`(run, lowered)`: one jitted `Sampler.sample` call per `run()` (state donated)."""
    sampler = jaxrunner.make_sampler(_config(num_envs, num_steps, **env_runners))
    params = sampler.params
    holder = {"state": jax.jit(sampler.init)(sampler.default_key)}

    def run():
        holder["state"], traj, _ = sampler.sample_jit(holder["state"], params)
        jax.block_until_ready(traj)

    run()
    lowered = lowering.jit(lambda s, p, n: sampler.sample(s, p, num_steps=n),
                           unrolled=sampler.unrolled_rng).lower(
        holder["state"], params, np.int32(num_steps))
    return run, lowered


def make_runner_side(num_envs: int, num_steps: int, **env_runners: Any):
    runner = jaxrunner.SingleAgentEnvRunner(config=_config(num_envs, num_steps, **env_runners))

    def run():
        runner.sample()

    run()
    return run


def bare_scan_lowered(num_envs: int, num_steps: int, unrolled_rng: bool = False,
                      num_seeds: int = 0):
    """The bare scan of `make_bare_scan`, lowered (for its HLO); `num_seeds > 0`: vmapped
    over that many seeds, each with its own sub-envs (as `make_bare_scan(num_seeds=)`)."""
    init, rollout, key = bare_scan_fns(ENV_ID, num_envs, num_steps, HIDDENS, False,
                                       num_seeds=num_seeds)
    return lowering.jit(rollout, unrolled=unrolled_rng).lower(jax.eval_shape(init, key))


def _computations(text: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if match:
            current = match.group(1)
            comps[current] = []
        elif current is not None and line.startswith("  "):
            comps[current].append(line)
    return comps


def _opcode(line: str) -> str | None:
    match = re.match(r"\s*(?:ROOT )?%[\w.\-]+ = .+? ([\w\-]+)\(", line)
    return match.group(1) if match else None


def kernel_counts(text: str) -> dict[str, Any]:
    """Opcode counts of the time loop's body (the while loop whose body has the most
    instructions; all zero for a program without a loop) and the whole program's fusion
    count."""
    comps = _computations(text)
    bodies = re.findall(r"while\(.*?body=%([\w.\-]+)", text)
    body = max(bodies, key=lambda name: len(comps.get(name, [])), default=None)
    ops = collections.Counter(_opcode(line) for line in comps.get(body, []))
    ops.pop(None, None)
    fused_roots = collections.Counter()
    for line in comps.get(body, []):
        match = re.search(r"fusion\(.*calls=%([\w.\-]+)", line)
        if match:
            for inner in comps.get(match.group(1), []):
                if inner.lstrip().startswith("ROOT"):
                    fused_roots[_opcode(inner)] += 1
    every = collections.Counter(_opcode(line) for lines in comps.values() for line in lines)
    return {
        "loop_body_instructions": sum(ops.values()),
        "loop_body_fusions": ops.get("fusion", 0),
        "loop_body_copies": ops.get("copy", 0),
        "loop_body_inner_loops": ops.get("while", 0) + ops.get("call", 0),
        "loop_body_scatters": fused_roots.get("scatter", 0) + ops.get("scatter", 0),
        "loop_body_buffer_writes": fused_roots.get("dynamic-update-slice", 0)
        + ops.get("dynamic-update-slice", 0),
        "program_fusions": every.get("fusion", 0),
        "program_instructions": sum(v for k, v in every.items() if k is not None),
    }


def run(num_envs_list, num_steps: int, rounds: int, output: str | None, log=print
        ) -> dict[str, Any]:
    results: dict[str, Any] = {
        "benchmark": "chunk_lean", "env": ENV_ID, "policy": f"mlp{list(HIDDENS)} explore",
        "num_steps_per_call": num_steps, "machine": machine_info(),
        "note": "one process, alternating rounds (at least 50 ms of work per side a round), "
                "median of per-round ratios; the machine is shared (see load_avg_1min)",
        "targets": {"sampler_over_bare_scan": ">= 0.97 (issue 17)",
                    "runner_sample_over_bare_scan": ">= 0.9 at 16-128 envs, >= 0.95 at "
                                                    ">= 1024 (issue 15)"},
        "cases": []}
    for num_envs in num_envs_list:
        sampler_run, sampler_lowered = make_sampler_side(num_envs, num_steps)
        sides = {"bare_scan": make_bare_scan(ENV_ID, num_envs, num_steps, HIDDENS, False),
                 "bare_scan_unrolled_rng": make_bare_scan(ENV_ID, num_envs, num_steps, HIDDENS,
                                                          False, unrolled_rng=True),
                 "sampler": sampler_run,
                 "runner_sample": make_runner_side(num_envs, num_steps)}
        load_before = os.getloadavg()[0]
        result = compare(sides, num_envs * num_steps, rounds=rounds, calls_per_round=None)
        result.pop("_timings")
        case = {"num_envs": num_envs, **result,
                "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "kernels": {
                    "bare_scan": kernel_counts(
                        bare_scan_lowered(num_envs, num_steps).compile().as_text()),
                    "bare_scan_unrolled_rng": kernel_counts(
                        bare_scan_lowered(num_envs, num_steps, True).compile().as_text()),
                    "sampler": kernel_counts(sampler_lowered.compile().as_text())}}
        results["cases"].append(case)
        log(json.dumps({k: case[k] for k in ("num_envs", "ratio_to_bare_scan",
                                              "load_avg_1min")}))
        if output:
            with open(output, "w") as f:
                json.dump(results, f, indent=1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[16, 128, 1024])
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "throughput_chunk_lean.json"))
    args = parser.parse_args()
    run(args.num_envs, args.num_steps, args.rounds, args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
