"""THE rollout chunk: `scan_while` over time of a batched step over `B` sub-envs, for any
agent layout (single-agent is a layout of one agent).

Everything here is pure JAX: no Ray, no host I/O, no Python randomness. A runner jits
`chunk` once per policy mode and calls it with traced step, episode and agent-step limits,
so any `sample()` size reuses the same compiled program.

The chunk owns what every layout shares: the key splits (one per vector step: the next
carry key, the acting key and every key of the env step), the vmapped reset, the
auto-reset step (`core.autoreset`), failure detection and per-sub-env recreation
(`core.faults`), the episode and failure counters, `scan_while` with its limits and
validity mask, the metric ring write (`core.ring`), the lookback roll and the chunk info (the
last three in `finish_chunk`, which shells that step the env on the host reuse).
The layout (`core.rollout.SingleAgentLayout`, `core.multi_agent_rollout.MultiAgentLayout`)
supplies only what differs: who acts and how (modules, connectors), its own carry fields
(pending agent steps, reward accumulation, ...), the compact per-step record and its
decoding, its extra rings and its lookback.

A chunk runs up to `T = chunk_len` vector steps in a `while_loop`: it stops after
`num_steps` steps, once `episodes_limit` episodes finished or `agent_steps_limit` agent
steps completed; the steps not taken hold zeros and are marked invalid (`valid`).

Layout protocol (duck-typed; see the two layouts): attributes `spec` (with the common
fields `env`, `num_envs`, `chunk_len`, `lookback_len`, `metrics_window`, `check_finite`,
`autoreset_mode`, `partial_reset_ratio`, `restart_failed_sub_environments`,
`steps_per_loop_check`),
`step_fns` (`autoreset.EnvStepFns`), `counts_agent_steps` (bool), `carry_cls`; methods
`init_fields`, `reset_fields`, `act`, `outcome`, `after_step`, `record_counts`,
`begin_chunk`, `decode`, `ring_input`, `after_ring`, `init_lookback`, `roll_lookback`,
`info_extras`; with device callbacks (`spec.callbacks`, see `jaxrunner.core.callbacks`)
also `callback_view(carry, acted, outcome, info)`. `init_lookback(record_shape)` returns
zero buffers (the runner shell builds them on the host from their shapes).

Device callbacks, when the spec has them, run per step after `after_step` on the layout's
`callback_view` (their state lives in `carry.callbacks`); the metric values of the
episodes ending at a step are kept beside the row store's episode-end rows (one more scan
output `(T, B, K)` for a layout without a row store), and the counted episodes' values are
written after the scan. When
the spec has none, none of this is traced: the chunk is the same program.

Optionally a layout has `row_store`, an object that keeps part of the per-step record
out of the `(T, ...)` buffers in a fixed-size store carried through the scan (the
single-agent final observations, `core.final_obs`): `init(record_shape, extra_shape,
obs_dtypes) -> state` (`obs_dtypes`: None, or the narrower dtypes that hold the
observation leaves exactly, `core.value_range.storage_dtypes`),
`strip(record) -> record` (the record the buffers hold), `write(state, record, extra) ->
(state, record)`, `room(state) -> bool` (the chunk stops early when False),
`finish(state, traj, carry) -> traj` and `end_rows(state) -> core.final_obs.EndRows` (the
episode-end rows' positions and the `extra` values written beside them).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
from flax import struct

from jaxrunner import lowering
from jaxrunner.core.autoreset import (SEPARATE_DRAWS_MIN_ENVS, STEP_OUTPUTS, make_env_step,
                                     reset_spreads_its_draw, step_outputs_to_separate,
                                     step_reads_key)
from jaxrunner.core.callbacks import EpisodeStart, batched_info, per_env_struct
from jaxrunner.core.carry import ChunkInfo, MetricRegisters
from jaxrunner.core.faults import has_large_float_leaf, recreate_failed, step_failed
from jaxrunner.core.dependence import trace_abstract
from jaxrunner.core.finiteness import finite_outputs
from jaxrunner.core.ring import count_true, write_ring
from jaxrunner.core.value_range import output_storage_dtypes

POLICY_MODES = ("explore", "inference", "random")
# Whether rollouts compiled with the unrolled hash compute each sub-env's reset in a kernel
# of its own on CPU (`jaxrunner.core.autoreset.separate_reset`): "auto" where the reset's
# draw would otherwise be computed in several fusions (`reset_spreads_its_draw`); True and
# False (always, never) are for A/B benchmarks (`benchmarks/separate_resets.py`). Only
# programs traced inside `lowering.unrolled_threefry()` separate them: with JAX's lowering
# the draw is a loop XLA does not fuse into its readers, and the separating conditional
# only adds a branch of about 50 instructions to compile (CartPole's fused PPO).
SEPARATE_RESETS: bool | str = "auto"
# Whether a separated reset also draws its random bits in kernels of their own
# (`jaxrunner.core.autoreset.separate_draws`): "auto" from `SEPARATE_DRAWS_MIN_ENVS`
# sub-envs on; True and False are for A/B benchmarks (`benchmarks/separate_draws.py`).
SEPARATE_RESET_DRAWS: bool | str = "auto"
# Which outputs of each sub-env's step (observation, reward, flags) "gymnax"-mode rollouts
# compute in a kernel of their own on CPU, with either Threefry lowering: "auto" those
# whose work beyond the next state's has a transcendental function
# (`jaxrunner.core.autoreset.step_outputs_to_separate`: Pendulum's observation; Acrobot's
# observation, reward and termination; none of CartPole's or Breakout-MinAtar's); True
# (all four) and False (none) are for A/B benchmarks (`benchmarks/separate_outputs.py`).
SEPARATE_STEP_OUTPUTS: bool | str = "auto"
# The fault check leaves out the observation leaves the env builds finite by construction
# (`obs_facts` in `make_chunk_fns`). False checks them anyway: for A/B benchmarks
# (`benchmarks/proven_finite.py`).
PROVE_OBS_FINITE = True
# The chunk's loop body evaluates the vector step's trace made for its shapes (`init`'s
# lookback, the chunk's buffers) instead of tracing the env's step again: one Python trace
# of the step per program, the same compiled program (a runner's first program traces and
# lowers in 3.2 s instead of 4.2 s for Brax's Ant, 10.0 s instead of 11.7 s for Craftax;
# `benchmarks/step_trace.py`). The trace is kept while the chunk functions live. False
# traces the step in the body again: for tests and A/B benchmarks.
SHARE_STEP_TRACE = True
# Under `vmap_members` the chunk is traced twice (`custom_vmap`'s own unbatched trace, then
# the batched one); the second evaluates the first trace of the chunk's finish (decode,
# metric ring, lookback roll: most of the chunk's Python) instead of tracing it again.
# The same compiled program (identical optimised HLO for the 8-seed fused PPOs of
# `benchmarks/time_to_solve.py`); an 8-seed fused Pendulum PPO traced in 0.46-0.55 s
# instead of 0.55-0.62 s (scratch, a warm process). False traces it again: for tests and
# A/B benchmarks.
SHARE_FINISH_TRACE = True

# Under `jax.vmap`, a loop whose carry starts partly unbatched (constants: zero counters,
# empty buffers) and turns batched after a step is batched by JAX once more for every
# such turn, the whole body each time. With this switch the chunk's loop over its steps
# (under `vmap_members`) and a fused train's state (`PPOLearner.make_train`'s `init`)
# start batched wherever the carry is (`same_batching_as`): the body is batched once.
# The values are the same (discrete parts exactly, floats to rounding: XLA may fuse the
# two batchings differently; for the fused PPO of `benchmarks/time_to_solve.py`, at 1 and
# 8 seeds for CartPole and Pendulum, the optimised HLO was identical). The 8-seed fused
# PPO traced and lowered in 1.39 s against 1.63 s (CartPole) and 1.58 s (Pendulum),
# medians of 3 fresh processes (`benchmarks/compile_parts.py --batched-from-start
# true|false`, `benchmarks/results/compile_parts/batched_from_start_*`).
BATCHED_FROM_START = True
# A layout's row store keeps the observation leaves the env only ever fills with small
# integers in the narrowest integer dtype that holds them exactly (`obs_facts` in
# `make_chunk_fns`; MinAtar's float32 grids in uint8: a quarter of the bytes). False keeps
# the observation's own dtypes: for A/B benchmarks (`benchmarks/narrow_store.py`).
NARROW_ROW_STORE = True
# A layout that keeps its per-step observations narrow (`narrows_trajectory_obs`: the
# single-agent one) stores the leaves the env only ever fills with small integers (reset
# observations included) in the same narrow dtypes in the trajectory, `Trajectory.
# stored_obs`; `Trajectory.obs` reads them widened back (MinAtar: a quarter of the bytes
# written per step). False stores them in their own dtypes: for A/B benchmarks
# (`benchmarks/narrow_store.py`).
NARROW_TRAJECTORY_OBS = True


class ObsFacts(NamedTuple):
    """What a rollout reads from its env step's jaxpr about the observations (None: not
    read). `known_finite`: a pytree of bools like the observation, the leaves finite by
    construction (`core.finiteness`), which the fault check leaves out. `store_dtypes`: a
    pytree of dtypes like it, those the row store keeps the leaves in, narrower where a
    leaf only holds small integers (`core.value_range`). `trajectory_dtypes`: the same
    for the observations the trajectory records (next observations and reset ones)."""

    known_finite: Any = None
    store_dtypes: Any = None
    trajectory_dtypes: Any = None


def scan_while(step: Callable, state: Any, record_shape: Any, length: int,
               keep_going: Callable[[jax.Array, Any, int], jax.Array],
               steps_per_check: int = 1) -> tuple:
    """A `lax.scan` of `step: state -> (state, record)` over at most `length` steps that
    stops before the first step where `keep_going(t, state, 1)` is False.

    A `while_loop` writing each record into preallocated `(length, ...)` buffers: no
    per-step `cond` (whose branch copies and extra kernels cost more than the step itself
    for small batches) and no work for the steps not taken, whose records stay zeros.
    `record_shape` is the record pytree of `jax.ShapeDtypeStruct`s. Returns
    `(steps_taken, state, records)`.

    `keep_going(t, state, n)` says whether the `n` steps from step `t` on would all be
    taken (for `n = 1`: whether step `t` is). With `steps_per_check = K > 1` the loop
    first takes blocks of `K` steps, each an inner loop of fixed length, while
    `keep_going(t, state, K)` holds, then single steps as above: the same steps, records
    and state, with one loop test per block instead of per step. On a GPU each loop test
    is a device-to-host copy of the predicate and a wait for it; a fixed-length inner loop
    needs none. The step is traced twice then (compile time), so CPU rollouts keep
    `K = 1`."""
    buffers = jax.tree.map(lambda s: jnp.zeros((length,) + tuple(s.shape), s.dtype),
                           record_shape)
    if _member_axes():
        return _scan_while_members(step, state, buffers, length, keep_going)

    def one(loop):
        t, state, out = loop
        state, record = step(state)
        return t + 1, state, _write_record(out, record, t)

    loop = (jnp.zeros((), jnp.int32), state, buffers)
    if steps_per_check > 1 and length >= steps_per_check:
        def block(loop):
            return jax.lax.fori_loop(0, steps_per_check, lambda _, inner: one(inner), loop)

        loop = jax.lax.while_loop(
            lambda loop: (loop[0] + steps_per_check <= length)
            & keep_going(loop[0], loop[1], steps_per_check), block, loop)
    return jax.lax.while_loop(lambda loop: (loop[0] < length) & keep_going(loop[0], loop[1], 1),
                              one, loop)


def _write_record(buffers: Any, record: Any, t: jax.Array) -> Any:
    """`buffers` (`(length, ...)` leaves) with step `t`'s `record` written in."""
    return jax.tree.map(lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, t, 0),
                        buffers, record)


