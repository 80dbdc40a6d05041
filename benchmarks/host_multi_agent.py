"""Host multi-agent envs (issue 18): jaxrunner's `MultiAgentEnvRunner` on RLlib's own
multi-agent CartPole example (`ray.rllib.examples.envs.classes.multi_agent.MultiAgentCartPole`,
a Python `MultiAgentEnv`) vs RLlib's `MultiAgentEnvRunner` on the same env class, agent
count, sub-env count and MLP (one shared module), sampling with exploration.

Sides are timed in alternating rounds in one process; the ratio is the median of per-round
wall-time ratios (RLlib's time over ours: > 1 means jaxrunner is faster); CPU-time and
best-round ratios are reported too, because the machine is shared (`load_average_*` in
the JSON).

    python benchmarks/host_multi_agent.py [--agents 4] [--envs 8] [--vector-steps 100]
                                          [--rounds 5]
                                          [--output benchmarks/results/host_multi_agent.json]
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
from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner  # noqa: E402


def _env_class():
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    return MultiAgentCartPole


def make_jaxrunner(num_agents: int, num_envs: int, steps: int, hiddens):
    config = (RunnerConfig().environment(_env_class(), env_config={"num_agents": num_agents})
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=max(1, steps // num_envs))
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)})
              .debugging(seed=0))
    runner = MultiAgentEnvRunner(config=config)
    start = time.perf_counter()
    runner.sample(num_timesteps=steps)
    return (lambda: runner.sample(num_timesteps=steps)), time.perf_counter() - start


def make_rllib(num_agents: int, num_envs: int, steps: int, hiddens):
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner

    config = (PPOConfig().environment(_env_class(), env_config={"num_agents": num_agents})
              .env_runners(num_envs_per_env_runner=num_envs, num_env_runners=0)
              .multi_agent(policies={"shared"},
                           policy_mapping_fn=lambda agent_id, *args, **kwargs: "shared")
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)}))
    runner = RLlibRunner(config=config)
    start = time.perf_counter()
    runner.sample(num_timesteps=steps)
    return (lambda: runner.sample(num_timesteps=steps)), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--vector-steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "host_multi_agent.json"))
    args = parser.parse_args()
    load_start = os.getloadavg()
    steps = args.envs * args.vector_steps
    ours, ours_first = make_jaxrunner(args.agents, args.envs, steps, args.hiddens)
    logging.disable(logging.WARNING)  # RLlib's construction warnings
    try:
        rllib, rllib_first = make_rllib(args.agents, args.envs, steps, args.hiddens)
    finally:
        logging.disable(logging.NOTSET)
    sides = {"jaxrunner_host_multi_agent": ours, "rllib_multi_agent_env_runner": rllib}
    timings = {name: {"wall": [], "cpu": []} for name in sides}
    for _ in range(args.rounds):
        for name, run in sides.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            timings[name]["cpu"].append(time.process_time() - cpu)
            timings[name]["wall"].append(time.perf_counter() - wall)
    ours_t, ref_t = (timings["jaxrunner_host_multi_agent"],
                     timings["rllib_multi_agent_env_runner"])
    result = {
        "benchmark": "host multi-agent env: jaxrunner MultiAgentEnvRunner vs RLlib "
                     "MultiAgentEnvRunner on RLlib's MultiAgentCartPole example",
        "num_agents": args.agents, "num_envs": args.envs, "env_steps_per_call": steps,
        "rounds": args.rounds, "hiddens": args.hiddens,
        "median_env_steps_per_s": {n: steps / statistics.median(t["wall"])
                                   for n, t in timings.items()},
        "best_env_steps_per_s": {n: steps / min(t["wall"]) for n, t in timings.items()},
        "ratio_rllib_time_over_ours": {
            "wall_median": statistics.median(r / o for r, o in zip(ref_t["wall"],
                                                                    ours_t["wall"])),
            "cpu_median": statistics.median(r / o for r, o in zip(ref_t["cpu"],
                                                                   ours_t["cpu"])),
            "wall_best": min(ref_t["wall"]) / min(ours_t["wall"])},
        "first_sample_s": {"jaxrunner_host_multi_agent": ours_first,
                           "rllib_multi_agent_env_runner": rllib_first},
        "timings": timings,
        "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
        "machine": machine_info(),
        "note": "shared 2-core machine: other processes ran during the measurement",
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("median_env_steps_per_s",
                                             "ratio_rllib_time_over_ours",
                                             "load_average_at_start")}, indent=2))


if __name__ == "__main__":
    main()
