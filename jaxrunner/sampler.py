"""A pure, functional sampler: the runner's rollout inside the user's own `jax.jit`.

`Sampler` exposes the compiled chunk of `jaxrunner.core.chunk` (the same env, module,
connectors, auto-reset mode, fault handling, metric ring and lookback as the runner) as two
pure functions, so a whole training loop can be one compiled program (`lax.scan` over
iterations, `jax.vmap` over seeds, params or env params, sharded with `jax.sharding`):

    sampler = jaxrunner.make_sampler(config)         # or runner.sampler
    state = sampler.init(jax.random.key(0))          # SamplerState (a pytree)
    state, traj, metrics = sampler.sample(state, params)   # Trajectory (T, B, ...)

`SingleAgentEnvRunner` / `MultiAgentEnvRunner` are shells over the same object: their
`sample()` runs `runner.sampler`'s jitted chunk, so a sampler state converts to and from
`runner.get_state()` / `runner.set_state()` (`Sampler.to_runner_state`,
`Sampler.from_runner_state`) and the episodes and metrics are the same either way.

What a fused loop cannot do is what needs the host: top-ups after discarded episodes
(the call returns its fixed `T` steps with `traj.failed` marked and the discarded steps
counted in the metrics) and raising on a failing sub-env (a failure with
`restart_failed_sub_environments=False`, or more consecutive failures than
`num_consecutive_sub_env_failures_tolerance`, restarts every sub-env at the end of the call
and is counted in `num_env_step_failures`, where the runner raises and restarts on the next
call).

Device callbacks (`config.callbacks(on_episode_end=...)`) run in the fused chunk as in
the runner: their per-episode state rides in the carry, their metric ring is part of the
metrics (`SampleMetrics.custom_registers`) and their lifetime sums are kept on the device
(`SamplerCounters.custom_lifetime_*`, float32 pairs summed without rounding loss: see
`SamplerCounters`), so `Sampler.reduce_metrics` gives the custom keys `get_metrics()` gives
and a state handed to a runner (`to_runner_state`) keeps reporting them. Values logged by
host callbacks (`metrics_logger.log_value`) need the host: a fused loop has none, and a
runner that takes over keeps its own host-logged values.

Static sizes (`num_envs`, the chunk length `T`, the policy mode) are Python values fixed
when the sampler is built or passed as Python arguments; the number of steps to take is a
traced value, so nothing recompiles when only values change.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrunner.core.callbacks import CustomRegisters, MetricSpec
from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.chunk import POLICY_MODES, ChunkFns, vmap_members
from jaxrunner.core.ring import NO_EPISODE_LIMIT
from jaxrunner import lowering

CARRY_COMPONENT = "env_runner_carry"
_MOD = 2**32


def _zero_lookback(init_lookback: Callable, unrolled_rng: bool) -> Callable:
    """`init_lookback` for the runner shell: every layout's first lookback is zero
    buffers, built here on the host from its traced shapes, so a fresh runner compiles no
    program for it. Traced under the runner's Threefry lowering (`unrolled_rng`), so the
    chunk's trace reuses this trace of the step (`core.chunk.make_chunk_fns`)."""
    def build(carry: Any, params: Any, env_params: Any) -> Any:
        with lowering.unrolled_threefry() if unrolled_rng else contextlib.nullcontext():
            shapes = jax.eval_shape(init_lookback, carry, params, env_params)
        return jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype)), shapes)
    return build


