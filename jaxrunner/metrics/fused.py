"""Host reduction of a fused loop's metrics (`jaxrunner.SampleMetrics`) into RLlib's keys.

`Sampler.sample()` returns a `SampleMetrics` per call; stacked by `lax.scan` over
iterations and/or `jax.vmap` over seeds it has leading axes `S`. `reduce_sample_metrics`
gives the keys `runner.get_metrics()` gives (the smoothed episode keys over the ring's
window, the call's and the lifetime step and episode counters), as Python numbers for one
call and as numpy arrays of shape `S` for a stack: one array per key, one entry per seed /
iteration. Wall-clock keys (timers, throughput, episode durations) need the host and are
absent; an empty window gives NaN episode keys in a stack and no episode keys for one call.

With device callbacks, `custom_metrics=sampler.custom_metrics` (or `sampler.reduce_metrics`)
adds their keys, reduced as `runner.get_metrics()` reduces them (`jaxrunner.MetricSpec`):
mean / min / max / windowed sums over the ring's last `window` episodes (the same values
in the same order, so the same float64 result), lifetime sums from the device's
`(hi, lo)` pair, and "since the last report" sums (`clear_on_reduce=True`) as the call's
own sum: each fused call is one report, as `num_env_steps_sampled` is the call's steps.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from jaxrunner.core.callbacks import MetricSpec
from jaxrunner.metrics import keys
from jaxrunner.metrics.custom import reduce_values, ring_window_values
from jaxrunner.metrics.logger import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID

_MOD = 2**32


def _window_stats(registers: Any, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Mean / min / max of the ring's filled slots, shape `lead` (NaN where empty)."""
    size = np.asarray(registers.window_size, np.int64)
    returns = np.asarray(registers.window_return, np.float64)
    lengths = np.asarray(registers.window_len, np.float64)
    filled = np.arange(returns.shape[-1]) < size[..., None]
    count = filled.sum(-1)
    empty = count == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        def stats(x):
            mean = np.where(filled, x, 0.0).sum(-1) / np.where(empty, 1, count)
            low = np.where(filled, x, np.inf).min(-1)
            high = np.where(filled, x, -np.inf).max(-1)
            return tuple(np.where(empty, np.nan, v) for v in (mean, low, high))

        r, l_ = stats(returns), stats(lengths)
    return {keys.EPISODE_RETURN_MEAN: r[0], keys.EPISODE_RETURN_MIN: r[1],
            keys.EPISODE_RETURN_MAX: r[2], keys.EPISODE_LEN_MEAN: l_[0],
            keys.EPISODE_LEN_MIN: l_[1], keys.EPISODE_LEN_MAX: l_[2], "_empty": empty}


