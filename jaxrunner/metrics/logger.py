"""Host side of the metrics: counters, timers and the reduction of the device registers
into RLlib's metric keys."""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np

from jaxrunner.metrics import keys

DEFAULT_AGENT_ID = "default_agent"
DEFAULT_MODULE_ID = "default_policy"
_EMA_COEFF = 0.01  # RLlib's default EMA coefficient for timers
_MAX_CALLS_REMEMBERED = 100_000



def episode_window_metrics(window: dict[str, np.ndarray]) -> dict[str, Any]:
    """RLlib's episode keys (means, minima, maxima) over a window of finished episodes
    (`RunnerMetrics.window_values`, or several runners' windows joined); `{}` if empty."""
    returns, lengths = window["episode_return"], window["episode_len"]
    if not len(returns):
        return {}
    mean_return = float(returns.mean())
    return {
        keys.EPISODE_RETURN_MEAN: mean_return,
        keys.EPISODE_RETURN_MIN: float(returns.min()),
        keys.EPISODE_RETURN_MAX: float(returns.max()),
        keys.EPISODE_LEN_MEAN: float(lengths.mean()),
        keys.EPISODE_LEN_MIN: int(lengths.min()),
        keys.EPISODE_LEN_MAX: int(lengths.max()),
        keys.EPISODE_DURATION_SEC_MEAN: float(window["episode_duration_sec"].mean()),
        keys.AGENT_EPISODE_RETURN_MEAN: {DEFAULT_AGENT_ID: mean_return},
        keys.MODULE_EPISODE_RETURN_MEAN: {DEFAULT_MODULE_ID: mean_return},
    }

class _Ema:
    def __init__(self):
        self.value: float | None = None

    def push(self, value: float) -> None:
        self.value = value if self.value is None else (
            (1.0 - _EMA_COEFF) * self.value + _EMA_COEFF * value)