# The axis names of the `vmap_members` vmaps being traced (innermost last), per thread.
_MEMBER_AXES = threading.local()
_AXIS_NAMES = itertools.count()


def _member_axes() -> tuple[str, ...]:
    return tuple(getattr(_MEMBER_AXES, "names", ()))


@contextlib.contextmanager
def _members(name: str) -> Iterator[None]:
    outer = _member_axes()
    _MEMBER_AXES.names = outer + (name,)
    try:
        yield
    finally:
        _MEMBER_AXES.names = outer


def vmap_members(fn: Callable, state_argnums: tuple[int, ...] = ()) -> Callable:
    """`fn` (a chunk: pure, its batched inputs all arguments) that, under `jax.vmap` (a
    sampler vmapped over seeds, params or env params), runs its `scan_while` with one loop
    counter for all members.

    A `while_loop` whose condition reads batched values is batched by JAX as a loop until
    every member stops, with every carried value selected per member on every step and
    its records written by scatters at per-member indices: on CPU the whole `(T, ...)`
    trajectory buffer was copied every step (8 seeds of 1024 CartPoles sampled at 0.29 of
    a vmapped bare scan, 0.96 with this; `benchmarks/results/fused_lowering/
    sampler_throughput_vmapped_2026-12-07.json`). Under `vmap_members` the vmap carries an axis name,
    `scan_while` stops when no member has a step left (`pmax` over the members) and keeps
    each stopped member's state and zero records as they are: the same values.

    The batching rule runs once per batching of the enclosing program, and JAX batches a
    `while_loop`'s body several times to find which carried values are batched (a fused
    train's loop over iterations: three times, the first with the counters that start
    as constants unbatched). The vmapped chunk is traced once, as a `jax.jit` the later
    batchings call again from its trace cache: the arguments in `state_argnums` (the
    carried state) enter it batched whatever their batching, so every pass has the same
    pattern. With `custom_vmap`'s own unbatched trace, that is two traces of the chunk
    where there were four (8 seeds of a fused CartPole PPO: the program traced and
    lowered in 1.9 s, not 3.3 s, the bare PPO's in 0.9 s; `benchmarks/results/
    compile_parts/trace_lower_compile_2026-12-07.json`)."""

    @jax.custom_batching.custom_vmap
    def members(*args: Any) -> Any:
        return fn(*args)

    vmapped_of: dict[tuple, Callable] = {}

    @members.def_vmap
    def batched(axis_size: int, in_batched: list, *args: Any):
        args, in_batched = list(args), list(in_batched)
        for i in state_argnums:
            args[i] = jax.tree.map(
                lambda x, b: x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)),
                args[i], in_batched[i])
            in_batched[i] = jax.tree.map(lambda _: True, in_batched[i])
        flags, structure = jax.tree.flatten(in_batched)
        key = (axis_size, tuple(flags), structure, _member_axes(),
               lowering.unrolled_threefry_active())
        if key not in vmapped_of:
            in_axes = tuple(jax.tree.map(lambda b: 0 if b else None, b) for b in in_batched)
            name = f"jaxrunner_members_{next(_AXIS_NAMES)}"
            vmapped = jax.vmap(fn, in_axes=in_axes, axis_name=name, axis_size=axis_size)

            def traced(*args: Any) -> Any:
                with _members(name):
                    return vmapped(*args)

            vmapped_of[key] = jax.jit(traced)
        out = vmapped_of[key](*args)
        return out, jax.tree.map(lambda _: True, out)

    return members


