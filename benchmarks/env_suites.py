"""JAX env suites through jaxrunner against each suite's own bare rollout.

For each installed suite case, `sample()` of a `SingleAgentEnvRunner` on the adapted env
(`"<suite>/<id>"`) is compared with a rollout written the way that suite's own training
code writes it, on the same env and the same 64x64 tanh MLP policy (sampled actions):

* Brax: `brax.envs.training.wrap` (Brax's `VmapWrapper` + `EpisodeWrapper` +
  `AutoResetWrapper`, what Brax's PPO trains on) and `brax.training.acting.generate_unroll`
  (Brax's own `lax.scan` of `actor_step`), jitted;
* Craftax: a PureJaxRL-style `lax.scan` over `vmap(env.step)` of Craftax's own auto-reset
  env (`make_craftax_env_from_name(id, auto_reset=True)`), keeping what a PPO rollout keeps
  (observation, action, reward, done, log-prob) and summing finished episodes' returns;
* Navix: the same PureJaxRL-style scan of Navix's own `env.step` (which resets a finished
  episode itself).

The suite's rollout does less than `sample()`: it has no final observations (Brax's and
Craftax's auto-reset overwrite them), no terminated/truncated split, no episode ids or
metrics, and Brax/Playground restart every episode from the cached first state. The sides
run in alternating rounds in one process (`jaxrunner.benchmarking.compare`); the first
call of each side (compilation included) is timed too. `--adapted-scan` adds a third side:
the same PureJaxRL-style scan of the *adapted* env (`jaxrunner.benchmarking.make_bare_scan`).
The load average is recorded before and after each case (the machine may be shared).
JSON to `benchmarks/results/env_suites.json`, each row with the git commit it measured
(`source`).

    python benchmarks/env_suites.py                  # every installed case, 1024 envs
    python benchmarks/env_suites.py --cases brax/inverted_pendulum --num-envs 4096
    python benchmarks/env_suites.py --merge --cases navix/Navix-Empty-5x5-v0  # one case
    python benchmarks/env_suites.py --merge --cases craftax/Craftax-Symbolic-v1 \
        --autoreset-mode partial    # the runner with autoreset_mode="partial"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from gymnax.environments import spaces as gx

from jaxrunner.benchmarking import (compare, machine_info, make_bare_scan, make_policy,
                                    make_scan_rollout)
from jaxrunner.config import RunnerConfig
from jaxrunner.core.chunk import strong_types
from jaxrunner.envs import adapters
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HIDDENS = (64, 64)


def _timed_first_call(run: Callable[[], None]) -> tuple[Callable[[], None], float]:
    """Times the first call (compilation included), then calls once more untimed."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    run()
    return run, first


# ---------------------------------------------------------------- the suites' own rollouts
def brax_own_rollout(name: str, num_envs: int, num_steps: int, seed: int = 0,
                     episode_length: int = 1000) -> tuple[Callable[[], None], float]:
    """Brax's training rollout: `wrap(env)` (vmap, episode limit, auto-reset to the cached
    first state) and `generate_unroll` with `extra_fields=("truncation",)`, as Brax's PPO
    collects data. Returns `(run, first_call_s)`."""
    from brax import envs
    from brax.envs.wrappers.training import wrap
    from brax.training.acting import generate_unroll

    env = wrap(envs.get_environment(name), episode_length=episode_length)
    act = make_policy(env.observation_size, gx.Box(-1.0, 1.0, (env.action_size,)), HIDDENS,
                      seed=seed)

    def policy(obs, key):
        action, logp = act(obs, key)
        return action, {"log_prob": logp}

    @jax.jit
    def unroll(state, key):
        key, unroll_key = jax.random.split(key)
        state, data = generate_unroll(env, state, policy, unroll_key, num_steps,
                                      extra_fields=("truncation",))
        return strong_types(state), key, data

    key = jax.random.PRNGKey(seed)  # Brax's wrappers take raw uint32 keys ((B, 2) batched)
    holder = {"state": strong_types(jax.jit(env.reset)(jax.random.split(key, num_envs))),
              "key": key}

    def run():
        holder["state"], holder["key"], data = unroll(holder["state"], holder["key"])
        jax.block_until_ready(data)

    return _timed_first_call(run)


