"""RLlib PPO wall time per iteration: `JaxEnvRunner` (gymnax CartPole-v1) vs RLlib's own
`SingleAgentEnvRunner` (gymnasium CartPole-v1), same PPO config and batch size.

    python benchmarks/rllib_dropin.py [--rounds 6] [--num-envs 8] [--batch 4000]
                                      [--output benchmarks/results/rllib_dropin.json]

Both algorithms live in one 2-CPU Ray instance (one remote env runner each, the learner in
the driver) and are measured in alternating rounds, so machine noise hits both alike. Each
round times, per algorithm:

* `iteration_s`: one `algo.train()` (sample `batch` env steps on the remote runner, PPO
  update on the local learner, weight sync);
* `sample_s`: one more `synchronous_parallel_sample(max_env_steps=batch)`, the sampling
  step of PPO's `training_step` alone (episodes back in the driver).

The first `--warmup` rounds (JAX compilation, torch warm-up) are not counted. The speed-up
is the ratio of medians. The learner (torch, CPU) is the same for both, so the iteration
speed-up is bounded by the learner's share of the iteration.
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


def build(kind: str, args):
    from ray.rllib.algorithms.ppo import PPOConfig

    from jaxrunner.rllib import JaxEnvRunner

    runner_kwargs = {"env_runner_cls": JaxEnvRunner} if kind == "jax" else {}
    config = (PPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=1, num_envs_per_env_runner=args.num_envs,
                           sample_timeout_s=600.0, **runner_kwargs)
              .training(train_batch_size_per_learner=args.batch,
                        minibatch_size=args.minibatch, num_epochs=args.epochs, lr=3e-4,
                        vf_loss_coeff=0.01)
              .rl_module(model_config={"fcnet_hiddens": [32], "vf_share_layers": True})
              .debugging(seed=0))
    return config.build_algo()


def time_round(algo, batch: int) -> dict:
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    start = time.perf_counter()
    result = algo.train()
    iteration = time.perf_counter() - start
    start = time.perf_counter()
    episodes = synchronous_parallel_sample(worker_set=algo.env_runner_group,
                                           max_env_steps=batch, _uses_new_env_runners=True)
    sample = time.perf_counter() - start
    return {"iteration_s": iteration, "sample_s": sample,
            "sampled_env_steps": int(sum(len(e) for e in episodes)),
            "episode_return_mean": result["env_runners"].get("episode_return_mean")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4000)
    parser.add_argument("--minibatch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "rllib_dropin.json"))
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    load_before = os.getloadavg()
    algos = {"jax": build("jax", args), "rllib": build("rllib", args)}
    rounds = {kind: [] for kind in algos}
    try:
        for i in range(args.warmup + args.rounds):
            for kind, algo in algos.items():
                record = time_round(algo, args.batch)
                record["warmup"] = i < args.warmup
                rounds[kind].append(record)
                print(f"round {i} {kind:5s} iteration {record['iteration_s']:7.2f}s  "
                      f"sample {record['sample_s']:6.3f}s  "
                      f"return {record['episode_return_mean']}", flush=True)
    finally:
        for algo in algos.values():
            algo.stop()
        ray.shutdown()

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[kind] if not r["warmup"])

    summary = {}
    for kind in algos:
        summary[kind] = {
            "iteration_s_median": median(kind, "iteration_s"),
            "sample_s_median": median(kind, "sample_s"),
            "sample_env_steps_per_s": args.batch / median(kind, "sample_s"),
            "learner_and_rest_s_median": statistics.median(
                r["iteration_s"] - r["sample_s"] for r in rounds[kind] if not r["warmup"]),
        }
    summary["speedup_iteration"] = (summary["rllib"]["iteration_s_median"]
                                    / summary["jax"]["iteration_s_median"])
    summary["speedup_sampling"] = (summary["rllib"]["sample_s_median"]
                                   / summary["jax"]["sample_s_median"])
    out = {
        "benchmark": "RLlib PPO on CartPole-v1: JaxEnvRunner (gymnax) vs SingleAgentEnvRunner "
                     "(gymnasium), alternating rounds in one 2-CPU Ray instance",
        "config": {"train_batch_size_per_learner": args.batch,
                   "num_envs_per_env_runner": args.num_envs, "num_env_runners": 1,
                   "num_learners": 0, "minibatch_size": args.minibatch,
                   "num_epochs": args.epochs, "fcnet_hiddens": [32],
                   "rounds": args.rounds, "warmup_rounds": args.warmup},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "summary": summary,
        "rounds": rounds,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
