"""JAX env suites through jaxrunner against the suite's own bare rollout.

For each installed suite case, `sample()` of a `SingleAgentEnvRunner` on the adapted env
(`"<suite>/<id>"`) is compared with a PureJaxRL-style `lax.scan` of the same adapted env
and the same 64x64 MLP policy (`jaxrunner.benchmarking.make_bare_scan`), in alternating
rounds in one process; the first `sample()` (compile included) is timed too. JSON to
`benchmarks/results/env_suites.json`.

    python benchmarks/env_suites.py                 # every installed case, 1024 envs
    python benchmarks/env_suites.py --cases brax/inverted_pendulum --num-envs 4096
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

from jaxrunner.benchmarking import compare, machine_info, make_bare_scan
from jaxrunner.config import RunnerConfig
from jaxrunner.envs import adapters
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CASES = {  # case -> the package that must be installed
    "brax/inverted_pendulum": "brax",
    "craftax/Craftax-Symbolic-v1": "craftax",
    "navix/Navix-Empty-5x5-v0": "navix",
}
HIDDENS = (64, 64)


def measure(case: str, num_envs: int, num_steps: int, rounds: int) -> dict:
    config = (RunnerConfig().environment(case)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps)
              .rl_module(model_config={"fcnet_hiddens": list(HIDDENS)}).debugging(seed=0))
    start = time.perf_counter()
    runner = SingleAgentEnvRunner(config=config)
    built = time.perf_counter()
    runner.sample()
    first_sample = time.perf_counter()
    env, params = adapters.make_suite_env(case, {})
    bare_start = time.perf_counter()
    bare = make_bare_scan((env, params), num_envs, num_steps, HIDDENS, random_actions=False)
    bare_first = time.perf_counter() - bare_start
    result = compare({"jaxrunner": runner.sample, "bare_scan": bare}, num_envs * num_steps,
                     rounds=rounds)
    steps = result["median_steps_per_s"]
    return {"case": case, "num_envs": num_envs, "num_steps": num_steps,
            "construction_s": built - start, "first_sample_s": first_sample - built,
            "bare_first_call_s": bare_first, "median_steps_per_s": steps,
            "ratio": steps["jaxrunner"] / steps["bare_scan"], "target": 0.95}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--num-steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=os.path.join(RESULTS, "env_suites.json"))
    args = parser.parse_args()
    out = {"benchmark": "env_suites", "policy": f"mlp{HIDDENS}, explore",
           "machine": machine_info(), "cases": [], "not_installed": []}
    for case in args.cases:
        package = CASES.get(case, case.split("/")[0])
        if importlib.util.find_spec(package) is None:
            out["not_installed"].append(case)
            continue
        row = measure(case, args.num_envs, args.num_steps, args.rounds)
        out["cases"].append(row)
        _write(out, args.output)  # after every case: a long sweep keeps what it measured
        print(f"{case} num_envs={args.num_envs}: ratio {row['ratio']:.3f} "
              f"(jaxrunner {row['median_steps_per_s']['jaxrunner']:,.0f} vs bare "
              f"{row['median_steps_per_s']['bare_scan']:,.0f} steps/s); first sample() "
              f"{row['first_sample_s']:.1f} s, bare first call {row['bare_first_call_s']:.1f} s",
              flush=True)
    _write(out, args.output)
    print(f"wrote {args.output}")


def _write(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
