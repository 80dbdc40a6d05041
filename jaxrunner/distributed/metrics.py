"""Merging the metrics of several runners into one RLlib-style metrics dict.

Each runner reports `get_metrics()` (RLlib's keys) and the raw contents of its smoothing
window (`get_metrics_window()`: return, length and duration of each episode in it).
Episode statistics are recomputed from the union of the windows, so a mean is over all
episodes of all runners, never a mean of per-runner means. Counters since the last call
are summed; timers are averaged over runners; lifetime counters are kept by the group
(`GroupCounters`), so a restarted runner that starts counting from its restored value
neither loses nor double-counts steps.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from jaxrunner.metrics import keys
from jaxrunner.metrics.logger import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID, episode_window_metrics

_SUMMED = (keys.NUM_ENV_STEPS_SAMPLED, keys.NUM_EPISODES, keys.NUM_ENV_STEPS_DISCARDED,
           keys.NUM_ENV_STEP_FAILURES)
_AVERAGED = (keys.SAMPLE_TIMER, keys.TIME_BETWEEN_SAMPLING)


@dataclasses.dataclass
class GroupCounters:
    """Lifetime counters of the whole group, summed from per-call deltas."""

    env_steps: int = 0
    episodes: int = 0
    env_steps_discarded: int = 0
    last_time: float = dataclasses.field(default_factory=time.perf_counter)


def _sum_dicts(dicts: Sequence[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


def merge_windows(windows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The union of several runners' smoothing windows."""
    names = ("episode_return", "episode_len", "episode_duration_sec")
    return {name: np.concatenate([np.asarray(w[name]) for w in windows] or [np.zeros(0)])
            for name in names}


def aggregate(parts: Sequence[tuple[dict[str, Any], dict[str, np.ndarray]]],
              counters: GroupCounters) -> dict[str, Any]:
    """One metrics dict from `(metrics, window)` of each runner; updates `counters`."""
    metrics = [m for m, _ in parts]
    out: dict[str, Any] = episode_window_metrics(merge_windows([w for _, w in parts]))
    for key in _SUMMED:
        out[key] = int(sum(m.get(key, 0) for m in metrics))
    now = time.perf_counter()
    counters.env_steps += out[keys.NUM_ENV_STEPS_SAMPLED]
    counters.episodes += out[keys.NUM_EPISODES]
    counters.env_steps_discarded += out[keys.NUM_ENV_STEPS_DISCARDED]
    elapsed = max(now - counters.last_time, 1e-9)
    counters.last_time = now
    steps = out[keys.NUM_ENV_STEPS_SAMPLED]
    out.update({
        keys.NUM_ENV_STEPS_SAMPLED_LIFETIME: counters.env_steps,
        keys.NUM_ENV_STEPS_SAMPLED_LIFETIME_THROUGHPUT: steps / elapsed,
        keys.NUM_EPISODES_LIFETIME: counters.episodes,
        keys.NUM_ENV_STEPS_DISCARDED_LIFETIME: counters.env_steps_discarded,
        keys.NUM_AGENT_STEPS_SAMPLED: _sum_dicts(
            [m.get(keys.NUM_AGENT_STEPS_SAMPLED, {}) for m in metrics]),
        keys.NUM_MODULE_STEPS_SAMPLED: _sum_dicts(
            [m.get(keys.NUM_MODULE_STEPS_SAMPLED, {}) for m in metrics]),
        keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME: {DEFAULT_AGENT_ID: counters.env_steps},
        keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME: {DEFAULT_MODULE_ID: counters.env_steps},
    })
    for key in _AVERAGED:
        values = [m[key] for m in metrics if key in m]
        if values:
            out[key] = float(np.mean(values))
    seqs = [m[keys.WEIGHTS_SEQ_NO] for m in metrics if keys.WEIGHTS_SEQ_NO in m]
    if seqs:
        out[keys.WEIGHTS_SEQ_NO] = max(seqs)
    return out


__all__ = ["GroupCounters", "aggregate", "merge_windows"]
