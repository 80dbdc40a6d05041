"""A reference PPO learner that consumes `EpisodeBatch` device arrays.

Small and readable on purpose (CleanRL / PureJaxRL style): it shows how a JAX learner uses
the runner API, and is not an algorithm zoo.

    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    learner = PPOLearner.from_runner(runner, PPOConfig())
    learner.push_weights(runner)              # the runner acts with the learner's policy
    for _ in range(100):
        batch = runner.sample()               # device arrays, (T, B, ...)
        stats = learner.update(batch)         # one jitted call: GAE + clipped PPO epochs
        learner.push_weights(runner)          # runner.set_state({"rl_module", "weights_seq_no"})

or `learner.train(runner, num_iterations=100, time_budget_s=60)`, which does the same,
prints progress and returns the losses, entropy, KL and clip fraction per iteration.

The fused loop trains inside one `jax.jit` instead (no host round trip per iteration),
vmapped over seeds, with the runner's pure sampler (`jaxrunner.Sampler`):

    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig())
    out = learner.fused_train(sampler, num_iterations=100, seeds=8)
    out["metrics"]["episode_return_mean"]     # (8, 100): per seed and iteration
Recurrent (stateful) modules are refused: this learner trains feed-forward policies.

`update` reads `batch.trajectory()` on the device (no host transfer). With a group of Ray
runners, the driver learns and `push_weights(group)` calls `group.sync_weights(...)`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrunner import lowering
from jaxrunner.core import chunk as core_chunk
from jaxrunner.core.carry import Trajectory
from jaxrunner.core.final_obs import join_stores_across_envs
from jaxrunner.modules.rl_module import (DEFAULT_MODULE_ID, Deferred, RLModule, RLModuleSpec,
                                         init_params)
from jaxrunner.structure import check_same_structure


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (defaults: PureJaxRL's CartPole settings)."""

    learning_rate: float | Callable[[jax.Array], jax.Array] = 2.5e-4
    """A float, or an optax schedule of the optimizer step (epochs x minibatches per update)."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    num_epochs: int = 4
    num_minibatches: int = 4
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    reward_scale: float = 1.0
    """Rewards are multiplied by this before GAE (e.g. 0.1 for Pendulum)."""
    seed: int = 0

    def __post_init__(self):
        for name in ("num_epochs", "num_minibatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be an int >= 1, got {value!r}.")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPOConfig.{name} must be in [0, 1], got {getattr(self, name)}.")


class LearnerState(struct.PyTreeNode):
    """What the learner carries from one update to the next."""

    params: Any  # full module params: {"pi": ..., "vf": ...}
    opt_state: Any  # optax state
    key: jax.Array  # () typed PRNG key, for minibatch shuffling


class FusedTrainState(struct.PyTreeNode):
    """The carry of `PPOLearner.make_train`'s loop."""

    learner: LearnerState
    sampler: Any  # jaxrunner.SamplerState


class _Sample(NamedTuple):
    """One flattened (T * B) row per step, as the loss sees it."""

    obs: Any  # (N, *obs_shape)
    actions: jax.Array  # (N, *act_shape)
    logp: jax.Array  # (N,) log-prob under the policy that sampled
    advantages: jax.Array  # (N,)
    targets: jax.Array  # (N,) value targets
    weight: jax.Array  # (N,) 1.0 for taken steps, 0.0 for padding (valid == False)


# The update's V(final_obs) runs the critic only on the final-observation store's rows
# (`PPOLearner._final_values`). False runs it on the dense `(T, B)` final observations, as
# before: for A/B benchmarks (`benchmarks/ppo_final_values.py`).
FINAL_VALUES_FROM_STORE = True