def _purejaxrl_scan(reset, step, obs_size: int, action_space: Any, num_envs: int,
                    num_steps: int, seed: int) -> tuple[Callable[[], None], float]:
    """The PureJaxRL-style rollout of `jaxrunner.benchmarking` (the one `--adapted-scan`
    runs on the adapted env) over the suite's own `reset(keys) -> (obs, state)` and
    `step(keys, state, action) -> (obs, state, reward, done)`, both over `[num_envs]`."""
    act = make_policy(obs_size, action_space, HIDDENS, seed=seed)
    return _timed_first_call(make_scan_rollout(reset, step, act, num_envs, num_steps, seed))


def craftax_own_rollout(env_id: str, num_envs: int, num_steps: int, seed: int = 0
                        ) -> tuple[Callable[[], None], float]:
    """PureJaxRL-style scan of Craftax's own auto-reset env (`auto_reset=True`: Craftax's
    `step` replaces a finished episode's state with a fresh `reset_env`)."""
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(env_id, auto_reset=True)
    params = env.default_params
    obs_size = int(jnp.prod(jnp.array(env.observation_space(params).shape)))

    def reset(keys):
        return jax.vmap(env.reset, in_axes=(0, None))(keys, params)

    def step(keys, state, action):
        obs, state, reward, done, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            keys, state, action, params)
        return obs, state, reward, done

    return _purejaxrl_scan(reset, step, obs_size, env.action_space(params), num_envs,
                           num_steps, seed)


def navix_own_rollout(env_id: str, num_envs: int, num_steps: int, seed: int = 0
                      ) -> tuple[Callable[[], None], float]:
    """PureJaxRL-style scan of Navix's own `step` (it resets a finished episode from the
    key in its state)."""
    import navix

    env = navix.make(env_id)
    obs_size = int(jnp.prod(jnp.array(env.observation_space.shape)))

    def reset(keys):
        timestep = jax.vmap(env.reset)(keys)
        return timestep.observation, timestep

    def step(keys, timestep, action):
        del keys
        timestep = jax.vmap(env.step)(timestep, action)
        done = timestep.is_done()
        return timestep.observation, timestep, timestep.reward, done

    return _purejaxrl_scan(reset, step, obs_size, env.action_space, num_envs, num_steps,
                           seed)


CASES: dict[str, tuple[str, Callable[..., tuple[Callable[[], None], float]], int]] = {
    # case -> (package that must be installed, the suite's own rollout, default num_steps)
    "brax/inverted_pendulum": ("brax", brax_own_rollout, 16),
    "craftax/Craftax-Symbolic-v1": ("craftax", craftax_own_rollout, 8),
    "navix/Navix-Empty-5x5-v0": ("navix", navix_own_rollout, 16),
}


