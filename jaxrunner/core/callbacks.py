"""Device callbacks: user code that runs inside the compiled rollout chunk.

A `DeviceCallbacks` holds three pure JAX functions written for ONE sub-env (the chunk
vmaps them over the `B` sub-envs):

* `on_episode_start(start: EpisodeStart) -> state`: the per-sub-env state of a new
  episode (any pytree of arrays; `()` when left out), from its first observation.
* `on_episode_step(state, step: StepView) -> state`: called at every env step of the
  episode with a typed view of the step; must return a state of the same structure,
  shapes and dtypes.
* `on_episode_end(state, step: StepView) -> {name: scalar}`: the episode's custom
  metrics, given the state after its last step and that step's view.

The state rides in the rollout carry (`carry.callbacks`): an episode cut across
`sample()` calls keeps it and is measured once, whole; it is part of `get_state()` /
checkpoints (the `env_runner_carry` component); a failed sub-env's episode (recreated with
`restart_failed_sub_environments`) is dropped with its state, and its metrics are never
written. The metrics of counted episodes are written once per chunk, after the scan, into
a device ring of the last `W` episodes (`CustomRegisters`) and summed into the chunk's
`ChunkInfo.custom_metric_sums`; the host reduces them (`jaxrunner.metrics.custom`).

Everything here is pure JAX: no Ray, no host I/O, no Python randomness. When no device
callback is configured nothing of this module is traced: the chunk is the same program.

Shapes: `T` chunk length, `B` sub-envs, `K` custom metrics, `W` custom-metric window.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import struct

from jaxrunner.core.final_obs import EndRows
from jaxrunner.core.ring import RingInput, RingUpdate, locate_writes

REDUCTIONS = ("mean", "min", "max", "sum")


class CallbackError(ValueError):
    """A configured callback cannot be used: not traceable, wrong outputs, or a state
    whose structure changes. The message names the callback."""


@struct.dataclass
class EpisodeStart:
    """What `on_episode_start` sees of one sub-env's new episode.

    `obs`: the episode's first observation (single-agent: `obs_shape`; multi-agent:
    `{agent_id: obs}` of every agent)."""

    obs: Any


@struct.dataclass
class StepView:
    """One env step of one sub-env, as `on_episode_step` / `on_episode_end` see it.

    Single-agent: `obs` the observation the action was taken on, `action` the module's
    action (before clipping to the env), `reward` () float32, `terminated` / `truncated`
    () bool, `next_obs` the next observation before any auto-reset, `info` the env's info
    dict (this sub-env's entries), `extra_model_outputs` {"action_logp": (),
    "action_dist_inputs": (D,), ...}. Multi-agent: the same fields as dicts keyed by agent
    id (`reward`, `terminated`, `truncated` per agent, the episode's flags under
    `"__all__"`; `action` / `extra_model_outputs` hold the agents that acted, zeros for the
    others) plus `acting` {agent_id: () bool}."""

    obs: Any
    action: Any
    reward: Any
    terminated: Any
    truncated: Any
    next_obs: Any
    info: Any
    extra_model_outputs: Any
    acting: Any = None


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """How a custom metric reduces, as RLlib's `MetricsLogger.log_value` does.

    `reduce`: "mean", "min", "max" or "sum". `window`: the number of most recent episodes
    reduced over (None: the episode smoothing window for mean/min/max; for "sum" None means
    no window). `clear_on_reduce` (sum without window only): report the sum since the last
    `get_metrics()` instead of the lifetime sum."""

    reduce: str = "mean"
    window: int | None = None
    clear_on_reduce: bool = False

    def __post_init__(self):
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {list(REDUCTIONS)}, got {self.reduce!r}.")
        if self.window is not None and (isinstance(self.window, bool)
                                        or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"window must be an int >= 1 or None, got {self.window!r}.")
        if self.clear_on_reduce and (self.reduce != "sum" or self.window is not None):
            raise ValueError("clear_on_reduce applies to reduce='sum' without a window only "
                             f"(got reduce={self.reduce!r}, window={self.window!r}).")

    @classmethod
    def coerce(cls, name: str, value: Any) -> "MetricSpec":
        """A `MetricSpec` from a spec, a reduce name or a dict of its fields."""
        if isinstance(value, MetricSpec):
            return value
        try:
            if isinstance(value, str):
                return cls(reduce=value)
            if isinstance(value, Mapping):
                return cls(**dict(value))
        except (TypeError, ValueError) as error:
            raise ValueError(f"custom_metrics[{name!r}]: {error}") from error
        raise TypeError(f"custom_metrics[{name!r}] must be a reduce name {list(REDUCTIONS)}, "
                        f"a dict(reduce=..., window=..., clear_on_reduce=...) or a "
                        f"jaxrunner.MetricSpec, got {value!r}.")


@struct.dataclass
class CustomRegisters:
    """The last `W` counted episodes' custom metrics (a ring, oldest overwritten)."""

    values: jax.Array  # (W, K) float32
    next: jax.Array  # () int32: slot the next episode is written to
    size: jax.Array  # () int32: filled slots (<= W)

    @classmethod
    def create(cls, window: int, num_metrics: int) -> "CustomRegisters":
        return cls(values=jnp.zeros((window, num_metrics), jnp.float32),
                   next=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))