def same_batching_as(tree: Any, like: Any) -> Any:
    """`tree` with the same values, batched under `jax.vmap` wherever an integer, bool or
    key leaf of `like` is batched: each array leaf goes through a select between two
    copies of itself on a flag computed from those leaves. Under `vmap` a value made of
    constants is unbatched, and a loop whose carry starts unbatched and becomes batched
    is batched by JAX once more for each such step. XLA simplifies the selects away (the
    fused PPOs of `benchmarks/time_to_solve.py` compiled to identical optimised
    programs), though the program batched the other way may still fuse differently."""
    flag = jnp.ones((), jnp.bool_)
    for leaf in jax.tree.leaves(like):
        if not isinstance(leaf, jax.Array):  # a Python number: a constant, never batched
            continue
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if leaf.size and (jnp.issubdtype(leaf.dtype, jnp.integer) or leaf.dtype == jnp.bool_):
            first = jnp.ravel(leaf)[0]
            flag = flag & (first == first)

    keep = _select_by(flag)

    def select(x: Any) -> Any:
        if not isinstance(x, jax.Array) or jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return x
        return keep(x, x)

    return jax.tree.map(select, tree)


def _select_by(pred: jax.Array) -> Callable[[Any, Any], Any]:
    """`select(a, b)`: `a` where the scalar `pred`, else `b` (same shapes and dtypes), as
    `jnp.where` gives it, with `pred` broadcast once per shape and no `jnp.where` call
    of its own per leaf (each a nested `jit` in the traced program; a vmapped fused train
    selects dozens of leaves a step)."""
    broadcast: dict[tuple, jax.Array] = {}

    def select(a: Any, b: Any) -> Any:
        shape = jnp.shape(a)
        if shape not in broadcast:
            broadcast[shape] = jnp.broadcast_to(pred, shape)
        return jax.lax.select(broadcast[shape], a, b)

    return select


