"""Time to solve: wall-clock (compile included) until the mean return of the last 100
episodes reaches the target, for three PPOs with the same hyperparameters:

* `jaxrunner`: `SingleAgentEnvRunner.sample()` + `jaxrunner.learners.PPOLearner` (a Python
  loop of sample -> jitted update -> `set_state`);
* `bare`: a hand-written PureJaxRL-style PPO, written here: one jitted train loop
  (`lax.while_loop` of rollout scan + GAE + minibatch epochs) that stops itself when solved;
* `rllib`: RLlib PPO, new API stack, on gymnasium's env of the same name.

    python benchmarks/time_to_solve.py                       # CartPole-v1 and Pendulum-v1
    python benchmarks/time_to_solve.py --envs CartPole-v1 --seeds 3 --skip-rllib

Every measurement runs in a fresh Python process (so each pays its own compilation) and
starts its clock after the imports, right before the runner / train function / RLlib
algorithm is built. jaxrunner and bare runs alternate, seed by seed. Also measured: 8 seeds
of CartPole at once, with the bare PPO vmapped over seeds (one program), and with jaxrunner
batched (one runner whose module is a population of 8 policies, the learner's pure update
vmapped over them).

Writes `benchmarks/results/time_to_solve.json` and `time_to_solve.png` (return against
wall time).

    python benchmarks/time_to_solve.py --fused        # fused jaxrunner PPO vs bare, one process
    python benchmarks/time_to_solve.py --fused-fresh --rounds 3 --seed-blocks 4

`--fused` compiles and runs both sides in one process (its bare side compiles in a process
the fused side's build has already warmed, and the fused side's build is not timed) and
also times an iteration of each; `--fused-fresh` runs each side in its own fresh process
a round, timing what a script pays after its imports (build, trace, compile, then one run
per block of seeds), and writes `time_to_solve_fused_fresh.json` (with `--fused-loop
make_train`, the fused side is the library's own loop to a target,
`PPOLearner.make_train(..., target_return=...)`: `time_to_solve_fused_fresh_make_train.json`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SMOOTHING = 100  # episodes in the mean that must reach the target (RLlib's default window)


@dataclasses.dataclass(frozen=True)
class Hyper:
    """The hyperparameters every side uses for one env."""

    target: float
    num_envs: int
    num_steps: int  # rollout length per update (rollout_fragment_length)
    learning_rate: float
    gamma: float
    gae_lambda: float
    clip_eps: float
    vf_coef: float
    ent_coef: float
    num_epochs: int
    num_minibatches: int
    max_grad_norm: float
    reward_scale: float
    hiddens: tuple[int, ...]
    max_env_steps: int  # give up after this many env steps

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps


FUSED_LOOPS = ("hand", "make_train")

HYPER = {
    "CartPole-v1": Hyper(target=475.0, num_envs=16, num_steps=64, learning_rate=1e-3,
                         gamma=0.99, gae_lambda=0.95, clip_eps=0.2, vf_coef=0.5,
                         ent_coef=0.01, num_epochs=4, num_minibatches=4, max_grad_norm=0.5,
                         reward_scale=1.0, hiddens=(64, 64), max_env_steps=1_000_000),
    "Pendulum-v1": Hyper(target=-250.0, num_envs=16, num_steps=128, learning_rate=1e-3,
                         gamma=0.95, gae_lambda=0.95, clip_eps=0.2, vf_coef=0.5,
                         ent_coef=0.0, num_epochs=10, num_minibatches=8, max_grad_norm=0.5,
                         reward_scale=0.1, hiddens=(64, 64), max_env_steps=3_000_000),
}


def _curve_row(time_s: float, env_steps: int, ret: float | None) -> dict:
    return {"time_s": round(time_s, 4), "env_steps": int(env_steps),
            "episode_return_mean": None if ret is None else float(ret)}


def _runner_config(env_id: str, seed: int, hp: Hyper) -> Any:
    """The jaxrunner config of one PPO agent: `hp`'s env count, rollout length and MLP,
    RLlib's smoothing window."""
    import jaxrunner

    return (jaxrunner.RunnerConfig().environment(env_id)
            .env_runners(num_envs_per_env_runner=hp.num_envs,
                         rollout_fragment_length=hp.num_steps)
            .rl_module(model_config={"fcnet_hiddens": list(hp.hiddens),
                                     "fcnet_activation": "tanh"})
            .reporting(metrics_num_episodes_for_smoothing=SMOOTHING)
            .debugging(seed=seed))


def _ppo_config(hp: Hyper, **kwargs: Any) -> Any:
    """The reference learner's `PPOConfig` with `hp`'s hyperparameters (and `kwargs`)."""
    from jaxrunner.learners import PPOConfig

    return PPOConfig(learning_rate=hp.learning_rate, gamma=hp.gamma, gae_lambda=hp.gae_lambda,
                     clip_eps=hp.clip_eps, vf_coef=hp.vf_coef, ent_coef=hp.ent_coef,
                     num_epochs=hp.num_epochs, num_minibatches=hp.num_minibatches,
                     max_grad_norm=hp.max_grad_norm, reward_scale=hp.reward_scale, **kwargs)


# ====================================================================== jaxrunner PPO
def run_jaxrunner(env_id: str, seed: int, hp: Hyper, max_time_s: float) -> dict:
    """jaxrunner runner + reference PPO learner; the clock starts before the runner."""
    import jax

    import jaxrunner
    from jaxrunner.learners import PPOLearner

    start = time.perf_counter()
    config = _runner_config(env_id, seed, hp)
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    learner = PPOLearner.from_runner(runner, _ppo_config(hp, seed=seed))
    setup_s = time.perf_counter() - start
    curve: list[dict] = []
    max_iterations = math.ceil(hp.max_env_steps / hp.batch_size)

    def record(row: dict) -> None:
        curve.append(_curve_row(time.perf_counter() - start, row["env_steps"],
                                row["episode_return_mean"]))
        if time.perf_counter() - start > max_time_s:
            raise TimeoutError

    try:
        learner.train(runner, num_iterations=max_iterations, target_return=hp.target,
                      callback=record)
    except TimeoutError:
        pass
    runner.stop()
    del jax
    return _summary("jaxrunner", env_id, seed, hp, curve, setup_s=setup_s)


def _summary(method: str, env_id: str, seed: int, hp: Hyper, curve: list[dict],
             **extra: Any) -> dict:
    solved_at = next((row for row in curve if row["episode_return_mean"] is not None
                      and row["episode_return_mean"] >= hp.target), None)
    times = [row["time_s"] for row in curve]
    steps = sorted({row["env_steps"] for row in curve})
    return {"method": method, "env": env_id, "seed": seed, "solved": solved_at is not None,
            "time_to_solve_s": solved_at["time_s"] if solved_at else None,
            "env_steps_to_solve": solved_at["env_steps"] if solved_at else None,
            "total_s": times[-1] if times else None,
            # Where the time goes: until the first iteration is done (setup, compilation,
            # one iteration), then the median wall time of one iteration after it.
            "first_iteration_done_s": times[0] if times else None,
            "median_iteration_s": (statistics.median(b - a for a, b in zip(times, times[1:]))
                                   if len(times) > 1 else None),
            "env_steps_per_iteration": steps[1] - steps[0] if len(steps) > 1 else None,
            "curve": curve, **extra}


# ====================================================================== bare PPO
class _Carry(NamedTuple):
    params: Any
    opt_state: Any
    env_state: Any
    obs: Any  # (B, obs_dim)
    key: Any
    episode_return: Any  # (B,) return of each running episode
    ring: Any  # (W,) returns of the last W finished episodes
    ring_next: Any  # () int32
    ring_size: Any  # () int32
    update: Any  # () int32
    seed_index: Any  # () int32, for the host callback