@struct.dataclass
class SamplerCounters:
    """The runner's host counters as device scalars (uint32, mod 2**32), so a fused loop
    can hand its state back to a runner with exact metrics. `A` agents, `M` modules
    (both 0 for a single-agent sampler), `K` device-callback metrics (0 without them).

    The custom metrics' sums are float32 pairs `(hi, lo)` with `hi + lo` the sum (each
    chunk's float32 sum is added with an error-free two-sum, so only the low part
    rounds): about 48 bits of precision, where the runner sums the same chunk sums in
    float64 on the host (JAX runs without float64 by default). The two are equal while
    the sum is exact in 48 bits (e.g. integer-valued metrics, counts and sums of episode
    lengths, below 2**48); otherwise each addition rounds by at most 2**-48 of the sum
    (float64: 2**-53)."""

    vector_steps: jax.Array  # () vector steps sampled (lifetime)
    env_steps_lo: jax.Array  # () env steps sampled (lifetime), low 32 bits
    env_steps_hi: jax.Array  # () ... high 32 bits
    env_steps_unreported: jax.Array  # () env steps not yet reported by get_metrics()
    discarded_lifetime: jax.Array  # () env steps of failed episodes (lifetime)
    discarded_unreported: jax.Array  # () ... not yet reported
    failures_lifetime: jax.Array  # () failed sub-env steps (lifetime)
    episodes_lifetime: jax.Array  # () episodes reported by the last get_metrics()
    episodes_seen: jax.Array  # () the ring's episode counter at the last get_metrics()
    agent_steps_lifetime: jax.Array  # (A,) agent steps reported per agent
    agent_seen: jax.Array  # (A,) device agent-step counters at the last get_metrics()
    module_steps_lifetime: jax.Array  # (M,)
    module_seen: jax.Array  # (M,)
    custom_lifetime_hi: jax.Array | None = None  # (K,) float32: lifetime custom metric sums
    custom_lifetime_lo: jax.Array | None = None  # (K,) float32: ... their low parts
    custom_unreported_hi: jax.Array | None = None  # (K,) float32: ... not yet reported
    custom_unreported_lo: jax.Array | None = None  # (K,) float32

    @classmethod
    def zeros(cls, num_agents: int = 0, num_modules: int = 0,
              num_custom: int = 0) -> "SamplerCounters":
        def z():  # one buffer per field (a state may be donated)
            return jnp.zeros((), jnp.uint32)

        def f():
            return jnp.zeros((num_custom,), jnp.float32)

        return cls(vector_steps=z(), env_steps_lo=z(), env_steps_hi=z(),
                   env_steps_unreported=z(), discarded_lifetime=z(), discarded_unreported=z(),
                   failures_lifetime=z(), episodes_lifetime=z(), episodes_seen=z(),
                   agent_steps_lifetime=jnp.zeros((num_agents,), jnp.uint32),
                   agent_seen=jnp.zeros((num_agents,), jnp.uint32),
                   module_steps_lifetime=jnp.zeros((num_modules,), jnp.uint32),
                   module_seen=jnp.zeros((num_modules,), jnp.uint32),
                   custom_lifetime_hi=f(), custom_lifetime_lo=f(),
                   custom_unreported_hi=f(), custom_unreported_lo=f())


