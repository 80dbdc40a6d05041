"""Environments: the gymnax env protocol, the registry and space conversion."""

from jaxrunner.envs.context import EnvContext as EnvContext
from jaxrunner.envs.registry import gymnax_env_ids as gymnax_env_ids
from jaxrunner.envs.registry import make_jax_env as make_jax_env
from jaxrunner.envs.registry import register_env as register_env
from jaxrunner.envs.registry import registered_env_names as registered_env_names
from jaxrunner.envs.spaces import to_gymnasium as to_gymnasium

__all__ = ["EnvContext", "gymnax_env_ids", "make_jax_env", "register_env",
           "registered_env_names", "to_gymnasium"]