def make_bare_train(env_id: str, hp: Hyper, *, max_updates: int,
                    on_update: Callable | None = None) -> Callable:
    """A PureJaxRL-style PPO: `train(key)` runs updates until the mean return of the last
    100 finished episodes reaches `hp.target` (or `max_updates`) inside one jitted
    `lax.while_loop`; `on_update(seed_index, update, ring_mean)` is a host callback per
    update (`train(key, seed_index)`; under `vmap` it is called once per seed).

    Same network (separate 64x64 tanh policy and value MLPs, orthogonal init), same
    action distribution and action scaling, same GAE (truncated episodes bootstrap from
    their final observation) and same loss as jaxrunner's reference learner.
    """
    import flax.linen as nn
    import gymnax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    env, env_params = gymnax.make(env_id)
    action_space = env.action_space(env_params)
    discrete = hasattr(action_space, "n")
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    out_dim = int(action_space.n) if discrete else 2 * int(np.prod(action_space.shape))
    num_envs, num_steps = hp.num_envs, hp.num_steps
    batch = num_envs * num_steps
    minibatch = batch // hp.num_minibatches
    if not discrete:
        low = jnp.asarray(action_space.low, jnp.float32)
        high = jnp.asarray(action_space.high, jnp.float32)

    class MLP(nn.Module):
        out: int
        out_scale: float

        @nn.compact
        def __call__(self, x):
            for width in hp.hiddens:
                x = jnp.tanh(nn.Dense(width, kernel_init=nn.initializers.orthogonal(
                    math.sqrt(2)))(x))
            return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(
                self.out_scale))(x)

    pi_net, vf_net = MLP(out_dim, 0.01), MLP(1, 1.0)
    tx = optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                     optax.adam(hp.learning_rate, eps=1e-5))

    def log_prob_and_entropy(dist_inputs, actions):
        if discrete:
            log_p = jax.nn.log_softmax(dist_inputs)
            logp = jnp.take_along_axis(log_p, actions[..., None], axis=-1)[..., 0]
            return logp, -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
        mean, log_std = jnp.split(dist_inputs, 2, axis=-1)
        z = (actions - mean) * jnp.exp(-log_std)
        logp = jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
        return logp, jnp.sum(log_std + 0.5 * (1 + math.log(2 * math.pi)), axis=-1)

    def sample_action(dist_inputs, key):
        if discrete:
            actions = jax.random.categorical(key, dist_inputs).astype(jnp.int32)
            env_actions = actions
        else:
            mean, log_std = jnp.split(dist_inputs, 2, axis=-1)
            actions = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
            env_actions = jnp.clip(low + (actions + 1.0) * (high - low) / 2.0, low, high)
        return actions, env_actions, log_prob_and_entropy(dist_inputs, actions)[0]

    def value(params, obs):
        return vf_net.apply({"params": params["vf"]}, obs)[..., 0]

    def loss_fn(params, mb):
        obs, actions, old_logp, advantages, targets = mb
        logp, entropy = log_prob_and_entropy(
            pi_net.apply({"params": params["pi"]}, obs), actions)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = jnp.exp(logp - old_logp)
        policy_loss = -jnp.minimum(
            ratio * advantages,
            jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps) * advantages).mean()
        value_loss = 0.5 * ((value(params, obs) - targets) ** 2).mean()
        return policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy.mean()

    def env_step(carry: _Carry, _):
        key, act_key, step_key = jax.random.split(carry.key, 3)
        dist_inputs = pi_net.apply({"params": carry.params["pi"]}, carry.obs)
        actions, env_actions, logp = sample_action(dist_inputs, act_key)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(jax.random.split(step_key, num_envs),
                                              carry.env_state, env_actions, env_params)
        done = terminated | truncated
        episode_return = carry.episode_return + reward
        transition = (carry.obs, actions, logp, reward, terminated, truncated,
                      info["final_observation"], done, episode_return)
        carry = carry._replace(env_state=env_state, obs=obs, key=key,
                               episode_return=jnp.where(done, 0.0, episode_return))
        return carry, transition

    def gae(rewards, values, final_values, terminated, truncated):
        done = terminated | truncated
        values_next = jnp.concatenate([values[1:], final_values[-1:]], axis=0)
        next_values = jnp.where(terminated, 0.0, jnp.where(done, final_values, values_next))
        deltas = rewards + hp.gamma * next_values - values

        def backward(next_adv, x):
            delta, not_done = x
            adv = delta + hp.gamma * hp.gae_lambda * jnp.where(not_done, next_adv, 0.0)
            return adv, adv

        _, adv = jax.lax.scan(backward, jnp.zeros((num_envs,)), (deltas, ~done),
                              reverse=True)
        return adv, adv + values

    def record_episodes(carry, done, returns):
        """Appends the episodes finished in the rollout ((t, b) order) to the ring."""
        window = carry.ring.shape[0]
        done, returns = done.reshape(-1), returns.reshape(-1)
        rank = jnp.cumsum(done) - 1
        count = jnp.sum(done)
        keep = done & (rank >= count - window)  # at most the last `window`: unique slots
        slot = jnp.where(keep, (carry.ring_next + rank) % window, window)
        return carry._replace(ring=carry.ring.at[slot].set(returns, mode="drop"),
                              ring_next=(carry.ring_next + count) % window,
                              ring_size=jnp.minimum(carry.ring_size + count, window))

    def ring_mean(carry):
        filled = jnp.arange(carry.ring.shape[0]) < carry.ring_size
        return jnp.where(carry.ring_size > 0,
                         jnp.sum(jnp.where(filled, carry.ring, 0.0))
                         / jnp.maximum(carry.ring_size, 1), -jnp.inf)

    def update(carry: _Carry) -> _Carry:
        carry, traj = jax.lax.scan(env_step, carry, None, length=num_steps)
        obs, actions, logp, rewards, terminated, truncated, final_obs, done, ep_ret = traj
        carry = record_episodes(carry, done, ep_ret)
        flat = lambda x: x.reshape((batch,) + x.shape[2:])  # noqa: E731
        values = value(carry.params, flat(obs)).reshape(num_steps, num_envs)
        final_values = value(carry.params, flat(final_obs)).reshape(num_steps, num_envs)
        advantages, targets = gae(rewards * hp.reward_scale, values, final_values,
                                  terminated, truncated)
        data = (flat(obs), flat(actions), flat(logp), flat(advantages), flat(targets))

        def minibatch_step(state, mb):
            params, opt_state = state
            grads = jax.grad(loss_fn)(params, mb)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None

        def epoch(state, key):
            order = jax.random.permutation(key, batch)
            mbs = jax.tree.map(
                lambda x: x[order].reshape((hp.num_minibatches, minibatch) + x.shape[1:]),
                data)
            return jax.lax.scan(minibatch_step, state, mbs)[0], None

        key, epoch_key = jax.random.split(carry.key)
        (params, opt_state), _ = jax.lax.scan(
            epoch, (carry.params, carry.opt_state), jax.random.split(epoch_key, hp.num_epochs))
        carry = carry._replace(params=params, opt_state=opt_state, key=key,
                               update=carry.update + 1)
        if on_update is not None:
            jax.debug.callback(on_update, carry.seed_index, carry.update, ring_mean(carry))
        return carry

    # One seed after another under vmap (the same values): a vmapped orthogonal init is a
    # batched LAPACK QR, which deadlocks XLA:CPU's intra-op pool on a 2-core machine
    # (jaxrunner's `init_params` does the same).
    @jax.custom_batching.sequential_vmap
    def init_params(pi_key, vf_key):
        dummy = jnp.zeros((1, obs_dim))
        return {"pi": pi_net.init(pi_key, dummy)["params"],
                "vf": vf_net.init(vf_key, dummy)["params"]}

    def init_carry(key, seed_index):
        key, pi_key, vf_key, reset_key = jax.random.split(key, 4)
        params = init_params(pi_key, vf_key)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), env_params)
        carry = _Carry(params=params, opt_state=tx.init(params), env_state=env_state,
                       obs=obs, key=key, episode_return=jnp.zeros((num_envs,)),
                       ring=jnp.zeros((SMOOTHING,)), ring_next=jnp.zeros((), jnp.int32),
                       ring_size=jnp.zeros((), jnp.int32), update=jnp.zeros((), jnp.int32),
                       seed_index=jnp.asarray(seed_index, jnp.int32))
        return carry

    def train(key, seed_index):
        carry = init_carry(key, seed_index)
        carry = jax.lax.while_loop(
            lambda c: (ring_mean(c) < hp.target) & (c.update < max_updates), update, carry)
        return carry.update, ring_mean(carry)

    # The pieces, for profiling.
    train.init_carry, train.update = init_carry, update
    train.rollout = lambda carry: jax.lax.scan(env_step, carry, None, length=num_steps)
    return train


