"""Fault-handling and host-env throughput (issue 4, "Speed"), in one process:

1. host path: jaxrunner `sample()` on gymnasium's numpy CartPole-v1 (a `SyncVectorEnv`
   stepped in Python, the 64x64 tanh MLP jitted) vs RLlib's `SingleAgentEnvRunner` on the
   same env, same sub-env count and same MLP (PyTorch), sampling with exploration.
   Target: jaxrunner at least as fast (ratio >= 1.0).
2. compiled path: gymnax CartPole-v1 at 4096 sub-envs with `check_finite` on vs off (no
   faults). Target: ratio on/off >= 0.95.

3. vector backends (issue 18): on CartPole-v1 and MuJoCo HalfCheetah-v5, jaxrunner
   `sample()` with `envpool:<id>` (EnvPool's C++ thread pool), `gymnasium:<id>` in
   `gym_env_vectorize_mode="sync"` and `"async"` (spawned sub-processes), and RLlib's own
   `SingleAgentEnvRunner` (gymnasium, sync; torch MLP) on the same env, sub-env count and
   MLP. Ratios are EnvPool's speed over each other side. Target: EnvPool faster than
   gymnasium sync and RLlib (ratio > 1).

Sides are timed in alternating rounds; the ratio is the median of per-round wall-time ratios
(CPU-time and best-round ratios are reported too: wall time is noisy on a shared machine).

    python benchmarks/host_env.py [--host-envs 128] [--compiled-envs 4096]
                                  [--vector-envs 8] [--skip host|compiled|vector]
                                  [--output benchmarks/results/host_env.json]

The machine is shared while this runs: `load_average_at_start/end` are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrunner.benchmarking import machine_info  # noqa: E402
from jaxrunner.config import RunnerConfig  # noqa: E402
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402


def make_jaxrunner(env: str, num_envs: int, steps_per_call: int, hiddens,
                   vectorize_mode: str = "sync", **fault_kwargs):
    config = (RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=max(1, steps_per_call // num_envs),
                           gym_env_vectorize_mode=vectorize_mode)
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)})
              .fault_tolerance(**fault_kwargs)
              .debugging(seed=0))
    runner = SingleAgentEnvRunner(config=config)
    start = time.perf_counter()
    runner.sample(num_timesteps=steps_per_call)
    first_s = time.perf_counter() - start

    def run():
        runner.sample(num_timesteps=steps_per_call)

    return run, first_s


def make_rllib(env: str, num_envs: int, steps_per_call: int, hiddens,
               torch_threads: int | None = None):
    """RLlib's runner, built as in /work/shared/peer_bench/rllib_runner.py. With
    `torch_threads`, torch runs with that many intra-op threads during its calls (on a
    loaded 2-core machine torch's default threads oversubscribe the cores)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    config = (PPOConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs, num_env_runners=0)
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)}))
    runner = RLlibRunner(config=config)

    def run():
        default = torch.get_num_threads()
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        try:
            runner.sample(num_timesteps=steps_per_call)
        finally:
            torch.set_num_threads(default)

    start = time.perf_counter()
    run()
    first_s = time.perf_counter() - start
    return run, first_s


