"""Test and example helpers: small envs that pin contracts."""

from jaxrunner.testing.envs import DictObsEnv as DictObsEnv
from jaxrunner.testing.envs import MultiDiscreteEnv as MultiDiscreteEnv
from jaxrunner.testing.envs import TargetEnv as TargetEnv

__all__ = ["DictObsEnv", "MultiDiscreteEnv", "TargetEnv"]