def run_bare(env_id: str, seeds: list[int], hp: Hyper) -> list[dict]:
    """The bare PPO for `seeds` (one seed: plain jit; several: jit of vmap over seeds)."""
    import jax
    import numpy as np

    start = time.perf_counter()
    curves: list[list[dict]] = [[] for _ in seeds]
    max_updates = math.ceil(hp.max_env_steps / hp.batch_size)

    def on_update(seed_index, update, mean):
        value = float(mean)
        curves[int(seed_index)].append(_curve_row(
            time.perf_counter() - start, int(update) * hp.batch_size,
            value if np.isfinite(value) else None))

    train = make_bare_train(env_id, hp, max_updates=max_updates, on_update=on_update)
    if len(seeds) == 1:
        out = jax.jit(train)(jax.random.key(seeds[0]), 0)
    else:
        keys = jax.vmap(jax.random.key)(np.asarray(seeds))
        out = jax.jit(jax.vmap(train))(keys, np.arange(len(seeds)))
    jax.block_until_ready(out)
    total_s = time.perf_counter() - start
    method = "bare" if len(seeds) == 1 else "bare_vmap"
    results = []
    for i, seed in enumerate(seeds):
        # Under vmap the loop runs until every seed is solved; a seed's curve ends at its
        # first solved update.
        curve = curves[i]
        first = next((k for k, row in enumerate(curve) if row["episode_return_mean"] is not None
                      and row["episode_return_mean"] >= hp.target), None)
        if first is not None:
            curve = curve[: first + 1]
        results.append(_summary(method, env_id, seed, hp, curve, all_seeds_done_s=total_s))
    return results


# ====================================================================== RLlib PPO
def _rllib_record_return(*, episode, env_runner, prev_episode_chunks=(), **kwargs) -> None:
    """RLlib callback: keeps the returns of the runner's last SMOOTHING episodes on it
    (an episode's return: its last chunk's plus those of the chunks returned before)."""
    returns = getattr(env_runner, "_time_to_solve_returns", None)
    if returns is None:
        returns = env_runner._time_to_solve_returns = collections.deque(maxlen=SMOOTHING)
    returns.append(float(episode.get_return())
                   + sum(float(chunk.get_return()) for chunk in prev_episode_chunks))


def _rllib_last_returns(env_runner) -> list:
    return list(getattr(env_runner, "_time_to_solve_returns", ()))


def run_rllib(env_id: str, seed: int, hp: Hyper, max_time_s: float,
              num_env_runners: int = 1) -> dict:
    """RLlib PPO (new API stack) with the same hyperparameters; the clock starts before
    `build_algo()` (Ray start-up included, as compilation is for the JAX sides)."""
    import logging

    logging.disable(logging.WARNING)
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig as RLlibPPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    start = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    config = (RLlibPPOConfig()
              .environment(env_id)
              .env_runners(num_env_runners=num_env_runners,
                           num_envs_per_env_runner=hp.num_envs,
                           rollout_fragment_length="auto")
              .training(train_batch_size_per_learner=hp.batch_size,
                        minibatch_size=hp.batch_size // hp.num_minibatches,
                        num_epochs=hp.num_epochs, lr=hp.learning_rate, gamma=hp.gamma,
                        lambda_=hp.gae_lambda, clip_param=hp.clip_eps,
                        vf_loss_coeff=hp.vf_coef, entropy_coeff=hp.ent_coef,
                        grad_clip=hp.max_grad_norm, grad_clip_by="global_norm",
                        use_kl_loss=False, vf_clip_param=float("inf"))
              .rl_module(model_config=DefaultModelConfig(
                  fcnet_hiddens=list(hp.hiddens), fcnet_activation="tanh",
                  vf_share_layers=False))
              .reporting(metrics_num_episodes_for_smoothing=SMOOTHING)
              .callbacks(on_episode_end=_rllib_record_return)
              .debugging(seed=seed))
    algo = config.build_algo()
    setup_s = time.perf_counter() - start
    curve: list[dict] = []
    # RLlib's reported `env_runners/episode_return_mean` is not the mean of the last 100
    # episodes here (it follows the last iteration's episodes; values logged through its
    # MetricsLogger come back smoothed), so the runner keeps its last 100 returns (callback
    # above) and they are read from it after every iteration (one remote call).
    while time.perf_counter() - start < max_time_s:
        result = algo.train()
        runners = result.get("env_runners", {})
        returns = [r for part in algo.env_runner_group.foreach_env_runner(
            _rllib_last_returns, local_env_runner=num_env_runners == 0) for r in part]
        ret = sum(returns[-SMOOTHING:]) / len(returns[-SMOOTHING:]) if returns else None
        steps = result.get("num_env_steps_sampled_lifetime",
                           runners.get("num_env_steps_sampled_lifetime", 0))
        rllib_mean = runners.get("episode_return_mean")
        rllib_mean = None if rllib_mean is None or math.isnan(rllib_mean) else float(rllib_mean)
        curve.append({**_curve_row(time.perf_counter() - start, steps, ret),
                      "rllib_episode_return_mean": rllib_mean})
        if (ret is not None and ret >= hp.target) or steps >= hp.max_env_steps:
            break
    algo.stop()
    ray.shutdown()
    return _summary("rllib", env_id, seed, hp, curve, setup_s=setup_s,
                    num_env_runners=num_env_runners)