def _scan_while_members(step: Callable, state: Any, buffers: Any, length: int,
                        keep_going: Callable) -> tuple:
    """`scan_while` inside `vmap_members`: one loop counter `t` for every member (the
    loop runs while any member takes step `t`, `pmax` over the members); a member that
    stopped keeps its state and writes zero records from then on, as its own loop would
    have stopped. Returns each member's steps taken."""
    names = _member_axes()

    def one(loop):
        t, taken, go, state, out = loop  # go: this member takes step t
        new_state, record = step(state)
        keep = _select_by(go)
        state = jax.tree.map(keep, new_state, state)
        record = jax.tree.map(lambda x: keep(x, jnp.zeros_like(x)), record)
        return (t + 1, taken + go.astype(jnp.int32), go & keep_going(t + 1, state, 1), state,
                _write_record(out, record, t))

    zero = jnp.zeros((), jnp.int32)
    carried = (zero, keep_going(zero, state, 1), state, buffers)  # taken, go, state, records
    if BATCHED_FROM_START:
        # Every carried value but the shared counter enters the loop batched (as the
        # carry is), so JAX batches the loop's body once, not once per newly batched value.
        carried = same_batching_as(carried, state)
    loop = (zero, *carried)
    _, taken, _, state, out = jax.lax.while_loop(
        lambda loop: (loop[0] < length)
        & (jax.lax.pmax(loop[2].astype(jnp.int32), names) > 0), one, loop)
    return taken, state, out


def strong_types(tree: Any) -> Any:
    """`tree` with weakly typed leaves made strong (same dtype). Envs' resets and steps
    may return weakly typed leaves (a Python float in a gymnax state): a carry whose
    leaves flip between weak and strong would be a new signature for `jit(chunk)` on the
    next call, so the carry always holds strong types."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.asarray(x).dtype), tree)


def check_policy_mode(mode: str) -> None:
    """Raises ValueError unless `mode` is one of `POLICY_MODES`."""
    if mode not in POLICY_MODES:
        raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}.")


@struct.dataclass
class StepOutcome:
    """One vector step's env outcome as the layout sees it in `after_step` (`(B, ...)`).

    `reward`, `terminated`, `truncated` are in the layout's own form (single-agent:
    `(B,)` arrays; multi-agent: dicts keyed by agent id), already cast; a failed
    sub-env's flags are not yet masked. `all_terminated` / `all_truncated` are the whole
    episode's flags with failed sub-envs masked out; `ended` = done or failed."""

    next_obs: Any
    env_state: Any
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any
    all_terminated: jax.Array  # (B,) bool
    all_truncated: jax.Array  # (B,) bool
    failed: jax.Array  # (B,) bool
    ended: jax.Array  # (B,) bool
    # The dtypes to record the observations in (`ObsFacts.trajectory_dtypes`), or None.
    obs_record_dtypes: Any = struct.field(pytree_node=False, default=None)


class ChunkFns(NamedTuple):
    """The pure functions of a rollout (see `make_chunk_fns`)."""

    init_carry: Callable[..., Any]  # (key, params, env_params) -> carry
    reset_carry: Callable[..., Any]  # (carry, env_params) -> carry
    init_lookback: Callable[..., Any]  # (carry, params, env_params) -> lookback
    chunk: Callable[..., tuple]  # -> (carry, lookback, trajectory, ChunkInfo)
    # (carry, params, env_params) -> (carry, record): one vector step (for shape checks)
    vector_step: Callable[..., tuple] | None = None
    # (carry, params, env_params) -> the spec's device callbacks bound to the step view
    # (their metric names read by tracing them once), or None without callbacks.
    bound_callbacks: Callable[..., Any] | None = None


