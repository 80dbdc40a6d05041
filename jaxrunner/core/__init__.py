"""The pure rollout core: one chunk (`scan_while` over a batched step over sub-envs) for
every agent layout, with auto-reset, faults, the metric ring and the lookback each in a
module of its own (no Ray, no host I/O)."""

from jaxrunner.core.carry import ChunkInfo as ChunkInfo
from jaxrunner.core.carry import Lookback as Lookback
from jaxrunner.core.carry import MetricRegisters as MetricRegisters
from jaxrunner.core.carry import RolloutCarry as RolloutCarry
from jaxrunner.core.carry import Trajectory as Trajectory
from jaxrunner.core.chunk import POLICY_MODES as POLICY_MODES
from jaxrunner.core.chunk import ChunkFns as ChunkFns
from jaxrunner.core.chunk import make_chunk_fns as make_chunk_fns
from jaxrunner.core.chunk import scan_while as scan_while
from jaxrunner.core.faults import FAILURE_INFO_KEY as FAILURE_INFO_KEY
from jaxrunner.core.faults import mark_step_failed as mark_step_failed
from jaxrunner.core.ring import NO_EPISODE_LIMIT as NO_EPISODE_LIMIT
from jaxrunner.core.rollout import RolloutFns as RolloutFns
from jaxrunner.core.rollout import RolloutSpec as RolloutSpec
from jaxrunner.core.rollout import make_rollout_fns as make_rollout_fns

__all__ = ["ChunkFns", "ChunkInfo", "FAILURE_INFO_KEY", "Lookback", "MetricRegisters",
           "NO_EPISODE_LIMIT", "POLICY_MODES", "RolloutCarry", "RolloutFns", "RolloutSpec",
           "Trajectory", "make_chunk_fns", "make_rollout_fns", "mark_step_failed",
           "scan_while"]
