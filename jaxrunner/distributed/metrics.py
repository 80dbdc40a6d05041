"""Merging the metrics of several runners into one RLlib-style metrics dict.

Each runner reports `get_metrics()` (RLlib's keys) and the raw contents of its smoothing
window (`get_metrics_window()`: return, length and duration of each episode in it; a
multi-agent runner adds `agent_episode_return` and `module_episode_return`, the returns in
its per-agent and per-module windows). Episode statistics are recomputed from the union
of the windows, so a mean (overall, per agent, per module) is over all episodes of all
runners, never a mean of per-runner means. Counters since the last call are summed (per
agent and per module too); timers are averaged over runners; lifetime counters are kept
by the group (`GroupCounters`) as sums of those per-call counts, so a restarted runner
that starts counting from its restored value neither loses nor double-counts steps.
Custom metrics (device callbacks and host `log_value`s, `window["custom_metrics"]`) merge
by `jaxrunner.metrics.custom.merge_exports`: pooled windows, summed per-call sums.

Also RLlib's two Ray metrics counters of an env runner (`RayStepCounters`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Sequence

import numpy as np

from jaxrunner.metrics import keys
from jaxrunner.metrics.custom import merge_exports
from jaxrunner.metrics.logger import episode_window_metrics

_SUMMED = (keys.NUM_ENV_STEPS_SAMPLED, keys.NUM_EPISODES, keys.NUM_ENV_STEPS_DISCARDED,
           keys.NUM_ENV_STEP_FAILURES)
_AVERAGED = (keys.SAMPLE_TIMER, keys.TIME_BETWEEN_SAMPLING)


@dataclasses.dataclass
class GroupCounters:
    """Lifetime counters of the whole group, summed from per-call deltas."""

    env_steps: int = 0
    episodes: int = 0
    env_steps_discarded: int = 0
    agent_steps: dict[str, int] = dataclasses.field(default_factory=dict)  # {agent_id: steps}
    module_steps: dict[str, int] = dataclasses.field(default_factory=dict)  # {module_id: steps}
    custom: dict[str, float] = dataclasses.field(default_factory=dict)  # {metric: lifetime sum}
    last_time: float = dataclasses.field(default_factory=time.perf_counter)


def _sum_dicts(dicts: Sequence[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


_EPISODE_WINDOW = ("episode_return", "episode_len", "episode_duration_sec")
_PER_ID_WINDOWS = {"agent_episode_return": keys.AGENT_EPISODE_RETURN_MEAN,
                   "module_episode_return": keys.MODULE_EPISODE_RETURN_MEAN}


def merge_windows(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The union of several runners' smoothing windows: each of `episode_return`,
    `episode_len`, `episode_duration_sec` concatenated (`(sum n_i,)`), and, where runners
    report them, `agent_episode_return` / `module_episode_return` as
    `{id: concatenation over the runners that have id}`."""
    out: dict[str, Any] = {}
    for name in _EPISODE_WINDOW:
        out[name] = np.concatenate([np.asarray(w[name]) for w in windows] or [np.zeros(0)])
    for name in _PER_ID_WINDOWS:
        per_id: dict[str, list[np.ndarray]] = {}
        for window in windows:
            for id_, values in (window.get(name) or {}).items():
                per_id.setdefault(id_, []).append(np.asarray(values, np.float64))
        if any(name in window for window in windows):
            out[name] = {id_: np.concatenate(parts) for id_, parts in per_id.items()}
    return out


