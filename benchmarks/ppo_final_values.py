"""What the PPO update's V(final_obs) costs: the critic on the store's rows or on dense rows.

    python benchmarks/ppo_final_values.py [--rounds 10] [--cases ENV:NUM_ENVS:STEPS ...]
                                          [--output PATH]

The PPO update bootstraps truncated and cut episodes from V(final_obs[t]). A step's final
observation is the next step's observation except where an episode ended or the chunk
stopped, and those rows are the trajectory's final-observation store; so the update reads
V(obs[t + 1]) from the values it computes anyway and runs the critic on the store's rows
only (`"store"`, the default). `"dense"` (`jaxrunner.learners.ppo.FINAL_VALUES_FROM_STORE
= False`) rebuilds the dense `(T, B)` final observations and runs the critic on all of
them. For each case one trajectory is sampled (`jaxrunner.make_sampler`, 64x64 MLP), both
`update_fn`s are compiled in one process (4 epochs of 4 minibatches) and called on it in
alternating rounds (`jaxrunner.benchmarking.compare`, the order reversed every round):
`ratio_to_dense` is the median per-round speed of "store" over "dense" (above 1: the
store's update is faster). JSON to `benchmarks/results/ppo_final_values.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

import jax  # noqa: E402
from same_process_ab import run_header  # noqa: E402

import jaxrunner  # noqa: E402
from jaxrunner.benchmarking import compare, switched  # noqa: E402
from jaxrunner.learners import PPOConfig, PPOLearner  # noqa: E402
from jaxrunner.learners import ppo as ppo_module  # noqa: E402

CASES = (("CartPole-v1", 1024, 64), ("Pendulum-v1", 16, 128), ("Breakout-MinAtar", 512, 64))


def measure(env_id: str, num_envs: int, num_steps: int, rounds: int) -> dict:
    """Both updates' median seconds on one trajectory of `env_id`, and the median ratio."""
    config = (jaxrunner.RunnerConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=num_steps)
              .rl_module(model_config={"fcnet_hiddens": [64, 64]}).debugging(seed=0))
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(num_epochs=4, num_minibatches=4))
    _, traj, _ = sampler.sample(sampler.init(jax.random.key(0)), learner.state.params)
    updates = {}
    for side, from_store in (("store", True), ("dense", False)):
        with switched(ppo_module, "FINAL_VALUES_FROM_STORE", from_store):  # read at trace
            updates[side] = jax.jit(learner.update_fn).lower(learner.state, traj).compile()
        jax.block_until_ready(updates[side](learner.state, traj))
    result = compare({side: (lambda u=update: jax.block_until_ready(u(learner.state, traj)))
                      for side, update in updates.items()}, num_envs * num_steps,
                     rounds=rounds, calls_per_round=1, reference="dense")
    return {"env": env_id, "num_envs": num_envs, "num_steps": num_steps,
            "store_rows": int(traj.final_obs_store.index.shape[0]),
            "dense_rows": num_envs * num_steps,
            "ratio_to_dense": result["ratio_to_dense"]["store"],
            "timings_s": result["_timings"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cases", nargs="*", default=None,
                        help="ENV:NUM_ENVS:STEPS entries (default: all)")
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "ppo_final_values.json"))
    args = parser.parse_args()
    cases = CASES if not args.cases else tuple(
        (c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in args.cases)
    out = {**run_header("ppo_final_values"), "rounds": args.rounds, "cases": []}
    for env_id, num_envs, num_steps in cases:
        load = os.getloadavg()[0]
        result = measure(env_id, num_envs, num_steps, args.rounds)
        result["load_avg_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        out["cases"].append(result)
        print(f"{env_id} {num_envs}x{num_steps}: store {result['store_rows']} rows / dense "
              f"{result['dense_rows']}: update {result['ratio_to_dense']:.3f}x as fast as the "
              "dense one", flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