def initial_counters(num_envs: int, metrics_window: int) -> dict[str, Any]:
    """The counters every layout's carry starts with: per sub-env `(B,)` int32 episode
    count, episode length and consecutive failures (zeros), the uint32 vector-step counter
    and an empty metric ring of `metrics_window` episodes. The host-env engine starts its
    carry from the same values."""
    return dict(episode_count=jnp.zeros((num_envs,), jnp.int32),
                episode_len=jnp.zeros((num_envs,), jnp.int32),
                consecutive_failures=jnp.zeros((num_envs,), jnp.int32),
                vector_step=jnp.zeros((), jnp.uint32),
                metrics=MetricRegisters.create(metrics_window))


def _aval_signature(x: Any) -> tuple:
    """`(shape, dtype, weak_type)` of an array, tracer or Python scalar: what a trace
    of it depends on."""
    aval = jax.typeof(x)
    return tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False))


class TracedOnce:
    """`fn(context, *args)` traced to a jaxpr once per signature: the pytree structure,
    shapes, dtypes and weak types of `args` (arrays and tracers), the `context` object
    (what else the trace reads: bound callbacks; by identity, kept alive with the trace)
    and a hashable `key` (e.g. the Threefry lowering in force). `shapes(...)` gives the
    output shapes from that trace; a call evaluates the trace's equations on `args`
    instead of running `fn`'s Python again: the equations a second trace would give, so
    the same program. A call runs `fn` itself where `share()` is False or the trace
    captured a value of an enclosing trace (its jaxpr cannot stand alone). Traces live as
    long as this object."""

    def __init__(self, fn: Callable, share: Callable[[], bool] = lambda: True):
        self._fn = fn
        self._share = share
        self._programs: dict[tuple, tuple] = {}

    def _traced(self, context: Any, args: tuple, key: Any) -> tuple:
        leaves, treedef = jax.tree.flatten(args)
        signature = (id(context), key, treedef, tuple(_aval_signature(x) for x in leaves))
        if signature not in self._programs:
            closed, out_shape = jax.make_jaxpr(
                lambda *flat: self._fn(context, *jax.tree.unflatten(treedef, flat)),
                return_shape=True)(*leaves)
            own = not any(isinstance(c, jax.core.Tracer) for c in closed.consts)
            self._programs[signature] = (closed if own else None,
                                         jax.tree.structure(out_shape), out_shape, context)
        return self._programs[signature]

    def shapes(self, context: Any, *args: Any, key: Any = None) -> Any:
        """The `jax.ShapeDtypeStruct` tree of `fn(context, *args)`."""
        return self._traced(context, args, key)[2]

    def __call__(self, context: Any, *args: Any, key: Any = None) -> Any:
        if not self._share():
            return self._fn(context, *args)
        closed, out_tree, _, _ = self._traced(context, args, key)
        if closed is None:
            return self._fn(context, *args)
        flat = jax.extend.core.jaxpr_as_fun(closed)(*jax.tree.leaves(args))
        return jax.tree.unflatten(out_tree, flat)


