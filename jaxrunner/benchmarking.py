"""Throughput measurement: jaxrunner `sample()` against a bare hand-written `lax.scan`.

Both sides run the same gymnax env and the same MLP policy (tanh hidden layers, a
categorical or Gaussian head, sampled actions), with `vmap` over sub-envs and `lax.scan`
over time. The bare scan keeps only what a minimal PPO rollout keeps (observation, action,
reward, done, log-prob) and sums finished episodes' returns on device; jaxrunner's
`sample()` additionally records terminated/truncated apart, final observations, action
distribution inputs, episode ids, lookback and the metric ring. Its overhead is the ratio.

Machines are noisy, so sides are measured in alternating rounds in one process and the
ratio is taken per round (median reported).
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
import statistics
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner import lowering
from jaxrunner.config import RunnerConfig
from jaxrunner.core.chunk import strong_types
from jaxrunner.runners.single_agent_env_runner import SingleAgentEnvRunner


class _PolicyNet(nn.Module):
    hiddens: tuple[int, ...]
    out_dim: int

    @nn.compact
    def __call__(self, x):
        for width in self.hiddens:
            x = jnp.tanh(nn.Dense(width)(x))
        return nn.Dense(self.out_dim)(x)


def make_policy(obs_size: int, action_space: Any, hiddens: tuple[int, ...], *,
                random_actions: bool = False, seed: int = 0
                ) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """The bare rollouts' policy: `act(obs [B, ...], key) -> (action, logp [B] float32)`.

    An MLP of `hiddens` (tanh) on the flattened float32 observation, as jaxrunner's default
    policy net: for an `action_space` with `n` a sampled categorical action (`[B]`),
    otherwise a Gaussian (mean and log-std heads) sampled and clipped to the space's
    `low`/`high` (`[B, A]`), with its log-density up to the constant. `random_actions`:
    `action_space.sample` per sub-env, logp zeros. `action_space` is read by attribute
    (gymnax's and the suites' own spaces)."""
    discrete = hasattr(action_space, "n")
    out_dim = int(action_space.n) if discrete else 2 * int(action_space.shape[0])
    net = _PolicyNet(tuple(hiddens), out_dim)
    weights = net.init(jax.random.key(seed), jnp.zeros((1, obs_size)))

    def act(obs, key):
        num_envs = obs.shape[0]
        if random_actions:
            return (jax.vmap(action_space.sample)(jax.random.split(key, num_envs)),
                    jnp.zeros((num_envs,)))
        out = net.apply(weights, obs.reshape(num_envs, -1).astype(jnp.float32))
        if discrete:
            action = jax.random.categorical(key, out)
            logp = jnp.take_along_axis(jax.nn.log_softmax(out), action[:, None], 1)[:, 0]
            return action, logp
        mean, log_std = jnp.split(out, 2, axis=-1)
        noise = jax.random.normal(key, mean.shape)
        logp = jnp.sum(-0.5 * noise * noise - log_std, axis=-1)
        action = jnp.clip(mean + jnp.exp(log_std) * noise, action_space.low, action_space.high)
        return action, logp

    return act


def scan_rollout_fns(reset: Callable, step: Callable, act: Callable, num_envs: int,
                     num_steps: int, seed: int = 0, num_seeds: int = 0
                     ) -> tuple[Callable, Callable, jax.Array]:
    """A PureJaxRL-style rollout, pure: `(init, rollout, key)` with `init(key) -> carry` and
    `rollout(carry) -> (carry, trajectory)`, one `lax.scan` of `num_steps` steps.

    `reset(keys [B]) -> (obs, state)` and `step(keys [B], state, action) -> (obs, state,
    reward [B], done [B])` work on all `num_envs` sub-envs at once (the env's own
    auto-reset inside `step`); `act` as `make_policy` returns. The scan keeps what a
    minimal PPO rollout keeps (obs, action, reward, done, logp per step) and sums finished
    episodes' returns on device; the carry holds strong types only. `key`: `init`'s
    argument for `seed`.

    `num_seeds`: 0 (default) one rollout; `S > 0` `S` independent rollouts in one program
    (`jax.vmap` over seeds, each with its own keys and sub-envs, the same policy), as a
    PureJaxRL-style loop vmapped over seeds; the trajectory is then `[S, num_steps,
    num_envs, ...]`."""

    def body(carry, _):
        obs, state, key, ret, ret_sum, episodes = carry
        key, act_key, step_key = jax.random.split(key, 3)
        action, logp = act(obs, act_key)
        next_obs, state, reward, done = step(jax.random.split(step_key, num_envs), state,
                                             action)
        ret = ret + reward
        ret_sum = ret_sum + jnp.sum(jnp.where(done, ret, 0.0))
        episodes = episodes + jnp.sum(done)
        ret = jnp.where(done, 0.0, ret)
        return (next_obs, state, key, ret, ret_sum, episodes), (obs, action, reward, done,
                                                                logp)

    def rollout(carry):
        carry, traj = jax.lax.scan(body, carry, None, length=num_steps)
        return strong_types(carry), traj

    def init(key):
        key, reset_key = jax.random.split(key)
        obs, state = reset(jax.random.split(reset_key, num_envs))
        return strong_types((obs, state, key, jnp.zeros((num_envs,)), jnp.zeros(()),
                             jnp.zeros((), jnp.int32)))

    key = jax.random.key(seed)
    if num_seeds:
        init, rollout = jax.vmap(init), jax.vmap(rollout)
        key = jax.random.split(key, num_seeds)
    return init, rollout, key


def make_scan_rollout(reset: Callable, step: Callable, act: Callable, num_envs: int,
                      num_steps: int, seed: int = 0, unrolled_rng: bool = False,
                      num_seeds: int = 0) -> Callable[[], Any]:
    """`scan_rollout_fns`' rollout, jitted: `run()` does one `lax.scan` of `num_steps`
    steps and returns the rollout's time-major trajectory `(obs, action, reward, done,
    logp)`, each `[num_steps, num_envs, ...]` (`[S, num_steps, ...]` with `num_seeds=S`),
    on device; it is not called here. The carry holds strong types only, so the second
    call runs the first call's program (no recompilation in the timed calls).

    `unrolled_rng`: compile with jaxrunner's unrolled Threefry lowering
    (`jaxrunner.lowering`), as jaxrunner's own programs are; default JAX's lowering, as a
    hand-written scan gets."""
    init, rollout, key = scan_rollout_fns(reset, step, act, num_envs, num_steps, seed=seed,
                                          num_seeds=num_seeds)
    rollout = lowering.jit(rollout, unrolled=unrolled_rng)
    holder = {"carry": lowering.jit(init, unrolled=unrolled_rng)(key)}

    def run():
        holder["carry"], traj = rollout(holder["carry"])
        return jax.block_until_ready(traj)

    return run


def _gymnax_scan_parts(env_id: Any, hiddens: tuple[int, ...], random_actions: bool,
                       seed: int) -> tuple[Callable, Callable, Callable]:
    """`(reset, step, act)` for `scan_rollout_fns` of a gymnax id or an `(env, params)`
    pair: `vmap` of the env's reset and auto-resetting `step` (done = terminated |
    truncated), `make_policy`'s policy."""
    import gymnax

    env, params = gymnax.make(env_id) if isinstance(env_id, str) else env_id
    obs_size = int(np.prod(env.observation_space(params).shape))
    act = make_policy(obs_size, env.action_space(params), hiddens,
                      random_actions=random_actions, seed=seed)

    def reset(keys):
        return jax.vmap(env.reset, in_axes=(0, None))(keys, params)

    def step(keys, state, action):
        obs, state, reward, terminated, truncated, _ = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)
        return obs, state, reward, terminated | truncated

    return reset, step, act


def bare_scan_fns(env_id: Any, num_envs: int, num_steps: int, hiddens: tuple[int, ...],
                  random_actions: bool, seed: int = 0, num_seeds: int = 0
                  ) -> tuple[Callable, Callable, jax.Array]:
    """`scan_rollout_fns` of a gymnax id or an `(env, params)` pair (`make_bare_scan`'s
    rollout, pure: e.g. to lower it for its HLO)."""
    return scan_rollout_fns(*_gymnax_scan_parts(env_id, hiddens, random_actions, seed),
                            num_envs, num_steps, seed=seed, num_seeds=num_seeds)


def make_bare_scan(env_id: Any, num_envs: int, num_steps: int, hiddens: tuple[int, ...],
                   random_actions: bool, seed: int = 0, unrolled_rng: bool = False,
                   num_seeds: int = 0) -> Callable[[], None]:
    """A hand-written PureJaxRL-style rollout of a gymnax id or an `(env, params)` pair
    (e.g. an adapted env suite's): `make_scan_rollout` over `vmap` of the env's
    auto-resetting `step` (done = terminated | truncated) with `make_policy`'s policy.
    Returns `run()` that does one rollout, already called once (compiled).
    `unrolled_rng`, `num_seeds`: as `make_scan_rollout`'s."""
    run = make_scan_rollout(*_gymnax_scan_parts(env_id, hiddens, random_actions, seed),
                            num_envs, num_steps, seed=seed, unrolled_rng=unrolled_rng,
                            num_seeds=num_seeds)
    run()
    return run


def make_jaxrunner(env_id: str, num_envs: int, num_steps: int, hiddens: tuple[int, ...],
                   random_actions: bool, seed: int = 0, check_finite: bool = True,
                   **env_runner_kwargs: Any) -> tuple[Callable[[], None], float]:
    """A runner sampling `num_envs * num_steps` env steps per call; returns `(run, compile_s)`
    where `compile_s` is the wall time of the first `sample()` (compilation included).
    `check_finite`: the runner's fault check (`fault_tolerance(check_finite=...)`)."""
    config = (RunnerConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=num_steps,
                           **env_runner_kwargs)
              .fault_tolerance(check_finite=check_finite)
              .rl_module(model_config={"fcnet_hiddens": list(hiddens)})
              .debugging(seed=seed))
    runner = SingleAgentEnvRunner(config=config)
    start = time.perf_counter()
    runner.sample(random_actions=random_actions)
    compile_s = time.perf_counter() - start

    def run():
        runner.sample(random_actions=random_actions)

    return run, compile_s


@contextlib.contextmanager
def switched(module: Any, name: str, value: Any):
    """Sets the module-level switch `module.name` to `value` inside the block and restores
    it after. Runners read such switches (`jaxrunner.core.chunk.SEPARATE_RESETS`,
    `jaxrunner.core.faults.SMALL_LEAVES_CHECK`, ...) when their chunk is first traced, so
    a runner built and first sampled inside the block keeps the setting: the A/B
    benchmarks build one runner per side this way."""
    previous = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, previous)


def compare(sides: dict[str, Callable[[], None]], steps_per_call: int | dict[str, int], *,
            rounds: int = 10, calls_per_round: int | None = 3,
            reference: str = "bare_scan") -> dict[str, Any]:
    """Alternating rounds; returns best steps/s per side and median per-round ratios.

    `steps_per_call`: env steps one call of each side takes (one number for all, or per
    side). The order of the sides is reversed every round, so no side always runs right
    after the same other one. `calls_per_round=None` picks, per side, enough calls for
    at least 50 ms of work a round (from one timed call). `_timings` holds seconds per
    call, per round."""
    steps = (steps_per_call if isinstance(steps_per_call, dict)
             else {name: steps_per_call for name in sides})
    calls = {}
    for name, run in sides.items():
        if calls_per_round is None:
            start = time.perf_counter()
            run()
            calls[name] = max(1, int(0.05 / max(time.perf_counter() - start, 1e-6)) + 1)
        else:
            calls[name] = calls_per_round
    names = list(sides)
    timings: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            for _ in range(calls[name]):
                sides[name]()
            timings[name].append((time.perf_counter() - start) / calls[name])
    result: dict[str, Any] = {
        "_timings": timings,
        "steps_per_s": {name: steps[name] / min(t) for name, t in timings.items()},
        "median_steps_per_s": {name: steps[name] / statistics.median(t)
                               for name, t in timings.items()},
    }
    if reference in sides:
        result["ratio_to_" + reference] = {
            name: statistics.median((steps[name] / own) / (steps[reference] / ref)
                                    for ref, own in zip(timings[reference], t))
            for name, t in timings.items() if name != reference}
    return result


def _filter_and_stack(env, spaces, device):
    """MeanStdFilter + 4-frame stacking: the connector cost case of the benchmark."""
    from jaxrunner.connectors import FrameStacking, MeanStdFilter

    obs_space = spaces["__env_single__"][0]
    return [MeanStdFilter(obs_space), FrameStacking(obs_space, 4)]


_VECTOR_EXTENSIONS = re.compile(r"^(sse4_[12]|avx.*|fma|amx.*)$")


def cpu_info() -> dict[str, Any]:
    """The host CPU's model name and the vector extensions XLA:CPU's LLVM may target
    (`sse4_*`, `avx*`, `fma`, `amx*` from /proc/cpuinfo; empty where it cannot be read).
    Code size and compile time of one XLA program differ between CPUs that report the
    same model name: an AVX2 and an AVX-512 machine vectorise bool reductions differently."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"cpu_model": model,
            "cpu_vector_extensions": sorted(f for f in flags if _VECTOR_EXTENSIONS.match(f))}


def machine_info() -> dict[str, Any]:
    return {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
            "platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), **cpu_info()}


def run_throughput(*, env_id: str = "CartPole-v1", num_envs_list=(1024, 4096),
                   num_steps: int = 128, hiddens=(64, 64), random_actions: bool = False,
                   rounds: int = 10, output: str | None = None, progress=print,
                   with_connectors: bool = False) -> dict[str, Any]:
    """jaxrunner `sample()` vs the bare scan at each `num_envs`; JSON-ready results."""
    results: dict[str, Any] = {"benchmark": "throughput", "env": env_id, "policy":
                               "random" if random_actions else f"mlp{list(hiddens)} explore",
                               "num_steps_per_call": num_steps, "machine": machine_info(),
                               "cases": []}
    for num_envs in num_envs_list:
        run_ours, compile_s = make_jaxrunner(env_id, num_envs, num_steps, tuple(hiddens),
                                             random_actions)
        run_bare = make_bare_scan(env_id, num_envs, num_steps, tuple(hiddens), random_actions)
        sides = {"jaxrunner": run_ours, "bare_scan": run_bare}
        if with_connectors:
            sides["jaxrunner_meanstd_framestack"], _ = make_jaxrunner(
                env_id, num_envs, num_steps, tuple(hiddens), random_actions,
                env_to_module_connector=_filter_and_stack)
        case = compare(sides, num_envs * num_steps, rounds=rounds)
        if with_connectors:
            case["connector_cost_ratio"] = statistics.median(
                ours / with_conn for ours, with_conn in zip(
                    case["_timings"]["jaxrunner"],
                    case["_timings"]["jaxrunner_meanstd_framestack"]))
        case.update({"num_envs": num_envs, "jaxrunner_first_sample_s": compile_s})
        results["cases"].append(case)
        progress(f"{env_id} num_envs={num_envs}: jaxrunner "
                 f"{case['steps_per_s']['jaxrunner']:,.0f} steps/s, bare scan "
                 f"{case['steps_per_s']['bare_scan']:,.0f} steps/s, ratio "
                 f"{case['ratio_to_bare_scan']['jaxrunner']:.3f}")
    if output:
        with open(output, "w") as f:
            json.dump(results, f, indent=1)
    return results
