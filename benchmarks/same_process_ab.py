"""Shared pieces of the same-process A/B benchmarks (`separate_resets.py`,
`separate_outputs.py`, `separate_draws.py`, `finite_check.py`, `proven_finite.py`,
`narrow_store.py`, `unroll_limit.py`, `recorded_outputs.py`): the sides of a case, the
command line and the case loop.

Single-agent sides: a 64x64 MLP runner (explore, or random actions on both sides) and the
bare PureJaxRL-style scan of
`jaxrunner.benchmarking` (JAX's default lowering); multi-agent (`MultiAgent*` ids): the
runner and bare scan of `throughput_multi_agent.py` with 2 agents. `NUM_STEPS` vector
steps a call.
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

HIDDENS = (64, 64)
NUM_STEPS = 128


def runner_and_bare(env_id: str, num_envs: int, random_actions: bool = False) -> tuple:
    """`(runner, bare)`: builders of one side each, `runner(**runner_kwargs)` a jaxrunner
    runner's `sample()` (multi-agent for `MultiAgent*` ids; `runner_kwargs` go to
    `make_jaxrunner`, e.g. `check_finite=False` or `env_runners` settings, and only
    `check_finite` to the multi-agent runner) and `bare()` the bare scan; each built side is
    a `run()` doing one call. `random_actions`: both sides act at random (single-agent).
    The runner reads module-level switches (such as `chunk.SEPARATE_RESETS`) when its chunk
    is first traced, inside `runner()`."""
    if env_id.startswith("MultiAgent"):
        if random_actions:
            raise ValueError(f"{env_id}: the multi-agent sides act with their MLPs only; "
                             "drop random_actions.")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import throughput_multi_agent as multi_agent

        def runner(**runner_kwargs):
            return multi_agent.make_runner(env_id, num_envs, NUM_STEPS, HIDDENS,
                                           {"num_agents": 2}, **runner_kwargs)[0]

        def bare():
            return multi_agent.make_bare_scan(env_id, num_envs, NUM_STEPS, HIDDENS,
                                              {"num_agents": 2})
    else:
        def runner(**runner_kwargs):
            return make_jaxrunner(env_id, num_envs, NUM_STEPS, HIDDENS, random_actions,
                                  **runner_kwargs)[0]

        def bare():
            return make_bare_scan(env_id, num_envs, NUM_STEPS, HIDDENS, random_actions)
    return runner, bare


def gymnax_step_args(env_id: str) -> tuple:
    """`(env, params, key, state, action)`: a gymnax env, its default params and one
    step's arguments (a key, the state after a reset, a sampled action), for reading what
    the defaults pick from the env's step."""
    import gymnax
    import jax

    env, params = gymnax.make(env_id)
    key = jax.random.key(0)
    _, state = env.reset_env(key, params)
    return env, params, key, state, env.action_space(params).sample(key)


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


def run_header(benchmark: str) -> dict:
    """What every benchmark JSON here starts with: its name, the commit, the machine."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return {"benchmark": benchmark, "commit": commit, "machine": machine_info()}


def run_cases(benchmark: str, cases: tuple, sides: Callable[[str, int], dict], rounds: int,
              output: str, extra: Callable[[str, int], dict] = lambda env_id, num_envs: {},
              **header: Any) -> dict:
    """Measures each `(env_id, num_envs)` case's `sides(env_id, num_envs)` in alternating
    rounds beside `"bare_scan"`, prints the ratios and rewrites the JSON at `output` after
    every case (with the commit, the machine, `header` and per case `extra(env_id,
    num_envs)`)."""
    out = {**run_header(benchmark), "rounds": rounds, "num_steps_per_call": NUM_STEPS,
           **header, "cases": []}
    for env_id, num_envs in cases:
        load = os.getloadavg()[0]
        result = compare(sides(env_id, num_envs), num_envs * NUM_STEPS, rounds=rounds)
        result.pop("_timings", None)
        result.update(env=env_id, num_envs=num_envs, **extra(env_id, num_envs),
                      load_avg_1min=[round(load, 2), round(os.getloadavg()[0], 2)])
        out["cases"].append(result)
        ratios = ", ".join(f"{name} {ratio:.3f}"
                           for name, ratio in result["ratio_to_bare_scan"].items())
        print(f"{env_id} {num_envs}: {ratios} of the bare scan", flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump(out, f, indent=1)
    return out


def ab_main(benchmark: str, doc: str, default_cases: tuple, default_output: str,
            sides: Callable[[str, int], dict],
            extra: Callable[[str, int], dict] = lambda env_id, num_envs: {},
            **header: Any) -> dict:
    """An A/B script's `main()`: its command line (`parse_ab_args`, described by the first
    line of its `doc`) and its case loop (`run_cases`). `default_output` is relative to
    `benchmarks/results/`."""
    cases, rounds, output = parse_ab_args(
        doc.splitlines()[0], default_cases,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", default_output))
    return run_cases(benchmark, cases, sides, rounds, output, extra=extra, **header)
