"""Reference learners that consume `EpisodeBatch` device arrays."""

from jaxrunner.learners.ppo import FusedTrainState as FusedTrainState
from jaxrunner.learners.ppo import LearnerState as LearnerState
from jaxrunner.learners.ppo import PPOConfig as PPOConfig
from jaxrunner.learners.ppo import PPOLearner as PPOLearner
from jaxrunner.learners.ppo import clipped_surrogate_loss as clipped_surrogate_loss
from jaxrunner.learners.ppo import compute_gae as compute_gae

__all__ = ["FusedTrainState", "LearnerState", "PPOConfig", "PPOLearner", "clipped_surrogate_loss", "compute_gae"]
