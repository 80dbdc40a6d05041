"""Custom metrics on the host: RLlib's `MetricsLogger.log_value` reductions for the device
callbacks' per-episode metrics and for values host callbacks log.

Every custom metric of a runner is reported two ways: `get_metrics()` has its reduced
value under its name, beside RLlib's keys, and `get_metrics_window()` has its raw window
(`MetricExport`) so that `EnvRunnerGroup.get_metrics()` can merge several runners exactly
(`merge_exports`): mean/min/max and windowed sums over the pooled windows (each episode
counts once, never a mean of means), sums add.

Reductions (`jaxrunner.MetricSpec`):

* "mean" / "min" / "max": over the last `window` values (default: the episode smoothing
  window, `metrics_num_episodes_for_smoothing`, split between remote runners as RLlib
  splits it); absent until a value was logged.
* "sum" with a window: the sum of the last `window` values.
* "sum" without a window: the lifetime sum (RLlib's default `clear_on_reduce=False`), or
  with `clear_on_reduce=True` the sum since the last `get_metrics()`.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrunner.core.callbacks import MetricSpec
from jaxrunner.metrics import keys

RESERVED_NAMES = frozenset(v for k, v in vars(keys).items() if k.isupper())


def runner_window(spec: MetricSpec, episode_window: int, num_env_runners: int) -> int:
    """Values each runner keeps for `spec`: its window split over the remote runners
    (at least 1), or the episode window."""
    if spec.window is None:
        return episode_window
    return max(1, math.ceil(spec.window / max(1, num_env_runners)))


def check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{where}: a metric name must be a non-empty str, got {name!r}.")
    if name in RESERVED_NAMES or name in ("fault_tolerance", "env_runner_group"):
        raise ValueError(f"{where}: the metric name {name!r} is one of RLlib's own metric "
                         "keys in get_metrics(); choose another name.")


def reduce_values(spec: MetricSpec, values: np.ndarray, lifetime: float,
                  since_last: float) -> float | None:
    """The reported value of one metric (None: nothing to report yet)."""
    if spec.reduce == "sum" and spec.window is None:
        return float(since_last if spec.clear_on_reduce else lifetime)
    if not len(values):
        return 0.0 if spec.reduce == "sum" else None
    return float({"mean": np.mean, "min": np.min, "max": np.max,
                  "sum": np.sum}[spec.reduce](values))


def export(spec: MetricSpec, values: np.ndarray, delta: float) -> dict[str, Any]:
    """One metric's `get_metrics_window()` entry: its spec, window values and the sum
    its runner reported as new in its latest `get_metrics()`."""
    return {"reduce": spec.reduce, "window": spec.window,
            "clear_on_reduce": spec.clear_on_reduce,
            "values": np.asarray(values, np.float64), "delta": float(delta)}


def merge_exports(exports: Sequence[Mapping[str, dict]],
                  lifetime: dict[str, float]) -> dict[str, float]:
    """One value per metric from several runners' exports; `lifetime` ({name: sum}, the
    group's own lifetime sums of per-call deltas) is updated."""
    out: dict[str, float] = {}
    names = sorted({name for e in exports for name in e})
    for name in names:
        parts = [e[name] for e in exports if name in e]
        first = parts[0]
        spec = MetricSpec(first["reduce"], first["window"], first["clear_on_reduce"])
        delta = float(sum(p["delta"] for p in parts))
        lifetime[name] = lifetime.get(name, 0.0) + delta
        pooled = np.concatenate([np.asarray(p["values"], np.float64) for p in parts])
        value = reduce_values(spec, pooled, lifetime[name], delta)
        if value is not None:
            out[name] = value
    return out