def compute_gae(rewards: jax.Array, values: jax.Array, final_values: jax.Array,
                terminated: jax.Array, truncated: jax.Array, valid: jax.Array, *,
                gamma: float, gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimates over a time-major chunk, episode boundaries kept.

    The value of the state after step `t` is:
      * `values[t + 1]` when the episode goes on in the next row (same sub-env);
      * `final_values[t]` = V(`final_obs[t]`) when the episode was truncated at `t`, or is
        still running at the end of the chunk (cut: bootstrap from its last observation);
      * 0 when the episode terminated at `t`.
    Advantages never flow across an episode end or across a missing (`valid == False`) step.

    Args:
        rewards: (T, B) float32.
        values: (T, B) float32, V(obs[t]).
        final_values: (T, B) float32, V(final_obs[t]) (next observation before any reset).
        terminated, truncated: (T, B) bool.
        valid: (T,) or (T, B) bool, False for steps that were not taken (or that failed).

    Returns:
        `(advantages, targets)`, both (T, B) float32 and 0 where `valid` is False;
        `targets = advantages + values`.
    """
    done = terminated | truncated
    valid = jnp.broadcast_to(valid if valid.ndim == 2 else valid[:, None], done.shape)
    valid_next = jnp.concatenate([valid[1:], jnp.zeros_like(valid[:1])], axis=0)
    continues = ~done & valid_next  # (T, B) the next row is the same episode
    values_next = jnp.concatenate([values[1:], jnp.zeros_like(values[:1])], axis=0)
    next_values = jnp.where(continues, values_next, final_values)
    next_values = jnp.where(terminated, 0.0, next_values)
    deltas = rewards + gamma * next_values - values

    def backward(next_advantage, inputs):
        delta, cont = inputs
        advantage = delta + gamma * gae_lambda * cont * next_advantage
        return advantage, advantage

    # As a select of the float episode flag (not a cast of the bool `continues`): XLA:CPU
    # compiles the cast of a bool mask into several times the code.
    continues_f = jnp.where(valid_next, (~done).astype(values.dtype), 0.0)
    _, advantages = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, continues_f),
                                 reverse=True)
    advantages = jnp.where(valid, advantages, 0.0)
    return advantages, jnp.where(valid, advantages + values, 0.0)


def clipped_surrogate_loss(log_ratio: jax.Array, advantages: jax.Array,
                           clip_eps: float) -> jax.Array:
    """PPO's clipped policy loss per sample: `-min(r * A, clip(r, 1 - eps, 1 + eps) * A)`
    with `r = exp(log_ratio)` (new over sampling policy)."""
    ratio = jnp.exp(log_ratio)
    return -jnp.minimum(ratio * advantages,
                        jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)


def _weighted_mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    return jnp.sum(x * weight) / jnp.maximum(jnp.sum(weight), 1.0)


class PPOLearner:
    """Clipped PPO on a full (policy + value) `RLModule`.

    Args:
        module: a module built with `inference_only=False` (its `forward_train` returns
            "action_dist_inputs" and "vf_preds").
        config: `PPOConfig`.
        params: initial params (default: `module.init(key(config.seed))`).
    """

    def __init__(self, module: RLModule, config: PPOConfig = PPOConfig(), params: Any = None):
        if module.inference_only:
            raise ValueError("PPOLearner needs a module with a value head: build it with "
                             "RLModuleSpec(inference_only=False).")
        if module.is_stateful():
            raise ValueError(f"PPOLearner trains feed-forward modules; "
                             f"{type(module).__name__} is recurrent.")
        self.module = module
        self.config = config
        self.optimizer = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adam(config.learning_rate, eps=1e-5),
        )
        # The state is built on its first read (`state`): a fused train (`make_train`,
        # `fused_train`) initialises its own inside its program and never reads this one,
        # and building it compiles the module's init (about 1 s for a 64x64 MLP on a
        # 2-core CPU). Its shapes are traced now, so a module that cannot initialise
        # fails here, at construction.
        self._state = Deferred(self.init_state, jax.random.key(config.seed), params)
        self.weights_seq_no = 0
        self.iteration = 0  # `train()` iterations done so far, over all calls
        self.history: list[dict] = []  # every `train()` row, over all calls
        self._update = jax.jit(self.update_fn)

    @property
    def state(self) -> LearnerState:
        """The learner's `LearnerState` (params, optimizer state, shuffling key): the one
        `config.seed` (or the `params` given) makes, built on first read, then each
        update's."""
        return self._state.value

    @state.setter
    def state(self, value: LearnerState) -> None:
        self._state = Deferred.built(value)

    def init_state(self, key: jax.Array, params: Any = None) -> LearnerState:
        """A fresh `LearnerState` (pure: `jax.vmap` it over keys for a population)."""
        params_key, shuffle_key = jax.random.split(key)
        if params is None:
            params = init_params(self.module, params_key)
        return LearnerState(params=params, opt_state=self.optimizer.init(params),
                            key=shuffle_key)

    @classmethod
    def from_runner(cls, runner: Any, config: PPOConfig = PPOConfig()) -> "PPOLearner":
        """A learner whose module matches `runner`'s (same class and model config) plus a
        value head. `runner` is a `SingleAgentEnvRunner` or an `EnvRunnerGroup`."""
        runner_config = runner.config
        source = getattr(runner, "local_env_runner", runner)  # a group: its local runner
        spaces = source.get_spaces()
        if getattr(source, "agent_ids", ()) or DEFAULT_MODULE_ID not in spaces:
            raise ValueError(
                f"PPOLearner trains one single-agent module, but {type(source).__name__} "
                f"has the modules {sorted(k for k in spaces if not k.startswith('__'))} "
                "(a multi-agent env). Use a single-agent env, or train each module with a "
                "learner of your own over the sampler's MultiAgentTrajectory.")
        obs_space, act_space = spaces[DEFAULT_MODULE_ID]
        env_obs_space = spaces.get("__env_single__", (obs_space,))[0]
        if runner_config.env_to_module_connector is not None or env_obs_space != obs_space:
            # The trajectory holds env observations; the module would see them changed.
            raise ValueError(
                "PPOLearner trains on the trajectory's env observations, but this runner's "
                f"env-to-module connectors change what the module sees ({env_obs_space} -> "
                f"{obs_space}). Use the default connectors with Box or Discrete "
                "observations, or a learner that applies the same connectors.")
        spec = runner_config.rl_module_spec or RLModuleSpec()
        module = RLModuleSpec(
            module_class=spec.module_class,
            observation_space=spec.observation_space or obs_space,
            action_space=spec.action_space or act_space,
            model_config={**runner_config.model_config_with_defaults,
                          **(spec.model_config or {})},
            inference_only=False,
        ).build()
        learner = cls(module, config)
        learner.weights_seq_no = int(getattr(runner, "weights_seq_no", 0) or 0)
        return learner

    # ------------------------------------------------------------------ the update
    def _values(self, params: Any, obs: Any) -> jax.Array:
        return self.module.forward_train(params, {"obs": obs})["vf_preds"]

    def _final_values(self, params: Any, traj: Trajectory, values: jax.Array) -> jax.Array:
        """(T, B) float32 V(`final_obs[t]`), given `values` (T, B) = V(`obs[t]`).

        A step's final observation is the next step's observation unless the step ended an
        episode or is the chunk's last taken step, and those are exactly the rows of the
        trajectory's final-observation store (`core.final_obs`). So V(`obs[t + 1]`) is
        read from `values` and the critic runs only on the store's rows instead of on a
        second dense `(T, B)` batch: `ceil(T / 8) + 2` rows per sub-env for chunks longer
        than 16 steps (the default store size). A store as large as the dense batch (short
        chunks, host trajectories) takes the dense path. Steps not taken read an arbitrary
        value; `compute_gae` masks them."""
        num_steps, num_envs = values.shape
        store = traj.final_obs_store
        if not FINAL_VALUES_FROM_STORE or store.index.shape[0] >= num_steps * num_envs:
            flat = lambda x: x.reshape((num_steps * num_envs,) + x.shape[2:])  # noqa: E731
            return self._values(params, jax.tree.map(flat, traj.final_obs)
                                ).reshape(num_steps, num_envs)
        rows = jax.tree.map(lambda like, row: row.astype(like.dtype), traj.obs, store.obs)
        row_values = self._values(params, rows)
        shifted = jnp.concatenate([values[1:], jnp.zeros_like(values[:1])], axis=0)
        target = jnp.where(store.index >= 0, store.index, num_steps * num_envs)
        return (shifted.reshape(-1).at[target].set(row_values, mode="drop")
                .reshape(num_steps, num_envs))

    def _loss(self, params: Any, sample: _Sample) -> tuple[jax.Array, dict]:
        cfg = self.config
        out = self.module.forward_train(params, {"obs": sample.obs})
        dist = self.module.action_dist(out["action_dist_inputs"])
        logp = dist.logp(sample.actions)
        advantages = sample.advantages
        if cfg.normalize_advantages:
            mean = _weighted_mean(advantages, sample.weight)
            std = jnp.sqrt(_weighted_mean((advantages - mean) ** 2, sample.weight))
            advantages = (advantages - mean) / (std + 1e-8)
        log_ratio = logp - sample.logp
        ratio = jnp.exp(log_ratio)
        policy_loss = clipped_surrogate_loss(log_ratio, advantages, cfg.clip_eps)
        value_loss = 0.5 * (out["vf_preds"] - sample.targets) ** 2
        entropy = dist.entropy()
        stats = {
            "policy_loss": _weighted_mean(policy_loss, sample.weight),
            "vf_loss": _weighted_mean(value_loss, sample.weight),
            "entropy": _weighted_mean(entropy, sample.weight),
            "approx_kl": _weighted_mean((ratio - 1) - log_ratio, sample.weight),
            "clip_fraction": _weighted_mean(
                (jnp.abs(ratio - 1) > cfg.clip_eps).astype(jnp.float32), sample.weight),
        }
        total = (stats["policy_loss"] + cfg.vf_coef * stats["vf_loss"]
                 - cfg.ent_coef * stats["entropy"])
        stats["total_loss"] = total
        return total, stats

    def update_fn(self, state: LearnerState, traj: Trajectory
                  ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """One PPO update, pure: GAE over the `(T, B)` trajectory, then `num_epochs` passes
        of `num_minibatches` shuffled minibatches. `update` is this, jitted; `jax.vmap` it
        to train a population (one state and one trajectory slice per member)."""
        cfg = self.config
        num_steps, num_envs = traj.rewards.shape
        n = num_steps * num_envs
        flat = lambda x: x.reshape((n,) + x.shape[2:])  # noqa: E731
        obs = jax.tree.map(flat, traj.obs)
        values = self._values(state.params, obs).reshape(num_steps, num_envs)
        final_values = self._final_values(state.params, traj, values)
        # Steps not taken, and steps where a sub-env failed (its episode is discarded),
        # neither count in the loss nor pass advantages back.
        # A select on the (T,) validity rather than `&` with its broadcast: XLA:CPU
        # compiles the `&` into several times the code (`benchmarks/compile_parts.py`).
        valid = jnp.where(traj.valid[:, None], ~traj.failed, False)
        advantages, targets = compute_gae(
            traj.rewards * cfg.reward_scale, values, final_values, traj.terminated,
            traj.truncated, valid, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda)
        data = _Sample(
            obs=obs, actions=flat(traj.actions),
            logp=flat(traj.extra_model_outputs["action_logp"]),
            advantages=flat(advantages), targets=flat(targets),
            weight=flat(valid.astype(jnp.float32)))
        _check_minibatches(cfg, num_steps, num_envs)
        minibatch = n // cfg.num_minibatches  # rows left over are skipped (reshuffled each epoch)

        def minibatch_step(carry, sample):
            params, opt_state = carry
            grads, stats = jax.grad(self._loss, has_aux=True)(params, sample)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), stats

        def epoch(carry, key):
            order = jax.random.permutation(key, n)[: minibatch * cfg.num_minibatches]
            shuffled = jax.tree.map(
                lambda x: x[order].reshape((cfg.num_minibatches, minibatch) + x.shape[1:]),
                data)
            return jax.lax.scan(minibatch_step, carry, shuffled)

        key, epoch_key = jax.random.split(state.key)
        (params, opt_state), stats = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(epoch_key, cfg.num_epochs))
        stats = jax.tree.map(jnp.mean, stats)
        stats["vf_explained_var"] = 1.0 - (
            _weighted_mean((targets - values) ** 2, data.weight.reshape(num_steps, num_envs))
            / jnp.maximum(jnp.var(targets), 1e-8))
        return LearnerState(params=params, opt_state=opt_state, key=key), stats

    def update(self, batch: Any) -> dict[str, jax.Array]:
        """One PPO update on a batch (`EpisodeBatch`, `Trajectory`, or a list of either
        with the same `T`, joined along the sub-env axis). Returns device scalars."""
        traj = _as_trajectory(batch)
        self.state, stats = self._update(self.state, traj)
        return stats

    # ------------------------------------------------------------------ the fused loop
    @classmethod
    def from_sampler(cls, sampler: Any, config: PPOConfig = PPOConfig()) -> "PPOLearner":
        """A learner for `sampler` (`jaxrunner.Sampler`): `from_runner` of its runner."""
        return cls.from_runner(sampler.runner, config)

    def make_train(self, sampler: Any, num_iterations: int, *,
                   target_return: float | None = None) -> Callable[..., tuple]:
        """The whole training loop as one pure function, `train(key) -> (state, stats,
        metrics)`: `lax.scan` over `num_iterations` iterations of `sampler.sample()` with
        the policy being trained, then `update_fn` on its trajectory. Jit it, and `vmap`
        it over keys for several seeds (`fused_train` does both).

        Returns `(FusedTrainState, stats, metrics)`: the final learner and sampler states;
        `update_fn`'s statistics per iteration (each `(num_iterations,)`); the
        `SampleMetrics` per iteration (leading axis `num_iterations`, reduce them with
        `sampler.reduce_metrics`).

        With `target_return`, the loop is a `lax.while_loop` that stops after the first
        iteration whose `episode_return_mean` (the mean of the sampler's episode ring,
        RLlib's smoothing window, in float32 on the device) is at least `target_return`,
        or after `num_iterations` (RLlib's `stop={"env_runners/episode_return_mean": R}`;
        at least one iteration runs). Vmapped over seeds, a seed that has stopped is frozen
        while the others go on, and the loop ends when every seed has. `train` then
        returns `(state, stats, metrics, iterations_run)`: the iterations a stopped seed
        did not run have NaN statistics and `SampleMetrics.nothing_sampled()` rows (its
        ring and lifetime counters as they were, no steps).

        `train.run(state)` is the same loop from a given `FusedTrainState` (e.g.
        `fused_state(runner)`, to continue a runner-driven `train(runner, ...)` in the
        fused loop); `train.init(key)` and `train.iteration(state, _)` are its parts."""
        if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or (
                num_iterations < 1):
            raise ValueError(f"num_iterations must be an int >= 1, got {num_iterations!r}.")
        target = _check_target_return(target_return)
        _check_minibatches(self.config, sampler.num_steps, sampler.num_envs)
        acting = sampler.module
        acting_params = jax.eval_shape(acting.params_for_inference, self._state.like.params)
        check_same_structure(  # shapes only: nothing is built or compiled
            sampler.params_like, acting_params,
            "PPOLearner.make_train: the learner's acting params",
            hint="Build the learner from this sampler, PPOLearner.from_sampler(sampler): "
                 "the same env spaces and model config.")

        def init(key: jax.Array) -> FusedTrainState:
            learner_key, sampler_key = jax.random.split(key)
            learner = self.init_state(learner_key)
            params = acting.params_for_inference(learner.params)
            state = FusedTrainState(learner=learner, sampler=sampler.init(sampler_key, params))
            # Batched like the key from the start: vmapped over seeds, the scan over
            # iterations then batches its body once (see `core.chunk.BATCHED_FROM_START`).
            return (core_chunk.same_batching_as(state, key)
                    if core_chunk.BATCHED_FROM_START else state)

        def iteration(state: FusedTrainState, _):
            params = acting.params_for_inference(state.learner.params)
            sampler_state, traj, metrics = sampler.sample(state.sampler, params)
            learner, stats = self.update_fn(state.learner, traj)
            return FusedTrainState(learner=learner, sampler=sampler_state), (stats, metrics)

        def run(state: FusedTrainState) -> tuple:
            if target is None:
                state, (stats, metrics) = jax.lax.scan(iteration, state, None,
                                                       length=num_iterations)
                return state, stats, metrics
            return _run_until_target(iteration, state, num_iterations, target)

        def train(key: jax.Array) -> tuple:
            return run(init(key))

        train.init, train.iteration, train.run = init, iteration, run
        return train

    def fused_state(self, runner: Any) -> FusedTrainState:
        """The state of the runner-driven loop as a fused loop's `FusedTrainState`: this
        learner's current `state` and `runner`'s episodes, counters and metrics (through
        `runner.sampler.from_runner_state`). `make_train(runner.sampler, n).run(state)`
        then does what `train(runner, num_iterations=n)` does from here."""
        return FusedTrainState(learner=self.state, sampler=runner.sampler.from_runner_state(
            runner.get_state(components="all")))

    def fused_train(self, sampler: Any, num_iterations: int, *,
                    seeds: int | list[int] = 1, target_return: float | None = None,
                    rng_lowering: str = "auto") -> dict[str, Any]:
        """Trains `seeds` independent policies (an int: seeds `config.seed ...`; or a
        list of seeds) at once, each with its own sub-envs, in one `jax.jit` of a `vmap`
        of `make_train` (no host round trip per iteration).

        Returns a dict: `state` (the `FusedTrainState`, leading axis = seeds), `stats`
        (host arrays `(S, num_iterations)` per statistic), `metrics` (RLlib's keys per
        seed and iteration, host arrays `(S, num_iterations)`; `episode_return_mean` is
        NaN until an episode has finished), `iterations_run` (a list: the iterations each
        seed ran), `seeds` and `time_s` (compilation included).
        The learner's own `state` is left unchanged.

        `target_return`: each seed stops after the first iteration whose
        `episode_return_mean` reaches it (`make_train`), and the call returns when every
        seed has stopped or run `num_iterations`; a stopped seed's later rows are NaN
        statistics and iterations that sampled nothing (its metrics as they were, no new
        steps or episodes).

        `rng_lowering`: the Threefry lowering of the program on CPU (the same random
        values either way; `jaxrunner.lowering`): "auto" unrolls the hash for several
        seeds of up to `UNROLL_MAX_ENVS` sub-envs in all and keeps JAX's lowering for one
        seed, which compiles faster (`lowering.unroll_for_training`); "unrolled"; "jax"."""
        from jaxrunner.metrics.fused import reduce_sample_metrics

        seed_list = _seed_list(seeds, self.config.seed)
        unrolled = lowering.choose_unrolled(rng_lowering, lowering.unroll_for_training(
            sampler.num_envs, len(seed_list)))
        train = self.make_train(sampler, num_iterations, target_return=target_return)
        keys = jnp.stack([jax.random.key(s) for s in seed_list])
        start = time.perf_counter()
        out = jax.block_until_ready(lowering.jit(jax.vmap(train), unrolled=unrolled)(keys))
        elapsed = time.perf_counter() - start
        state, stats, metrics = out[:3]
        iterations_run = ([num_iterations] * len(seed_list) if target_return is None
                          else [int(n) for n in jax.device_get(out[3])])
        return {"state": state, "stats": jax.device_get(stats),
                "metrics": reduce_sample_metrics(metrics, agent_ids=sampler.agent_ids,
                                                 module_ids=sampler.module_ids,
                                                 custom_metrics=sampler.custom_metrics),
                "iterations_run": iterations_run, "time_s": elapsed, "seeds": seed_list}

    # ------------------------------------------------------------------ weights
    @property
    def params(self) -> Any:
        return self.state.params

    def push_weights(self, target: Any) -> int:
        """Sends the policy to `target`, a runner (`set_state`) or a group
        (`sync_weights`), under a new `weights_seq_no`; returns it."""
        self.weights_seq_no += 1
        if hasattr(target, "sync_weights"):  # an EnvRunnerGroup: one ray.put for all runners
            return target.sync_weights(self.state.params, weights_seq_no=self.weights_seq_no)
        target.set_state({"rl_module": self.state.params,
                          "weights_seq_no": self.weights_seq_no})
        return self.weights_seq_no

    # ------------------------------------------------------------------ a training loop
    def train(self, runner: Any, *, num_iterations: int | None = None,
              target_return: float | None = None, time_budget_s: float | None = None,
              callback: Callable[[dict], None] | None = None, verbose: bool = True,
              log_interval_s: float = 2.0, logdir: str | None = None) -> list[dict]:
        """Samples, updates and pushes weights until `num_iterations` iterations of this
        call are done, the runner's `episode_return_mean` reaches `target_return`, or
        `time_budget_s` seconds of this call have passed (checked after each iteration,
        so the last one may run past it), whichever comes first. At least one of
        `num_iterations` and `time_budget_s` must be given. `runner` is a runner or an
        `EnvRunnerGroup` (the driver learns, the group's runners sample).

        Returns this call's rows, one per iteration (all calls' rows are in
        `self.history`):

        * `iteration`: counted over all `train()` calls of this learner (a second call
          continues where the first stopped; `self.iteration` is the next one);
        * `env_steps`: the runner's lifetime env steps; `time_s`: seconds since this call
          started (compilation included);
        * `episode_return_mean`: None until an episode has finished;
        * what `update()` computed, as floats: `total_loss`, `policy_loss`, `vf_loss`,
          `entropy`, `approx_kl`, `clip_fraction` (means over the epochs and
          minibatches) and `vf_explained_var`.

        With `logdir`, every iteration's row and the runner's metrics (RLlib's keys, under
        `env_runners/`) are written to `logdir` as TensorBoard event files and
        `metrics.jsonl` (`jaxrunner.metrics.experiment_log`; x axis: the iteration).

        With `verbose`, prints a progress line (iteration, env steps, steps/s, return,
        loss, entropy, KL, clip fraction) after the first iteration, then at most every
        `log_interval_s` seconds, and after the last.
        """
        if num_iterations is None and time_budget_s is None:
            raise ValueError("PPOLearner.train needs num_iterations=..., time_budget_s=... "
                             "or both, to know when to stop.")
        if num_iterations is not None and (isinstance(num_iterations, bool) or not isinstance(
                num_iterations, int) or num_iterations < 0):
            raise ValueError(f"num_iterations must be an int >= 0, got {num_iterations!r}.")
        if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(
                time_budget_s, (int, float)) or not time_budget_s > 0):
            raise ValueError(f"time_budget_s must be a number > 0, got {time_budget_s!r}.")
        log = _ProgressLog(verbose, log_interval_s)
        experiment_log = None
        if logdir is not None:
            from jaxrunner.metrics.experiment_log import ExperimentLog

            experiment_log = ExperimentLog(logdir)
        start = time.perf_counter()
        history: list[dict] = []
        self.push_weights(runner)
        while num_iterations is None or len(history) < num_iterations:
            batch = runner.sample()
            stats = self.update(batch)
            self.push_weights(runner)
            metrics = runner.get_metrics()
            row = {"iteration": self.iteration,
                   "env_steps": metrics["num_env_steps_sampled_lifetime"],
                   "time_s": time.perf_counter() - start,
                   "episode_return_mean": metrics.get("episode_return_mean")}
            row.update({name: float(value) for name, value in jax.device_get(stats).items()})
            if experiment_log is not None:
                experiment_log.log({**row, "env_runners": metrics}, step=row["iteration"])
            self.iteration += 1
            history.append(row)
            self.history.append(row)
            if callback is not None:
                callback(row)
            reached = (target_return is not None and row["episode_return_mean"] is not None
                       and row["episode_return_mean"] >= target_return)
            out_of_time = time_budget_s is not None and row["time_s"] >= time_budget_s
            last = (reached or out_of_time
                    or (num_iterations is not None and len(history) >= num_iterations))
            log.row(row, last=last)
            if reached or out_of_time:
                log.line("stopped: " + ("target return reached" if reached
                                        else f"time budget of {time_budget_s:g} s used"))
                break
        if experiment_log is not None:
            experiment_log.close()
        return history


