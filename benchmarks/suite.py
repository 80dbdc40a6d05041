"""The benchmark suite: throughput sweeps against peers, auto-reset strategies, memory,
host RSS and compile time. JSON to benchmarks/results/suite.json, a PNG plot beside it.

    python -m benchmarks            # full sweep (about 15 minutes on a 2-core CPU)
    python -m benchmarks --quick    # small sweep (a few minutes)
    python -m benchmarks --targets  # the speed targets only, merged into suite.json

Samplers, measured in alternating rounds in one process (ratios are what to compare):
- jaxrunner `sample()` (auto-reset "gymnax" and, for random actions, "partial");
- a bare hand-written `lax.scan` of the same env and policy (`jaxrunner.benchmarking`);
- a `gymnasium.vector` loop of the numpy env with the same policy jitted (CartPole,
  Pendulum);
- RLlib's `SingleAgentEnvRunner` (CartPole, 64x64 torch MLP), when `ray[rllib]` and torch
  are installed (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.benchmarking import compare, machine_info, make_bare_scan, make_jaxrunner

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HIDDENS = (64, 64)


def make_gymnasium_loop(env_id: str, num_envs: int, num_steps: int, random_actions: bool):
    """A `gymnasium.vector.SyncVectorEnv` loop with the same MLP policy jitted per step."""
    import gymnasium as gym

    from jaxrunner.benchmarking import _PolicyNet

    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    discrete = isinstance(envs.single_action_space, gym.spaces.Discrete)
    out_dim = (envs.single_action_space.n if discrete
               else 2 * envs.single_action_space.shape[0])
    net = _PolicyNet(HIDDENS, out_dim)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    weights = net.init(jax.random.key(0), jnp.zeros((1, obs_dim)))

    @jax.jit
    def policy(obs, key):
        out = net.apply(weights, obs)
        if discrete:
            return jax.random.categorical(key, out)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)

    holder = {"obs": envs.reset(seed=0)[0], "key": jax.random.key(0)}

    def run():
        obs, key = holder["obs"], holder["key"]
        for _ in range(num_steps):
            if random_actions:
                action = envs.action_space.sample()
            else:
                key, sub = jax.random.split(key)
                action = np.asarray(policy(obs, sub))
                if not discrete:
                    action = np.clip(action, envs.single_action_space.low,
                                     envs.single_action_space.high)
            obs, _, _, _, _ = envs.step(action)
        holder["obs"], holder["key"] = obs, key

    run()
    return run


def make_rllib_runner(num_envs: int, num_steps: int, random_actions: bool):
    """RLlib's own SingleAgentEnvRunner on gymnasium CartPole-v1 (64x64 torch MLP)."""
    import logging

    logging.disable(logging.WARNING)
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=num_envs, num_env_runners=0)
              .rl_module(model_config={"fcnet_hiddens": list(HIDDENS)}))
    runner = SingleAgentEnvRunner(config=config)
    runner.sample(num_timesteps=num_envs * 4, random_actions=random_actions)

    def run():
        runner.sample(num_timesteps=num_envs * num_steps, random_actions=random_actions)

    return run