class MetricsLogger:
    """What host callbacks log into: `log_value(key, value, reduce=..., window=...,
    clear_on_reduce=...)` as RLlib's `MetricsLogger` (see the module docstring for the
    reductions). `peek(key)` reads a reduced value without reporting it."""

    def __init__(self, episode_window: int = 100, num_env_runners: int = 0,
                 reserved: Sequence[str] = ()):
        self._episode_window = episode_window
        self._num_env_runners = num_env_runners
        self._reserved: set[str] = set()
        self._specs: dict[str, MetricSpec] = {}
        self._values: dict[str, collections.deque] = {}
        self._lifetime: dict[str, float] = {}
        self._since_last: dict[str, float] = {}
        self._last_delta: dict[str, float] = {}
        self.reserve(reserved)

    def reserve(self, names: Sequence[str]) -> None:
        """Refuses `names` (a runner's device callback metrics) in later `log_value`s; a
        name already logged here is an error (the two would share one key)."""
        clash = sorted(set(names) & set(self._specs))
        if clash:
            raise ValueError(f"The host metrics {clash} were logged before the device "
                             "callbacks' on_episode_end returned metrics of the same names; "
                             "log host values under other names.")
        self._reserved.update(names)

    def log_value(self, key: str, value: Any, reduce: str = "mean", window: int | None = None,
                  clear_on_reduce: bool = False) -> None:
        """Logs one value (a number or a 0-d / 1-element array)."""
        check_name(key, "log_value")
        if key in self._reserved:
            raise ValueError(f"log_value: {key!r} is a device callback metric of this runner "
                             "(from on_episode_end); log host values under another name.")
        spec = MetricSpec(reduce, window, clear_on_reduce)
        known = self._specs.get(key)
        if known is None:
            self._specs[key] = spec
            self._values[key] = collections.deque(
                maxlen=runner_window(spec, self._episode_window, self._num_env_runners))
            self._lifetime[key] = 0.0
            self._since_last[key] = 0.0
        elif known != spec:
            raise ValueError(f"log_value({key!r}): logged before with {known}, now with "
                             f"{spec}; a metric keeps its reduce, window and clear_on_reduce.")
        array = np.asarray(value, np.float64)
        if array.size != 1:
            raise ValueError(f"log_value({key!r}): value must be a single number, got shape "
                             f"{array.shape}.")
        number = float(array.reshape(()))
        self._values[key].append(number)
        self._lifetime[key] += number
        self._since_last[key] += number

    def peek(self, key: str) -> float | None:
        spec = self._specs[key]
        return reduce_values(spec, np.asarray(self._values[key]), self._lifetime[key],
                             self._since_last[key])

    def reduce(self) -> dict[str, float]:
        """The reduced values (what `get_metrics()` reports); starts a new reporting
        period for the since-last sums."""
        out = {}
        for key, spec in self._specs.items():
            value = reduce_values(spec, np.asarray(self._values[key]), self._lifetime[key],
                                  self._since_last[key])
            if value is not None:
                out[key] = value
        self._last_delta = dict(self._since_last)
        self._since_last = dict.fromkeys(self._since_last, 0.0)
        return out

    def exports(self) -> dict[str, dict]:
        return {key: export(spec, np.asarray(self._values[key]),
                            self._last_delta.get(key, 0.0))
                for key, spec in self._specs.items()}

    def get_state(self) -> dict:
        return {"specs": {k: (s.reduce, s.window, s.clear_on_reduce)
                          for k, s in self._specs.items()},
                "values": {k: list(v) for k, v in self._values.items()},
                "lifetime": dict(self._lifetime), "since_last": dict(self._since_last)}

    def set_state(self, state: dict) -> None:
        self._specs, self._values = {}, {}
        for key, (reduce, window, clear) in state["specs"].items():
            spec = MetricSpec(reduce, window, clear)
            self._specs[key] = spec
            self._values[key] = collections.deque(
                state["values"][key],
                maxlen=runner_window(spec, self._episode_window, self._num_env_runners))
        self._lifetime = dict(state["lifetime"])
        self._since_last = dict(state["since_last"])


def ring_window_values(registers: Any, windows: Sequence[int | None]) -> list[np.ndarray]:
    """Column `k`'s last `windows[k]` values (all filled slots for None), oldest first, as
    float64, of one device-callback ring on the host (`values` `(W, K)`, `size`, `next`)."""
    size = int(registers.size)
    slots = registers.values.shape[0]
    order = (int(registers.next) - size + np.arange(size)) % slots
    values = np.asarray(registers.values, np.float64)[order]
    return [values[:, k] if window is None else values[max(0, size - window):, k]
            for k, window in enumerate(windows)]


class DeviceMetrics:
    """Host side of the device callbacks' metrics of one runner: the per-chunk sums still
    on the device, lifetime sums (float64) and the reduction of the device ring."""

    def __init__(self, names: Sequence[str], specs: Mapping[str, MetricSpec],
                 episode_window: int, num_env_runners: int):
        self.names = tuple(names)
        self.specs = {n: specs.get(n, MetricSpec()) for n in self.names}
        self.windows = {n: runner_window(s, episode_window, num_env_runners)
                        for n, s in self.specs.items()}
        self._pending: list = []  # device (K,) sums of chunks not yet transferred
        self.lifetime = np.zeros(len(self.names), np.float64)
        self._since_last = np.zeros(len(self.names), np.float64)
        self._last_delta = np.zeros(len(self.names), np.float64)

    def add_chunk_sums(self, sums: Any) -> None:
        """Keeps a chunk's `(K,)` device sums (transferred with the next report)."""
        self._pending.append(sums)
        if len(self._pending) >= 256:  # bound the list: fold on the device
            import jax.numpy as jnp

            self._pending = [jnp.sum(jnp.stack(self._pending).astype(jnp.float32), axis=0)]

    def pending(self) -> list:
        return self._pending

    def absorb(self, host_sums: Sequence[np.ndarray]) -> None:
        """Adds the transferred pending sums (in float64) and clears the pending list."""
        for sums in host_sums:
            sums = np.asarray(sums, np.float64)
            self.lifetime += sums
            self._since_last += sums
        self._pending = []

    def window_values(self, registers: Any) -> dict[str, np.ndarray]:
        """{name: the last `window` values, oldest first} from host registers."""
        columns = ring_window_values(registers, [self.windows[n] for n in self.names])
        return dict(zip(self.names, columns))

    def reduce(self, registers: Any) -> dict[str, float]:
        window = self.window_values(registers)
        out = {}
        for i, name in enumerate(self.names):
            value = reduce_values(self.specs[name], window[name], self.lifetime[i],
                                  self._since_last[i])
            if value is not None:
                out[name] = value
        self._last_delta = self._since_last
        self._since_last = np.zeros_like(self._since_last)
        return out

    def exports(self, registers: Any) -> dict[str, dict]:
        window = self.window_values(registers)
        return {n: export(self.specs[n], window[n], self._last_delta[i])
                for i, n in enumerate(self.names)}

    def get_state(self) -> dict:
        return {"lifetime": self.lifetime.tolist(), "since_last": self._since_last.tolist()}

    def set_state(self, state: dict) -> None:
        self.lifetime = np.asarray(state["lifetime"], np.float64)
        self._since_last = np.asarray(state["since_last"], np.float64)
        self._pending = []


__all__ = ["DeviceMetrics", "MetricsLogger", "RESERVED_NAMES", "check_name", "export",
           "merge_exports", "reduce_values", "ring_window_values", "runner_window"]