# ====================================================================== jaxrunner, seeds batched
def run_jaxrunner_batched(env_id: str, seeds: list[int], hp: Hyper, max_time_s: float
                          ) -> list[dict]:
    """`len(seeds)` independent PPO agents trained at once through one runner: the runner's
    module is a population (`n` copies of the default MLP, params stacked on a leading
    axis; sub-env `i` belongs to member `i // num_envs`), and the learner's pure
    `update_fn` is `vmap`-ed over the members. Each member solves on its own episodes."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxrunner
    from jaxrunner.learners import PPOLearner
    from jaxrunner.modules.rl_module import DefaultMLPModule, RLModule

    class Population(RLModule):
        def __init__(self, observation_space, action_space, model_config=None,
                     inference_only=False):
            model_config = dict(model_config or {})
            self.size = model_config.pop("population_size")
            super().__init__(observation_space, action_space, model_config, inference_only)
            self.member = DefaultMLPModule(observation_space, action_space, model_config,
                                           inference_only)

        def init(self, key):  # eager: after the first member, the small init ops are cached
            members = [self.member.init(k) for k in jax.random.split(key, self.size)]
            return jax.tree.map(lambda *xs: jnp.stack(xs), *members)

        def _per_member(self, forward, params, batch):
            obs = batch["obs"]
            rows = obs.shape[0]
            obs = obs.reshape((self.size, rows // self.size) + obs.shape[1:])
            out = jax.vmap(lambda p, o: forward(p, {"obs": o}))(params, obs)
            return jax.tree.map(lambda x: x.reshape((rows,) + x.shape[2:]), out)

        def _forward(self, params, batch):
            return self._per_member(self.member._forward, params, batch)

        def forward_train(self, params, batch):
            return self._per_member(self.member.forward_train, params, batch)

        def params_for_inference(self, params):
            return self.member.params_for_inference(params)

    size = len(seeds)
    start = time.perf_counter()
    config = (jaxrunner.RunnerConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=hp.num_envs * size,
                           rollout_fragment_length=hp.num_steps)
              .rl_module(rl_module_spec=jaxrunner.RLModuleSpec(module_class=Population),
                         model_config={"fcnet_hiddens": list(hp.hiddens),
                                       "fcnet_activation": "tanh", "population_size": size})
              .debugging(seed=seeds[0]))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    obs_space, act_space = runner.get_spaces()["default_policy"]
    member = DefaultMLPModule(obs_space, act_space, {"fcnet_hiddens": list(hp.hiddens),
                                                     "fcnet_activation": "tanh"})
    learner = PPOLearner(member, _ppo_config(hp))
    members = [learner.init_state(jax.random.key(seed)) for seed in seeds]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *members)
    update = jax.jit(jax.vmap(learner.update_fn))

    @jax.jit
    def per_member(traj):
        """(T, n * B, ...) -> (n, T, B, ...); valid (T,) -> (n, T)."""
        num_steps = traj.valid.shape[0]
        split = jax.tree.map(
            lambda x: jnp.swapaxes(x.reshape((num_steps, size, -1) + x.shape[2:]), 0, 1),
            traj.replace(valid=None))
        return split.replace(valid=jnp.broadcast_to(traj.valid, (size, num_steps)))

    @jax.jit
    def track(tracker, traj):
        """Per member: the mean return of its last SMOOTHING finished episodes."""
        running, ring, ring_next, ring_size = tracker
        done = (traj.terminated | traj.truncated) & traj.valid[:, None]

        def step(total, x):
            reward, finished, taken = x
            total = total + jnp.where(taken, reward, 0.0)
            return jnp.where(finished, 0.0, total), total

        running, returns = jax.lax.scan(step, running, (traj.rewards, done, traj.valid))

        def record(ring, ring_next, ring_size, done, returns):  # one member, (t, b) order
            done, returns = done.reshape(-1), returns.reshape(-1)
            rank = jnp.cumsum(done) - 1
            count = jnp.sum(done)
            keep = done & (rank >= count - SMOOTHING)
            slot = jnp.where(keep, (ring_next + rank) % SMOOTHING, SMOOTHING)
            return (ring.at[slot].set(returns, mode="drop"), (ring_next + count) % SMOOTHING,
                    jnp.minimum(ring_size + count, SMOOTHING))

        split = lambda x: jnp.swapaxes(x.reshape(x.shape[0], size, -1), 0, 1)  # noqa: E731
        ring, ring_next, ring_size = jax.vmap(record)(ring, ring_next, ring_size,
                                                      split(done), split(returns))
        filled = jnp.arange(SMOOTHING)[None, :] < ring_size[:, None]
        means = jnp.where(ring_size > 0, jnp.sum(jnp.where(filled, ring, 0.0), axis=1)
                          / jnp.maximum(ring_size, 1), -jnp.inf)
        return (running, ring, ring_next, ring_size), means

    tracker = (jnp.zeros((hp.num_envs * size,)), jnp.zeros((size, SMOOTHING)),
               jnp.zeros((size,), jnp.int32), jnp.zeros((size,), jnp.int32))
    setup_s = time.perf_counter() - start
    curves: list[list[dict]] = [[] for _ in seeds]
    solved = [False] * size
    seq = 0
    steps_per_member = 0
    for _ in range(math.ceil(hp.max_env_steps / hp.batch_size)):
        seq += 1
        runner.set_state({"rl_module": states.params, "weights_seq_no": seq})
        batch = runner.sample()
        traj = batch.trajectory()
        states, _ = update(states, per_member(traj))
        tracker, means = track(tracker, traj)
        means = np.asarray(means)
        now = time.perf_counter() - start
        steps_per_member += hp.batch_size
        for i in range(size):
            if not solved[i]:
                value = float(means[i])
                curves[i].append(_curve_row(now, steps_per_member,
                                            value if np.isfinite(value) else None))
                solved[i] = value >= hp.target
        if all(solved) or now > max_time_s:
            break
    total_s = time.perf_counter() - start
    runner.stop()
    return [_summary("jaxrunner_batched", env_id, seed, hp, curves[i], setup_s=setup_s,
                     all_seeds_done_s=total_s) for i, seed in enumerate(seeds)]


# ====================================================================== fused jaxrunner PPO
def make_fused_pieces(env_id: str, seed: int, hp: Hyper) -> tuple[Any, Any]:
    """`(sampler, learner)`: jaxrunner's pure sampler (`jaxrunner.make_sampler`) and the
    reference PPO learner, with the hyperparameters every side uses."""
    import jaxrunner
    from jaxrunner.learners import PPOLearner

    config = _runner_config(env_id, seed, hp)
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, _ppo_config(hp, seed=seed))
    return sampler, learner


def make_fused_train(env_id: str, hp: Hyper, *, max_updates: int, seed: int = 0,
                     loop: str = "hand") -> Callable:
    """jaxrunner's fused PPO as a solve-until-target loop like the bare one: `train(key)`
    runs `PPOLearner.make_train`'s iteration (sampler.sample + update_fn) in a
    `lax.while_loop` until the mean return of the sampler's last 100 episodes (its metric
    ring) reaches `hp.target` or `max_updates`; returns `(updates, ring_mean)`. The
    pieces for per-iteration timing: `train.init(key)`, `train.iteration(state, None)`.

    `loop="hand"` writes that loop here, returning only what the bare PPO returns;
    `loop="make_train"` is the library's own, `make_train(..., target_return=hp.target)`,
    which also keeps every iteration's statistics and metrics (what a user gets)."""
    import jax
    import jax.numpy as jnp

    if loop not in FUSED_LOOPS:
        raise ValueError(f"loop must be one of {FUSED_LOOPS}, got {loop!r}")
    sampler, learner = make_fused_pieces(env_id, seed, hp)
    pieces = learner.make_train(sampler, 1)

    def ring_mean(state):  # NaN until an episode has finished
        return state.sampler.carry.metrics.return_mean()

    library = (learner.make_train(sampler, max_updates, target_return=hp.target)
               if loop == "make_train" else None)

    def train(key):
        if library is not None:
            state, _, _, updates = library(key)
            return updates, ring_mean(state)

        def body(loop):
            state, updates = loop
            state, _ = pieces.iteration(state, None)
            return state, updates + 1

        state, updates = jax.lax.while_loop(
            lambda loop: ~(ring_mean(loop[0]) >= hp.target) & (loop[1] < max_updates), body,
            (pieces.init(key), jnp.zeros((), jnp.int32)))
        return updates, ring_mean(state)

    train.init, train.iteration = pieces.init, pieces.iteration
    return train


def _timed_compile(fn: Callable, *args: Any, unrolled_rng: bool = False
                   ) -> tuple[Any, float]:
    from jaxrunner import lowering

    start = time.perf_counter()
    compiled = lowering.jit(fn, unrolled=unrolled_rng).lower(*args).compile()
    return compiled, time.perf_counter() - start


def seed_keys(num_seeds: int, first_seed: int = 0) -> Any:
    """The solve programs' key argument: `jax.random.key(first_seed)` for one seed, else
    the `(num_seeds,)` keys of seeds `first_seed, first_seed + 1, ...`."""
    import jax
    import numpy as np

    keys = jax.vmap(jax.random.key)(np.arange(first_seed, first_seed + num_seeds))
    return keys[0] if num_seeds == 1 else keys