def _ring_means(registers: Any, ids: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per id (axis -2 of the stacked rings) the mean return, NaN where empty."""
    size = np.asarray(registers.window_size, np.int64)  # (..., N)
    returns = np.asarray(registers.window_return, np.float64)  # (..., N, W)
    filled = np.arange(returns.shape[-1]) < size[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(filled, returns, 0.0).sum(-1) / size
    return {name: np.where(size[..., i] > 0, means[..., i], np.nan)
            for i, name in enumerate(ids)}


def _custom_keys(m: Any, specs: Mapping[str, MetricSpec], lead: tuple[int, ...]
                 ) -> dict[str, np.ndarray]:
    """`{name: float64 array of shape lead}` of the device callbacks' metrics (NaN where
    a mean / min / max had no episode yet), each entry reduced by `reduce_values` over the
    window's values oldest first, as the runner's `DeviceMetrics.reduce`."""
    regs = m.custom_registers  # leaves (*lead, ...): values (*lead, W, K)
    lifetime = (np.asarray(m.custom_lifetime_hi, np.float64)
                + np.asarray(m.custom_lifetime_lo, np.float64))  # (*lead, K)
    call = np.asarray(m.custom_sums, np.float32).astype(np.float64)  # (*lead, K)
    names = list(specs)
    if np.shape(regs.values)[-1] != len(names):
        raise ValueError(
            f"reduce_sample_metrics: the metrics hold {np.shape(regs.values)[-1]} "
            f"device-callback metrics, custom_metrics names {len(names)} ({names}): pass "
            "the custom_metrics of the sampler that produced them (sampler.custom_metrics).")
    windows = [spec.window for spec in specs.values()]
    out = {name: np.full(lead, np.nan) for name in names}
    for index in np.ndindex(*lead):
        ring = ring_window_values(jax.tree.map(lambda x: np.asarray(x)[index], regs), windows)
        for k, (name, spec) in enumerate(specs.items()):
            value = reduce_values(spec, ring[k], float(lifetime[index + (k,)]),
                                  float(call[index + (k,)]))
            if value is not None:
                out[name][index] = value
    return out


def reduce_sample_metrics(metrics: Any, *, agent_ids: tuple[str, ...] = (),
                          module_ids: tuple[str, ...] = (),
                          custom_metrics: Mapping[str, MetricSpec] | None = None
                          ) -> dict[str, Any]:
    """RLlib's metric keys from a `SampleMetrics` (device or host arrays).

    Args:
        metrics: one call's `SampleMetrics`, or a stack of them with leading axes `S`
            (`lax.scan` over iterations, `jax.vmap` over seeds).
        agent_ids, module_ids: a multi-agent sampler's `agent_ids` / `module_ids` (the
            per-agent and per-module keys are keyed by them).
        custom_metrics: the sampler's `custom_metrics` (`{name: MetricSpec}` with the
            runner's windows), needed when it has device callbacks: their keys are added
            (float64 arrays of shape `S` for a stack, NaN before a mean / min / max has an
            episode; floats for one call, absent then).

    Returns:
        For one call, the dict `runner.get_metrics()` returns for the same steps (less the
        wall-clock keys); for a stack, the same keys with numpy arrays of shape `S` (dict
        valued keys: `{id: array}`), episode keys NaN where no episode had finished.
    """
    from jaxrunner.sampler import SampleMetrics

    if not isinstance(metrics, SampleMetrics):
        raise TypeError(
            f"reduce_sample_metrics takes the SampleMetrics that Sampler.sample returns "
            f"(one call's, or stacked by lax.scan / jax.vmap), got {type(metrics).__name__}.")
    m = jax.device_get(metrics)
    lead = tuple(np.shape(m.num_env_steps))
    if m.custom_registers is not None and custom_metrics is None:
        raise ValueError(
            "reduce_sample_metrics: these metrics hold device-callback metrics "
            "(config.callbacks(on_episode_end=...)); pass "
            "custom_metrics=sampler.custom_metrics, or call sampler.reduce_metrics(metrics).")
    scalar = lead == ()
    stats = _window_stats(m.registers, lead)
    empty = stats.pop("_empty")
    lifetime = (np.asarray(m.env_steps_lifetime_hi, np.int64) * _MOD
                + np.asarray(m.env_steps_lifetime_lo, np.int64))
    env_steps = np.asarray(m.num_env_steps, np.int64)
    out: dict[str, Any] = dict(stats)
    multi = m.agent_registers is not None
    if multi:
        out[keys.AGENT_EPISODE_RETURN_MEAN] = _ring_means(m.agent_registers, agent_ids)
        out[keys.MODULE_EPISODE_RETURN_MEAN] = _ring_means(m.module_registers, module_ids)
        agent_steps = np.asarray(m.agent_steps, np.int64)
        module_steps = np.asarray(m.module_steps, np.int64)
        agent_life = np.asarray(m.agent_steps_lifetime, np.int64)
        module_life = np.asarray(m.module_steps_lifetime, np.int64)
        out[keys.NUM_AGENT_STEPS_SAMPLED] = {a: agent_steps[..., i]
                                             for i, a in enumerate(agent_ids)}
        out[keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME] = {a: agent_life[..., i]
                                                      for i, a in enumerate(agent_ids)}
        out[keys.NUM_MODULE_STEPS_SAMPLED] = {x: module_steps[..., i]
                                              for i, x in enumerate(module_ids)}
        out[keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME] = {x: module_life[..., i]
                                                       for i, x in enumerate(module_ids)}
    else:
        mean = stats[keys.EPISODE_RETURN_MEAN]
        out[keys.AGENT_EPISODE_RETURN_MEAN] = {DEFAULT_AGENT_ID: mean}
        out[keys.MODULE_EPISODE_RETURN_MEAN] = {DEFAULT_MODULE_ID: mean}
        out[keys.NUM_AGENT_STEPS_SAMPLED] = {DEFAULT_AGENT_ID: env_steps}
        out[keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME] = {DEFAULT_AGENT_ID: lifetime}
        out[keys.NUM_MODULE_STEPS_SAMPLED] = {DEFAULT_MODULE_ID: env_steps}
        out[keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME] = {DEFAULT_MODULE_ID: lifetime}
    out.update({
        keys.NUM_ENV_STEPS_SAMPLED: env_steps,
        keys.NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime,
        keys.NUM_EPISODES: np.asarray(m.num_episodes, np.int64),
        keys.NUM_EPISODES_LIFETIME: np.asarray(m.episodes_lifetime, np.int64),
        keys.NUM_ENV_STEP_FAILURES: np.asarray(m.failures_lifetime, np.int64),
        keys.NUM_ENV_STEPS_DISCARDED: np.asarray(m.num_env_steps_discarded, np.int64),
        keys.NUM_ENV_STEPS_DISCARDED_LIFETIME: np.asarray(m.discarded_lifetime, np.int64),
    })
    custom = ({} if m.custom_registers is None or not custom_metrics
              else _custom_keys(m, dict(custom_metrics), lead))
    if not scalar:
        out.update(custom)
        return out
    result = _to_python(out, bool(empty))
    result.update({name: float(v) for name, v in custom.items() if not np.isnan(v)})
    return result


_INT_KEYS = {keys.EPISODE_LEN_MIN, keys.EPISODE_LEN_MAX}
_EPISODE_KEYS = {keys.EPISODE_RETURN_MEAN, keys.EPISODE_RETURN_MIN, keys.EPISODE_RETURN_MAX,
                 keys.EPISODE_LEN_MEAN, keys.EPISODE_LEN_MIN, keys.EPISODE_LEN_MAX,
                 keys.AGENT_EPISODE_RETURN_MEAN, keys.MODULE_EPISODE_RETURN_MEAN}


def _to_python(out: dict[str, Any], empty: bool) -> dict[str, Any]:
    """One call's keys as Python numbers, in the runner's form (no episode keys while the
    window is empty; per-id means only for ids that have finished an episode)."""
    result: dict[str, Any] = {}
    for name, value in out.items():
        if name in _EPISODE_KEYS and empty and not isinstance(value, dict):
            continue
        if isinstance(value, dict):
            items = {k: v.item() for k, v in value.items()}
            if name in _EPISODE_KEYS:
                items = {k: float(v) for k, v in items.items() if not np.isnan(v)}
                if not items:
                    continue
            result[name] = items
        elif name in _INT_KEYS:
            result[name] = int(value)
        elif name in _EPISODE_KEYS:
            result[name] = float(value)
        else:
            result[name] = int(value)
    return result


__all__ = ["reduce_sample_metrics"]
