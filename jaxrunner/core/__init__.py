"""The pure rollout core: scan over time of a vmap over sub-envs (no Ray, no host I/O)."""

from jaxrunner.core.carry import ChunkInfo as ChunkInfo
from jaxrunner.core.carry import Lookback as Lookback
from jaxrunner.core.carry import MetricRegisters as MetricRegisters
from jaxrunner.core.carry import RolloutCarry as RolloutCarry
from jaxrunner.core.carry import Trajectory as Trajectory
from jaxrunner.core.rollout import NO_EPISODE_LIMIT as NO_EPISODE_LIMIT
from jaxrunner.core.rollout import POLICY_MODES as POLICY_MODES
from jaxrunner.core.rollout import RolloutFns as RolloutFns
from jaxrunner.core.rollout import RolloutSpec as RolloutSpec
from jaxrunner.core.rollout import make_rollout_fns as make_rollout_fns

__all__ = ["ChunkInfo", "Lookback", "MetricRegisters", "NO_EPISODE_LIMIT", "POLICY_MODES",
           "RolloutCarry", "RolloutFns", "RolloutSpec", "Trajectory", "make_rollout_fns"]