def _add_exact(hi: jax.Array, lo: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(hi, lo) + x` for float32 pairs: Knuth's two-sum of `hi + x` (exact), its error
    added to `lo`, then renormalised so that `|lo| <= ulp(hi) / 2`."""
    s = hi + x
    v = s - hi
    err = (hi - (s - v)) + (x - v)
    err = err + lo
    new_hi = s + err
    return new_hi, err - (new_hi - s)


def _split_float64(values: Any, num: int) -> tuple[jax.Array, jax.Array]:
    """float64 host values as float32 pairs `(hi, lo)`."""
    x = np.asarray(values, np.float64).reshape(-1)
    if x.shape != (num,):
        from jaxrunner.errors import StateStructureError

        raise StateStructureError(
            f"Sampler.from_runner_state: the state holds {x.size} device-callback metric "
            f"sums, this sampler's callbacks report {num}: pass the state of a runner built "
            "from the same config (same config.callbacks(...)).")
    hi = x.astype(np.float32)
    lo = (x - hi.astype(np.float64)).astype(np.float32)
    return jnp.asarray(hi), jnp.asarray(lo)


@struct.dataclass
class SamplerState:
    """Everything a sampler carries from one `sample()` to the next (a pytree; `vmap`
    `Sampler.init` over keys for a batch of them)."""

    carry: Any  # the chunk's carry (`RolloutCarry` / `MultiAgentCarry`), leaves (B, ...)
    lookback: Any  # the last `L` steps of every sub-env, leaves (L, B, ...)
    counters: SamplerCounters


@struct.dataclass
class SampleMetrics:
    """What one `Sampler.sample()` call adds to the metrics (device arrays; with leading
    axes under `vmap` / `lax.scan`). `jaxrunner.metrics.reduce_sample_metrics` turns it
    into RLlib's keys on the host."""

    registers: MetricRegisters  # the episode ring after the call (window of W episodes)
    num_env_steps: jax.Array  # () int32: env steps sampled in the call (T * B)
    num_episodes: jax.Array  # () int32: episodes finished and counted in the call
    num_env_step_failures: jax.Array  # () int32: failed sub-env steps in the call
    num_env_steps_discarded: jax.Array  # () int32: env steps of the call's failed episodes
    env_steps_lifetime_lo: jax.Array  # () uint32: lifetime env steps, low 32 bits
    env_steps_lifetime_hi: jax.Array  # () uint32: ... high 32 bits
    episodes_lifetime: jax.Array  # () uint32: lifetime episodes (mod 2**32)
    failures_lifetime: jax.Array  # () uint32: lifetime failed sub-env steps
    discarded_lifetime: jax.Array  # () uint32: lifetime discarded env steps
    # Multi-agent samplers only (None for single-agent):
    agent_registers: MetricRegisters | None = None  # leaves (A, ...)
    module_registers: MetricRegisters | None = None  # leaves (M, ...)
    agent_steps: jax.Array | None = None  # (A,) int32: agent steps completed in the call
    module_steps: jax.Array | None = None  # (M,) int32
    agent_steps_lifetime: jax.Array | None = None  # (A,) uint32 (mod 2**32)
    module_steps_lifetime: jax.Array | None = None  # (M,) uint32 (mod 2**32)
    # With device callbacks only (None without them):
    custom_registers: CustomRegisters | None = None  # the ring of the last W episodes' (K,)
    custom_sums: jax.Array | None = None  # (K,) float32: the call's counted episodes' sums
    custom_lifetime_hi: jax.Array | None = None  # (K,) float32: lifetime sums (hi + lo)
    custom_lifetime_lo: jax.Array | None = None  # (K,) float32

    def nothing_sampled(self) -> "SampleMetrics":
        """The metrics of a call after this one that sampled nothing: the same ring and
        lifetime counters, the call's own counts zero (what a `sample(num_steps=0)` call
        gives; a fused loop that has stopped fills its remaining iterations with it)."""
        def zero(x):
            return None if x is None else jnp.zeros_like(x)

        return self.replace(
            num_env_steps=zero(self.num_env_steps), num_episodes=zero(self.num_episodes),
            num_env_step_failures=zero(self.num_env_step_failures),
            num_env_steps_discarded=zero(self.num_env_steps_discarded),
            agent_steps=zero(self.agent_steps), module_steps=zero(self.module_steps),
            custom_sums=zero(self.custom_sums))


def _typed_key(key: Any, what: str) -> jax.Array:
    """`key` as a typed PRNG key: a typed key as it is, the raw uint32 key data of
    `jax.random.PRNGKey` wrapped (the same random bits); anything else raises `TypeError`."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return key
    if dtype == jnp.uint32:
        return jax.random.wrap_key_data(key)
    raise TypeError(
        f"{what}: key must be a typed jax.random.key (e.g. jax.random.key(0), or "
        f"jax.random.split of one for several seeds under vmap), got {type(key).__name__}"
        f"{'' if dtype is None else f' of dtype {dtype}'}.")


def _check_num_steps(num_steps: Any, limit: int) -> None:
    """Raises `ValueError` for a concrete `num_steps` that is not an int in `[0, limit]`
    (a traced one cannot be checked: above `limit` it takes `limit` steps, below 0 none)."""
    if num_steps is None or isinstance(num_steps, jax.core.Tracer):
        return
    value = np.asarray(num_steps)
    if (value.shape != () or not np.issubdtype(value.dtype, np.integer)
            or not 0 <= int(value) <= limit):
        raise ValueError(
            f"Sampler.sample: num_steps must be an int in [0, {limit}] (at most T, the "
            f"sampler's num_steps: rollout_fragment_length), got {num_steps!r}. Take longer "
            "rollouts with more sample calls (lax.scan over them), or build the sampler "
            "with a longer rollout_fragment_length.")


def _first_mismatch(*checks: tuple) -> Exception | None:
    """The `StateStructureError` of the first `(expected, given, what, hint, dtypes)`
    check whose `given` does not fit `expected` (`structure.check_same_structure`), or
    None when all fit: a failed trace is explained by the input it was given."""
    from jaxrunner.errors import StateStructureError
    from jaxrunner.structure import check_same_structure

    for expected, given, what, hint, dtypes in checks:
        try:
            check_same_structure(expected, given, what, dtypes=dtypes, hint=hint)
        except StateStructureError as mismatch:
            return mismatch
    return None


def _mode(explore: bool, random_actions: bool) -> str:
    if not isinstance(explore, bool) or not isinstance(random_actions, bool):
        raise TypeError(
            f"Sampler.sample: explore and random_actions must be Python bools (static "
            f"arguments), got explore={explore!r}, random_actions={random_actions!r}. Pass "
            "them as Python values, or mark them static in your own jax.jit.")
    return "random" if random_actions else ("explore" if explore else "inference")


class Sampler:
    """The pure rollout of a compiled runner (see the module docstring).

    Build it with `jaxrunner.make_sampler(config)` or take `runner.sampler`; both share
    the runner's env, module and connectors. Attributes: `num_envs` (B), `num_steps` (T,
    the chunk length: `rollout_fragment_length`, at most `max_chunk_length`), `env`,
    `env_params`, `module`, `params` (the runner's inference params),
    `default_key` (the key the runner's own carry starts from), `runner` (the runner
    it was built from), `agent_ids`, `module_ids`
    (multi-agent), `custom_metrics` (the device callbacks' metrics and how they reduce).
    """

    def __init__(self, runner: Any, *, rollout_fns: Callable[[str], ChunkFns], num_steps: int,
                 default_key: Callable[[], jax.Array], current_params: Callable[[], Any],
                 params_like: Callable[[], Any], agent_ids: tuple[str, ...] = ()):
        """Built by the runner (`runner.sampler`), which hands over its layout's
        `rollout_fns(mode) -> ChunkFns`, the chunk length, a getter of the key its own
        carry starts from (read on first use: computing it compiles a `fold_in`), getters
        of its current inference params and of their shapes (which build nothing) and
        (multi-agent) its agent ids;
        the env, module and config are the runner's public attributes."""
        self.runner = runner  # the runner this sampler was built from
        self._rollout_fns = rollout_fns
        self._current_params = current_params
        self._params_like = params_like
        self.config = runner.config
        self.env = runner.env
        self.env_params = runner.env_params
        self.env_name = runner.env_name
        self.module = runner.module
        self.num_envs = runner.num_envs
        # On CPU the programs compile with Threefry unrolled up to lowering.UNROLL_MAX_ENVS
        # sub-envs (faster there, bit for bit the same values; `jaxrunner.lowering`).
        self.unrolled_rng = lowering.unroll_for(self.num_envs)
        self.num_steps = int(num_steps)
        self._start_key = default_key
        self.agent_ids = tuple(agent_ids)
        self.module_ids = tuple(self.module.module_ids) if self.agent_ids else ()
        self.multi_agent = bool(self.agent_ids)
        self._restart = bool(self.config.restart_failed_sub_environments)
        self._tolerance = int(self.config.num_consecutive_sub_env_failures_tolerance)
        self._fns: dict[str, ChunkFns] = {}
        self._member_chunks: dict[str, Callable] = {}
        self._jitted: dict[str, dict] = {}
        self._jit_sample: dict[tuple, Any] = {}
        self._jit_reset = None
        self._custom_metrics: dict[str, MetricSpec] | None = None

    @functools.cached_property
    def default_key(self) -> jax.Array:
        """The typed key the runner's own carry starts from (`init(sampler.default_key)`
        starts where the runner's first `sample()` does)."""
        return self._start_key()

    @property
    def custom_metrics(self) -> dict[str, MetricSpec]:
        """`{name: MetricSpec}` of the device callbacks' metrics in the order of their `K`
        axis (empty without device callbacks), each window the number of episodes this
        runner reduces over (`config.custom_metrics`' window split over the remote runners
        as the runner splits it; the episode smoothing window where none is given; None
        for lifetime and since-last sums). Pass it to
        `jaxrunner.metrics.reduce_sample_metrics(..., custom_metrics=...)`."""
        if self._custom_metrics is None:
            from jaxrunner.callbacks import device_callbacks
            from jaxrunner.metrics.custom import runner_window

            fns = self.chunk_fns("explore")
            callbacks = device_callbacks(self.config)
            out: dict[str, MetricSpec] = {}
            if callbacks is not None and fns.bound_callbacks is not None:
                carry = jax.eval_shape(fns.init_carry, self.default_key, self.params,
                                       self.env_params)
                names = fns.bound_callbacks(carry, self.params, self.env_params).names
                for name in names:
                    spec = callbacks.custom_metrics.get(name, MetricSpec())
                    lifetime = spec.reduce == "sum" and spec.window is None
                    window = None if lifetime else runner_window(
                        spec, self.config.metrics_window, self.config.num_env_runners)
                    out[name] = MetricSpec(spec.reduce, window, spec.clear_on_reduce)
            self._custom_metrics = out
        return dict(self._custom_metrics)

    def reduce_metrics(self, metrics: SampleMetrics) -> dict[str, Any]:
        """`jaxrunner.metrics.reduce_sample_metrics` of `metrics` with this sampler's
        agent, module and custom metric names (host; one call or a stack)."""
        from jaxrunner.metrics.fused import reduce_sample_metrics

        return reduce_sample_metrics(metrics, agent_ids=self.agent_ids,
                                     module_ids=self.module_ids,
                                     custom_metrics=self.custom_metrics)

    @property
    def params(self) -> Any:
        """The runner's current inference params (initial ones unless weights were set)."""
        return self._current_params()

    @property
    def params_like(self) -> Any:
        """The runner's inference params, or their `jax.ShapeDtypeStruct` tree while they
        are not built (reading this builds nothing): the structure `sample` takes."""
        return self._params_like()

    # ------------------------------------------------------------------ pure pieces
    def chunk_fns(self, mode: str = "explore") -> ChunkFns:
        """The pure `ChunkFns` of policy `mode` ("explore", "inference", "random")."""
        if mode not in POLICY_MODES:
            raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}.")
        if mode not in self._fns:
            self._fns[mode] = self._rollout_fns(mode)
        return self._fns[mode]

    def _member_chunk(self, mode: str) -> Callable:
        """`(carry, lookback, params, env_params, steps) -> fns.chunk(...)` without
        episode or agent-step limits, whose loop stays one loop for all members under
        `jax.vmap` (`core.chunk.vmap_members`)."""
        if mode not in self._member_chunks:
            chunk = self.chunk_fns(mode).chunk
            self._member_chunks[mode] = vmap_members(
                lambda carry, lookback, params, env_params, steps: chunk(
                    carry, lookback, params, env_params, steps, NO_EPISODE_LIMIT,
                    NO_EPISODE_LIMIT, jnp.zeros((), jnp.int32)), state_argnums=(0, 1))
        return self._member_chunks[mode]

    def jitted(self, mode: str) -> dict:
        """The chunk functions of `mode`, jitted once (the runner shell calls these)."""
        if mode not in self._jitted:
            fns = self.chunk_fns(mode)
            jit = functools.partial(lowering.jit, unrolled=self.unrolled_rng)
            self._jitted[mode] = {
                "init_carry": jit(fns.init_carry),
                "reset_carry": jit(fns.reset_carry, donate_argnums=(0,)),
                "init_lookback": _zero_lookback(fns.init_lookback, self.unrolled_rng),
                "chunk": jit(fns.chunk, donate_argnums=(0,)),
            }
        return self._jitted[mode]

    def _env_params(self, env_params: Any) -> Any:
        return self.env_params if env_params is None else env_params

    def init(self, key: jax.Array, params: Any = None, env_params: Any = None) -> SamplerState:
        """A fresh state: every sub-env reset, empty metric ring and lookback.

        Args:
            key: a typed `jax.random.key` (`sampler.default_key` gives the runner's own
                start; the raw uint32 data of `jax.random.PRNGKey` is wrapped into one);
                `vmap` over a batch of keys for one state per seed.
            params: module params (only their structure is used; default `self.params`).
            env_params: the env's params (default the env's own).
        Pure and jittable."""
        key = _typed_key(key, "Sampler.init")
        params = self.params if params is None else params
        env_params = self._env_params(env_params)
        fns = self.chunk_fns("explore")
        try:
            carry = fns.init_carry(key, params, env_params)
        except Exception as error:
            mismatch = _first_mismatch(self._params_check("Sampler.init", params),
                                       self._env_params_check("Sampler.init", env_params))
            if mismatch is None:
                raise
            raise mismatch from error
        lookback = fns.init_lookback(carry, params, env_params)
        return SamplerState(carry=carry, lookback=lookback,
                            counters=SamplerCounters.zeros(len(self.agent_ids),
                                                           len(self.module_ids),
                                                           _num_custom(carry)))

    def reset(self, state: SamplerState, env_params: Any = None) -> SamplerState:
        """`state` with every sub-env restarted (episodes in progress are abandoned, as
        `sample(force_reset=True)` does). Pure and jittable."""
        carry = self.chunk_fns("explore").reset_carry(state.carry, self._env_params(env_params))
        return state.replace(carry=carry)

    def sample(self, state: SamplerState, params: Any, env_params: Any = None, *,
               num_steps: Any = None, explore: bool = True, random_actions: bool = False
               ) -> tuple[SamplerState, Any, SampleMetrics]:
        """One rollout of up to `T = self.num_steps` vector steps of all `B` sub-envs.

        Pure and jittable (no host transfer, no Python randomness); use it inside your own
        `jax.jit`, `lax.scan` and `jax.vmap` (over states, params and env params).

        Args:
            state: a `SamplerState` (`init`, a previous `sample`, or `from_runner_state`).
            params: the module's inference params (as `runner.get_state()["rl_module"]`).
            env_params: the env's params (default the env's own).
            num_steps: vector steps to take, an int in `[0, T]` (default `T`), traced or
                not (a traced value above `T` takes `T` steps); the steps not taken hold
                zeros and have `traj.valid == False`.
            explore, random_actions: the policy mode (Python bools, static).

        Returns:
            `(state, traj, metrics)`: the next state; the time-major trajectory of the
            layout (`Trajectory` `(T, B, ...)` single-agent, `MultiAgentTrajectory`
            multi-agent); a `SampleMetrics`.
        """
        mode = _mode(explore, random_actions)
        if not isinstance(state, SamplerState):
            raise TypeError(f"Sampler.sample: state must be a SamplerState (from "
                            f"sampler.init, sample or from_runner_state), got "
                            f"{type(state).__name__}.")
        if params is None:
            raise TypeError("Sampler.sample needs the module's inference params: pass "
                            "sampler.params (the runner's) or your own of the same structure "
                            "(e.g. module.params_for_inference(learner_params)).")
        _check_num_steps(num_steps, self.num_steps)
        env_params = self._env_params(env_params)
        fns = self.chunk_fns(mode)
        steps = jnp.asarray(self.num_steps if num_steps is None else num_steps, jnp.int32)
        try:
            carry, lookback, traj, info = self._member_chunk(mode)(
                state.carry, state.lookback, params, env_params, steps)
        except Exception as error:
            # Only this failure path traces the template, so a `sample` that traces pays
            # nothing for the checks.
            mismatch = _first_mismatch(
                (self._state_shapes(), state, "Sampler.sample: the state",
                 f"Pass a state of this sampler ({self!r}): from its init(), sample() or "
                 "from_runner_state(); a state of a sampler with another env, module or "
                 "sub-env count does not fit.", "same_kind"),
                self._env_params_check("Sampler.sample", env_params),
                self._params_check("Sampler.sample", params))
            if mismatch is None:
                raise
            raise mismatch from error
        must_restart = info.max_consecutive_failures > self._tolerance
        if not self._restart:
            must_restart = must_restart | (info.num_failures > 0)
        carry = jax.lax.cond(must_restart, lambda c: fns.reset_carry(c, env_params),
                             lambda c: c, carry)
        counters = self._count(state.counters, info)
        metrics = self._metrics(carry, counters, info, state.carry)
        return SamplerState(carry=carry, lookback=lookback, counters=counters), traj, metrics

    def _state_shapes(self) -> SamplerState:
        """The `jax.ShapeDtypeStruct` tree of this sampler's state (builds no params)."""
        return jax.eval_shape(self.init, self.default_key, self.params_like)

    def _params_check(self, where: str, params: Any) -> tuple:
        """A `_first_mismatch` check of `params` against this sampler's module."""
        return (self.params_like, params, f"{where}: params",
                "Pass the module's inference params: sampler.params, or your own of the "
                "same structure (a learner built by PPOLearner.from_sampler(sampler) gives "
                "them by module.params_for_inference(learner_params)).", "same_kind")

    def _env_params_check(self, where: str, env_params: Any) -> tuple:
        """A `_first_mismatch` check of `env_params` against this sampler's env (structure
        and shapes; values and dtypes may differ)."""
        return (self.env_params, env_params, f"{where}: env_params",
                f"Pass params of this sampler's env ({self.env_name!r}): sampler.env_params, "
                "or a copy with other values (sampler.env_params.replace(...)).", "ignore")

    def _count(self, c: SamplerCounters, info: Any) -> SamplerCounters:
        steps = info.num_steps.astype(jnp.uint32)
        env_steps = steps * jnp.uint32(self.num_envs)
        lo = c.env_steps_lo + env_steps
        discarded = info.discarded_env_steps.astype(jnp.uint32)
        if info.custom_metric_sums is not None:
            sums = info.custom_metric_sums
            lhi, llo = _add_exact(c.custom_lifetime_hi, c.custom_lifetime_lo, sums)
            uhi, ulo = _add_exact(c.custom_unreported_hi, c.custom_unreported_lo, sums)
            c = c.replace(custom_lifetime_hi=lhi, custom_lifetime_lo=llo,
                          custom_unreported_hi=uhi, custom_unreported_lo=ulo)
        return c.replace(
            vector_steps=c.vector_steps + steps, env_steps_lo=lo,
            env_steps_hi=c.env_steps_hi + (lo < c.env_steps_lo).astype(jnp.uint32),
            env_steps_unreported=c.env_steps_unreported + env_steps,
            discarded_lifetime=c.discarded_lifetime + discarded,
            discarded_unreported=c.discarded_unreported + discarded,
            failures_lifetime=c.failures_lifetime + info.num_failures.astype(jnp.uint32))

    def _metrics(self, carry: Any, c: SamplerCounters, info: Any, start: Any) -> SampleMetrics:
        extra = {}
        if self.multi_agent:
            extra = dict(agent_registers=carry.agent_metrics,
                         module_registers=carry.module_metrics,
                         agent_steps=(carry.agent_steps - start.agent_steps).astype(jnp.int32),
                         module_steps=(carry.module_steps - start.module_steps
                                       ).astype(jnp.int32),
                         agent_steps_lifetime=c.agent_steps_lifetime
                         + (carry.agent_steps - c.agent_seen),
                         module_steps_lifetime=c.module_steps_lifetime
                         + (carry.module_steps - c.module_seen))
        if info.custom_metric_sums is not None:
            extra.update(custom_registers=carry.callbacks.registers,
                         custom_sums=info.custom_metric_sums,
                         custom_lifetime_hi=c.custom_lifetime_hi,
                         custom_lifetime_lo=c.custom_lifetime_lo)
        return SampleMetrics(
            registers=carry.metrics,
            num_env_steps=info.num_steps * jnp.int32(self.num_envs),
            num_episodes=info.num_episodes,
            num_env_step_failures=info.num_failures,
            num_env_steps_discarded=info.discarded_env_steps,
            env_steps_lifetime_lo=c.env_steps_lo, env_steps_lifetime_hi=c.env_steps_hi,
            episodes_lifetime=c.episodes_lifetime + (carry.metrics.episodes - c.episodes_seen),
            failures_lifetime=c.failures_lifetime, discarded_lifetime=c.discarded_lifetime,
            **extra)

    # ------------------------------------------------------------------ jitted entry points
    def sample_jit(self, state: SamplerState, params: Any, env_params: Any = None, *,
                   num_steps: Any = None, explore: bool = True, random_actions: bool = False):
        """`sample`, jitted once per policy mode (the state is donated)."""
        mode = _mode(explore, random_actions)
        if mode not in self._jit_sample:
            self._jit_sample[mode] = lowering.jit(
                lambda s, p, e, n: self.sample(s, p, e, num_steps=n, explore=explore,
                                               random_actions=random_actions),
                unrolled=self.unrolled_rng, donate_argnums=(0,))
        _check_num_steps(num_steps, self.num_steps)
        steps = np.int32(self.num_steps if num_steps is None else num_steps)
        return self._jit_sample[mode](state, params, self._env_params(env_params), steps)

    # ------------------------------------------------------------------ runner round trip
    def to_runner_state(self, state: SamplerState, params: Any = None,
                        weights_seq_no: int | None = None) -> dict[str, Any]:
        """A dict for `runner.set_state()` of a runner built from the same config: the
        carry, lookback and the metric counters (and, with `params`, the weights under
        `weights_seq_no`, default 0: always applied). The runner then continues where the
        fused loop stopped, and its `get_metrics()` reports what the fused calls sampled
        (the device callbacks' metrics too; the runner keeps its own host-logged values).
        `state` must be one state (index a vmapped batch first)."""
        from jaxrunner.runners.compiled_runner import keys_to_data

        if jnp.ndim(state.counters.vector_steps) != 0:
            raise ValueError(
                "Sampler.to_runner_state takes one state, got a batch of shape "
                f"{jnp.shape(state.counters.vector_steps)} (from vmap): pick one with "
                "jax.tree.map(lambda x: x[i], state).")
        key_impl = str(jax.random.key_impl(state.carry.key))
        carry, lookback, c = jax.device_get((keys_to_data(state.carry), state.lookback,
                                             state.counters))
        general = {
            "episodes_lifetime": int(c.episodes_lifetime),
            "vector_steps_lifetime": int(c.vector_steps),
            "episodes_seen_on_device": int(c.episodes_seen),
            "env_step_failures_lifetime": int(c.failures_lifetime),
            "env_steps_discarded_lifetime": int(c.discarded_lifetime),
            "env_steps_unreported": int(c.env_steps_unreported),
            "env_steps_discarded_unreported": int(c.discarded_unreported)}
        if self.multi_agent:
            metrics = {
                "general": general,
                "agent_steps_lifetime": {a: int(v) for a, v in
                                         zip(self.agent_ids, c.agent_steps_lifetime)},
                "module_steps_lifetime": {m: int(v) for m, v in
                                          zip(self.module_ids, c.module_steps_lifetime)},
                "agent_seen": [int(v) for v in c.agent_seen],
                "module_seen": [int(v) for v in c.module_seen]}
        else:
            metrics = general
        component = {"carry": carry, "lookback": lookback, "needs_reset": False,
                     "key_impl": key_impl, "metrics": metrics}
        if np.size(c.custom_lifetime_hi):
            pair = lambda hi, lo: (np.asarray(hi, np.float64)  # noqa: E731
                                   + np.asarray(lo, np.float64)).tolist()
            component["custom_metrics"] = {"device": {
                "lifetime": pair(c.custom_lifetime_hi, c.custom_lifetime_lo),
                "since_last": pair(c.custom_unreported_hi, c.custom_unreported_lo)}}
        out: dict[str, Any] = {
            CARRY_COMPONENT: component,
            "num_env_steps_sampled_lifetime": int(c.env_steps_hi) * _MOD + int(c.env_steps_lo),
        }
        if params is not None:
            out["rl_module"] = jax.device_get(params)
            out["weights_seq_no"] = int(weights_seq_no or 0)
        return out

    def from_runner_state(self, runner_state: dict[str, Any]) -> SamplerState:
        """A `SamplerState` from `runner.get_state(components="all")` (or any state with
        the "env_runner_carry" component) of a runner built from the same config: the
        fused loop continues the runner's episodes and counters. A runner that would
        restart its sub-envs on its next `sample()` has them restarted here."""
        from jaxrunner.errors import StateStructureError
        from jaxrunner.structure import check_same_structure

        saved = runner_state.get(CARRY_COMPONENT) if isinstance(runner_state, dict) else None
        if saved is None:
            raise StateStructureError(
                "Sampler.from_runner_state needs the 'env_runner_carry' component: pass "
                "runner.get_state(components='all') (or components=['env_runner_carry']).")
        from jaxrunner.runners.compiled_runner import STATE_HINT, keys_to_data

        template = self._state_shapes()
        check_same_structure(  # keys are stored as their raw data
            jax.eval_shape(keys_to_data, {"carry": template.carry, "lookback": template.lookback}),
            {"carry": saved["carry"], "lookback": saved["lookback"]},
            "Sampler.from_runner_state: the env_runner_carry", hint=STATE_HINT)
        impl = saved.get("key_impl") or None

        def restore(shape, value):
            if jnp.issubdtype(shape.dtype, jax.dtypes.prng_key):
                return jax.random.wrap_key_data(jnp.asarray(value), impl=impl)
            return jnp.asarray(value, shape.dtype)

        carry = jax.tree.map(restore, template.carry, saved["carry"])
        lookback = jax.tree.map(restore, template.lookback, saved["lookback"])
        m = saved.get("metrics") or {}
        general = m.get("general", m) if self.multi_agent else m
        u32 = lambda v: jnp.asarray(int(v) % _MOD, jnp.uint32)  # noqa: E731
        lifetime = int(runner_state.get("num_env_steps_sampled_lifetime", 0) or 0)
        num_custom = _num_custom(template.carry)
        counters = SamplerCounters.zeros(len(self.agent_ids), len(self.module_ids),
                                         num_custom).replace(
            vector_steps=u32(general.get("vector_steps_lifetime", 0)),
            env_steps_lo=u32(lifetime), env_steps_hi=u32(lifetime // _MOD),
            env_steps_unreported=u32(general.get("env_steps_unreported", 0)),
            discarded_lifetime=u32(general.get("env_steps_discarded_lifetime", 0)),
            discarded_unreported=u32(general.get("env_steps_discarded_unreported", 0)),
            failures_lifetime=u32(general.get("env_step_failures_lifetime", 0)),
            episodes_lifetime=u32(general.get("episodes_lifetime", 0)),
            episodes_seen=u32(general.get("episodes_seen_on_device", 0)))
        if self.multi_agent and "agent_seen" in m:
            arr = lambda values: jnp.asarray(  # noqa: E731
                np.asarray([int(v) % _MOD for v in values], np.uint32).reshape(-1))
            counters = counters.replace(
                agent_steps_lifetime=arr(m["agent_steps_lifetime"][a] for a in self.agent_ids),
                agent_seen=arr(m["agent_seen"]),
                module_steps_lifetime=arr(m["module_steps_lifetime"][x]
                                          for x in self.module_ids),
                module_seen=arr(m["module_seen"]))
        device = (saved.get("custom_metrics") or {}).get("device")
        if num_custom and device is not None:
            hi, lo = _split_float64(device["lifetime"], num_custom)
            uhi, ulo = _split_float64(device["since_last"], num_custom)
            counters = counters.replace(custom_lifetime_hi=hi, custom_lifetime_lo=lo,
                                        custom_unreported_hi=uhi, custom_unreported_lo=ulo)
        state = SamplerState(carry=carry, lookback=lookback, counters=counters)
        if saved.get("needs_reset"):
            if self._jit_reset is None:
                self._jit_reset = lowering.jit(self.reset, unrolled=self.unrolled_rng)
            state = self._jit_reset(state, self.env_params)
        return state

    # ------------------------------------------------------------------ sharding
    def shard(self, state: SamplerState, mesh: Any) -> SamplerState:
        """`state` placed on `mesh` (a `jax.sharding.Mesh` with an axis named "env"): the
        per-sub-env leaves split over it, the rest replicated; a jitted `sample` of the
        result runs SPMD over the mesh's devices."""
        from jaxrunner.runners.sharding import shard_carry

        env_devices = dict(mesh.shape).get("env")
        if env_devices is None or self.num_envs % env_devices:
            raise ValueError(
                f"Sampler.shard needs a mesh with an axis named 'env' whose size divides the "
                f"{self.num_envs} sub-envs, got a mesh of axes {dict(mesh.shape)}: e.g. "
                "jax.sharding.Mesh(np.array(jax.devices()), ('env',)) with "
                "num_envs_per_env_runner a multiple of the device count.")
        carry, lookback = shard_carry(state.carry, state.lookback, mesh)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        counters = jax.tree.map(lambda x: jax.device_put(x, replicated), state.counters)
        return SamplerState(carry=carry, lookback=lookback, counters=counters)

    def __repr__(self) -> str:
        return (f"Sampler(env={self.env_name!r}, num_envs={self.num_envs}, "
                f"num_steps={self.num_steps})")


def _num_custom(carry: Any) -> int:
    """`K`, the number of device-callback metrics of a carry (0 without callbacks)."""
    part = getattr(carry, "callbacks", None)
    return 0 if part is None else int(part.registers.values.shape[-1])


def make_sampler(config: Any, **runner_kwargs: Any) -> Sampler:
    """The `Sampler` of the runner `config` builds (`jaxrunner.runner_class_for(config)`:
    single- or multi-agent), with that runner's env, module, connectors and seed. The
    runner builds its module's params on their first read (`sampler.params`, its own
    `sample()`): a fused train initialises params of its own and never compiles the
    runner's init (pass `params_on_first_read=False` to build them at once)."""
    from jaxrunner.runners.selection import runner_class_for

    runner_kwargs.setdefault("params_on_first_read", True)
    runner = runner_class_for(config)(config=config, **runner_kwargs)
    return runner.sampler


__all__ = ["SampleMetrics", "Sampler", "SamplerCounters", "SamplerState", "make_sampler"]