def _rllib_available() -> bool:
    try:
        import ray.rllib  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def throughput_sweep(env_id: str, num_envs_list, random_actions: bool, rounds: int,
                     with_gymnasium: bool, with_rllib: bool, log) -> list[dict[str, Any]]:
    cases = []
    for num_envs in num_envs_list:
        num_steps = 128 if num_envs >= 64 else 256
        sides, first_call = {}, {}
        sides["jaxrunner"], first_call["jaxrunner"] = make_jaxrunner(
            env_id, num_envs, num_steps, HIDDENS, random_actions)
        if random_actions:
            sides["jaxrunner_partial_reset"], first_call["jaxrunner_partial_reset"] = (
                make_jaxrunner(env_id, num_envs, num_steps, HIDDENS, random_actions,
                               autoreset_mode="partial"))
        sides["bare_scan"] = make_bare_scan(env_id, num_envs, num_steps, HIDDENS,
                                            random_actions)
        result = compare(sides, num_envs * num_steps, rounds=rounds, calls_per_round=None)
        del result["_timings"]
        # Host peers are measured apart: torch's and numpy's thread pools keep spinning
        # after a call and would slow whichever JAX side ran next.
        host_sides, host_steps_per_call = {}, {}
        host_steps = max(4, min(num_steps, 20_000 // num_envs))
        if with_gymnasium and num_envs <= 1024:
            host_sides["gymnasium_vector"] = make_gymnasium_loop(env_id, num_envs, host_steps,
                                                                 random_actions)
            host_steps_per_call["gymnasium_vector"] = num_envs * host_steps
        if with_rllib and num_envs <= 1024:
            host_sides["rllib_env_runner"] = make_rllib_runner(num_envs, host_steps,
                                                               random_actions)
            host_steps_per_call["rllib_env_runner"] = num_envs * host_steps
        if host_sides:
            result["steps_per_s"].update(
                compare(host_sides, host_steps_per_call, rounds=3,
                        calls_per_round=None)["steps_per_s"])
        del host_sides
        result.update({"env": env_id, "num_envs": num_envs,
                       "policy": "random" if random_actions else "mlp64x64 explore",
                       "first_sample_s": first_call})
        cases.append(result)
        log(f"{env_id} {'random' if random_actions else 'mlp'} num_envs={num_envs}: " + ", ".join(
            f"{k} {v:,.0f}/s" for k, v in result["steps_per_s"].items()))
        del sides
        gc.collect()
    return cases


def memory_per_step(env_id: str = "CartPole-v1", num_envs: int = 4096,
                    num_steps: int = 128) -> dict[str, Any]:
    """Device bytes the compiled chunk needs (outputs + temporaries) per sampled step,
    against the raw trajectory bytes per step (obs, next obs, action, reward, flags)."""
    from jaxrunner import RunnerConfig, SingleAgentEnvRunner

    config = (RunnerConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps)
              .rl_module(model_config={"fcnet_hiddens": list(HIDDENS)}).debugging(seed=0))
    runner = SingleAgentEnvRunner(config=config)
    runner.sample()
    fns = runner._fns("explore")
    lowered = fns["chunk"].lower(runner._carry, runner._lookback, runner._params,
                                 runner.env_params, np.int32(num_steps), np.int32(2**31 - 1),
                                 np.int32(2**31 - 1), np.int32(0))
    analysis = lowered.compile().memory_analysis()
    traj = runner.sample().chunks[0]
    # Raw trajectory bytes: the per-step data itself (observation, final observation,
    # action, reward, terminated, truncated, action_logp, action_dist_inputs).
    data = (traj.obs, traj.final_obs, traj.actions, traj.rewards, traj.terminated,
            traj.truncated, traj.extra_model_outputs)
    raw_per_step = sum(leaf.nbytes for leaf in jax.tree.leaves(data)) / (num_envs * num_steps)
    steps = num_envs * num_steps
    used = analysis.output_size_in_bytes + analysis.temp_size_in_bytes
    return {"env": env_id, "num_envs": num_envs, "num_steps": num_steps,
            "output_bytes": analysis.output_size_in_bytes,
            "temp_bytes": analysis.temp_size_in_bytes,
            "bytes_per_step": used / steps, "raw_trajectory_bytes_per_step": raw_per_step,
            "ratio": used / steps / raw_per_step}


def host_rss_over_calls(calls: int = 1000) -> dict[str, Any]:
    """Host RSS before and after `calls` small `sample()` calls (after warm-up)."""
    import psutil

    from jaxrunner import RunnerConfig, SingleAgentEnvRunner

    config = (RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=64, rollout_fragment_length=32)
              .rl_module(model_config={"fcnet_hiddens": [16]}).debugging(seed=0))
    runner = SingleAgentEnvRunner(config=config)
    process = psutil.Process()
    for _ in range(50):
        runner.sample()
    runner.get_metrics()
    gc.collect()
    before = process.memory_info().rss
    samples = []
    for i in range(calls):
        runner.sample()
        if i % 100 == 99:
            runner.get_metrics()
            gc.collect()
            samples.append(process.memory_info().rss)
    after = process.memory_info().rss
    return {"calls": calls, "rss_before_mb": before / 2**20, "rss_after_mb": after / 2**20,
            "growth_mb": (after - before) / 2**20,
            "rss_every_100_calls_mb": [s / 2**20 for s in samples]}


def compile_times(env_ids=None, num_envs: int = 64) -> dict[str, float]:
    """Wall time of each env's first `sample()` (compilation included)."""
    from jaxrunner.envs.registry import gymnax_env_ids

    out = {}
    for env_id in env_ids or gymnax_env_ids():
        _, seconds = make_jaxrunner(env_id, num_envs, 128, HIDDENS, False)
        out[env_id] = seconds
    return out