def solve_program(side: str, env_id: str, num_seeds: int, hp: Hyper, *, max_updates: int,
                  fused_lowering: str = "auto", fused_loop: str = "hand"
                  ) -> tuple[Callable, Callable, bool]:
    """`(train, fn, unrolled_rng)` of one side ("bare" or "fused"): its train
    (`make_bare_train` / `make_fused_train`), its solve-until-target program over
    `num_seeds` seeds (vmapped for more than one; the argument is `seed_keys`), and
    whether it compiles with the unrolled Threefry lowering. The bare PPO compiles as a
    hand-written `jax.jit` does (JAX's lowering); the fused one as `PPOLearner.fused_train`
    compiles it (`fused_lowering="auto"`): the unrolled lowering for several seeds of few
    sub-envs, JAX's for one seed (`jaxrunner.lowering.unroll_for_training`)."""
    import jax

    from jaxrunner import lowering

    if side == "bare":
        train = make_bare_train(env_id, hp, max_updates=max_updates)
        fn, unrolled = (lambda k: train(k, 0)), False
    elif side == "fused":
        train = fn = make_fused_train(env_id, hp, max_updates=max_updates, loop=fused_loop)
        unrolled = lowering.choose_unrolled(
            fused_lowering, lowering.unroll_for_training(hp.num_envs, num_seeds))
    else:
        raise ValueError(f"side must be 'bare' or 'fused', got {side!r}")
    return train, (fn if num_seeds == 1 else jax.vmap(fn)), unrolled


def solve_programs(env_id: str, num_seeds: int, hp: Hyper, *, max_updates: int,
                   fused_lowering: str = "auto") -> dict[str, tuple[Any, Callable, Any, bool]]:
    """`{"bare": ..., "fused": ...}`, each `(train, fn, arg, unrolled_rng)`: `solve_program`
    of each side (the bare one built first) with the key argument of seeds
    `0 .. num_seeds - 1`."""
    programs = {side: solve_program(side, env_id, num_seeds, hp, max_updates=max_updates,
                                    fused_lowering=fused_lowering)
                for side in ("bare", "fused")}
    keys = seed_keys(num_seeds)
    return {side: (train, fn, keys, unrolled)
            for side, (train, fn, unrolled) in programs.items()}


def run_fused_comparison(env_id: str, num_seeds: int, hp: Hyper, *, max_updates: int,
                         timing_iterations: int, rounds: int, fused_lowering: str = "auto"
                         ) -> dict:
    """Fused jaxrunner PPO against the bare PPO, `num_seeds` seeds vmapped (1: no vmap):
    compile time, time to solve with compilation excluded and included (both solve-until
    -target loops, every seed to the target or `max_updates`), and the per-iteration
    time of `timing_iterations` scanned iterations, in `rounds` alternating rounds. Each
    side compiles as `solve_programs` says."""
    import jax
    import numpy as np

    from jaxrunner import lowering

    programs = solve_programs(env_id, num_seeds, hp, max_updates=max_updates,
                              fused_lowering=fused_lowering)
    out: dict[str, Any] = {"env": env_id, "num_seeds": num_seeds,
                           "fused_unrolled_rng": programs["fused"][3],
                           "load_avg_1min_start": round(os.getloadavg()[0], 2)}
    for name in ("bare", "fused"):
        _, fn, arg, unrolled_rng = programs[name]
        compiled, compile_s = _timed_compile(fn, arg, unrolled_rng=unrolled_rng)
        start = time.perf_counter()
        updates, mean = jax.block_until_ready(compiled(arg))
        run_s = time.perf_counter() - start
        updates = np.atleast_1d(np.asarray(updates))
        mean = np.atleast_1d(np.asarray(mean))
        out[name] = {"compile_s": compile_s, "solve_run_s": run_s,
                     "solve_total_s": compile_s + run_s,
                     "updates": updates.tolist(), "final_mean_return": mean.tolist(),
                     "all_solved": bool(np.all(mean >= hp.target))}
        print(f"{env_id} seeds={num_seeds} {name}: compile {compile_s:.1f}s, solve "
              f"{run_s:.1f}s, updates {updates.tolist()}", flush=True)

    # Per-iteration time: the same number of scanned iterations on both sides.
    bare, fused = programs["bare"][0], programs["fused"][0]

    def bare_iter(carry):
        return jax.lax.scan(lambda c, _: (bare.update(c), None), carry, None,
                            length=timing_iterations)[0]

    def fused_iter(state):
        return jax.lax.scan(lambda s, _: (fused.iteration(s, None)[0], None), state, None,
                            length=timing_iterations)[0]

    inits = {"bare": lambda k: bare.init_carry(k, 0), "fused": fused.init}
    steps = {"bare": bare_iter, "fused": fused_iter}
    states, runs = {}, {}
    for name in ("bare", "fused"):
        init = inits[name] if num_seeds == 1 else jax.vmap(inits[name])
        step = steps[name] if num_seeds == 1 else jax.vmap(steps[name])
        _, _, arg, unrolled_rng = programs[name]
        jit = functools.partial(lowering.jit, unrolled=unrolled_rng)
        states[name] = jit(init)(arg)
        runs[name] = jit(step, donate_argnums=(0,))
        states[name] = jax.block_until_ready(runs[name](states[name]))  # compile + warm up
    timings: dict[str, list[float]] = {"bare": [], "fused": []}
    for index in range(rounds):
        for name in (("bare", "fused") if index % 2 == 0 else ("fused", "bare")):
            start = time.perf_counter()
            states[name] = jax.block_until_ready(runs[name](states[name]))
            timings[name].append((time.perf_counter() - start) / timing_iterations)
    ratios = [f / b for f, b in zip(timings["fused"], timings["bare"])]
    out["per_iteration_s"] = {name: statistics.median(t) for name, t in timings.items()}
    out["per_iteration_ratio_fused_over_bare"] = statistics.median(ratios)
    out["per_iteration_timings_s"] = timings
    # Both loops run the same algorithm; how many updates a seed needs is luck of its RNG
    # stream. Charging each side its own compile and per-iteration time at the pooled
    # median update count separates the implementations' cost from that luck.
    pooled = statistics.median(
        [max(out[n]["updates"]) for n in ("bare", "fused")])
    estimate = {n: out[n]["compile_s"] + pooled * out["per_iteration_s"][n]
                for n in ("bare", "fused")}
    out["pooled_updates_to_solve"] = pooled
    out["estimated_time_to_solve_s"] = estimate
    out["ratio_fused_over_bare"] = {
        "solve_total_s": out["fused"]["solve_total_s"] / out["bare"]["solve_total_s"],
        "solve_run_s": out["fused"]["solve_run_s"] / out["bare"]["solve_run_s"],
        "compile_s": out["fused"]["compile_s"] / out["bare"]["compile_s"],
        "estimated_compile_included": estimate["fused"] / estimate["bare"],
        "estimated_compile_excluded": out["per_iteration_s"]["fused"]
        / out["per_iteration_s"]["bare"],
    }
    out["load_avg_1min_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps({k: out[k] for k in ("per_iteration_s", "ratio_fused_over_bare")}),
          flush=True)
    return out