class RunnerMetrics:
    """Counters kept as Python ints (no overflow) and the reduction to RLlib's keys.

    Episode statistics live on the device (`MetricRegisters`); `reduce()` receives the
    registers already on the host and turns them into the smoothed episode keys.
    Episode durations are wall-clock times from the episode's first to its last step,
    interpolated from the start and end times of the `sample()` calls its steps fell in.
    """

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.env_steps_lifetime = 0
        self.episodes_lifetime = 0
        self.env_step_failures_lifetime = 0
        self.env_steps_discarded_lifetime = 0
        self.vector_steps_lifetime = 0
        self.weights_seq_no = 0
        self._env_steps = 0
        self._env_steps_discarded = 0
        self._episodes_seen_on_device = 0  # device counter value at the last reduce (mod 2**32)
        self._sample_timer = _Ema()
        self._between_timer = _Ema()
        self._last_sample_end: float | None = None
        self._last_reduce_time = time.perf_counter()
        self._lifetime_at_last_reduce = 0
        # (first vector step, last vector step, start time, end time) of recent calls.
        self._calls: collections.deque = collections.deque(maxlen=_MAX_CALLS_REMEMBERED)

    def record_sample(self, *, vector_steps: int, env_steps: int, discarded_env_steps: int,
                      start_time: float, end_time: float) -> None:
        """Books one `sample()` call."""
        if self._last_sample_end is not None:
            self._between_timer.push(start_time - self._last_sample_end)
        self._last_sample_end = end_time
        self._sample_timer.push(end_time - start_time)
        if vector_steps > 0:
            self._calls.append((self.vector_steps_lifetime,
                                self.vector_steps_lifetime + vector_steps,
                                start_time, end_time))
        self.vector_steps_lifetime += vector_steps
        self._env_steps += env_steps
        self.env_steps_lifetime += env_steps
        self._env_steps_discarded += discarded_env_steps
        self.env_steps_discarded_lifetime += discarded_env_steps

    def _time_of_vector_step(self, steps: np.ndarray) -> np.ndarray:
        """Wall time at which `steps` vector steps had been taken (interpolated per call)."""
        if not self._calls:
            return np.zeros_like(steps, dtype=np.float64)
        calls = np.asarray(self._calls, dtype=np.float64)
        first, last, t0, t1 = calls.T
        idx = np.clip(np.searchsorted(first, steps, side="right") - 1, 0, len(first) - 1)
        span = np.maximum(last[idx] - first[idx], 1.0)
        frac = np.clip((steps - first[idx]) / span, 0.0, 1.0)
        return t0[idx] + frac * (t1[idx] - t0[idx])

    def reduce(self, registers: Any) -> dict[str, Any]:
        """RLlib's metrics dict from host copies of the device `MetricRegisters`."""
        out = episode_window_metrics(self.window_values(registers))
        device_count = int(registers.episodes)
        new_episodes = (device_count - self._episodes_seen_on_device) % 2**32
        self._episodes_seen_on_device = device_count
        self.episodes_lifetime += new_episodes
        now = time.perf_counter()
        elapsed = max(now - self._last_reduce_time, 1e-9)
        throughput = (self.env_steps_lifetime - self._lifetime_at_last_reduce) / elapsed
        self._last_reduce_time = now
        self._lifetime_at_last_reduce = self.env_steps_lifetime
        out.update({
            keys.NUM_ENV_STEPS_SAMPLED: self._env_steps,
            keys.NUM_ENV_STEPS_SAMPLED_LIFETIME: self.env_steps_lifetime,
            keys.NUM_ENV_STEPS_SAMPLED_LIFETIME_THROUGHPUT: throughput,
            keys.NUM_AGENT_STEPS_SAMPLED: {DEFAULT_AGENT_ID: self._env_steps},
            keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME: {DEFAULT_AGENT_ID: self.env_steps_lifetime},
            keys.NUM_MODULE_STEPS_SAMPLED: {DEFAULT_MODULE_ID: self._env_steps},
            keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME: {DEFAULT_MODULE_ID:
                                                     self.env_steps_lifetime},
            keys.NUM_EPISODES: new_episodes,
            keys.NUM_EPISODES_LIFETIME: self.episodes_lifetime,
            keys.NUM_ENV_STEP_FAILURES: self.env_step_failures_lifetime,
            keys.NUM_ENV_STEPS_DISCARDED: self._env_steps_discarded,
            keys.NUM_ENV_STEPS_DISCARDED_LIFETIME: self.env_steps_discarded_lifetime,
            keys.WEIGHTS_SEQ_NO: self.weights_seq_no,
        })
        if self._sample_timer.value is not None:
            out[keys.SAMPLE_TIMER] = self._sample_timer.value
        if self._between_timer.value is not None:
            out[keys.TIME_BETWEEN_SAMPLING] = self._between_timer.value
        self._env_steps = 0
        self._env_steps_discarded = 0
        return out

    def window_values(self, registers: Any) -> dict[str, np.ndarray]:
        """The episodes in the smoothing window as host arrays (ring order), for merging
        the windows of several runners into exact means: `episode_return` float64,
        `episode_len` int64 and `episode_duration_sec` float64, each `(window_size,)`."""
        size = int(registers.window_size)
        returns = np.asarray(registers.window_return[:size], np.float64)
        lengths = np.asarray(registers.window_len[:size], np.int64)
        now_mod = self.vector_steps_lifetime % 2**32
        end_mod = np.asarray(registers.window_end_step[:size], np.int64)
        end = self.vector_steps_lifetime - ((now_mod - end_mod) % 2**32)
        durations = (self._time_of_vector_step(end.astype(np.float64))
                     - self._time_of_vector_step((end - lengths).astype(np.float64)))
        return {"episode_return": returns, "episode_len": lengths,
                "episode_duration_sec": np.asarray(durations, np.float64)}

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, int]:
        return {"episodes_lifetime": self.episodes_lifetime,
                "vector_steps_lifetime": self.vector_steps_lifetime,
                "episodes_seen_on_device": self._episodes_seen_on_device,
                "env_step_failures_lifetime": self.env_step_failures_lifetime,
                "env_steps_discarded_lifetime": self.env_steps_discarded_lifetime,
                # Sampled since the last get_metrics() (reported by the next one).
                "env_steps_unreported": self._env_steps,
                "env_steps_discarded_unreported": self._env_steps_discarded}

    def set_state(self, state: dict[str, int]) -> None:
        self.episodes_lifetime = int(state["episodes_lifetime"])
        self.vector_steps_lifetime = int(state["vector_steps_lifetime"])
        self._episodes_seen_on_device = int(state["episodes_seen_on_device"])
        self.env_step_failures_lifetime = int(state["env_step_failures_lifetime"])
        self.env_steps_discarded_lifetime = int(state.get("env_steps_discarded_lifetime", 0))
        self._env_steps = int(state.get("env_steps_unreported", 0))
        self._env_steps_discarded = int(state.get("env_steps_discarded_unreported", 0))