_STARTUP_SCRIPT = """
import json, sys, time
start = time.perf_counter()
import jaxrunner
imported = time.perf_counter()
if sys.argv[2]:
    jaxrunner.enable_compilation_cache(sys.argv[2])
config = (jaxrunner.RunnerConfig().environment(sys.argv[1])
          .env_runners(num_envs_per_env_runner=64, rollout_fragment_length=128)
          .rl_module(model_config={"fcnet_hiddens": [64, 64]}).debugging(seed=0))
built = time.perf_counter()
runner = jaxrunner.SingleAgentEnvRunner(config=config)
constructed = time.perf_counter()
runner.sample()
sampled = time.perf_counter()
print(json.dumps({"import_s": imported - start, "construct_s": constructed - built,
                  "first_sample_s": sampled - constructed,
                  "construct_and_first_sample_s": sampled - built}))
"""


def startup_times(env_id: str = "CartPole-v1") -> dict[str, Any]:
    """Fresh processes: runner construction and first `sample()` (64 envs, 64x64 MLP), cold
    and with `enable_compilation_cache` after a process filled the cache."""
    import subprocess
    import sys
    import tempfile

    def run(cache_dir: str) -> dict[str, float]:
        proc = subprocess.run([sys.executable, "-c", _STARTUP_SCRIPT, env_id, cache_dir],
                              capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run("")
        run(cache_dir)  # fills the cache
        warm = run(cache_dir)
    return {"env": env_id, "num_envs": 64, "cold": cold, "warm_compilation_cache": warm}


_BARE_STARTUP_SCRIPT = """
import json, sys, time
start = time.perf_counter()
from jaxrunner.benchmarking import make_bare_scan
imported = time.perf_counter()
make_bare_scan(sys.argv[1], 64, 128, (64, 64), False)  # builds, compiles and runs once
print(json.dumps({"import_s": imported - start,
                  "first_call_s": time.perf_counter() - imported}))
"""


def bare_scan_startup(env_id: str = "CartPole-v1") -> dict[str, float]:
    """A fresh process's first call of the bare scan (64 envs, 128 steps, 64x64 MLP):
    what the runner's first `sample()` is held against."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _BARE_STARTUP_SCRIPT, env_id],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(cases, env_id: str, policy: str, sizes, side: str = "jaxrunner") -> list:
    return [{"num_envs": c["num_envs"], "ratio": c["ratio_to_bare_scan"][side]}
            for c in cases if c["env"] == env_id and (c["policy"] == "random") == (
                policy == "random") and c["num_envs"] in sizes]


def _verdict(values: list, target: float, higher: bool = True) -> dict[str, Any]:
    worst = (min if higher else max)(values) if values else None
    met = worst is not None and (worst >= target if higher else worst <= target)
    return {"worst": worst, "target": (">= " if higher else "<= ") + str(target),
            "met": bool(met)}


def speed_targets(rounds: int = 5, log=print, quick: bool = False) -> dict[str, Any]:
    """The speed issue's targets, measured in this process (ratios from alternating
    rounds) and in fresh processes (first `sample()`), with the machine load. `quick`:
    fewer sizes (no 16,384 envs)."""
    load_before = os.getloadavg()
    big = [1024, 4096] if quick else [1024, 4096, 16384]
    plan = [("CartPole-v1", False, [16, 128] + big), ("CartPole-v1", True, big),
            ("Breakout-MinAtar", False, big[:1] if quick else [1024, 4096]),
            ("Pendulum-v1", False, big[:1] if quick else [1024, 4096])]
    cases = []
    for env_id, random_actions, sizes in plan:
        cases += throughput_sweep(env_id, sizes, random_actions, rounds, False, False, log)
    memory = memory_per_step()
    log(f"memory: {memory['ratio']:.3f}x the raw trajectory bytes")
    startup = startup_times("CartPole-v1")
    bare = bare_scan_startup("CartPole-v1")
    first = compile_times(["CartPole-v1", "Breakout-MinAtar", "Pendulum-v1"])
    load_after = os.getloadavg()
    cart_small = _ratio(cases, "CartPole-v1", "mlp", [16, 128])
    cart_big = _ratio(cases, "CartPole-v1", "mlp", [1024, 4096, 16384])
    partial = _ratio(cases, "CartPole-v1", "random", [1024, 4096, 16384],
                     "jaxrunner_partial_reset")
    minatar = _ratio(cases, "Breakout-MinAtar", "mlp", [1024, 4096])
    pendulum = _ratio(cases, "Pendulum-v1", "mlp", [1024, 4096])
    cold = startup["cold"]["first_sample_s"]
    summary = {
        "cartpole_mlp_ratio_16_to_128_envs": {
            **_verdict([c["ratio"] for c in cart_small], 0.9), "values": cart_small},
        "cartpole_mlp_ratio_1024_to_16384_envs": {
            **_verdict([c["ratio"] for c in cart_big], 0.95), "values": cart_big},
        "minatar_mlp_ratio_1024_plus_envs": {
            **_verdict([c["ratio"] for c in minatar], 0.95), "values": minatar},
        "pendulum_mlp_ratio_1024_plus_envs": {
            **_verdict([c["ratio"] for c in pendulum], 0.95), "values": pendulum},
        "partial_reset_over_bare_gymnax_1024_plus_envs": {
            **_verdict([c["ratio"] for c in partial], 1.5), "values": partial},
        "memory_ratio_to_raw_trajectory": _verdict([memory["ratio"]], 1.1, higher=False),
        "cartpole_first_sample_s_fresh_process": {
            **_verdict([cold], 3.0, higher=False),
            "bare_scan_first_call_s": bare["first_call_s"],
            "no_slower_than_bare_scan": bool(cold <= bare["first_call_s"])},
    }
    return {"machine": machine_info(), "load_avg_before": load_before,
            "load_avg_after": load_after, "rounds": rounds,
            "note": "ratios from alternating rounds in one process on a shared 2-core "
                    "machine; see load_avg", "cases": cases, "memory": memory,
            "startup": startup, "bare_scan_startup": bare, "first_sample_s": first,
            "summary": summary}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets next to what this run measured."""
    cases = results["cases"]
    mlp_big = [c["ratio_to_bare_scan"]["jaxrunner"] for c in cases
               if c["env"] == "CartPole-v1" and c["policy"] != "random" and c["num_envs"] >= 1024]
    partial = [c["ratio_to_bare_scan"]["jaxrunner_partial_reset"] for c in cases
               if c["env"] == "CartPole-v1" and c["policy"] == "random" and c["num_envs"] >= 1024]
    best = lambda name, policy: max(  # noqa: E731
        (c["steps_per_s"][name] for c in cases
         if c["env"] == "CartPole-v1" and c["policy"] == policy and name in c["steps_per_s"]),
        default=None)
    out: dict[str, Any] = {
        "cartpole_mlp_ratio_to_bare_at_1024_plus_envs": {
            "min": min(mlp_big, default=None), "values": mlp_big, "target": ">= 0.95"},
        "cartpole_random_partial_reset_ratio_to_bare_at_1024_plus_envs": {
            "min": min(partial, default=None), "values": partial, "target": ">= 1.5"},
        "memory_ratio_to_raw_trajectory": {"value": results["memory"]["ratio"],
                                           "target": "<= 1.1"},
        "host_rss_growth_mb_over_calls": {"value": results["host_rss"]["growth_mb"],
                                          "calls": results["host_rss"]["calls"]},
        "cartpole_first_sample_s": {
            "cold": results["startup"]["cold"]["first_sample_s"],
            "cold_construct_and_first_sample": results["startup"]["cold"][
                "construct_and_first_sample_s"],
            "warm_compilation_cache": results["startup"]["warm_compilation_cache"][
                "first_sample_s"],
            "target": "<= 3 s"},
    }
    for policy in ("mlp64x64 explore", "random"):
        ours, rllib = best("jaxrunner", policy), best("rllib_env_runner", policy)
        if ours and rllib:
            out[f"cartpole_{policy.split()[0]}_best_jaxrunner_over_best_rllib"] = {
                "value": ours / rllib, "jaxrunner_best_steps_per_s": ours,
                "rllib_best_steps_per_s": rllib, "target": ">= 250"}
    return out


