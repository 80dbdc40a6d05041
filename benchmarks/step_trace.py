"""What a runner's first program costs in Python with the env's step traced once or
twice: the A/B of `jaxrunner.core.chunk.SHARE_STEP_TRACE`.

    python benchmarks/step_trace.py [--envs CartPole-v1 brax/ant ...] [--rounds 3]
        [--num-envs 16] [--output benchmarks/results/step_trace.json]

The chunk's loop body evaluates the trace of the vector step made for its shapes (the
runner's zero lookback, the chunk's record buffers) instead of tracing the env's step
again (`SHARE_STEP_TRACE = True`, the default). The step's Python trace is what a heavy
env (Brax's Ant, Craftax) pays most of its first `sample()` outside XLA. Each side runs
in a fresh process, the sides alternating, `--rounds` pairs per env; each process builds
the sampler of a runner (64x64 MLP, `--num-envs` sub-envs, 16 steps a call) and times
what the runner's first `sample()` does before XLA compiles: the zero lookback's shapes,
the chunk's trace (the runner's own jit and Threefry lowering) and its lowering. XLA's
compile, the same program either way, is left out: on a 2-core CPU its spread (seconds
for Brax's Ant and Craftax) hides the trace's. `saved_s_median` compares trace and lower
together: where Python's full garbage collection falls (a few tenths of a second for
Craftax's hundreds of thousands of trace objects) moves between the two phases from run
to run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

_ONE = """
import json, sys, time
import jax
import jax.numpy as jnp
import jaxrunner
import jaxrunner.core.chunk
jaxrunner.core.chunk.SHARE_STEP_TRACE = sys.argv[2] == "shared"
config = (jaxrunner.RunnerConfig().environment(sys.argv[1])
          .env_runners(num_envs_per_env_runner=int(sys.argv[3]), rollout_fragment_length=16)
          .rl_module(model_config={"fcnet_hiddens": [64, 64]}).debugging(seed=0))
sampler = jaxrunner.make_sampler(config)
params, env_params = sampler.params, sampler.env_params
carry = jax.eval_shape(sampler.chunk_fns("explore").init_carry, sampler.default_key, params,
                       env_params)
jitted = sampler.jitted("explore")
start = time.perf_counter()
lookback = jitted["init_lookback"](carry, params, env_params)
shaped = time.perf_counter()
scalar = jax.ShapeDtypeStruct((), jnp.int32)
traced = jitted["chunk"].trace(carry, lookback, params, env_params, *[scalar] * 4)
chunk_traced = time.perf_counter()
traced.lower()
lowered = time.perf_counter()
print(json.dumps({"lookback_s": shaped - start, "chunk_trace_s": chunk_traced - shaped,
                  "lower_s": lowered - chunk_traced, "trace_s": chunk_traced - start,
                  "trace_and_lower_s": lowered - start}))
"""

SIDES = ("shared", "traced_twice")


def first_program_trace(env_id: str, side: str, num_envs: int) -> dict[str, float]:
    """Seconds a fresh runner of `env_id` spends in Python on its first program, in a
    fresh process: its zero lookback's shapes (`lookback_s`), the chunk's trace
    (`chunk_trace_s`; `trace_s` the two), the lowering to StableHLO (`lower_s`); with the
    step's trace shared (`side="shared"`) or not."""
    out = subprocess.run([sys.executable, "-c", _ONE, env_id, side, str(num_envs)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the {side} runner of {env_id} failed in its own process "
                           f"(exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "brax/ant",
                                                      "craftax/Craftax-Symbolic-v1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "step_trace.json"))
    args = parser.parse_args()
    from jaxrunner.benchmarking import machine_info

    load_before = os.getloadavg()
    envs: dict[str, Any] = {}
    for env_id in args.envs:
        runs: dict[str, list] = {side: [] for side in SIDES}
        for r in range(args.rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                runs[side].append(first_program_trace(env_id, side, args.num_envs))
                print(f"{env_id} round {r} {side}: traced in "
                      f"{runs[side][-1]['trace_s']:.2f} s, lowered in "
                      f"{runs[side][-1]['lower_s']:.2f} s", flush=True)
        envs[env_id] = {side: {
            "median_trace_s": statistics.median(x["trace_s"] for x in runs[side]),
            "median_trace_and_lower_s": statistics.median(x["trace_and_lower_s"]
                                                          for x in runs[side]),
            **{key: [x[key] for x in runs[side]] for key in (
                "trace_and_lower_s", "trace_s", "lookback_s", "chunk_trace_s", "lower_s")}}
            for side in SIDES}
        envs[env_id]["saved_s_median"] = (
            envs[env_id]["traced_twice"]["median_trace_and_lower_s"]
            - envs[env_id]["shared"]["median_trace_and_lower_s"])
    results = {"benchmark": "step_trace", "rounds": args.rounds, "num_envs": args.num_envs,
               "machine": machine_info(), "load_avg_before": load_before,
               "load_avg_after": os.getloadavg(), "envs": envs}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({e: round(v["saved_s_median"], 2) for e, v in envs.items()}))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
