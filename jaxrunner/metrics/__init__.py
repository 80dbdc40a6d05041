"""Metrics: RLlib's key names and the host-side reduction of the device registers."""

from jaxrunner.metrics import keys as keys
from jaxrunner.metrics.fused import reduce_sample_metrics as reduce_sample_metrics
from jaxrunner.metrics.logger import RunnerMetrics as RunnerMetrics

__all__ = ["RunnerMetrics", "keys", "reduce_sample_metrics"]