def fresh_solve(side: str, env_id: str, num_seeds: int, hp: Hyper, *, max_updates: int,
                seed_blocks: int, fused_lowering: str = "auto", fused_loop: str = "hand"
                ) -> dict:
    """One side's time to solve as a fresh process pays it: the clock starts after the
    imports, then the side's solve program is built (`solve_program`: the fused side
    builds its sampler and learner here), traced, compiled once and run on `seed_blocks`
    blocks of `num_seeds` seeds (block `k`: seeds `k * num_seeds ...`), each to the
    target or `max_updates`. Returns the seconds of each part and each block's updates."""
    import jax
    import numpy as np

    from jaxrunner import lowering

    start = time.perf_counter()
    _, fn, unrolled = solve_program(side, env_id, num_seeds, hp, max_updates=max_updates,
                                    fused_lowering=fused_lowering, fused_loop=fused_loop)
    built = time.perf_counter()
    compiled = lowering.jit(fn, unrolled=unrolled).lower(seed_keys(num_seeds)).compile()
    compiled_at = time.perf_counter()
    run_s, updates, returns = [], [], []
    for block in range(seed_blocks):
        keys = seed_keys(num_seeds, block * num_seeds)
        block_start = time.perf_counter()
        block_updates, mean = jax.block_until_ready(compiled(keys))
        run_s.append(time.perf_counter() - block_start)
        updates.append(np.atleast_1d(np.asarray(block_updates)).tolist())
        returns.append(np.atleast_1d(np.asarray(mean)).tolist())
    return {"side": side, "env": env_id, "num_seeds": num_seeds, "unrolled_rng": unrolled,
            "build_s": built - start, "compile_s": compiled_at - built,
            "startup_s": compiled_at - start, "run_s": run_s, "updates": updates,
            "final_mean_return": returns,
            "all_solved": bool(np.all(np.asarray(returns) >= hp.target))}


