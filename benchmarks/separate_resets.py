"""What drawing each sub-env's reset in a kernel of its own costs or saves, same process.

    python benchmarks/separate_resets.py [--rounds 5] [--output PATH]

For each case two runners are built in one process, one with the reset separated
(`jaxrunner.core.chunk.SEPARATE_RESETS = True`) and one with XLA left to fuse it into the
selects of the auto-reset (`False`), beside the bare PureJaxRL-style scan
(`jaxrunner.benchmarking`, JAX's default lowering), in alternating rounds
(`jaxrunner.benchmarking.compare`, the order reversed every round). Separating applies to
rollouts compiled with the unrolled hash (at most `lowering.UNROLL_MAX_ENVS` sub-envs) on
CPU; see `jaxrunner.core.autoreset.separate_reset`. Both runners sample the same values.
The default ("auto") separates where at least 4 leaves of the reset read its key
(`reset_spreads_its_draw`); each case records which it picks (`auto_separates`).
Single-agent: 64x64 MLP, explore, 128 steps a call; multi-agent: `MultiAgentCartPole-v1`
with 2 agents, one 64x64 MLP each (`benchmarks/throughput_multi_agent.py`).
JSON to `benchmarks/results/separate_resets/ab.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrunner.benchmarking import (compare, machine_info, make_bare_scan,  # noqa: E402
                                    make_jaxrunner)
from jaxrunner.core import chunk  # noqa: E402

HIDDENS = (64, 64)
NUM_STEPS = 128
CASES = (("CartPole-v1", 64), ("CartPole-v1", 1024), ("CartPole-v1", 4096),
         ("Breakout-MinAtar", 1024), ("Breakout-MinAtar", 4096),
         ("Pendulum-v1", 1024), ("Pendulum-v1", 4096),
         ("MultiAgentCartPole-v1", 1024), ("MultiAgentCartPole-v1", 4096))


def runner_and_bare(env_id: str, num_envs: int) -> tuple:
    """`(runner, bare)`: builders of one side each, `runner()` a jaxrunner runner's
    `sample()` (multi-agent for `MultiAgent*` ids) and `bare()` the bare scan; each built
    side is a `run()` doing one call. The runner reads module-level switches (such as
    `chunk.SEPARATE_RESETS`) when its chunk is first traced, inside `runner()`."""
    if env_id.startswith("MultiAgent"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import throughput_multi_agent as multi_agent

        def runner():
            return multi_agent.make_runner(env_id, num_envs, NUM_STEPS, HIDDENS,
                                           {"num_agents": 2})[0]

        def bare():
            return multi_agent.make_bare_scan(env_id, num_envs, NUM_STEPS, HIDDENS,
                                              {"num_agents": 2})
    else:
        def runner():
            return make_jaxrunner(env_id, num_envs, NUM_STEPS, HIDDENS, False)[0]

        def bare():
            return make_bare_scan(env_id, num_envs, NUM_STEPS, HIDDENS, False)
    return runner, bare


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"separate": run, "fused": run, "bare_scan": run}`, each `run()` one call."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {}
    try:
        for name, flag in (("fused", False), ("separate", True)):
            chunk.SEPARATE_RESETS = flag  # read when the runner's chunk is first traced
            sides[name] = runner()
    finally:
        chunk.SEPARATE_RESETS = "auto"
    sides["bare_scan"] = bare()
    return sides


def _auto_separates(env_id: str) -> bool:
    """Whether the default ("auto") separates this env's reset."""
    import jax

    import gymnax

    from jaxrunner.core.autoreset import gymnax_step_fns, reset_spreads_its_draw

    if env_id.startswith("MultiAgent"):
        from jaxrunner.core.multi_agent_rollout import multi_agent_step_fns
        from jaxrunner.envs.context import EnvContext
        from jaxrunner.envs.multi_agent import make_multi_agent_env

        env, params, _ = make_multi_agent_env(env_id, EnvContext({"num_agents": 2}))
        fns = multi_agent_step_fns(env)
    else:
        env, params = gymnax.make(env_id)
        fns = gymnax_step_fns(env)
    return reset_spreads_its_draw(fns, jax.random.key(0), params)


def parse_ab_args(description: str, default_cases: tuple, default_output: str
                  ) -> tuple[tuple, int, str]:
    """`(cases, rounds, output)` from the command line of an A/B script of this kind."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=None,
                        help="ENV:NUM_ENVS entries (default: all)")
    parser.add_argument("--output", default=default_output)
    args = parser.parse_args()
    cases = default_cases if not args.cases else tuple(
        (c.split(":")[0], int(c.split(":")[1])) for c in args.cases)
    return cases, args.rounds, args.output


def main() -> None:
    cases, rounds, output = parse_ab_args(
        __doc__.splitlines()[0], CASES,
        os.path.join(os.path.dirname(__file__), "results", "separate_resets", "ab.json"))
    run_cases("separate_resets", cases, _sides, rounds, output,
              extra=lambda env_id: {"auto_separates": _auto_separates(env_id)})


def run_cases(benchmark: str, cases: tuple, sides: Callable[[str, int], dict], rounds: int,
              output: str, extra: Callable[[str], dict] = lambda env_id: {},
              **header: Any) -> dict:
    """Measures each `(env_id, num_envs)` case's `sides(env_id, num_envs)` in alternating
    rounds beside `"bare_scan"`, prints the ratios and rewrites the JSON at `output` after
    every case (with the commit, the machine, `header` and per case `extra(env_id)`)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    out = {"benchmark": benchmark, "commit": commit, "machine": machine_info(),
           "rounds": rounds, "num_steps_per_call": NUM_STEPS, **header, "cases": []}
    for env_id, num_envs in cases:
        load = os.getloadavg()[0]
        result = compare(sides(env_id, num_envs), num_envs * NUM_STEPS, rounds=rounds)
        result.pop("_timings", None)
        result.update(env=env_id, num_envs=num_envs, **extra(env_id),
                      load_avg_1min=[round(load, 2), round(os.getloadavg()[0], 2)])
        out["cases"].append(result)
        ratios = ", ".join(f"{name} {ratio:.3f}"
                           for name, ratio in result["ratio_to_bare_scan"].items())
        print(f"{env_id} {num_envs}: {ratios} of the bare scan", flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump(out, f, indent=1)
    return out

if __name__ == "__main__":
    main()
