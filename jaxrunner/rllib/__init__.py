"""RLlib integration: jaxrunner as the env runner of an RLlib algorithm.

    from ray.rllib.algorithms.ppo import PPOConfig
    from jaxrunner.rllib import JaxEnvRunner

    config = (PPOConfig()
              .environment("CartPole-v1")  # gymnax id or registered JAX env
              .env_runners(env_runner_cls=JaxEnvRunner, num_env_runners=1,
                           num_envs_per_env_runner=16))

See docs/rllib.md. Importing this package imports `ray.rllib` and `torch`.
"""

from jaxrunner.rllib.config import check_supported as check_supported
from jaxrunner.rllib.config import runner_config_from_rllib as runner_config_from_rllib
from jaxrunner.rllib.env_runner import JaxEnvRunner as JaxEnvRunner
from jaxrunner.rllib.episodes import to_rllib_episodes as to_rllib_episodes
from jaxrunner.rllib.errors import SUPPORTED as SUPPORTED
from jaxrunner.rllib.errors import UnsupportedRLlibSetupError as UnsupportedRLlibSetupError
from jaxrunner.rllib.module import PPOLayout as PPOLayout
from jaxrunner.rllib.module import RLlibPPOModule as RLlibPPOModule
from jaxrunner.rllib.weights import flax_params_to_torch_state as flax_params_to_torch_state
from jaxrunner.rllib.weights import torch_state_to_flax_params as torch_state_to_flax_params

__all__ = [
    "JaxEnvRunner",
    "PPOLayout",
    "RLlibPPOModule",
    "SUPPORTED",
    "UnsupportedRLlibSetupError",
    "check_supported",
    "flax_params_to_torch_state",
    "runner_config_from_rllib",
    "to_rllib_episodes",
    "torch_state_to_flax_params",
]