def make_chunk_fns(layout: Any) -> ChunkFns:
    """Builds the pure rollout functions of `layout` (already bound to a policy mode)."""
    spec = layout.spec
    env, num_envs = spec.env, spec.num_envs
    step_fns = layout.step_fns
    vmapped_reset = jax.vmap(env.reset, in_axes=(0, None))
    callbacks = getattr(spec, "callbacks", None)
    bound: dict[str, Any] = {}  # the vector env step and the bound callbacks, once traced

    def reset_all(key: jax.Array, env_params: Any):
        return strong_types(vmapped_reset(jax.random.split(key, num_envs), env_params))

    def init_carry(key: jax.Array, params: Any, env_params: Any):
        key, reset_key, layout_key = jax.random.split(key, 3)
        obs, env_state = reset_all(reset_key, env_params)
        carry = layout.carry_cls(
            env_state=env_state, obs=obs, key=key,
            **initial_counters(num_envs, spec.metrics_window),
            **layout.init_fields(layout_key, obs, env_state, params, env_params))
        if callbacks is not None:
            carry = carry.replace(callbacks=bound_callbacks(carry, params, env_params).init(obs))
        return carry

    def vector_env_step(carry: Any, params: Any, env_params: Any):
        """The vector env step, built at the first trace under each Threefry lowering
        (resets are separated only under the unrolled one): the env's shapes say whether
        its step reads its key (if not, the step's split leaves out the `B` step keys)."""
        unrolled = lowering.unrolled_threefry_active()
        name = "env_step_unrolled" if unrolled else "env_step"
        if name not in bound:
            actions = jax.eval_shape(lambda c, p, e: layout.act(p, c, c.key, e)[0], carry,
                                     params, env_params)
            step_keys = step_reads_key(step_fns, carry.key, carry.env_state, actions,
                                       env_params)
            separate = (unrolled and lowering.unroll_for(num_envs)
                        and (SEPARATE_RESETS is True or SEPARATE_RESETS == "auto"
                             and reset_spreads_its_draw(step_fns, carry.key, env_params)))
            if SEPARATE_STEP_OUTPUTS == "auto":
                separate_outputs = step_outputs_to_separate(step_fns, carry.key,
                                                            carry.env_state, actions, env_params)
            else:
                separate_outputs = STEP_OUTPUTS if SEPARATE_STEP_OUTPUTS else ()
            bound[name] = make_env_step(
                step_fns, num_envs, spec.autoreset_mode, spec.partial_reset_ratio,
                step_keys=step_keys, separate_resets=bool(separate),
                separate_outputs=separate_outputs,
                separate_draws=(SEPARATE_RESET_DRAWS is True or SEPARATE_RESET_DRAWS == "auto"
                                and num_envs >= SEPARATE_DRAWS_MIN_ENVS))
        return bound[name]

    def obs_facts(env_step: Any, keys: Any, carry: Any, env_actions: Any,
                  env_params: Any) -> ObsFacts:
        """What the vector step's jaxpr says of its observations (`ObsFacts`), read once
        from one trace, and only for a large floating observation leaf
        (`faults.has_large_float_leaf`), so a small observation's env pays no extra
        trace."""
        if "obs_facts" not in bound:
            prove = spec.check_finite and PROVE_OBS_FINITE
            narrow = NARROW_ROW_STORE and getattr(layout, "row_store", None) is not None
            narrow_record = (NARROW_TRAJECTORY_OBS
                             and getattr(layout, "narrows_trajectory_obs", False))
            facts = ObsFacts()
            if (prove or narrow or narrow_record) and has_large_float_leaf(carry.obs):
                stack = lambda *xs: jnp.stack(xs)  # noqa: E731

                def final_and_stored(k, reset_key, state, actions, p):
                    """The final observation (what the check tests) and, stacked, the
                    next and final ones (what the row store holds) and the next and
                    reset ones (what the trajectory records: a chunk's first
                    observations may come from `reset_all`)."""
                    next_obs, _, _, _, _, info = env_step.step(k, state, actions, p)
                    final_obs = info.get("final_observation", next_obs)
                    reset_obs, _ = reset_all(reset_key, p)
                    return (final_obs, jax.tree.map(stack, next_obs, final_obs),
                            jax.tree.map(stack, next_obs, reset_obs))

                traced = trace_abstract(final_and_stored, keys, carry.key, carry.env_state,
                                        env_actions, env_params)
                if traced is not None:
                    closed, (final_shape, _, _) = traced
                    structure = jax.tree.structure(final_shape)
                    count = structure.num_leaves
                    dtypes = output_storage_dtypes(closed)
                    facts = ObsFacts(
                        known_finite=jax.tree.unflatten(
                            structure, finite_outputs(closed)[:count]) if prove else None,
                        store_dtypes=jax.tree.unflatten(structure, dtypes[count:2 * count])
                        if narrow else None,
                        trajectory_dtypes=jax.tree.unflatten(structure, dtypes[2 * count:])
                        if narrow_record else None)
            bound["obs_facts"] = facts
        return bound["obs_facts"]

    def bound_callbacks(carry: Any, params: Any, env_params: Any):
        """The device callbacks bound to this layout's step view (traced once)."""
        if "callbacks" not in bound:
            view = jax.eval_shape(lambda c, p, e: one_step(c, p, e, None, True)[2], carry,
                                  params, env_params)
            bound["callbacks"] = callbacks.bind(EpisodeStart(obs=per_env_struct(carry.obs)),
                                                per_env_struct(view))
        return bound["callbacks"]

    def reset_carry(carry: Any, env_params: Any):
        """Restarts every sub-env; episodes in progress are abandoned (new ids)."""
        key, reset_key = jax.random.split(carry.key)
        obs, env_state = reset_all(reset_key, env_params)
        carry = carry.replace(env_state=env_state, obs=obs, key=key,
                              episode_count=carry.episode_count + 1,
                              episode_len=jnp.zeros_like(carry.episode_len))
        if callbacks is not None:
            carry = carry.replace(callbacks=callbacks.restart(carry.callbacks, obs))
        return carry.replace(**layout.reset_fields(carry, env_params))

    def vector_step(carry: Any, params: Any, env_params: Any):
        new_carry, record, _, values = one_step(carry, params, env_params,
                                                 bound.get("callbacks"), False)
        return new_carry, (record if values is None else (record, values))

    def one_step(carry: Any, params: Any, env_params: Any, cbs: Any, want_view: bool):
        """One vector step: `(carry, record, callback view or None, (B, K) callback
        values or None)`; the view is built only with `cbs` or `want_view`."""
        env_step = vector_env_step(carry, params, env_params)
        keys = jax.random.split(carry.key, 2 + env_step.num_keys)  # the step's one split
        key, act_key = keys[0], keys[1]
        env_actions, acted = layout.act(params, carry, act_key, env_params)
        next_obs, env_state, reward, terminated, truncated, info = env_step.step(
            keys[2:], carry.env_state, env_actions, env_params)
        next_obs, env_state = strong_types((next_obs, env_state))
        final_obs = info.get("final_observation", next_obs)
        reward, terminated, truncated, all_terminated, all_truncated = layout.outcome(
            reward, terminated, truncated)
        facts = obs_facts(env_step, keys[2:], carry, env_actions, env_params)
        failed = step_failed(info, reward, final_obs, num_envs, spec.check_finite,
                             facts.known_finite)
        if spec.restart_failed_sub_environments:
            env_state, next_obs, key = recreate_failed(
                failed, env_state, next_obs, key, lambda k: reset_all(k, env_params))
            all_terminated = all_terminated & ~failed
            all_truncated = all_truncated & ~failed
        ended = all_terminated | all_truncated | failed  # a failed episode ends, discarded
        outcome = StepOutcome(next_obs=next_obs, env_state=env_state, reward=reward,
                              terminated=terminated, truncated=truncated, final_obs=final_obs,
                              all_terminated=all_terminated, all_truncated=all_truncated,
                              failed=failed, ended=ended,
                              obs_record_dtypes=facts.trajectory_dtypes)
        fields, record = layout.after_step(carry, acted, outcome, env_params)
        view = values = None
        if cbs is not None or want_view:
            view = layout.callback_view(carry, acted, outcome,
                                        batched_info(info, num_envs))
        if cbs is not None:
            fields["callbacks"], values = cbs.step(carry.callbacks, view, ended, next_obs)
        new_carry = carry.replace(
            env_state=env_state, obs=next_obs, key=key,
            episode_count=carry.episode_count + ended.astype(jnp.int32),
            episode_len=jnp.where(ended, 0, carry.episode_len + 1),
            consecutive_failures=jnp.where(failed, carry.consecutive_failures + 1, 0),
            vector_step=carry.vector_step + jnp.uint32(1),
            **fields)
        return new_carry, record, view, values

    def step_without_view(carry: Any, params: Any, env_params: Any, cbs: Any) -> tuple:
        """`one_step` as the chunk's loop runs it: `(carry, record, callback values or
        None)`."""
        new_carry, record, _, values = one_step(carry, params, env_params, cbs, False)
        return new_carry, record, values

    # `one_step` as the chunk's loop runs it, traced once per input signature, bound
    # callbacks and Threefry lowering (the vector step differs under the unrolled one):
    # `init_lookback`, the chunk's buffer shapes and the chunk's loop body share that
    # trace, so a program holding both the init and the chunk (a fused train), or a
    # runner's first `sample()`, traces the env's step once less.
    traced_step = TracedOnce(
        lambda cbs, carry, params, env_params: step_without_view(carry, params, env_params,
                                                                 cbs),
        share=lambda: SHARE_STEP_TRACE)

    def traced_one_step(carry: Any, params: Any, env_params: Any, cbs: Any) -> tuple:
        """`(carry, record, callback values or None)` of one vector step, from its
        shared trace (`traced_step`)."""
        return traced_step(cbs, carry, params, env_params,
                           key=lowering.unrolled_threefry_active())

    def step_shapes(carry: Any, params: Any, env_params: Any, cbs: Any) -> tuple:
        """`(record, callback values or None)` shapes of one vector step."""
        return traced_step.shapes(cbs, carry, params, env_params,
                                  key=lowering.unrolled_threefry_active())[1:]

    def init_lookback(carry: Any, params: Any, env_params: Any):
        return layout.init_lookback(step_shapes(carry, params, env_params, None)[0])

    def chunk(carry: Any, lookback: Any, params: Any, env_params: Any, num_steps: jax.Array,
              episodes_limit: jax.Array, agent_steps_limit: jax.Array,
              call_step_offset: jax.Array):
        """Runs up to `chunk_len` vector steps; see the module docstring.

        `call_step_offset`: vector steps the current `sample()` call took before this
        chunk (a failed episode's steps from before the call were already returned, so only
        the steps within the call count as discarded)."""
        carry = layout.begin_chunk(carry, call_step_offset)
        start = carry
        cbs = None if callbacks is None else bound_callbacks(carry, params, env_params)
        record_shape, values_shape = step_shapes(carry, params, env_params, cbs)
        counts_agents = layout.counts_agent_steps
        store = getattr(layout, "row_store", None)

        # With a row store, the callbacks' values of the episodes ending at a step go
        # beside the store's episode-end rows; without one, into `(T, B, K)` buffers.
        values_in_store = cbs is not None and store is not None
        values_per_step = cbs is not None and store is None

        def step(loop):
            c, episodes_done, agent_steps_done, rows = loop
            c, record, values = traced_one_step(c, params, env_params, cbs)
            if store is not None:  # `values` is None without callbacks
                rows, record = store.write(rows, record, values)
            episodes, agent_steps = layout.record_counts(record)
            episodes_done = episodes_done + episodes
            if counts_agents:
                agent_steps_done = agent_steps_done + agent_steps
            out = record.replace(valid=None)
            return (c, episodes_done, agent_steps_done, rows), ((out, values) if values_per_step
                                                                else out)

        def keep_going(t, loop, n):
            """Whether the `n` steps from `t` on are all taken: a step ends at most one
            episode a sub-env and writes at most `B` store rows."""
            _, episodes_done, agent_steps_done, rows = loop
            go = (t + n <= num_steps) & (episodes_done + (n - 1) * num_envs < episodes_limit)
            if store is not None:
                go = go & store.room(rows, n)
            return go & (agent_steps_done < agent_steps_limit) if counts_agents else go

        zero = jnp.zeros((), jnp.int32)
        rows = () if store is None else store.init(
            record_shape, values_shape if values_in_store else None,
            bound["obs_facts"].store_dtypes)  # read by `step_shapes`' trace above
        if store is not None:
            record_shape = store.strip(record_shape)
        buffers_shape = record_shape.replace(valid=None)
        if values_per_step:
            buffers_shape = (buffers_shape, values_shape)
        steps_taken, (carry, _, agent_steps_done, rows), records = scan_while(
            step, (carry, zero, zero, rows), buffers_shape, spec.chunk_len, keep_going,
            # Agent steps a vector step completes have no small bound: per step then.
            1 if counts_agents else spec.steps_per_loop_check)
        callback_values = None
        if values_in_store:
            callback_values = store.end_rows(rows)
        elif values_per_step:
            records, callback_values = records
        return traced_finish(cbs, carry, start, lookback, records, steps_taken,
                             episodes_limit, call_step_offset, agent_steps_done,
                             rows if store is not None else None, callback_values)

    # The chunk's finish, traced once per signature (`SHARE_FINISH_TRACE`).
    traced_finish = TracedOnce(
        lambda cbs, carry, start, lookback, records, steps_taken, episodes_limit,
        call_step_offset, agent_steps_done, rows, callback_values: finish_chunk(
            layout, carry, start, lookback, records, steps_taken, episodes_limit,
            call_step_offset, agent_steps_done, rows=rows, callbacks=cbs,
            callback_values=callback_values),
        share=lambda: SHARE_FINISH_TRACE)

    return ChunkFns(init_carry=init_carry, reset_carry=reset_carry,
                    init_lookback=init_lookback, chunk=chunk, vector_step=vector_step,
                    bound_callbacks=None if callbacks is None else bound_callbacks)