class _ProgressLog:
    """`train()`'s progress lines (rich markup), at most one per `interval_s`; steps/s
    is over the iterations since the previous line (the first line has none: its one
    iteration includes compilation)."""

    def __init__(self, verbose: bool, interval_s: float):
        self.console = None
        if verbose:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=True)  # one line per row
        self.interval_s = interval_s
        self.last: tuple[float, int] | None = None  # (time, env steps) of the last line

    def line(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def row(self, row: dict, *, last: bool) -> None:
        if self.console is None:
            return
        now = time.perf_counter()
        if not last and self.last is not None and now - self.last[0] < self.interval_s:
            return
        rate = ("-" if self.last is None else
                f"{(row['env_steps'] - self.last[1]) / max(now - self.last[0], 1e-9):,.0f}")
        self.last = (now, row["env_steps"])
        ret = row["episode_return_mean"]
        self.console.print(
            f"[bold]iter {row['iteration']}[/bold]  {row['env_steps']:,} env steps  "
            f"{row['time_s']:.1f} s  {rate} steps/s  return "
            f"{'-' if ret is None else f'{ret:.2f}'}  loss {row['total_loss']:.4f}  "
            f"entropy {row['entropy']:.4f}  kl {row['approx_kl']:.5f}  "
            f"clip {row['clip_fraction']:.3f}")


def _check_target_return(target_return: Any) -> float | None:
    """`make_train`'s `target_return` as a float (None stays None); anything but a finite
    real number raises."""
    if target_return is None:
        return None
    if isinstance(target_return, bool) or not isinstance(target_return, numbers.Real) or (
            not math.isfinite(target_return)):
        raise ValueError(f"target_return must be a finite number (the episode_return_mean "
                         f"to stop at) or None, got {target_return!r}.")
    return float(target_return)


def _run_until_target(iteration: Callable, state: FusedTrainState, num_iterations: int,
                      target: float) -> tuple:
    """`make_train`'s loop with a target: iterations until the sampler's ring mean reaches
    `target` or `num_iterations` have run, each iteration's `(stats, metrics)` written into
    buffers of `num_iterations` rows; rows not run are NaN statistics and
    `nothing_sampled()` metrics. Returns `(state, stats, metrics, iterations_run)`.
    The iteration is traced once: the buffers' shapes and the loop body share that trace."""
    step = core_chunk.TracedOnce(lambda _, state: iteration(state, None))
    out_like = step.shapes(None, state)[1]
    buffers = jax.tree.map(lambda x: jnp.zeros((num_iterations, *x.shape), x.dtype),
                           out_like)

    def running(loop) -> jax.Array:
        state, done, _ = loop
        mean = state.sampler.carry.metrics.return_mean()  # NaN (go on) while empty
        return (done < num_iterations) & ((done == 0) | ~(mean >= target))

    def body(loop) -> tuple:
        state, done, buffers = loop
        state, out = step(None, state)
        buffers = jax.tree.map(
            lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, done, 0), buffers, out)
        return state, done + 1, buffers

    state, done, (stats, metrics) = jax.lax.while_loop(
        running, body, (state, jnp.zeros((), jnp.int32), buffers))
    ran = jnp.arange(num_iterations) < done  # done >= 1: the first iteration always runs

    def keep_ran(rows: jax.Array, fill: jax.Array) -> jax.Array:
        return jnp.where(ran.reshape((num_iterations,) + (1,) * (rows.ndim - 1)), rows, fill)

    stats = jax.tree.map(lambda x: keep_ran(x, jnp.array(
        jnp.nan if jnp.issubdtype(x.dtype, jnp.inexact) else 0, x.dtype)), stats)
    idle = jax.tree.map(lambda x: x[done - 1], metrics).nothing_sampled()
    metrics = jax.tree.map(keep_ran, metrics, idle)
    return state, stats, metrics, done


