"""Env steps/s and agent steps/s of `MultiAgentEnvRunner.sample()` vs a bare hand-written
`lax.scan` of the same multi-agent env and the same modules, in alternating rounds in one
process.

    python benchmarks/throughput_multi_agent.py [--num-envs 1024] [--env MultiAgentCartPole-v1]

Both sides: `MultiAgentCartPole-v1` (2 agents, simultaneous moves, per-agent termination),
one `DefaultMLPModule` per agent (64x64 tanh, agent_i -> module p_i), sampled actions,
`vmap` over sub-envs and `lax.scan` over time. The bare scan keeps, per agent, what a
minimal PPO rollout keeps (observation, action, reward, done, log-prob) and sums finished
episodes' returns on device. The runner additionally tracks who acts, pending agent steps
and accumulated rewards, records whole agent transitions (both observations, action
distribution inputs), episode and agent counters, lookback and the metric rings.
Target (issue 6): ratio >= 0.9 at 1024 envs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxrunner import lowering  # noqa: E402
from jaxrunner.benchmarking import compare, machine_info  # noqa: E402
from jaxrunner.config import RunnerConfig  # noqa: E402
from jaxrunner.envs.context import EnvContext  # noqa: E402
from jaxrunner.envs.multi_agent import ALL, make_multi_agent_env  # noqa: E402
from jaxrunner.envs.spaces import to_gymnasium  # noqa: E402
from jaxrunner.modules.rl_module import DefaultMLPModule  # noqa: E402
from jaxrunner.runners.multi_agent_env_runner import MultiAgentEnvRunner  # noqa: E402


def _mapping(agent_id: str, episode: Any) -> str:
    return "p" + agent_id.rsplit("_", 1)[-1]


def make_bare_scan(env_id: str, num_envs: int, num_steps: int, hiddens: tuple[int, ...],
                   env_config: dict, seed: int = 0, unrolled_rng: bool = False
                   ) -> Callable[[], None]:
    """A hand-written PureJaxRL-style multi-agent rollout; returns `run()`. `unrolled_rng`:
    compiled with jaxrunner's unrolled Threefry lowering (`jaxrunner.lowering`), as the
    runner's programs are; default JAX's own lowering, as a hand-written scan gets."""
    env, params, _ = make_multi_agent_env(env_id, EnvContext(env_config))
    agents = tuple(env.agents)
    modules = {a: DefaultMLPModule(to_gymnasium(env.observation_space(a, params)),
                                   to_gymnasium(env.action_space(a, params)),
                                   {"fcnet_hiddens": list(hiddens)}, inference_only=True)
               for a in agents}
    key = jax.random.key(seed)
    weights = {a: modules[a].init(jax.random.fold_in(key, i)) for i, a in enumerate(agents)}
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, num_envs),
                                                         params)

    def step(carry, _):
        obs, state, key, ret, ret_sum, episodes = carry
        key, act_key, step_key = jax.random.split(key, 3)
        actions, logps = {}, {}
        for a, agent_key in zip(agents, jax.random.split(act_key, len(agents))):
            logits = modules[a].forward_exploration(weights[a], {"obs": obs[a]})[
                "action_dist_inputs"]
            actions[a] = jax.random.categorical(agent_key, logits)
            logps[a] = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[a][:, None],
                                           1)[:, 0]
        next_obs, state, rewards, terminateds, truncateds, _ = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(jax.random.split(step_key, num_envs), state,
                                               actions, params)
        done = terminateds[ALL] | truncateds[ALL]
        reward = sum(rewards[a] for a in agents)
        ret = ret + reward
        ret_sum = ret_sum + jnp.sum(jnp.where(done, ret, 0.0))
        episodes = episodes + jnp.sum(done)
        ret = jnp.where(done, 0.0, ret)
        record = {a: (obs[a], actions[a], rewards[a], terminateds[a] | truncateds[a] | done,
                      logps[a]) for a in agents}
        return (next_obs, state, key, ret, ret_sum, episodes), record

    def rollout(carry):
        return jax.lax.scan(step, carry, None, length=num_steps)

    rollout = lowering.jit(rollout, unrolled=unrolled_rng)

    holder = {"carry": (obs, state, key, jnp.zeros((num_envs,)), jnp.zeros(()),
                        jnp.zeros((), jnp.int32))}

    def run():
        holder["carry"], traj = rollout(holder["carry"])
        jax.block_until_ready(traj)

    run()
    return run


def make_runner(env_id: str, num_envs: int, num_steps: int, hiddens: tuple[int, ...],
                env_config: dict, seed: int = 0, check_finite: bool = True
                ) -> tuple[Callable[[], None], Callable, Any]:
    env, _, _ = make_multi_agent_env(env_id, EnvContext(env_config))
    policies = {_mapping(a, None) for a in env.agents}
    config = (RunnerConfig().environment(env_id, env_config=env_config)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps)
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)})
              .multi_agent(policies=policies, policy_mapping_fn=_mapping)
              .fault_tolerance(check_finite=check_finite)
              .debugging(seed=seed))
    runner = MultiAgentEnvRunner(config=config)
    runner.sample()

    def run():
        runner.sample()

    return run, runner.get_metrics, runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MultiAgentCartPole-v1")
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1024])
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--check-finite-off", action="store_true",
                        help="add a side: the runner with fault_tolerance(check_finite=False) "
                             "(what the per-step finiteness check of every agent's reward "
                             "and final observation costs)")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results",
                                                         "throughput_multi_agent.json"))
    args = parser.parse_args()
    env_config = {"num_agents": args.num_agents} if args.env == "MultiAgentCartPole-v1" else {}
    results: dict[str, Any] = {
        "benchmark": "throughput_multi_agent", "env": args.env, "env_config": env_config,
        "policy": f"one DefaultMLPModule{args.hiddens} per agent, explore",
        "num_steps_per_call": args.num_steps, "machine": machine_info(), "cases": []}
    for num_envs in args.num_envs:
        run_ours, get_metrics, runner = make_runner(args.env, num_envs, args.num_steps,
                                                    tuple(args.hiddens), env_config)
        run_bare = make_bare_scan(args.env, num_envs, args.num_steps, tuple(args.hiddens),
                                  env_config)
        get_metrics()
        env_steps = num_envs * args.num_steps
        sides = {"jaxrunner": run_ours, "bare_scan": run_bare,
                 "bare_scan_unrolled_rng": make_bare_scan(
                     args.env, num_envs, args.num_steps, tuple(args.hiddens), env_config,
                     unrolled_rng=True)}
        if args.check_finite_off:
            sides["jaxrunner_check_finite_off"], _, unchecked = make_runner(
                args.env, num_envs, args.num_steps, tuple(args.hiddens), env_config,
                check_finite=False)
        case = compare(sides, env_steps, rounds=args.rounds)
        if args.check_finite_off:
            unchecked.stop()
        metrics = get_metrics()
        agent_steps = sum(metrics["num_agent_steps_sampled"].values())
        agent_per_env = agent_steps / max(1, metrics["num_env_steps_sampled"])
        case.update({
            "num_envs": num_envs,
            "env_steps_per_s": case["steps_per_s"],
            "agent_steps_per_s": {name: v * agent_per_env
                                  for name, v in case["steps_per_s"].items()},
            "agent_steps_per_env_step": agent_per_env,
        })
        results["cases"].append(case)
        print(f"{args.env} num_envs={num_envs}: jaxrunner "
              f"{case['steps_per_s']['jaxrunner']:,.0f} env steps/s "
              f"({case['agent_steps_per_s']['jaxrunner']:,.0f} agent steps/s), bare scan "
              f"{case['steps_per_s']['bare_scan']:,.0f} env steps/s, ratio "
              f"{case['ratio_to_bare_scan']['jaxrunner']:.3f}"
              + (f", check_finite off {case['ratio_to_bare_scan']['jaxrunner_check_finite_off']:.3f}"
                 if args.check_finite_off else ""))
        runner.stop()
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
