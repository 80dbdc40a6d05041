"""Policy modules (pure Flax) and action distributions."""

from jaxrunner.modules.distributions import Categorical as Categorical
from jaxrunner.modules.distributions import DiagGaussian as DiagGaussian
from jaxrunner.modules.distributions import distribution_for as distribution_for
from jaxrunner.modules.rl_module import DEFAULT_MODULE_ID as DEFAULT_MODULE_ID
from jaxrunner.modules.recurrent import GRUModule as GRUModule
from jaxrunner.modules.rl_module import DefaultMLPModule as DefaultMLPModule
from jaxrunner.modules.rl_module import LinenRLModule as LinenRLModule
from jaxrunner.modules.rl_module import NNXRLModule as NNXRLModule
from jaxrunner.modules.rl_module import RLModule as RLModule
from jaxrunner.modules.rl_module import RLModuleSpec as RLModuleSpec

__all__ = ["Categorical", "DEFAULT_MODULE_ID", "DefaultMLPModule", "DiagGaussian",
           "GRUModule", "LinenRLModule", "NNXRLModule", "RLModule", "RLModuleSpec",
           "distribution_for"]