def plot(cases: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for case in cases:
        groups.setdefault((case["env"], case["policy"]), []).append(case)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, ((env, policy), group) in zip(axes[0], groups.items()):
        samplers = sorted({name for c in group for name in c["steps_per_s"]})
        for name in samplers:
            points = [(c["num_envs"], c["steps_per_s"][name]) for c in group
                      if name in c["steps_per_s"]]
            ax.plot(*zip(*points), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("num_envs")
        ax.set_ylabel("env steps / s")
        ax.set_title(f"{env} ({policy})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# What `--targets` writes into the suite's JSON (kept when the full sweep rewrites it).
TARGET_RUN_KEYS = ("speed_targets", "earlier_speed_targets")


def keep_speed_targets(results: dict[str, Any], targets: dict[str, Any],
                       run_note: str | None = None) -> None:
    """Makes `targets` (a `speed_targets` run, with its `run_note` if given) the newest in
    `results` and moves the run it replaces to the front of `earlier_speed_targets`."""
    if run_note is not None:
        targets["run_note"] = run_note
    if "speed_targets" in results:
        results.setdefault("earlier_speed_targets", []).insert(0, results["speed_targets"])
    results["speed_targets"] = targets


def carry_target_runs(results: dict[str, Any], path: str) -> None:
    """Copies the `--targets` runs (`TARGET_RUN_KEYS`) of the suite JSON at `path`, if
    there is one, into `results` (a full sweep about to replace that file)."""
    if os.path.exists(path):
        with open(path) as f:
            previous = json.load(f)
        results.update({key: previous[key] for key in TARGET_RUN_KEYS if key in previous})


def main(argv=None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="jaxrunner benchmark suite")
    parser.add_argument("--quick", action="store_true", help="small sweep")
    parser.add_argument("--output", default=os.path.join(RESULTS, "suite.json"))
    parser.add_argument("--no-rllib", action="store_true")
    parser.add_argument("--targets", action="store_true",
                        help="only the speed targets, merged into the output JSON under "
                             "'speed_targets' (the run they replace moves to the front of "
                             "'earlier_speed_targets')")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--run-note", default=None,
                        help="with --targets: what this run is (commit, machine, change), "
                             "stored with it as 'run_note'")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    if args.targets:
        targets = speed_targets(args.rounds or 5, log=lambda m: print(m, flush=True),
                                quick=args.quick)
        results = {}
        if os.path.exists(args.output):
            with open(args.output) as f:
                results = json.load(f)
        keep_speed_targets(results, targets, args.run_note)
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
        print(json.dumps(targets["summary"], indent=1))
        print(f"wrote {args.output}")
        return results
    sizes = [1, 128, 1024, 4096] if args.quick else [1, 16, 128, 1024, 4096, 16384]
    rounds = 3 if args.quick else 9
    with_rllib = not args.no_rllib and _rllib_available()
    results: dict[str, Any] = {"machine": machine_info(), "cases": []}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    plan = [("CartPole-v1", False, True, with_rllib), ("CartPole-v1", True, True, with_rllib),
            ("Breakout-MinAtar", False, False, False), ("Pendulum-v1", False, True, False)]
    for env_id, random_actions, with_gym, rllib in plan:
        env_sizes = [s for s in sizes if not (env_id == "Breakout-MinAtar" and s > 4096)]
        results["cases"] += throughput_sweep(env_id, env_sizes, random_actions, rounds,
                                             with_gym, rllib, log)
    results["memory"] = memory_per_step()
    log(f"memory: {results['memory']['bytes_per_step']:.1f} bytes/step, "
        f"{results['memory']['ratio']:.2f}x the raw trajectory bytes")
    results["host_rss"] = host_rss_over_calls(200 if args.quick else 1000)
    log(f"host RSS growth over {results['host_rss']['calls']} calls: "
        f"{results['host_rss']['growth_mb']:.1f} MB")
    results["startup"] = startup_times("CartPole-v1")
    log(f"CartPole startup: cold first sample() {results['startup']['cold']['first_sample_s']:.2f}s"
        f" (construct + first sample {results['startup']['cold']['construct_and_first_sample_s']:.2f}s),"
        f" with the compilation cache {results['startup']['warm_compilation_cache']['first_sample_s']:.2f}s")
    results["first_sample_s"] = compile_times(
        ["CartPole-v1", "Breakout-MinAtar", "Pendulum-v1"] if args.quick else None)
    log("first sample() (compile included): " + ", ".join(
        f"{k} {v:.2f}s" for k, v in results["first_sample_s"].items()))
    results["summary"] = summarize(results)
    log(json.dumps(results["summary"], indent=1))
    carry_target_runs(results, args.output)  # the sweep replaces the sweep only
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    plot(results["cases"], os.path.splitext(args.output)[0] + ".png")
    log(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