def _spawn_fresh_solve(side: str, env_id: str, num_seeds: int, *, max_updates: int,
                       seed_blocks: int, fused_lowering: str, fused_loop: str = "hand"
                       ) -> dict:
    """`fresh_solve` in a new Python process; its result."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_fresh_child", side, "--env", env_id,
           "--num-seeds", str(num_seeds), "--max-updates", str(max_updates),
           "--seed-blocks", str(seed_blocks), "--fused-lowering", fused_lowering,
           "--fused-loop", fused_loop]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"the fresh {side} process for {env_id} ({num_seeds} seeds) gave no "
                       f"result (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def summarize_fresh(rounds: list[dict[str, dict]]) -> dict:
    """Ratios (fused over bare) of `fresh_solve` rounds, `rounds[i] = {"bare": ...,
    "fused": ...}`, each the median over rounds of that round's ratio:

    - `time_to_solve_first_block`: startup + the first block's run (seeds `0 .. n - 1`,
      what `--fused` reports);
    - `expected_time_to_solve`: startup + the mean run over the blocks (compile included);
    - `expected_run`: the mean run over the blocks (compile excluded);
    - `startup`: build + trace + compile.

    Which seeds need how many updates is luck of their RNG streams (both sides run the same
    algorithm); the mean over blocks of seeds takes most of that luck out."""
    def ratio(key: Callable[[dict], float]) -> float:
        return statistics.median(key(r["fused"]) / key(r["bare"]) for r in rounds)

    def mean_run(side: dict) -> float:
        return statistics.fmean(side["run_s"])

    def updates_to_solve(side: str) -> list[int]:  # per block, its slowest seed
        return [max(block) for block in rounds[0][side]["updates"]]

    return {
        "time_to_solve_first_block": ratio(lambda s: s["startup_s"] + s["run_s"][0]),
        "expected_time_to_solve": ratio(lambda s: s["startup_s"] + mean_run(s)),
        "expected_run": ratio(mean_run),
        "startup": ratio(lambda s: s["startup_s"]),
        "slowest_seed_updates_per_block": {side: updates_to_solve(side)
                                           for side in ("bare", "fused")},
        "mean_updates_per_seed": {
            side: statistics.fmean(u for block in rounds[0][side]["updates"] for u in block)
            for side in ("bare", "fused")},
        "median_startup_s": {side: statistics.median(r[side]["startup_s"] for r in rounds)
                             for side in ("bare", "fused")},
        "median_compile_s": {side: statistics.median(r[side]["compile_s"] for r in rounds)
                             for side in ("bare", "fused")},
        "median_mean_run_s": {side: statistics.median(mean_run(r[side]) for r in rounds)
                              for side in ("bare", "fused")},
    }


def run_fresh_comparison(env_id: str, num_seeds: int, hp: Hyper, *, max_updates: int,
                         rounds: int, seed_blocks: int, fused_lowering: str = "auto",
                         fused_loop: str = "hand") -> dict:
    """`rounds` rounds of `fresh_solve` for each side, each in its own fresh process, the
    order alternating round by round; the rounds and `summarize_fresh` of them."""
    runs = []
    for index in range(rounds):
        sides = ("bare", "fused") if index % 2 == 0 else ("fused", "bare")
        runs.append({side: _spawn_fresh_solve(side, env_id, num_seeds,
                                              max_updates=max_updates,
                                              seed_blocks=seed_blocks,
                                              fused_lowering=fused_lowering,
                                              fused_loop=fused_loop)
                     for side in sides})
        print(f"{env_id} seeds={num_seeds} round {index}: " + ", ".join(
            f"{side} startup {r['startup_s']:.2f}s mean run "
            f"{statistics.fmean(r['run_s']):.2f}s" for side, r in runs[-1].items()),
            flush=True)
    deterministic = all(r[side]["updates"] == runs[0][side]["updates"]
                        for r in runs for side in ("bare", "fused"))
    return {"env": env_id, "num_seeds": num_seeds, "seed_blocks": seed_blocks,
            "max_updates": max_updates, "fused_loop": fused_loop, "rounds": runs,
            "same_updates_every_round": deterministic,
            "ratio_fused_over_bare": summarize_fresh(runs)}


def run_sampler_throughput(env_id: str, num_envs: int, num_steps: int, rounds: int,
                           num_seeds: int = 1) -> dict:
    """Single-chunk env steps/s: the pure sampler's jitted `sample()` against the bare
    `lax.scan` rollout (same env, 64x64 MLP, sampled actions), alternating rounds. With
    `num_seeds > 1` both run `jax.vmap`-ed over that many seeds (each its own keys and
    sub-envs, the same policy params) in one program, as in a loop trained over seeds;
    the sampler's side is then a plain `jax.jit` (JAX's Threefry lowering), as the user's
    own jit of a vmapped loop compiles it, where one seed runs `sample_jit` as the runner
    does."""
    import jax

    import jaxrunner
    from jaxrunner.benchmarking import compare, make_bare_scan

    config = (jaxrunner.RunnerConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps,
                           max_chunk_length=num_steps)
              .rl_module(model_config={"fcnet_hiddens": [64, 64]})
              .debugging(seed=0))
    sampler = jaxrunner.make_sampler(config)
    params = sampler.params
    if num_seeds > 1:
        sample = jax.jit(jax.vmap(lambda state: sampler.sample(state, params)[:2]))
        state = jax.jit(jax.vmap(sampler.init))(jax.random.split(sampler.default_key,
                                                                 num_seeds))
    else:
        sample = lambda state: sampler.sample_jit(state, params)[:2]  # noqa: E731
        state = jax.jit(sampler.init)(sampler.default_key)
    holder = {"state": state}

    def fused():
        holder["state"], traj = sample(holder["state"])
        jax.block_until_ready(traj)

    fused()
    sides = {"bare_scan": make_bare_scan(env_id, num_envs, num_steps, (64, 64), False,
                                         num_seeds=num_seeds if num_seeds > 1 else 0),
             "sampler": fused}
    result = compare(sides, num_seeds * num_envs * num_steps, rounds=rounds)
    result.pop("_timings")
    return {"env": env_id, "num_envs": num_envs, "num_seeds": num_seeds,
            "num_steps": num_steps, **result, "load_avg_1min": round(os.getloadavg()[0], 2)}


def main_fused(args: argparse.Namespace) -> None:
    """`--fused`: writes benchmarks/results/time_to_solve_fused.json."""
    import jax

    results: dict[str, Any] = {
        "benchmark": "time_to_solve_fused",
        "note": "fused jaxrunner PPO (jaxrunner.make_sampler + PPOLearner.make_train in one "
                "jax.jit) vs the bare PureJaxRL-style PPO; one process, compile measured "
                "with jit(...).lower().compile(); the machine is shared, see load_avg_1min",
        "machine": {"jax": jax.__version__, "cpu_count": os.cpu_count(),
                    "devices": [str(d) for d in jax.devices()],
                    "platform": platform.platform(), "python": platform.python_version()},
        "runs": [], "sampler_throughput": []}
    json_path = os.path.join(args.output_dir, "time_to_solve_fused.json")

    def save():
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)

    for num_envs in args.throughput_envs:
        for num_seeds in args.throughput_seeds:
            results["sampler_throughput"].append(run_sampler_throughput(
                "CartPole-v1", num_envs, 128, rounds=args.rounds, num_seeds=num_seeds))
            print(json.dumps(results["sampler_throughput"][-1]), flush=True)
            save()
    for env_id in args.envs:
        hp = HYPER[env_id]
        max_updates = min(args.max_updates, math.ceil(hp.max_env_steps / hp.batch_size))
        for num_seeds in args.fused_seeds:
            results["runs"].append(run_fused_comparison(
                env_id, num_seeds, hp, max_updates=max_updates,
                timing_iterations=args.timing_iterations, rounds=args.rounds,
                fused_lowering=args.fused_lowering))
            save()
    print(f"wrote {json_path}")


def main_fused_fresh(args: argparse.Namespace) -> None:
    """`--fused-fresh`: writes benchmarks/results/time_to_solve_fused_fresh.json."""
    from benchmarks.same_process_ab import run_header

    results: dict[str, Any] = {
        **run_header("time_to_solve_fused_fresh"),
        "note": "fused jaxrunner PPO (jaxrunner.make_sampler + PPOLearner.make_train in one "
                "jax.jit) vs the bare PureJaxRL-style PPO, each side in its own fresh "
                "process a round (order alternating); the clock starts after the imports "
                "(the same modules on both sides) and covers building the program, tracing, "
                "compiling it once and running it on seed_blocks blocks of num_seeds seeds",
        "load_avg_1min_start": round(os.getloadavg()[0], 2), "runs": []}
    name = ("time_to_solve_fused_fresh.json" if args.fused_loop == "hand"
            else f"time_to_solve_fused_fresh_{args.fused_loop}.json")
    json_path = os.path.join(args.output_dir, name)
    for env_id in args.envs:
        hp = HYPER[env_id]
        max_updates = min(args.max_updates, math.ceil(hp.max_env_steps / hp.batch_size))
        for num_seeds in args.fused_seeds:
            run = run_fresh_comparison(env_id, num_seeds, hp, max_updates=max_updates,
                                       rounds=args.rounds, seed_blocks=args.seed_blocks,
                                       fused_lowering=args.fused_lowering,
                                       fused_loop=args.fused_loop)
            results["runs"].append(run)
            print(json.dumps({"env": env_id, "num_seeds": num_seeds,
                              **run["ratio_fused_over_bare"]}), flush=True)
            results["load_avg_1min_end"] = round(os.getloadavg()[0], 2)
            with open(json_path, "w") as f:
                json.dump(results, f, indent=1)
    print(f"wrote {json_path}")


def _fresh_child(args: argparse.Namespace) -> None:
    """`--_fresh_child SIDE`: `fresh_solve` in this process, printed as one RESULT line.
    Every module either side uses is imported before its clock starts."""
    import flax.linen  # noqa: F401
    import gymnax  # noqa: F401
    import jax  # noqa: F401
    import optax  # noqa: F401

    import jaxrunner  # noqa: F401
    import jaxrunner.learners  # noqa: F401

    out = fresh_solve(args.fresh_child, args.env, args.num_seeds, HYPER[args.env],
                      max_updates=args.max_updates, seed_blocks=args.seed_blocks,
                      fused_lowering=args.fused_lowering, fused_loop=args.fused_loop)
    print("RESULT " + json.dumps(out))


# ====================================================================== driver
def _child(args: argparse.Namespace) -> None:
    hp = HYPER[args.env]
    load_before = os.getloadavg()[0]
    if args.method == "jaxrunner":
        out: Any = run_jaxrunner(args.env, args.seed, hp, args.max_time_s)
    elif args.method == "bare":
        out = run_bare(args.env, [args.seed], hp)[0]
    elif args.method == "bare_vmap":
        out = run_bare(args.env, list(range(args.seed, args.seed + args.num_seeds)), hp)
    elif args.method == "jaxrunner_batched":
        out = run_jaxrunner_batched(args.env, list(range(args.seed, args.seed + args.num_seeds)),
                                    hp, args.max_time_s)
    else:
        out = run_rllib(args.env, args.seed, hp, args.max_time_s,
                        num_env_runners=args.rllib_runners)
    # The machine's 1-minute load average before and after: runs on a shared machine are
    # only comparable when these are alike.
    for item in out if isinstance(out, list) else [out]:
        item["load_avg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print("RESULT " + json.dumps(out))


def _spawn(method: str, env_id: str, seed: int, *, max_time_s: float, num_seeds: int = 1,
           rllib_runners: int = 1) -> Any:
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", method, "--env", env_id,
           "--seed", str(seed), "--max-time-s", str(max_time_s), "--num-seeds",
           str(num_seeds), "--rllib-runners", str(rllib_runners)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", RAY_DEDUP_LOGS="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=max_time_s + 600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"{method} {env_id} seed {seed} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    failed = {"method": method, "env": env_id, "seed": seed, "solved": False,
              "time_to_solve_s": None, "env_steps_to_solve": None, "curve": [],
              "first_iteration_done_s": None, "median_iteration_s": None,
              "all_seeds_done_s": None, "load_avg_1min": None,
              "error": proc.stderr[-2000:]}
    return [dict(failed, seed=seed + i) for i in range(num_seeds)] if method in (
        "bare_vmap", "jaxrunner_batched") else failed


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def plot(results: dict, path: str) -> None:
    """Return against wall time, one panel per env, one colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    envs = list(results["envs"])
    fig, axes = plt.subplots(1, len(envs), figsize=(6.5 * len(envs), 4.2), squeeze=False)
    colours = {"jaxrunner": "tab:blue", "bare": "tab:orange", "rllib": "tab:green"}
    for ax, env_id in zip(axes[0], envs):
        section = results["envs"][env_id]
        for run in section["runs"]:
            points = [(r["time_s"], r["episode_return_mean"]) for r in run["curve"]
                      if r["episode_return_mean"] is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            first = all(r["method"] != run["method"] or r is run for r in section["runs"]
                        [: section["runs"].index(run) + 1])
            ax.plot(xs, ys, color=colours.get(run["method"], "grey"), alpha=0.8, lw=1.2,
                    label=run["method"] if first else None)
        ax.axhline(section["target"], color="black", ls="--", lw=0.8, label="target")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("wall time since start, compile included (s, log)")
        ax.set_ylabel(f"mean return of the last {SMOOTHING} episodes")
        summary = section["summary"]
        title = f"{env_id}"
        if summary.get("median_time_to_solve_s"):
            title += " — median s to solve: " + ", ".join(
                f"{k} {v:.1f}" for k, v in summary["median_time_to_solve_s"].items()
                if v is not None)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="*", default=list(HYPER), choices=list(HYPER),
                        help="none (with --fused): only the sampler throughput")
    parser.add_argument("--seeds", type=int, default=3,
                        help="single-seed runs per method (alternating jaxrunner / bare)")
    parser.add_argument("--rllib-seeds", type=int, default=1)
    parser.add_argument("--skip-rllib", action="store_true")
    parser.add_argument("--skip-multi-seed", action="store_true")
    parser.add_argument("--rllib-runners", type=int, default=1)
    parser.add_argument("--max-time-s", type=float, default=600.0,
                        help="give up on one run after this long")
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--_child", dest="child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--num-seeds", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--fused", action="store_true",
                        help="fused jaxrunner PPO vs bare (time_to_solve_fused.json)")
    parser.add_argument("--fused-fresh", action="store_true",
                        help="fused jaxrunner PPO vs bare, each side in fresh processes, "
                             "build + compile + runs on --seed-blocks blocks of seeds "
                             "(time_to_solve_fused_fresh.json)")
    parser.add_argument("--_fresh_child", dest="fresh_child", default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--seed-blocks", type=int, default=4,
                        help="with --fused-fresh: blocks of --fused-seeds seeds each side "
                             "runs after its one compile")
    parser.add_argument("--fused-seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--fused-lowering", choices=("auto", "unrolled", "jax"),
                        default="auto",
                        help="the fused side's Threefry lowering: 'auto' as "
                             "PPOLearner.fused_train picks it (jaxrunner.lowering."
                             "unroll_for_training), 'unrolled', or 'jax' (JAX's own, as "
                             "the bare side)")
    parser.add_argument("--fused-loop", choices=FUSED_LOOPS, default="hand",
                        help="with --fused-fresh: the fused side's solve loop, 'hand' (a "
                             "while loop written here, returning what the bare PPO returns) "
                             "or 'make_train' (PPOLearner.make_train(..., target_return=...), "
                             "which also keeps every iteration's metrics; writes "
                             "time_to_solve_fused_fresh_make_train.json)")
    parser.add_argument("--max-updates", type=int, default=10_000)
    parser.add_argument("--timing-iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--throughput-envs", type=int, nargs="*", default=[16, 1024])
    parser.add_argument("--throughput-seeds", type=int, nargs="+", default=[1],
                        help="sampler throughput also vmapped over this many seeds "
                             "(1: no vmap)")
    args = parser.parse_args()
    if min(args.throughput_seeds) < 1:
        parser.error(f"--throughput-seeds must be at least 1, got {args.throughput_seeds}")
    if args.seed_blocks < 1:
        parser.error(f"--seed-blocks must be at least 1, got {args.seed_blocks}")
    if args.fresh_child:
        _fresh_child(args)
        return
    if args.fused or args.fused_fresh:
        os.makedirs(args.output_dir, exist_ok=True)
        (main_fused_fresh if args.fused_fresh else main_fused)(args)
        return
    if args.child:
        args.method = args.child
        _child(args)
        return

    import jax

    os.makedirs(args.output_dir, exist_ok=True)
    results: dict[str, Any] = {
        "benchmark": "time_to_solve", "smoothing_episodes": SMOOTHING,
        "clock": "starts after imports, before the runner/train fn/algorithm is built; "
                 "compilation and Ray start-up included; one fresh process per run",
        "machine": {"jax": jax.__version__, "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version()},
        "envs": {}}
    for env_id in args.envs:
        hp = HYPER[env_id]
        runs: list[dict] = []
        for seed in range(args.seeds):
            for method in ("bare", "jaxrunner"):
                run = _spawn(method, env_id, seed, max_time_s=args.max_time_s)
                runs.append(run)
                print(f"{env_id} {method} seed {seed}: solved={run['solved']} "
                      f"time_to_solve_s={run['time_to_solve_s']} "
                      f"env_steps={run['env_steps_to_solve']}", flush=True)
        if not args.skip_rllib:
            for seed in range(args.rllib_seeds):
                run = _spawn("rllib", env_id, seed, max_time_s=args.max_time_s,
                             rllib_runners=args.rllib_runners)
                runs.append(run)
                print(f"{env_id} rllib seed {seed}: solved={run['solved']} "
                      f"time_to_solve_s={run['time_to_solve_s']} "
                      f"env_steps={run['env_steps_to_solve']}", flush=True)
        methods = sorted({r["method"] for r in runs})
        median = {m: _median([r["time_to_solve_s"] for r in runs if r["method"] == m])
                  for m in methods}
        pairs = [_ratio(j["time_to_solve_s"], b["time_to_solve_s"])
                 for j, b in zip([r for r in runs if r["method"] == "jaxrunner"],
                                 [r for r in runs if r["method"] == "bare"])]
        summary: dict[str, Any] = {
            "median_time_to_solve_s": median,
            "solved": {m: sum(r["solved"] for r in runs if r["method"] == m) for m in methods},
            "runs_per_method": {m: sum(r["method"] == m for r in runs) for m in methods},
            "jaxrunner_over_bare_median_time": _ratio(median.get("jaxrunner"),
                                                      median.get("bare")),
            "jaxrunner_over_bare_per_seed": pairs,
            "rllib_over_jaxrunner_median_time": _ratio(median.get("rllib"),
                                                       median.get("jaxrunner")),
            "median_env_steps_to_solve": {
                m: _median([r["env_steps_to_solve"] for r in runs if r["method"] == m])
                for m in methods},
            "median_setup_s": {m: _median([r.get("setup_s") for r in runs
                                           if r["method"] == m]) for m in methods},
            "median_first_iteration_done_s": {
                m: _median([r["first_iteration_done_s"] for r in runs if r["method"] == m])
                for m in methods},
            "median_iteration_s": {
                m: _median([r["median_iteration_s"] for r in runs if r["method"] == m])
                for m in methods},
        }
        # jaxrunner and bare run the same algorithm, so how many iterations a seed needs is
        # luck of the draw, the same for both; with few seeds that luck dominates the
        # medians above. This estimate pools the iteration counts of both and charges each
        # method its own start-up (compile) and per-iteration time.
        iterations = [r["env_steps_to_solve"] / r["env_steps_per_iteration"] for r in runs
                      if r["method"] in ("bare", "jaxrunner") and r["solved"]
                      and r.get("env_steps_per_iteration")]
        if iterations:
            pooled = statistics.median(iterations)
            estimate = {m: summary["median_first_iteration_done_s"][m]
                        + (pooled - 1) * summary["median_iteration_s"][m]
                        for m in ("bare", "jaxrunner")
                        if summary["median_first_iteration_done_s"].get(m) is not None
                        and summary["median_iteration_s"].get(m) is not None}
            summary["pooled_median_iterations_to_solve"] = pooled
            summary["estimated_time_to_solve_s_at_pooled_iterations"] = estimate
            summary["jaxrunner_over_bare_estimated"] = _ratio(estimate.get("jaxrunner"),
                                                              estimate.get("bare"))
        section = {"target": hp.target, "hyperparameters": dataclasses.asdict(hp),
                   "summary": summary, "runs": runs}
        if env_id == "CartPole-v1" and not args.skip_multi_seed:
            eight = {}
            for method in ("bare_vmap", "jaxrunner_batched"):
                runs8 = _spawn(method, env_id, 0, max_time_s=args.max_time_s, num_seeds=8)
                eight[method] = {
                    "all_seeds_done_s": runs8[0]["all_seeds_done_s"],
                    "all_solved": all(r["solved"] for r in runs8),
                    "first_iteration_done_s": runs8[0]["first_iteration_done_s"],
                    "median_iteration_s": _median([r["median_iteration_s"] for r in runs8]),
                    "per_seed_time_to_solve_s": [r["time_to_solve_s"] for r in runs8],
                    "per_seed_env_steps_to_solve": [r["env_steps_to_solve"] for r in runs8],
                    "load_avg_1min": runs8[0]["load_avg_1min"],
                }
                print(f"8 seeds, {method}: all solved={eight[method]['all_solved']} in "
                      f"{eight[method]['all_seeds_done_s']:.1f}s", flush=True)
            section["eight_seeds"] = eight
        results["envs"][env_id] = section
        print(json.dumps({env_id: summary}, indent=1), flush=True)
    json_path = os.path.join(args.output_dir, "time_to_solve.json")
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    png_path = os.path.join(args.output_dir, "time_to_solve.png")
    plot(results, png_path)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