def _check_minibatches(config: PPOConfig, num_steps: int, num_envs: int) -> None:
    """Raises `ValueError` if `config.num_minibatches` exceeds the `num_steps x num_envs`
    steps of an update's batch (every minibatch would be empty)."""
    if config.num_minibatches > num_steps * num_envs:
        raise ValueError(
            f"PPOConfig.num_minibatches ({config.num_minibatches}) is larger than the batch "
            f"of {num_steps * num_envs} steps ({num_steps} steps x {num_envs} sub-envs): "
            "every minibatch would be empty. Use fewer minibatches, or more sub-envs or "
            "steps per iteration.")


def _seed_list(seeds: Any, first: int) -> list[int]:
    """`fused_train`'s seeds: a count `n >= 1` gives `first ... first + n - 1`; a list
    (or tuple) of ints is taken as it is. Anything else raises."""
    def integer(x: Any) -> bool:
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    if integer(seeds):
        seed_list = list(range(first, first + int(seeds)))
    elif isinstance(seeds, (list, tuple)) and all(integer(s) for s in seeds):
        seed_list = [int(s) for s in seeds]
    else:
        raise TypeError(f"fused_train: seeds must be a number of seeds (an int >= 1) or a "
                        f"list of int seeds, got {seeds!r}.")
    if not seed_list:
        raise ValueError("fused_train needs at least one seed.")
    return seed_list