def _add(total: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    for id_, value in counts.items():
        total[id_] = total.get(id_, 0) + int(value)
    return dict(total)


def aggregate(parts: Sequence[tuple[dict[str, Any], dict[str, Any]]],
              counters: GroupCounters) -> dict[str, Any]:
    """One metrics dict from `(metrics, window)` of each runner; updates `counters`.

    Per-agent and per-module episode return means come from the pooled per-id windows when
    the runners report them (multi-agent), else `episode_window_metrics`' default ids
    (single-agent); an id without any episode in any window is left out, as a runner does.
    """
    metrics = [m for m, _ in parts]
    merged = merge_windows([w for _, w in parts])
    out: dict[str, Any] = episode_window_metrics(merged)
    for name, key in _PER_ID_WINDOWS.items():
        if name not in merged:
            continue
        means = {id_: float(values.mean()) for id_, values in merged[name].items()
                 if len(values)}
        out.pop(key, None)
        if means:
            out[key] = means
    for key in _SUMMED:
        out[key] = int(sum(m.get(key, 0) for m in metrics))
    now = time.perf_counter()
    counters.env_steps += out[keys.NUM_ENV_STEPS_SAMPLED]
    counters.episodes += out[keys.NUM_EPISODES]
    counters.env_steps_discarded += out[keys.NUM_ENV_STEPS_DISCARDED]
    elapsed = max(now - counters.last_time, 1e-9)
    counters.last_time = now
    steps = out[keys.NUM_ENV_STEPS_SAMPLED]
    agent_steps = _sum_dicts([m.get(keys.NUM_AGENT_STEPS_SAMPLED, {}) for m in metrics])
    module_steps = _sum_dicts([m.get(keys.NUM_MODULE_STEPS_SAMPLED, {}) for m in metrics])
    out.update({
        keys.NUM_ENV_STEPS_SAMPLED_LIFETIME: counters.env_steps,
        keys.NUM_ENV_STEPS_SAMPLED_LIFETIME_THROUGHPUT: steps / elapsed,
        keys.NUM_EPISODES_LIFETIME: counters.episodes,
        keys.NUM_ENV_STEPS_DISCARDED_LIFETIME: counters.env_steps_discarded,
        keys.NUM_AGENT_STEPS_SAMPLED: agent_steps,
        keys.NUM_MODULE_STEPS_SAMPLED: module_steps,
        keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME: _add(counters.agent_steps, agent_steps),
        keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME: _add(counters.module_steps, module_steps),
    })
    for key in _AVERAGED:
        values = [m[key] for m in metrics if key in m]
        if values:
            out[key] = float(np.mean(values))
    exports = [w["custom_metrics"] for _, w in parts if w.get("custom_metrics")]
    if exports:
        out.update(merge_exports(exports, counters.custom))
    seqs = [m[keys.WEIGHTS_SEQ_NO] for m in metrics if keys.WEIGHTS_SEQ_NO in m]
    if seqs:
        out[keys.WEIGHTS_SEQ_NO] = max(seqs)
    return out




# ---------------------------------------------------------------------- Ray metrics
TRY_ENV_STEP_COUNTER = "rllib_env_runner_num_try_env_step_counter"
ENV_STEPS_SAMPLED_COUNTER = "rllib_env_runner_num_env_steps_sampled_counter"


class RayStepCounters:
    """RLlib's two EnvRunner counters (`ray.util.metrics.Counter`, exported by Ray's
    metrics agent as Prometheus counters), tagged `rllib=<runner class name>`:
    `rllib_env_runner_num_try_env_step_counter` counts `env.step()` calls attempted (one
    per vector step of the sub-envs, as RLlib counts its vector env's steps) and
    `rllib_env_runner_num_env_steps_sampled_counter` the env steps sampled."""

    def __init__(self, runner_class_name: str):
        from ray.util.metrics import Counter

        tags = {"rllib": runner_class_name}
        self.try_env_step = Counter(
            TRY_ENV_STEP_COUNTER,
            description="Number of env.step() calls attempted in this Env Runner.",
            tag_keys=("rllib",))
        self.try_env_step.set_default_tags(tags)
        self.env_steps_sampled = Counter(
            ENV_STEPS_SAMPLED_COUNTER,
            description="Number of env steps sampled in this Env Runner.",
            tag_keys=("rllib",))
        self.env_steps_sampled.set_default_tags(tags)

    def record(self, *, vector_steps: int, env_steps: int) -> None:
        """Books one `sample()` call."""
        if vector_steps > 0:
            self.try_env_step.inc(vector_steps)
        if env_steps > 0:
            self.env_steps_sampled.inc(env_steps)


def ray_step_counters(runner_class_name: str) -> RayStepCounters | None:
    """The counters when this process has Ray initialised (a group actor always has),
    else None. Never imports Ray itself: a process that did not import Ray has none."""
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    return RayStepCounters(runner_class_name)


__all__ = ["ENV_STEPS_SAMPLED_COUNTER", "GroupCounters", "RayStepCounters",
           "TRY_ENV_STEP_COUNTER", "aggregate", "merge_windows", "ray_step_counters"]