@struct.dataclass
class CallbackCarry:
    """The callbacks' part of the rollout carry."""

    state: Any  # user state, leaves (B, ...)
    registers: CustomRegisters


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _describe(tree: Any) -> str:
    return str(jax.tree.map(lambda x: f"{jnp.dtype(x.dtype).name}{list(jnp.shape(x))}", tree))


def _no_state(start: EpisodeStart) -> tuple:
    return ()


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceCallbacks:
    """The device callbacks of a runner (see the module docstring). Built from
    `config.callbacks(on_episode_start=..., on_episode_step=..., on_episode_end=...,
    custom_metrics=...)`.

    `metrics` maps each name `on_episode_end` returns to its `MetricSpec` (names left out
    of `custom_metrics` reduce by mean over the episode window); their order is the
    order of the `K` axis of the registers. Compared by identity (a compile-cache key)."""

    on_episode_start: Callable | None
    on_episode_step: Callable | None
    on_episode_end: Callable
    custom_metrics: Mapping[str, MetricSpec]
    window: int  # W: ring slots (>= every metric's per-runner window)
    names: tuple[str, ...] = ()  # filled by `bind`

    # ------------------------------------------------------------------ user calls
    def _call(self, event: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except CallbackError:
            raise
        except Exception as error:  # noqa: BLE001 - re-raised with the callback's name
            raise CallbackError(
                f"The device callback {event}={_fn_name(fn)} failed while being traced "
                f"into the compiled rollout ({type(error).__name__}: {error}). Device "
                "callbacks must be pure JAX functions of one sub-env's arrays: use "
                "jnp/jax.lax ops, no Python control flow on array values (jnp.where, "
                "jax.lax.cond), no host I/O or numpy conversion."
            ) from error

    def start_one(self, start: EpisodeStart) -> Any:
        fn = self.on_episode_start or _no_state
        state = self._call("on_episode_start", fn, start)
        self._check_arrays("on_episode_start", fn, state, "state")
        return jax.tree.map(lambda x: jnp.asarray(x), state)

    def step_one(self, state: Any, view: StepView) -> Any:
        if self.on_episode_step is None:
            return state
        fn = self.on_episode_step
        new = self._call("on_episode_step", fn, state, view)
        self._check_arrays("on_episode_step", fn, new, "state")
        same = jax.tree.structure(new) == jax.tree.structure(state) and all(
            jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
            for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state)))
        if not same:
            raise CallbackError(
                f"The device callback on_episode_step={_fn_name(fn)} changed its state's "
                f"structure: it got {_describe(state)} (from on_episode_start) and returned "
                f"{_describe(new)}. Return a state with the same structure, shapes and "
                "dtypes (cast with .astype, e.g. jnp.maximum(s, x).astype(s.dtype)).")
        return new

    def end_one(self, state: Any, view: StepView) -> jax.Array:
        """`(K,)` float32 metric values of one sub-env's episode ending at `view`."""
        fn = self.on_episode_end
        out = self._call("on_episode_end", fn, state, view)
        if not isinstance(out, Mapping) or not all(isinstance(k, str) for k in out):
            raise CallbackError(
                f"The device callback on_episode_end={_fn_name(fn)} must return a dict "
                f"{{metric name (str): scalar}}, got {type(out).__name__}: {out!r}.")
        if tuple(sorted(out)) != self.names:
            raise CallbackError(
                f"The device callback on_episode_end={_fn_name(fn)} returned the metrics "
                f"{sorted(out)}, expected {list(self.names)} (the names it returned when "
                "the runner was built): return the same names on every path.")
        values = []
        for name in self.names:
            value = out[name]
            self._check_arrays("on_episode_end", fn, value, f"metric {name!r}")
            if jnp.shape(value) != ():
                raise CallbackError(
                    f"The device callback on_episode_end={_fn_name(fn)} returned metric "
                    f"{name!r} of shape {jnp.shape(value)}; each metric must be a scalar "
                    "(shape ()) per episode, e.g. jnp.max(x) or x.sum().")
            if not (jnp.issubdtype(jnp.result_type(value), jnp.number)
                    or jnp.result_type(value) == jnp.bool_):
                raise CallbackError(
                    f"The device callback on_episode_end={_fn_name(fn)} returned metric "
                    f"{name!r} of dtype {jnp.result_type(value)}; metrics must be numbers.")
            values.append(jnp.asarray(value).astype(jnp.float32))
        return jnp.stack(values) if values else jnp.zeros((0,), jnp.float32)

    def _check_arrays(self, event: str, fn: Callable, tree: Any, what: str) -> None:
        for leaf in jax.tree.leaves(tree):
            if not isinstance(leaf, (jax.Array, int, float, bool)) and not hasattr(leaf,
                                                                                    "dtype"):
                raise CallbackError(
                    f"The device callback {event}={_fn_name(fn)} returned a {what} holding "
                    f"{type(leaf).__name__} {leaf!r}; only JAX arrays and numbers can live "
                    "in the compiled rollout.")

    # ------------------------------------------------------------------ binding
    def bind(self, start: EpisodeStart, view: StepView) -> "DeviceCallbacks":
        """The callbacks with `names` read from tracing them on one sub-env's
        `ShapeDtypeStruct`s (raises `CallbackError` naming the callback on any problem)."""
        def probe(start, view):
            state = self.start_one(start)
            state = self.step_one(state, view)
            return self._call("on_episode_end", self.on_episode_end, state, view)

        out = jax.eval_shape(probe, start, view)
        if not isinstance(out, Mapping) or not out or not all(isinstance(k, str) for k in out):
            raise CallbackError(
                f"The device callback on_episode_end={_fn_name(self.on_episode_end)} must "
                f"return a non-empty dict {{metric name (str): scalar}}, got {out!r}.")
        names = tuple(sorted(out))
        unknown = sorted(set(self.custom_metrics) - set(names))
        if unknown:
            raise CallbackError(
                f"custom_metrics names {unknown}, which on_episode_end="
                f"{_fn_name(self.on_episode_end)} does not return (it returns {list(names)}).")
        bound = dataclasses.replace(self, names=names)
        jax.eval_shape(lambda s, v: bound.end_one(bound.step_one(bound.start_one(s), v), v),
                       start, view)
        return bound

    # ------------------------------------------------------------------ in the chunk
    def init(self, obs: Any) -> CallbackCarry:
        """The carry part for `B` new episodes starting at `obs` (leaves `(B, ...)`)."""
        return CallbackCarry(state=jax.vmap(self.start_one)(EpisodeStart(obs=obs)),
                             registers=CustomRegisters.create(self.window, len(self.names)))

    def restart(self, part: CallbackCarry, obs: Any) -> CallbackCarry:
        """Every sub-env starts a new episode (episodes in progress are abandoned)."""
        return part.replace(state=jax.vmap(self.start_one)(EpisodeStart(obs=obs)))

    def step(self, part: CallbackCarry, view: StepView, ended: jax.Array,
             next_obs: Any) -> tuple[CallbackCarry, jax.Array]:
        """One vector step: `(new part, (B, K) values of the episodes ending here)`.

        `view` leaves `(B, ...)`; `ended` (B,) bool (done or failed); `next_obs` the
        observations after auto-reset (the first of the sub-envs' new episodes)."""
        state = jax.vmap(self.step_one)(part.state, view)
        values = jax.vmap(self.end_one)(state, view)
        fresh = jax.vmap(self.start_one)(EpisodeStart(obs=next_obs))
        state = jax.tree.map(
            lambda new, old: jnp.where(ended.reshape((-1,) + (1,) * (old.ndim - 1)), new, old),
            fresh, state)
        return part.replace(state=state), values

    def write(self, part: CallbackCarry, ring: RingInput, values: jax.Array,
              episodes_limit: jax.Array, episode_ring: RingUpdate | None = None
              ) -> tuple[CallbackCarry, jax.Array]:
        """Writes the counted episode ends of a chunk (`ring.done` at taken steps, in
        (t, b) order, at most `episodes_limit`, as the metric ring counts them) from
        `values`: `(T, B, K)` per step, or `EndRows` (a row store's episode-end rows with
        their `(S, K)` values); returns the new part and the `(K,)` sum of their values.

        `episode_ring`: the metric ring's update for the same `ring`; when its window is
        this ring's, its write positions are reused (no second search)."""
        regs = part.registers
        window = regs.values.shape[0]
        done = ring.done  # False at the steps not taken (`RingInput`)
        writes = (episode_ring.writes if episode_ring is not None
                  and episode_ring.writes.rank.shape[0] == window
                  else locate_writes(done, window, episodes_limit))
        _, num_new, rank, positions, last_counted = writes
        done_flat = done.reshape(-1)
        if isinstance(values, EndRows):
            # Only the steps that ended an episode hold values, ascending by position.
            used = values.index >= 0
            at = jnp.where(used, values.index, 0)
            counted = used & done_flat[at] & (values.index <= last_counted)
            sums = jnp.sum(jnp.where(counted[:, None], values.values, 0.0), axis=0)
            keys = jnp.where(used, values.index, jnp.iinfo(jnp.int32).max)
            rows = jnp.minimum(jnp.searchsorted(keys, positions), keys.shape[0] - 1)
            written = values.values[rows]
        else:
            flat = values.reshape((-1, values.shape[-1]))
            index = jnp.arange(flat.shape[0], dtype=jnp.int32)
            counted = done_flat & (index <= last_counted)
            sums = jnp.sum(jnp.where(counted[:, None], flat, 0.0), axis=0)
            written = flat[positions]
        slot = jnp.where(rank >= 1, (regs.next + rank - 1) % window, window)
        regs = regs.replace(
            values=regs.values.at[slot].set(written, mode="drop"),
            next=(regs.next + num_new) % window,
            size=jnp.minimum(regs.size + num_new, window))
        return part.replace(registers=regs), sums


def per_env_struct(tree: Any) -> Any:
    """`ShapeDtypeStruct`s of one sub-env's slice of `(B, ...)` leaves."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape[1:]), x.dtype), tree)


def batched_info(info: Mapping, num_envs: int) -> dict:
    """The env's info dict with every leaf given a leading `(B,)` axis (leaves the env
    returns per vector step are broadcast), so the view can be vmapped."""
    def batch(x):
        x = jnp.asarray(x)
        if x.ndim >= 1 and x.shape[0] == num_envs:
            return x
        return jnp.broadcast_to(x, (num_envs,) + x.shape)

    return jax.tree.map(batch, dict(info))


__all__ = ["CallbackCarry", "CallbackError", "CustomRegisters", "DeviceCallbacks",
           "EpisodeStart", "MetricSpec", "REDUCTIONS", "StepView", "batched_info",
           "per_env_struct"]