def finish_chunk(layout: Any, carry: Any, start: Any, lookback: Any, records: Any,
                 steps_taken: jax.Array, episodes_limit: jax.Array,
                 call_step_offset: jax.Array, agent_steps_done: jax.Array, *,
                 rows: Any = None, callbacks: Any = None,
                 callback_values: Any = None) -> tuple:
    """A chunk's finish after its steps: decode, metric ring, lookback roll, `ChunkInfo`.

    Pure; shared by the compiled `chunk` and by shells that step the env on the host and
    collect the layout's per-step records themselves.

    `carry`: the layout's carry after the last step taken; `start`: the carry the chunk
    began with (after `layout.begin_chunk`); `records`: the layout's per-step records in
    `(T, ...)` buffers with `valid=None` (`T = spec.chunk_len`, zeros past
    `steps_taken`); `steps_taken`, `episodes_limit`, `call_step_offset`,
    `agent_steps_done`: () int32 (see `make_chunk_fns`'s `chunk`). `rows`: the layout's
    `row_store` state, when it has one. `callbacks` / `callback_values`: the bound device
    callbacks and their values, when the spec has callbacks: `(T, B, K)` per step, or the
    row store's `EndRows` holding the values of the episodes ending at its rows.
    Returns `(carry, lookback, trajectory, ChunkInfo)`."""
    spec = layout.spec
    num_envs, chunk_len = spec.num_envs, spec.chunk_len
    traj = layout.decode(records.replace(
        valid=jnp.arange(chunk_len, dtype=jnp.int32) < steps_taken), start)
    if rows is not None:
        traj = layout.row_store.finish(rows, traj, carry)
    steps_in_call = call_step_offset + 1 + jnp.arange(chunk_len, dtype=jnp.int32)
    update = write_ring(
        carry.metrics, layout.ring_input(traj), start.vector_step, episodes_limit,
        start_episode_len=start.episode_len,
        start_episode_return=getattr(start, "episode_return", None),
        end_episode_len=carry.episode_len, steps_in_call=steps_in_call)
    carry = layout.after_ring(carry.replace(metrics=update.registers), traj, start, update)
    extras = layout.info_extras(start, carry, traj, agent_steps_done)
    if callbacks is not None:
        part, extras["custom_metric_sums"] = callbacks.write(
            carry.callbacks, layout.ring_input(traj), callback_values, episodes_limit,
            episode_ring=update)
        carry = carry.replace(callbacks=part)
    lookback = layout.roll_lookback(lookback, traj, steps_taken)
    failed = traj.failed  # (T, B); False past the last step (the records are zeros)
    num_failures = count_true(failed)
    any_failed = num_failures > 0
    first = jnp.argmax(failed.reshape(-1))
    info = ChunkInfo(num_steps=steps_taken, num_episodes=update.num_counted,
                     episode_env_steps=update.counted_len,
                     start_episode_count=start.episode_count,
                     start_episode_len=start.episode_len,
                     num_failures=num_failures,
                     discarded_env_steps=update.discarded.astype(jnp.int32),
                     first_failure_step=jnp.where(any_failed, first // num_envs, -1),
                     first_failure_env=jnp.where(any_failed, first % num_envs, -1),
                     max_consecutive_failures=jnp.max(carry.consecutive_failures),
                     **extras)
    return carry, lookback, traj, info


__all__ = ["ChunkFns", "POLICY_MODES", "StepOutcome", "check_policy_mode", "finish_chunk",
           "make_chunk_fns", "same_batching_as", "scan_while", "strong_types"]