def _as_trajectory(batch: Any) -> Trajectory:
    if isinstance(batch, Trajectory):
        return batch
    if isinstance(batch, (list, tuple)):
        trajs = [_as_trajectory(b) for b in batch]
        if not trajs:
            raise ValueError("PPOLearner.update got no batches (did every runner of the group "
                             "time out? see sample_timeout_s).")
        if len(trajs) == 1:
            return trajs[0]
        lengths = {t.rewards.shape[0] for t in trajs}
        if len(lengths) != 1:
            raise ValueError(f"PPOLearner.update: batches have different lengths T {lengths}; "
                             "sample the same number of steps on every runner.")
        # Join along the sub-env axis; a step counts where every runner took it. Each
        # runner's final-observation store indexes its own (T, B_i) positions: the join
        # renumbers them (update_fn rebuilds the dense final observations once).
        valid = functools.reduce(jnp.logical_and, [t.valid for t in trajs])
        joined = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1),
                              *[t.replace(valid=None, final_obs_store=None) for t in trajs])
        store = join_stores_across_envs([t.final_obs_store for t in trajs],
                                        [t.rewards.shape[1] for t in trajs], valid)
        return joined.replace(valid=valid, final_obs_store=store)
    if hasattr(batch, "trajectory"):
        return batch.trajectory()
    raise TypeError(f"PPOLearner.update expects an EpisodeBatch or Trajectory, got "
                    f"{type(batch).__name__}.")
