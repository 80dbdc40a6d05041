"""Experiment logs: metrics dicts written as TensorBoard event files (tensorboardX, which
Ray installs) and as JSON lines, and read back.

`ExperimentLog(logdir)` writes, per `log(metrics, step)` call, every number of the
(nested) metrics dict as a TensorBoard scalar tagged with its `/`-joined key path
(`fault_tolerance/num_healthy_workers`, `agent_episode_return_mean/a`) at global step
`step`, and one JSON line `{"step": step, "time": unix time, **metrics}` to
`metrics.jsonl`. `read_jsonl(logdir)` and `read_event_scalars(logdir)` read them back
(the latter with tensorboardX's own protobufs, no TensorFlow or TensorBoard needed).
"""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import time
from typing import Any, Iterator, Mapping

import numpy as np

JSONL_NAME = "metrics.jsonl"


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a nested dict as `{"a/b": float}` (bools as 0/1; None, strings and
    non-finite numbers left out)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
            continue
        if isinstance(value, (bool, np.bool_, int, float, np.integer, np.floating)) or (
                isinstance(value, np.ndarray) and value.size == 1):
            number = float(np.asarray(value).reshape(()))
            if math.isfinite(number):
                out[name] = number
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return repr(value)


class ExperimentLog:
    """Writes metrics to `logdir` (created) as TensorBoard events and JSON lines."""

    def __init__(self, logdir: str | os.PathLike):
        from tensorboardX import SummaryWriter

        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = SummaryWriter(logdir=self.logdir)
        self._jsonl = open(os.path.join(self.logdir, JSONL_NAME), "a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Writes one row (`step`: the x axis, e.g. lifetime env steps or iteration)."""
        now = time.time()
        for tag, value in flatten(metrics).items():
            self._writer.add_scalar(tag, value, global_step=int(step), walltime=now)
        row = {"step": int(step), "time": now, **_jsonable(dict(metrics))}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        self._writer.flush()

    def close(self) -> None:
        if not self._jsonl.closed:
            self._writer.close()
            self._jsonl.close()

    def __enter__(self) -> "ExperimentLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_jsonl(logdir: str | os.PathLike) -> list[dict]:
    """The rows `ExperimentLog.log` wrote to `logdir/metrics.jsonl`."""
    with open(os.path.join(os.fspath(logdir), JSONL_NAME), encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def _records(path: str) -> Iterator[bytes]:
    """The records of a TFRecord file (length, masked CRC, data, masked CRC)."""
    with open(path, "rb") as file:
        while True:
            header = file.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = file.read(length)
            file.read(4)
            if len(data) < length:
                return
            yield data


def read_event_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """`{tag: [(step, value), ...]}` from every TensorBoard event file in `logdir`."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(os.fspath(logdir), "events.out.tfevents.*"))):
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((int(event.step), value.simple_value))
    return out


__all__ = ["ExperimentLog", "JSONL_NAME", "flatten", "read_event_scalars", "read_jsonl"]