def _alternate(sides: dict, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds per call of each side, in alternating rounds.

    CPU time (all threads of this process) is much less disturbed than wall time when
    other processes compete for the cores, so both are reported."""
    timings = {name: {"wall": [], "cpu": []} for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            timings[name]["cpu"].append(time.process_time() - cpu)
            timings[name]["wall"].append(time.perf_counter() - wall)
    return timings


def _summary(timings: dict, steps: int, ours: str, references: tuple[str, ...]) -> dict:
    """Steps/s (median and best rounds) and our speed ratio to each reference: the median
    of per-round ratios, for wall and for CPU time, and the ratio of best rounds."""
    out: dict = {"median_steps_per_s": {}, "best_steps_per_s": {},
                 "median_steps_per_cpu_s": {}, "ratio_to": {}}
    for name, t in timings.items():
        out["median_steps_per_s"][name] = steps / statistics.median(t["wall"])
        out["best_steps_per_s"][name] = steps / min(t["wall"])
        out["median_steps_per_cpu_s"][name] = steps / statistics.median(t["cpu"])
    for ref in references:
        ratio = lambda kind: statistics.median(  # noqa: E731
            r / o for r, o in zip(timings[ref][kind], timings[ours][kind]))
        out["ratio_to"][ref] = {"wall_median": ratio("wall"), "cpu_median": ratio("cpu"),
                                "wall_best": min(timings[ref]["wall"]) / min(
                                    timings[ours]["wall"])}
    return out


def host_case(num_envs: int, vector_steps: int, rounds: int, hiddens) -> dict:
    steps = num_envs * vector_steps
    ours, ours_first = make_jaxrunner("gymnasium:CartPole-v1", num_envs, steps, hiddens)
    logging.disable(logging.WARNING)  # RLlib's construction warnings
    try:
        rllib, rllib_first = make_rllib("CartPole-v1", num_envs, steps, hiddens)
        rllib_1, _ = make_rllib("CartPole-v1", num_envs, steps, hiddens, torch_threads=1)
    finally:
        logging.disable(logging.NOTSET)
    sides = {"jaxrunner_host": ours, "rllib": rllib, "rllib_torch_1_thread": rllib_1}
    case = {"case": "host_numpy_cartpole", "num_envs": num_envs, "steps_per_call": steps,
            **_summary(_alternate(sides, rounds), steps, "jaxrunner_host",
                       ("rllib", "rllib_torch_1_thread")),
            "first_sample_s": {"jaxrunner_host": ours_first, "rllib": rllib_first},
            "target": "jaxrunner_host >= RLlib (wall ratio >= 1.0 against the faster RLlib "
                      "setting)"}
    case["ratio"] = min(r["wall_median"] for r in case["ratio_to"].values())
    case["meets_target"] = case["ratio"] >= 1.0
    return case


def compiled_case(num_envs: int, vector_steps: int, rounds: int, hiddens) -> dict:
    steps = num_envs * vector_steps
    on, on_first = make_jaxrunner("CartPole-v1", num_envs, steps, hiddens, check_finite=True)
    off, off_first = make_jaxrunner("CartPole-v1", num_envs, steps, hiddens,
                                    check_finite=False)
    sides = {"check_finite_on": on, "check_finite_off": off}
    case = {"case": "compiled_cartpole_check_finite", "num_envs": num_envs,
            "steps_per_call": steps,
            **_summary(_alternate(sides, rounds), steps, "check_finite_on",
                       ("check_finite_off",)),
            "first_sample_s": {"check_finite_on": on_first, "check_finite_off": off_first},
            "target": "throughput with the check on / off >= 0.95"}
    ratios = case["ratio_to"]["check_finite_off"]
    case["ratio"] = ratios["wall_median"]
    case["meets_target"] = case["ratio"] >= 0.95
    return case


def vector_case(env_id: str, num_envs: int, vector_steps: int, rounds: int, hiddens) -> dict:
    """EnvPool vs gymnasium sync vs async vs RLlib on one env (see the module docstring)."""
    steps = num_envs * vector_steps
    sides, first = {}, {}
    for name, spec, mode in (("jaxrunner_envpool", f"envpool:{env_id}", "sync"),
                             ("jaxrunner_gymnasium_sync", f"gymnasium:{env_id}", "sync"),
                             ("jaxrunner_gymnasium_async", f"gymnasium:{env_id}", "async")):
        sides[name], first[name] = make_jaxrunner(spec, num_envs, steps, hiddens, mode)
    logging.disable(logging.WARNING)  # RLlib's construction warnings
    try:
        sides["rllib"], first["rllib"] = make_rllib(env_id, num_envs, steps, hiddens,
                                                    torch_threads=1)
    finally:
        logging.disable(logging.NOTSET)
    others = tuple(n for n in sides if n != "jaxrunner_envpool")
    case = {"case": f"vector_backends_{env_id}", "env": env_id, "num_envs": num_envs,
            "steps_per_call": steps,
            **_summary(_alternate(sides, rounds), steps, "jaxrunner_envpool", others),
            "first_sample_s": first,
            "target": "EnvPool faster than gymnasium sync and RLlib (ratio > 1)"}
    # ratio_to[x] = time(x) / time(envpool): how many times faster EnvPool is than x.
    case["ratio"] = min(case["ratio_to"][n]["wall_median"]
                        for n in ("jaxrunner_gymnasium_sync", "rllib"))
    case["meets_target"] = case["ratio"] > 1.0
    return case


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-envs", type=int, default=128)
    parser.add_argument("--host-vector-steps", type=int, default=100)
    parser.add_argument("--compiled-envs", type=int, default=4096)
    parser.add_argument("--compiled-vector-steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--vector-envs", type=int, default=8)
    parser.add_argument("--vector-steps", type=int, default=50)
    parser.add_argument("--skip", choices=["host", "compiled", "vector"], action="append",
                        default=[])
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "host_env.json"))
    args = parser.parse_args()
    hiddens = (64, 64)
    results = {"benchmark": "host_env", "policy": f"mlp{list(hiddens)} explore",
               "machine": machine_info(), "cpu_count": os.cpu_count(),
               "load_average_at_start": os.getloadavg(),
               "torch_threads": _torch_threads(), "cases": []}
    if "host" not in args.skip:
        case = host_case(args.host_envs, args.host_vector_steps, args.rounds, hiddens)
        results["cases"].append(case)
        speed = case["median_steps_per_s"]
        print(f"host numpy CartPole x{args.host_envs}: jaxrunner "
              f"{speed['jaxrunner_host']:,.0f} steps/s, RLlib {speed['rllib']:,.0f} steps/s "
              f"(torch 1 thread: {speed['rllib_torch_1_thread']:,.0f}), ratio to the faster "
              f"{case['ratio']:.2f} (CPU time: "
              + ", ".join(f"{k} {v['cpu_median']:.2f}" for k, v in case["ratio_to"].items())
              + ")", flush=True)
    if "compiled" not in args.skip:
        case = compiled_case(args.compiled_envs, args.compiled_vector_steps, args.rounds,
                             hiddens)
        results["cases"].append(case)
        ratios = case["ratio_to"]["check_finite_off"]
        print(f"compiled CartPole x{args.compiled_envs}: check_finite on "
              f"{case['median_steps_per_s']['check_finite_on']:,.0f} steps/s, off "
              f"{case['median_steps_per_s']['check_finite_off']:,.0f} steps/s, ratio "
              f"{case['ratio']:.3f} (CPU time {ratios['cpu_median']:.3f}, best rounds "
              f"{ratios['wall_best']:.3f})", flush=True)
    if "vector" not in args.skip:
        for env_id in ("CartPole-v1", "HalfCheetah-v5"):
            case = vector_case(env_id, args.vector_envs, args.vector_steps, args.rounds,
                               hiddens)
            results["cases"].append(case)
            speed = case["median_steps_per_s"]
            print(f"{env_id} x{args.vector_envs}: " + ", ".join(
                f"{k} {v:,.0f} steps/s" for k, v in speed.items()) + "; EnvPool over " +
                ", ".join(f"{k} {v['wall_median']:.2f}x" for k, v in case["ratio_to"].items()),
                flush=True)
    results["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    if args.skip and os.path.exists(args.output):
        # Keep the cases measured earlier that this run skipped.
        with open(args.output) as f:
            previous = json.load(f)
        ran = {case["case"] for case in results["cases"]}
        results["cases"] = [c for c in previous.get("cases", []) if c["case"] not in ran] + \
            results["cases"]
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