def measure(case: str, num_envs: int, num_steps: int, rounds: int, adapted_scan: bool,
            seed: int = 0, autoreset_mode: str = "gymnax") -> dict[str, Any]:
    _, own_rollout, _ = CASES[case]
    load_before = os.getloadavg()
    config = (RunnerConfig().environment(case)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps,
                           autoreset_mode=autoreset_mode)
              .rl_module(model_config={"fcnet_hiddens": list(HIDDENS)}).debugging(seed=seed))
    start = time.perf_counter()
    runner = SingleAgentEnvRunner(config=config)
    built = time.perf_counter()
    runner.sample()
    first_sample = time.perf_counter() - built
    runner.sample()  # as the suite's rollout gets: one more untimed call
    sides = {"jaxrunner": runner.sample}
    sides["suite_own"], own_first = own_rollout(case.split("/", 1)[1], num_envs, num_steps,
                                                seed=seed)
    row: dict[str, Any] = {"case": case, "autoreset_mode": autoreset_mode,
                           "num_envs": num_envs, "num_steps": num_steps, "rounds": rounds,
                           "construction_s": built - start,
                           "first_sample_s": first_sample, "suite_own_first_call_s": own_first}
    if adapted_scan:
        env, params = adapters.make_suite_env(case, {})
        bare_start = time.perf_counter()
        sides["adapted_scan"] = make_bare_scan((env, params), num_envs, num_steps, HIDDENS,
                                               random_actions=False, seed=seed)
        row["adapted_scan_first_call_s"] = time.perf_counter() - bare_start
        sides["adapted_scan"]()
    result = compare(sides, num_envs * num_steps, rounds=rounds, reference="suite_own")
    runner.stop()
    row.update({
        "median_steps_per_s": result["median_steps_per_s"],
        "best_steps_per_s": result["steps_per_s"],
        "ratio": result["ratio_to_suite_own"]["jaxrunner"],
        "ratios_to_suite_own": result["ratio_to_suite_own"],
        "seconds_per_call": result["_timings"],
        "target": 0.95,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    })
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--num-steps", type=int, default=None,
                        help="steps per call (default: per case, 8 for Craftax, else 16)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--autoreset-mode", choices=("gymnax", "partial"), default="gymnax",
                        help="the runner's autoreset_mode (a row per case and mode; the "
                             "suite's own rollout is the same in both)")
    parser.add_argument("--adapted-scan", action="store_true",
                        help="also time a bare scan of the adapted env")
    parser.add_argument("--output", default=os.path.join(RESULTS, "env_suites.json"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of --output for cases not measured now (one "
                             "process per case: run each with --merge)")
    args = parser.parse_args()
    kept = (_kept(args.output, args.cases, args.autoreset_mode) if args.merge
            else {"cases": []})
    out: dict[str, Any] = {
        "benchmark": "env_suites",
        "policy": f"mlp{HIDDENS} tanh, sampled actions (explore)",
        "reference": "suite_own: the suite's own rollout (Brax generate_unroll over "
                     "wrap(env); PureJaxRL-style scan of Craftax's / Navix's own "
                     "auto-resetting step)",
        "machine": machine_info(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cases": kept.pop("cases"), "not_installed": []}
    out.update({key: value for key, value in kept.items() if key not in out})
    source = _source_revision()
    for case in args.cases:
        package, _, default_steps = CASES[case]
        if importlib.util.find_spec(package) is None:
            out["not_installed"].append(case)
            continue
        row = measure(case, args.num_envs, args.num_steps or default_steps, args.rounds,
                      args.adapted_scan, autoreset_mode=args.autoreset_mode)
        row["source"] = source
        out["cases"].append(row)
        _write(out, args.output)  # after every case: a long sweep keeps what it measured
        steps = row["median_steps_per_s"]
        print(f"{case} ({args.autoreset_mode}) num_envs={args.num_envs} "
              f"T={row['num_steps']}: ratio "
              f"{row['ratio']:.3f} (jaxrunner {steps['jaxrunner']:,.0f} vs suite's own "
              f"{steps['suite_own']:,.0f} steps/s); first sample() "
              f"{row['first_sample_s']:.1f} s, suite's first call "
              f"{row['suite_own_first_call_s']:.1f} s; load {row['loadavg_before'][0]:.1f}"
              f"->{row['loadavg_after'][0]:.1f}", flush=True)
    _write(out, args.output)
    print(f"wrote {args.output}")


def _kept(path: str, cases: list[str], autoreset_mode: str) -> dict[str, Any]:
    """What `--merge` keeps of the JSON at `path` (if any): its rows other than those of
    `cases` in `autoreset_mode` (a row without a mode is "gymnax"), and its other entries
    (notes, `not_measured` less `cases` when they are measured in "gymnax" mode)."""
    if not os.path.exists(path):
        return {"cases": []}
    with open(path) as f:
        old = json.load(f)
    kept = {key: value for key, value in old.items()
            if key not in ("benchmark", "policy", "reference", "machine", "xla_flags",
                           "not_installed")}
    kept["cases"] = [row for row in old.get("cases", [])
                     if row["case"] not in cases
                     or row.get("autoreset_mode", "gymnax") != autoreset_mode]
    if isinstance(kept.get("not_measured"), dict) and autoreset_mode == "gymnax":
        kept["not_measured"] = {case: why for case, why in kept["not_measured"].items()
                                if case not in cases}
    return kept


def _source_revision() -> dict[str, Any]:
    """The git commit of the measured code and whether the work tree differed from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*command: str) -> str:
        return subprocess.run(("git", "-C", root) + command, capture_output=True,
                              text=True, check=True).stdout.strip()

    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "jaxrunner",
                      "benchmarks", ":(exclude)benchmarks/results")
        return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(changed)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted_changes": None}


def _write(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
